"""The adversarial clients' scenarios of the shared-budget benchmark
(issue 7; see README.md): short requests next to long downloads, a slow
reader, one client spread over a /24, connections that join and leave, and
lo at its default MTU; every tool side by side.
"""

from bench_client import http_request
from bench_figures import jain, median, percentile, spread
from bench_figures import windows as windows_of
from bench_table import row
from benchlib import BIG_FILE, harness
from scenario_common import (CLIENT, MODES, RATE, TARGET, _mode_line, _r,
                             failed_run, long_specs, refused, side_by_side)


def run_raw(run, target, conns=None):
    conns = run.conns if conns is None else conns
    return {"total": round(run.rate(conns) / target, 4),
            "windows": _r([w / target for w in run.windows(conns)]),
            "per_connection_Bps": [round(c.rate(run.t0, run.t1)) for c in conns],
            "workers": run.split, "stat": run.stat, "errors": run.errors[:20],
            "client_cpu_pct": run.client_cpu_pct,
            "window_s": [round(run.t0 - run.base, 3), round(run.t1 - run.base, 3)]}


def short(bench):
    """4 long downloads + f new 64 KiB Range requests per second (each a new
    connection, Connection: close), all from CLIENT; every tool side by
    side."""
    freqs = (20,) if bench.quick else (10, 20)
    warm, window = (2.0, 3.0) if bench.quick else (2.0, 10.0)
    rows, raw = [], {}
    for f in freqs:
        name = "%d/s" % f

        def specs(srv, count=int((warm + window + 1.5) * f)):
            shorts = []
            for i in range(count):
                # Spread over the file, each range inside it (a range past
                # its end would be a 416 of a few hundred bytes).
                x = (i * 7 + 1) * (1 << 20) % (harness.BIG_FILE_SIZE - (1 << 17))
                shorts.append({"source": CLIENT, "start": 0.1 + i / f,
                               "place": False, "group": "short",
                               "label": "short#%d" % i,
                               "request": http_request(srv.port, BIG_FILE,
                                                       (x, x + 65535))})
            return long_specs(4) + shorts
        runs, _ = side_by_side(bench, RATE, specs, window, warm=warm)
        figs = {}
        for mode, run in runs.items():
            if failed_run(bench, "short " + name, mode, run):
                figs[mode] = {"error": run}
                continue
            r = run_raw(run, TARGET)
            del r["per_connection_Bps"]
            shorts = [c for c in run.conns if c.group == "short"
                      and c.connected_at is not None and run.t0 <= c.start_at < run.t1]
            done = [c for c in shorts if c.eof and c.status in (200, 206)]
            durations = [c.done_at - c.connected_at for c in done]
            r["short_started"] = len(shorts)
            r["short_completed"] = len(done)
            r["short_refused"] = len(refused(shorts))
            r["short_status"] = sorted({c.status for c in shorts if c.status})
            r["short_bytes"] = sorted({c.total for c in done})[:5]
            r["short_duration_s"] = {"median": median(durations),
                                     "p90": percentile(durations, 90),
                                     "max": max(durations) if durations else None}
            r["long_Bps"] = [round(c.rate(run.t0, run.t1))
                             for c in run.conns if c.group is None]
            figs[mode] = r
            _mode_line(name, mode, "total %.3fx, max 1 s window %.3f; %d/%d short "
                       "done (%d refused), median %.2f s; workers at end %s" % (
                           r["total"], max(r["windows"]), len(done), len(shorts),
                           r["short_refused"], median(durations) or 0, r["workers"]))
        raw[name] = figs
        note_totals(bench, "short " + name, figs)
        rows += judged_rows("short", [
            ("%s total %.0f s / rate" % (name, window), "total", {"hi": 1.03}),
            ("%s max 1 s window" % name, lambda r: max(r["windows"]), {"hi": 1.05}),
            ("%s short request median s" % name,
             lambda r: r["short_duration_s"]["median"], {"fmt": "%.3f"}),
        ], figs)
    return rows, raw


def judged_rows(scenario, metrics, figs):
    """Table rows of a scenario: metrics are (text, key or function of a
    tool's figures, row() keywords); only the library's modes are columns
    (the comparators are in bench.adversarial and the report)."""
    rows = []
    if any("error" in figs.get(m, {"error": 1}) for m in MODES):
        return rows
    for text, get, kw in metrics:
        value = (lambda r: r[get]) if isinstance(get, str) else get
        rows.append(row(scenario, text, {m: value(figs[m]) for m in MODES}, **kw))
    return rows


def note_totals(bench, scenario, figs):
    """The client total against the rate of every tool in an adversarial
    scenario, for the comparators table and the report."""
    for tool, r in figs.items():
        entry = {"total": r.get("total"), "window_min": min(r["windows"])
                 if r.get("windows") else None,
                 "window_max": max(r["windows"]) if r.get("windows") else None,
                 "error": r.get("error")}
        bench.adversarial.setdefault(scenario, {})[tool] = entry


def slowreader(bench):
    """4 downloads of one client; the first read at 20 KiB/s (small
    SO_RCVBUF), the other three flat out; every tool side by side."""
    warm, window = (2.0, 3.0) if bench.quick else (2.0, 10.0)
    figs = {}
    specs = long_specs(4, read_rate=20480, rcvbuf=4096, label="slow")
    runs, _ = side_by_side(bench, RATE, lambda srv: specs, window, warm=warm)
    for mode, run in runs.items():
        if failed_run(bench, "slowreader", mode, run):
            figs[mode] = {"error": run}
            continue
        r = run_raw(run, TARGET)
        rates = r["per_connection_Bps"]
        r["slow_Bps"], r["fast_Bps"] = rates[0], rates[1:]
        r["fast_spread"] = round(spread(rates[1:]), 4)
        figs[mode] = r
        _mode_line("slowreader", mode, "total %.3fx; slow %d B/s, fast %s B/s "
                   "(spread %.3f); workers %s" % (r["total"], rates[0], rates[1:],
                                                  r["fast_spread"], r["workers"]))
    note_totals(bench, "slowreader", figs)
    rows = judged_rows("slowreader", [
        ("total %.0f s / rate" % window, "total", {"lo": 0.95}),
        ("3 fast: max/min - 1", "fast_spread", {"hi": 0.05}),
        ("slow reader B/s (reads 20480)", "slow_Bps", {"fmt": "%.0f"}),
        ("max 1 s window", lambda r: max(r["windows"]), {}),
    ], figs)
    return rows, figs


def spread24(bench):
    """One client spread over a /24: 8 downloads from 8 addresses of
    127.0.3.0/24, trafficrate keyed by TRAFFICRATE_KEY=peer/24 (one budget
    for the network), the comparators per address as they are."""
    warm, window = (2.0, 3.0) if bench.quick else (2.0, 10.0)
    sources = ["127.0.3.%d" % (10 + 20 * i) for i in range(8)]
    specs = [{"source": s, "label": "%s#0" % s} for s in sources]
    figs = {}
    # The library's modes need KEY=peer/24; the comparators ignore it.
    runs, _ = side_by_side(bench, RATE, lambda srv: specs, window, warm=warm,
                           server_kw={"KEY": "peer/24"})
    for mode, run in runs.items():
        if failed_run(bench, "spread24", mode, run):
            figs[mode] = {"error": run}
            continue
        r = run_raw(run, TARGET)
        r["jain"] = round(jain(r["per_connection_Bps"]), 5)
        r["refused"] = len(refused(run.conns))
        figs[mode] = r
        _mode_line("spread24", mode, "total %.3fx over %d addresses, Jain %.4f, "
                   "refused %d" % (r["total"], len(sources), r["jain"], r["refused"]))
    note_totals(bench, "spread24", figs)
    rows = judged_rows("spread24", [
        ("8 addresses of a /24, total / rate", "total", {"lo": 0.95, "hi": 1.05}),
        ("Jain index", "jain", {"lo": 0.99, "fmt": "%.4f"}),
    ], figs)
    return rows, figs


def joinleave(bench):
    """2 downloads, 6 more join (over both workers) and leave again; every
    tool side by side; per-second and per-100 ms totals."""
    a, b, c = (2.0, 3.0, 3.0) if bench.quick else (4.0, 5.0, 5.0)
    end = a + b + c
    spans = [(1.0, a), (a + 1, a + b), (a + b + 1, end)]
    figs = {}
    specs = long_specs(2) + [{"source": CLIENT, "start": a, "stop": a + b,
                              "label": "join#%d" % i} for i in range(6)]
    runs, _ = side_by_side(bench, RATE, lambda srv: specs, end, split_at=a + b / 2)
    for mode, run in runs.items():
        if failed_run(bench, "joinleave", mode, run):
            figs[mode] = {"error": run}
            continue
        per_second = [w / TARGET for w in run.windows()]  # [0,1), [1,2), ...
        tenths = [w / TARGET for w in windows_of(run.conns, run.t0, run.t1, 0.1)]
        kept = [per_second[i] for lo, hi in spans for i in range(int(lo), int(hi))]
        after = [per_second[i] for i in range(int(spans[2][0]), int(end))]
        figs[mode] = {"windows": _r(per_second), "windows_100ms": _r(tenths, 3),
                      "judged": _r(kept),
                      "after_leave": _r(after), "workers_with_8": run.split,
                      "stat_with_8": run.stat, "errors": run.errors[:20],
                      "client_cpu_pct": run.client_cpu_pct,
                      "phases_s": [a, b, c],
                      "right_after_join": round(per_second[int(a)], 4),
                      "right_after_leave": round(per_second[int(a + b)], 4)}
        _mode_line("joinleave", mode, "windows %s; workers with 8: %s"
                   % (" ".join("%.3f" % w for w in per_second), run.split))
    phases = "%g/%g/%g s" % (a, b, c)
    return judged_rows("joinleave", [
        ("2->8->2 (%s) min window" % phases, lambda r: min(r["judged"]), {"lo": 0.95}),
        ("2->8->2 max window", lambda r: max(r["judged"]), {"hi": 1.05}),
        ("min window after the leave", lambda r: min(r["after_leave"]), {"lo": 0.95}),
        ("window [%g,%g) (1st after leave)" % (a + b, a + b + 1),
         "right_after_leave", {}),
    ], figs), figs


def bigmtu(bench):
    """lo at its default MTU of 65 536 (in the benchmark's namespace, for
    this scenario only): one client, 3 downloads at 200k, equal and budget
    side by side, 12 s from the start (the first second holds the new
    connections' unpaced first segments: 10 x 64 KiB each without the
    shaper)."""
    rate, seconds = "200k", 6.0 if bench.quick else 12.0
    target = harness.parse_rate(rate)
    old_mtu = harness.interface_mtu("lo")
    harness.set_interface_mtu(65536)
    try:
        runs, _ = side_by_side(bench, rate, lambda srv: long_specs(3), seconds)
    finally:
        harness.set_interface_mtu(old_mtu)
    figs = {}
    for mode, run in runs.items():
        if failed_run(bench, "bigmtu", mode, run):
            figs[mode] = {"error": run}
            continue
        per_second = [w / target for w in run.windows()]
        figs[mode] = {"total": round(run.rate() / target, 4), "windows": _r(per_second),
                      "errors": run.errors[:20]}
        _mode_line("bigmtu", mode, "total %.3fx over %g s; 1 s windows %s" % (
            figs[mode]["total"], seconds, " ".join("%.3f" % w for w in per_second)))
    note_totals(bench, "bigmtu", figs)
    return judged_rows("bigmtu", [
        ("lo MTU 65536, 3 @200k: total %g s / rate" % seconds, "total", {"hi": 1.03}),
        ("lo MTU 65536: max 1 s window", lambda r: max(r["windows"]), {"hi": 1.10}),
        ("lo MTU 65536: first 1 s window", lambda r: r["windows"][0], {}),
    ], figs), figs
