"""The scenarios of the shared-budget benchmark (issue 7); see README.md.

Each scenario is a function (bench) -> (rows, raw): rows for the final table
(bench_table.row(): one figure per share mode and the budget column's target),
raw a JSON-able dict of what was measured. Every share mode runs against its
own fresh nginx and zone, one after the other, in the same namespace.
"""

import os
import re
import subprocess
from contextlib import ExitStack

import traceback

from bench_client import drive, drive_parallel, http_request
from bench_cpu import (InterruptTrace, outside_interrupts, outside_interrupts_sampled,
                       process_cpu, thread_cpu, watcher_tids)
from bench_figures import jain, median, percentile, spread
from bench_figures import windows as windows_of
from bench_table import row
from benchlib import (BIG_FILE, IDLE_THREAD, IDLE_THREAD_LIB, LIB_MODES, LIMIT_CONN,
                      NO_SHAPE, SERVER_HOST, SMALL_FILE_4K, TOOL_TEXT, harness, log,
                      trickle_evidence)
from scale import scale

RATE = "500k"
TARGET = 512000
CLIENT = "127.0.0.2"
MODES = LIB_MODES


def _r(values, nd=4):
    return [round(v, nd) for v in values]


def _mode_line(name, mode, text):
    log("  %-12s %-6s %s" % (name, mode, text))


# ------------------------------------------------------------------ keepalive

_WRK_RPS = re.compile(r"Requests/sec:\s*([\d.]+)")
_WRK_BYTES = re.compile(r"Transfer/sec:\s*([\d.]+)([KMGT]?B)")
_WRK_UNITS = {"B": 1, "KB": 1024, "MB": 1024 ** 2, "GB": 1024 ** 3, "TB": 1024 ** 4}


def _pin(pids, cpu):
    """Every thread of pids (and the threads they start later) to one CPU."""
    for pid in pids:
        subprocess.run(["taskset", "-apc", str(cpu), str(pid)],
                       capture_output=True, check=False)


def _pinnable():
    """Whether the server side and the client side can have a CPU each."""
    try:
        return {0, 1} <= os.sched_getaffinity(0)
    except OSError:
        return False


def _wrk_value(out, what):
    m = (_WRK_RPS if what == "rps" else _WRK_BYTES).search(out)
    if not m:
        raise RuntimeError("wrk printed no %s:\n%s" % (
            "Requests/sec" if what == "rps" else "Transfer/sec", out))
    value = float(m.group(1))
    if what == "bytes":
        value *= _WRK_UNITS[m.group(2)]
    return value


def wrk_side_by_side(servers, seconds, headers=(), path=SMALL_FILE_4K,
                     conns=20, what="rps", client_cpu=None):
    """`wrk -t1 -c<conns>` against every server of {name: server} at the same
    time (on client_cpu, if given). Returns {name: (requests/s or bytes/s,
    CPU seconds of the server's worker over the run, all its threads)} and
    wrk's error lines."""
    workers = {n: srv.worker_pids()[0] for n, srv in servers.items()}
    before = {n: process_cpu(w) for n, w in workers.items()}
    procs = {}
    for name, srv in servers.items():
        argv = [] if client_cpu is None else ["taskset", "-c", str(client_cpu)]
        argv += ["wrk", "-t1", "-c%d" % conns, "-d%ds" % seconds]
        for h in headers:
            argv += ["-H", h]
        argv.append("http://%s:%d%s" % (SERVER_HOST, srv.port, path))
        procs[name] = subprocess.Popen(argv, stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, text=True)
    outs = {}
    for name, proc in procs.items():
        try:
            outs[name] = proc.communicate(timeout=seconds + 20)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            outs[name] = proc.communicate()[0]
    after = {n: process_cpu(w) for n, w in workers.items()}
    got, problems = {}, []
    for name, out in outs.items():
        if before[name] is None or after[name] is None:
            raise RuntimeError("nginx worker %d (%s) ended" % (workers[name], name))
        got[name] = (_wrk_value(out, what), after[name] - before[name])
        problems += ["%s: %s" % (name, line.strip()) for line in out.splitlines()
                     if "errors" in line or "Non-2xx" in line]
    return got, problems


def keepalive(bench):
    """nginx, 1 worker, rate 65536m (64 GiB/s: never reached, not even by
    one download on loopback), against nginx without the library: req/s of
    the 4 KiB file over keep-alive and with Connection: close, bytes/s of one
    connection downloading 256 MiB.

    This machine's speed swings by 2-4x for seconds at a time (other
    guests): pairs of runs one after the other gave single ratios of
    0.53-1.21. So each comparison runs both servers at the same time, both
    workers on CPU 0 and both wrk on CPU 1: the two workers share the core
    equally and feel the same swings, and the figure is the work each does
    per CPU-second of its process (watcher included), over the same seconds.
    Two plain servers measured so agree within 0.97-1.02. The watcher's CPU,
    a cost per second, weighs twice what it would for a worker with the
    whole core: the figure errs against the library.

    Next to the library: nginx with a preload that only starts an idle
    thread (IDLE_THREAD), what any in-process watcher thread costs. With the
    shaper on, each mode also runs against itself with the shaper off
    (NO_SHAPE), in the same seconds: what the shaper costs a server whose
    key is far below its rate."""
    rounds, seconds = (2, 1) if bench.quick else (7, 2)
    pin = _pinnable()
    if not pin:
        bench.warn("keepalive: fewer than 2 CPUs: servers and clients not pinned")
    others = MODES + ((IDLE_THREAD,) if bench.idle_thread_lib() else ())
    if IDLE_THREAD not in others:
        bench.warn("keepalive: %s not built: no idle-thread floor" % IDLE_THREAD_LIB)
    unshaped = (tuple(m + NO_SHAPE for m in MODES)
                if getattr(bench, "shape", None) != "0" else ())
    rows, raw = [], {}
    with ExitStack() as stack:
        srvs = {m: stack.enter_context(bench.server(m, "65536m", workers=1))
                for m in ("none",) + others + unshaped}
        if pin:
            for srv in srvs.values():
                _pin(srv.worker_pids(), 0)
        for variant, headers, lo, wrk_kw in (
                ("keep-alive", (), 0.97, {}),
                ("close", ("Connection: close",), 0.90, {}),
                # One connection downloading the 256 MiB file over and over.
                ("1 conn 256 MiB", (), 0.95,
                 {"path": BIG_FILE, "conns": 1, "what": "bytes"})):
            per_cpu = {m: [] for m in others}  # work per CPU-s, m / none
            per_sec = {m: [] for m in others}  # work per second, m / none
            values = {m: [] for m in ("none",) + others}
            shaper = {m: [] for m in MODES}  # work per CPU-s, shaper on / off
            problems = []

            def side_by_side(i, base, m):
                """base and m at the same time (base first in even rounds):
                ((base's work, CPU s), (m's)), and m's work per CPU-second
                over base's."""
                pair = {n: srvs[n] for n in ((base, m) if i % 2 == 0 else (m, base))}
                got, errs = wrk_side_by_side(pair, seconds, headers,
                                             client_cpu=1 if pin else None, **wrk_kw)
                problems.extend("round %d: %s" % (i, e) for e in errs)
                (v0, c0), (v1, c1) = got[base], got[m]
                return got[base], got[m], (v1 / c1 / (v0 / c0)
                                           if min(v0, c0, c1) > 0 else 0.0)

            for i in range(rounds):
                for m in (others if i % 2 == 0 else others[::-1]):
                    (v0, _), (v1, _), ratio = side_by_side(i, "none", m)
                    values["none"].append(v0)
                    values[m].append(v1)
                    per_sec[m].append(v1 / v0 if v0 > 0 else 0.0)
                    per_cpu[m].append(ratio)
                for m in (MODES if unshaped else ()):
                    shaper[m].append(side_by_side(i, m + NO_SHAPE, m)[2])
                log("  %-14s round %d/%d: %s" % (variant, i + 1, rounds, ", ".join(
                    ["%s %.3fx/CPU-s %.3fx/s" % (m, per_cpu[m][-1], per_sec[m][-1])
                     for m in others] + ["%s shaper on/off %.3fx/CPU-s" % (m, shaper[m][-1])
                                         for m in (MODES if unshaped else ())])))
            for p in problems:
                bench.warn("wrk " + p)
            raw[variant] = {"values": values, "per_cpu": per_cpu, "per_sec": per_sec,
                            "shaper_on_per_off": shaper if unshaped else None,
                            "pinned": pin, "seconds": seconds,
                            "wrk_problems": problems}
            unit = "B" if wrk_kw.get("what") == "bytes" else "req"
            rows.append(row("keepalive", "%s: %s per CPU-second vs none, same seconds "
                            "(median of %d)" % (variant, unit, rounds),
                            {m: median(per_cpu[m]) for m in MODES}, lo=lo))
            rows.append(row("keepalive", "%s: %s/s vs none, same seconds" % (variant, unit),
                            {m: median(per_sec[m]) for m in MODES}))
            if unshaped:
                rows.append(row("keepalive", "%s: %s per CPU-second, shaper on / off, "
                                "same seconds (median of %d)" % (variant, unit, rounds),
                                {m: median(shaper[m]) for m in MODES}))
            if IDLE_THREAD in others:
                floor = median(per_cpu[IDLE_THREAD])
                rows.append(row("keepalive", "%s: idle-thread floor, %s per CPU-second "
                                "vs none (either column)" % (variant, unit),
                                {m: floor for m in MODES}))
            rows.append(row("keepalive", "%s: %s/s on a shared core (none: median %.0f)"
                            % (variant, unit, median(values["none"])),
                            {m: median(values[m]) for m in MODES}, fmt="%.0f"))
    return rows, raw


# -------------------------------------------------- one client, long downloads

def long_specs(n, **first):
    """n downloads of the big file from CLIENT; `first` (e.g. read_rate)
    applies to the first one only."""
    return [dict({"source": CLIENT, "label": "long#%d" % i}, **(first if i == 0 else {}))
            for i in range(n)]


def steady(bench, mode, rate, specs, warm, window, name, warn=True):
    """One mode of a steady scenario: fresh nginx (2 workers), drive()."""
    with bench.server(mode, rate) as srv:
        run = drive(bench, srv, specs, window, warm=warm)
        run.server = server_info(srv)
    if warn:
        for e in run.errors[:5]:
            bench.warn("%s %s: %s" % (name, mode, e))
    return run


def run_raw(run, target, conns=None):
    conns = run.conns if conns is None else conns
    return {"total": round(run.rate(conns) / target, 4),
            "windows": _r([w / target for w in run.windows(conns)]),
            "per_connection_Bps": [round(c.rate(run.t0, run.t1)) for c in conns],
            "workers": run.split, "stat": run.stat, "errors": run.errors[:20],
            "client_cpu_pct": run.client_cpu_pct,
            "window_s": [round(run.t0 - run.base, 3), round(run.t1 - run.base, 3)]}


def tool_figures(run, target, tool):
    """The comparison figures of one tool (or share mode) in one accuracy
    case: totals and rates as ratios of the rate, per-second totals and
    per-connection rates for plots, refused connections."""
    conns = run.conns
    done = [c for c in conns if c.eof and c.status in (200, 206)]
    t0, t1, basis = run.t0, run.t1, "window"
    if done:
        # Whole 256 MiB downloads finished (no limit at work, e.g. trickle):
        # the window may have seen none of it. Measure over the downloads'
        # life instead, first connect to last EOF, each connection over its own.
        started = [c.connected_at for c in conns if c.connected_at]
        t0, basis = min(started), "lifetime"
        t1 = max(c.done_at if c.eof else run.t1 for c in conns if c.connected_at)
        rates = [c.total / ((c.done_at if c.eof else run.t1) - c.connected_at)
                 if c.connected_at else 0.0 for c in conns]
        windows = [w / target for w in harness_windows(conns, t0, t1)]
    else:
        rates = [c.rate(t0, t1) for c in conns]
        windows = [w / target for w in run.windows()]
    # Refused: nginx answered 503 (limit_conn) or the connection was reset /
    # failed before it delivered a body.
    refused_ = refused(conns)
    served = [c for c, r in zip(conns, rates) if c not in refused_]
    total = (sum(rates) if basis == "window" else
             sum(c.total for c in conns) / max(1e-6, t1 - t0))
    return {
        "basis": basis,  # window: figures over the measurement window
        "total": round(total / target, 4),
        "conn_min": round(min(rates) / target, 4) if rates else None,
        "conn_max": round(max(rates) / target, 4) if rates else None,
        "jain": round(jain(rates), 5),
        "jain_served": round(jain(r for c, r in zip(conns, rates) if c in served), 5)
        if served else None,
        "window_min": round(min(windows), 4) if windows else None,
        "window_max": round(max(windows), 4) if windows else None,
        "connections": len(conns), "refused": len(refused_), "served": len(served),
        "status_counts": {str(k): sum(1 for c in conns if c.status == k)
                          for k in sorted({c.status for c in conns}, key=str)},
        # Downloads of the whole 256 MiB file that finished (an unlimited
        # server delivers it in well under a second on loopback).
        "completed": len(done),
        "completed_before_window": sum(1 for c in done if c.done_at <= run.t0),
        "rate_Bps": target,
        "windows": _r(windows),
        "per_connection_Bps": [round(r) for r in rates],
        "errors": run.errors[:20], "workers": run.split,
        "client_cpu_pct": run.client_cpu_pct,
        "window_s": [round(t0 - run.base, 3), round(t1 - run.base, 3)],
    }


def harness_windows(conns, t0, t1):
    """1 s windows over [t0, t1), the last one partial (a short lifetime)."""
    full = windows_of(conns, t0, t0 + max(1, int(t1 - t0)))
    return full if full else [sum(c.bytes_at(t1) - c.bytes_at(t0) for c in conns)
                              / max(1e-6, t1 - t0)]


def trickle_verdict(fig, server, evidence):
    """Whether trickle limited anything here, with the evidence: each nginx
    worker is its own trickle process (its own -u budget), so an effective
    trickle holds the client to at most workers x the rate."""
    workers = max(1, len(server.get("workers") or []))
    bound = 1.5 * workers
    why = []
    mapped = server.get("trickle_mapped") or {}
    why.append("%s mapped in %d of %d workers" % (
        "trickle-overload.so", sum(1 for v in mapped.values() if v), len(mapped)))
    if evidence.get("nginx_calls_not_hooked"):
        why.append("nginx calls %s, which trickle does not hook" % ", ".join(
            evidence["nginx_calls_not_hooked"]))
    if fig["completed"]:
        why.append("%d of %d downloads of the 256 MiB file finished within %.1f s"
                   % (fig["completed"], fig["connections"],
                      fig["window_s"][1] - fig["window_s"][0]))
    if fig["total"] > bound or fig["completed"]:
        return False, ("not applicable: nginx workers bypass it (client total "
                       "%.1fx the rate, above %d workers x rate; %s)"
                       % (fig["total"], workers, "; ".join(why)))
    return True, "limits (client total %.2fx the rate; %s)" % (fig["total"],
                                                               "; ".join(why))


# Trickle is run only in these accuracy cases (workers, rate, N), one after
# the other, never side by side with the others: nginx's workers bypass it,
# so it sends at loopback speed and would take the CPU the others need.
TRICKLE_CASES = ((2, "500k", 1), (2, "500k", 4))


def accuracy_cases(bench):
    """(workers, rate, N) of the accuracy scenario, the warm-up and the
    window (s)."""
    if bench.cases:  # --cases
        return list(bench.cases), 2.0, 3.0 if bench.quick else 10.0
    if bench.quick:
        return [(2, "500k", 4), (4, "5m", 16)], 2.0, 3.0
    # 8 connections of 4 KB/s: a slow client, whose 1 s windows need small
    # packets most.
    slow = [(2, "32k", 8)]
    if not bench.tools:  # a second tso setting: the library's modes only
        return ([(2, r, n) for r in ("500k", "5m") for n in (1, 4, 16, 64)] + slow,
                2.0, 10.0)
    return ([(w, r, n) for w in (2, 4) for r in ("500k", "5m")
             for n in (1, 2, 4, 8, 16, 64)] + slow, 2.0, 10.0)


def server_info(srv):
    return {"workers": srv.worker_pids(), "sendfile": srv.settings["sendfile"],
            "limit_rate": srv.settings["limit_rate"],
            "trickle_mapped": getattr(srv, "trickle_mapped", None),
            "argv0": srv.argv[0]}


def parallel_tools(bench):
    """The library's modes and the comparators that run side by side (all
    but trickle, see TRICKLE_CASES)."""
    return list(MODES) + [t for t in bench.tools if not t.startswith("trickle")]


def refused(conns):
    """Connections nginx answered 503 (limit_conn), or reset / failed
    before any response."""
    return [c for c in conns if c.status == 503 or (c.error and c.status is None)]


def side_by_side(bench, rate, make_specs, duration, tools=None, workers=2,
                 server_kw=None, **drive_kw):
    """Each of `tools` (default: the library's modes and the comparators
    but trickle, see TRICKLE_CASES) against its own nginx at `rate`, their
    clients at the same time (drive_parallel). make_specs(srv) gives one
    server's specs. Returns ({tool: Run or why it has none}, {tool:
    server_info})."""
    if tools is None:
        tools = parallel_tools(bench)
    if bench.serial:
        # --serial: one tool after the other, each alone on the machine (to
        # check that side by side measures the same).
        runs, infos = {}, {}
        for t in tools:
            with bench.server(t, rate, workers=workers, **(server_kw or {})) as srv:
                infos[t] = server_info(srv)
                try:
                    runs[t] = drive(bench, srv, make_specs(srv), duration, **drive_kw)
                except Exception:
                    runs[t] = "drive failed: " + traceback.format_exc()
        return runs, infos
    with ExitStack() as stack:
        srvs = {t: stack.enter_context(bench.server(t, rate, workers=workers,
                                                    **(server_kw or {})))
                for t in tools}
        infos = {t: server_info(srvs[t]) for t in tools}
        runs = drive_parallel(bench, [(srvs[t], make_specs(srvs[t])) for t in tools],
                              duration, **drive_kw)
    return dict(zip(tools, runs)), infos


def accuracy(bench):
    """One client, N downloads over every worker: total, 1 s windows, Jain,
    for equal and budget and the comparators (bench.tools: nginx limit_rate,
    limit_conn + limit_rate, trickle) into bench.tool_results. Each case's
    tools run at the same time, each against its own nginx (trickle after,
    alone)."""
    cases, warm, window = accuracy_cases(bench)
    rows, raw = [], {}
    parallel = parallel_tools(bench)
    for i, (workers, rate, n) in enumerate(cases):
        target = harness.parse_rate(rate)
        name = "%dw %s N=%d" % (workers, rate, n)
        log("  [%d/%d] %s: %s %s" % (i + 1, len(cases), name, ", ".join(parallel),
                                     "one after the other" if bench.serial
                                     else "side by side"))
        runs, infos = side_by_side(bench, rate, lambda srv: long_specs(n), window,
                                   tools=parallel, workers=workers, warm=warm)
        figs = {}
        for tool in parallel:
            figs[tool] = tool_entry(bench, tool, runs[tool], infos[tool], rate, n,
                                    target, name)
        for tool in bench.tools:
            if tool in parallel:
                continue
            if (workers, rate, n) in TRICKLE_CASES:
                figs[tool] = comparator(bench, tool, rate, n, target, name, warm,
                                        window, workers)
        for tool, entry in figs.items():
            bench.tool_results.setdefault(tool, {})[name] = entry
        raw[name] = figs
        if any("total" not in figs[m] for m in MODES):
            continue
        tol = 0.05
        label = "%s N=%-2d" % ("%dw %s" % (workers, rate), n)
        rows += [
            row("accuracy", "%s total %.0f s / rate" % (label, window),
                {m: figs[m]["total"] for m in MODES}, lo=0.97, hi=1.03),
            row("accuracy", "%s min 1 s window" % label,
                {m: figs[m]["window_min"] for m in MODES}, lo=1 - tol),
            row("accuracy", "%s max 1 s window" % label,
                {m: figs[m]["window_max"] for m in MODES}, hi=1 + tol),
        ]
        if n > 1:
            rows.append(row("accuracy", "%s Jain index" % label,
                            {m: figs[m]["jain"] for m in MODES}, lo=0.99, fmt="%.4f"))
        if any(figs[m].get("shaping", {}).get("shaped_calls") for m in MODES):
            rows += [
                row("accuracy", "%s shaper's extra syscalls / packets" % label,
                    {m: shaper_extra_per_packet(figs[m]) for m in MODES}, hi=1.2),
                row("accuracy", "%s shaper syscalls/s per connection" % label,
                    {m: shaper_syscalls_per_conn_sec(figs[m]) for m in MODES},
                    fmt="%.1f"),
            ]
    return rows, raw


def shaper_extra_per_packet(fig):
    """The shaper's system calls beyond the host's own calls it cut, per
    packet the kernel sent (segs_out of the open connections), over the
    connections' life; None if unknown."""
    s = fig.get("shaping") or {}
    if not s.get("segs_out"):
        return None
    return (s["shaper_syscalls"] - s["shaped_calls"]) / s["segs_out"]


def shaper_syscalls_per_conn_sec(fig):
    s = fig.get("shaping") or {}
    if not s.get("connections") or not s.get("seconds"):
        return None
    return s["shaper_syscalls"] / s["connections"] / s["seconds"]


def tool_entry(bench, tool, run, info, rate, n, target, name):
    """The figures of one tool (or share mode) in one accuracy case, from
    its Run (or the text of why it has none), with a verdict for trickle
    and the refusals of limit_conn; logs one line."""
    text = TOOL_TEXT[tool].format(rate=rate, rate_kb=target // 1024)
    entry = {"tool": text}
    if failed_run(bench, name, tool, run):
        entry.update(applicable=False, error=run,
                     note="not applicable, it failed here: %s" % run.splitlines()[-1])
        _mode_line(name, tool, entry["note"])
        return entry
    fig = tool_figures(run, target, tool)
    entry.update(fig)
    entry["server"] = info
    if tool.startswith("trickle"):
        evidence = trickle_evidence()
        ok, verdict_text = trickle_verdict(fig, info, evidence)
        entry.update(applicable=ok, note=verdict_text, evidence=evidence)
    elif tool == "limit_conn":
        entry["limit_conn"] = LIMIT_CONN
        entry["note"] = "%d of %d connections refused (503/reset)" % (
            fig["refused"], n)
    elif run.stat:
        entry["stat"] = run.stat
    if tool in MODES and getattr(run, "shaping", None):
        entry["shaping"] = run.shaping
    _mode_line(name, tool, "total %.3fx, per conn %.3f..%.3f, 1 s windows "
               "%.3f..%.3f, Jain %.4f, refused %d/%d, workers %s%s" % (
                   fig["total"], fig["conn_min"], fig["conn_max"],
                   fig["window_min"], fig["window_max"], fig["jain"],
                   fig["refused"], n, run.split,
                   "; " + entry["note"] if "note" in entry else ""))
    return entry


def comparator(bench, tool, rate, n, target, name, warm, window, workers=2):
    """One comparator in one accuracy case, alone. A tool that fails (nginx
    does not start under it, ...) is recorded as not applicable, never
    raised."""
    try:
        with bench.server(tool, rate, workers=workers) as srv:
            info = server_info(srv)
            run = drive(bench, srv, long_specs(n), window, warm=warm)
    except Exception:  # a comparator must never stop the benchmark
        run = traceback.format_exc()
        info = None
    entry = tool_entry(bench, tool, run, info, rate, n, target, name)
    if tool.startswith("trickle") and "evidence" not in entry:
        entry["evidence"] = trickle_evidence()
    return entry


def failed_run(bench, name, tool, run):
    """True (after a warning) if side_by_side() has no Run for tool."""
    if isinstance(run, str):
        bench.warn("%s %s: %s" % (name, tool, run.splitlines()[-1]))
        return True
    # limit_conn's refusals are what it does, not errors.
    for e in [e for e in run.errors if tool != "limit_conn" or "reset" not in e][:5]:
        bench.warn("%s %s: %s" % (name, tool, e))
    return False


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


# ---------------------------------------------------------------- manyclients

def machine_ticks():
    """The machine's CPU time by kind (/proc/stat's cpu line), or None."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None


def interrupt_share(start, end):
    """Of the machine's CPU time between two machine_ticks(), the part spent
    in hard and soft interrupts, or None. Without IRQ time accounting
    (Debian's kernels, this one) a thread's run time includes the interrupts
    that come while it runs: on loopback that is the kernel sending the
    shaper's packets and the client receiving them, spread over whatever
    runs."""
    if not start or not end:
        return None
    d = [b - a for a, b in zip(start, end)]
    total = sum(d)
    return (d[5] + d[6]) / total if total > 0 else None


def manyclients(bench):
    """1000 clients x 9 connections at 16 KiB/s each; watcher CPU."""
    nclients, per, rate = 1000, 9, "16k"
    target = harness.parse_rate(rate)
    # All 9000 connections start within a second or two, and under static
    # pacing they stay in step for many seconds (1 s windows swing 0.3-2x):
    # a long warm-up before the window.
    warm, window = (3.0, 4.0) if bench.quick else (10.0, 10.0)
    sources = ["127.0.%d.%d" % (1 + i // 250, 1 + i % 250) for i in range(nclients)]
    figs = {}
    for mode in MODES:
        specs = [{"source": s, "place": False, "group": s, "label": "%s#%d" % (s, j)}
                 for s in sources for j in range(per)]
        with bench.server(mode, rate, connections=nclients * per,
                          ZONE_SIZE="32m") as srv:
            workers = srv.worker_pids()

            traces = []

            def hook(when, workers=workers):
                # The trace runs within the run-time marks: if anything, it
                # misses some interrupt time, and the watchers' own CPU
                # comes out higher.
                irq = {}
                if when == "end" and traces:
                    irq = {"watcher_irq_s": traces[0].stop(),
                           "irq_trace_error": traces[0].error}
                marks = {"workers": {str(pid): {
                             "process": thread_cpu(pid),
                             "watchers": {str(t): thread_cpu(pid, t)
                                          for t in watcher_tids(pid)}}
                             for pid in workers},
                         "machine": machine_ticks(), **irq}
                if when == "start":
                    traces.append(InterruptTrace(
                        [t for w in marks["workers"].values() for t in w["watchers"]],
                        bench.workdir))
                return marks
            run = drive(bench, srv, specs, window, warm=warm, max_opening=256,
                        connect_timeout=60.0, hook=hook)
        for e in run.errors[:5]:
            bench.warn("manyclients %s: %s" % (mode, e))
        per_client = {}
        for c in run.conns:
            per_client[c.group] = per_client.get(c.group, 0.0) + c.rate(run.t0, run.t1)
        ratios = sorted(v / target for v in per_client.values())
        total = sum(per_client.values()) / (nclients * target)
        connected = sum(1 for c in run.conns if c.connected_at is not None)
        open_at_end = sum(run.split.values())
        watcher = process = 0.0
        missing = []
        irq_share = interrupt_share(run.marks["start"]["machine"],
                                    run.marks["end"]["machine"])
        for pid, start in run.marks["start"]["workers"].items():
            end_ = run.marks["end"]["workers"].get(pid, {})
            if start["process"] is not None and end_.get("process") is not None:
                process += end_["process"] - start["process"]
            for tid, t_start in start["watchers"].items():
                t_end = end_.get("watchers", {}).get(tid)
                if t_start is None or t_end is None:
                    missing.append("%s/%s" % (pid, tid))
                else:
                    watcher += t_end - t_start
        n_watchers = sum(len(v["watchers"])
                         for v in run.marks["start"]["workers"].values())
        irq_s = run.marks["end"].get("watcher_irq_s")
        if irq_s is None:
            bench.warn("manyclients %s: the watchers' interrupt time is not "
                       "known (%s): their own CPU is not shown"
                       % (mode, run.marks["end"].get("irq_trace_error")))
        seconds = run.t1 - run.t0
        per10k = 10000.0 / max(1, open_at_end or connected)
        sampled = outside_interrupts_sampled(watcher, traces[0] if traces else None)
        r = {"total": round(total, 4),
             "windows": _r([w / (nclients * target) for w in run.windows()]),
             "per_client": {"min": ratios[0], "p5": percentile(ratios, 5),
                            "median": median(ratios), "p95": percentile(ratios, 95),
                            "max": ratios[-1], "jain": jain(ratios)},
             "connected": connected, "open_at_end": open_at_end,
             "workers": run.split, "errors": run.errors[:20],
             "error_count": len(run.errors), "watcher_threads": n_watchers,
             "watcher_cpu_pct_per_10k": (100.0 * watcher / seconds * per10k
                                         if n_watchers else None),
             "interrupt_share": irq_share,
             "watcher_irq_s": irq_s,
             "watcher_own_cpu_pct_per_10k": (
                 100.0 * outside_interrupts(watcher, irq_s) / seconds * per10k
                 if n_watchers and irq_s is not None else None),
             "watcher_sampled_own_cpu_pct_per_10k": (
                 100.0 * sampled / seconds * per10k
                 if n_watchers and sampled is not None else None),
             "workers_cpu_pct": 100.0 * process / seconds, "cpu_marks": run.marks,
             "client_cpu_pct": run.client_cpu_pct,
             "per_client_ratios": _r(ratios)}
        figs[mode] = r
        pc = r["per_client"]
        _mode_line("manyclients", mode, "total %.3fx; per client %.2f/%.2f/%.2f/"
                   "%.2f/%.2f (min/p5/median/p95/max); %d connected, %d open at "
                   "end on %s; watcher CPU %s%% per 10k conns (outside "
                   "interrupts %s%% bracketed, %s%% sampled; the machine %s%% in "
                   "interrupts), workers %.0f%%, client %.0f%%" % (
                       total, pc["min"], pc["p5"], pc["median"], pc["p95"], pc["max"],
                       connected, open_at_end, run.split,
                       "n/a" if r["watcher_cpu_pct_per_10k"] is None
                       else "%.2f" % r["watcher_cpu_pct_per_10k"],
                       "n/a" if r["watcher_own_cpu_pct_per_10k"] is None
                       else "%.2f" % r["watcher_own_cpu_pct_per_10k"],
                       "n/a" if r["watcher_sampled_own_cpu_pct_per_10k"] is None
                       else "%.2f" % r["watcher_sampled_own_cpu_pct_per_10k"],
                       "n/a" if irq_share is None else "%.0f" % (100 * irq_share),
                       r["workers_cpu_pct"], run.client_cpu_pct))
    label = "%dx%d @16k" % (nclients, per)
    rows = [
        row("manyclients", "%s total / (clients x rate)" % label,
            {m: figs[m]["total"] for m in MODES}, lo=0.95, hi=1.05),
        row("manyclients", "per-client total, min", {m: figs[m]["per_client"]["min"]
                                                      for m in MODES}),
        row("manyclients", "per-client total, p5..p95 width",
            {m: figs[m]["per_client"]["p95"] - figs[m]["per_client"]["p5"]
             for m in MODES}),
        row("manyclients", "per-client total, max", {m: figs[m]["per_client"]["max"]
                                                      for m in MODES}),
        row("manyclients", "min 1 s window (all clients)",
            {m: min(figs[m]["windows"]) for m in MODES}),
        row("manyclients", "max 1 s window (all clients)",
            {m: max(figs[m]["windows"]) for m in MODES}),
        row("manyclients", "watcher run time, % of a core per 10k conns "
            "(interrupts in it included)",
            {m: figs[m]["watcher_cpu_pct_per_10k"] for m in MODES}, fmt="%.2f"),
        row("manyclients", "watcher CPU, same, outside the interrupts that irq "
            "tracepoints bracket",
            {m: figs[m]["watcher_own_cpu_pct_per_10k"] for m in MODES}, fmt="%.2f"),
        row("manyclients", "watcher CPU, same, outside interrupt context by stack "
            "samples",
            {m: figs[m]["watcher_sampled_own_cpu_pct_per_10k"] for m in MODES},
            hi=1.0, fmt="%.2f"),
        row("manyclients", "machine's time in interrupts, %",
            {m: None if figs[m]["interrupt_share"] is None
             else 100 * figs[m]["interrupt_share"] for m in MODES}, fmt="%.0f"),
        row("manyclients", "nginx workers CPU, % of a core",
            {m: figs[m]["workers_cpu_pct"] for m in MODES}, fmt="%.1f"),
        row("manyclients", "the same per 10k conns (the shaper's cost: compare "
            "TRAFFICRATE_SHAPE=0)",
            {m: figs[m]["workers_cpu_pct"] * 10000.0
             / max(1, figs[m]["open_at_end"] or figs[m]["connected"]) for m in MODES},
            fmt="%.1f"),
        row("manyclients", "bench client CPU, % of a core",
            {m: figs[m]["client_cpu_pct"] for m in MODES}, fmt="%.1f"),
    ]
    return rows, figs


# ---------------------------------------------------------------- convergence

_CONV_LINE = re.compile(r"^(join|leave|all)\s+n=(\d+)\s+median (\d+) us\s+"
                        r"p99 (\d+) us\s+max (\d+) us", re.M)


def run_convergence(bench, gap_ms, changes, siblings=4, others=0):
    """build/convergence_bench: {join|leave|all: {n, median_us, p99_us,
    max_us}}, its output and failures. others: connections of other keys
    held in 4 processes (the scale scenario)."""
    binary = harness.library_path().parent / "convergence_bench"
    argv = [str(binary), "--changes", str(changes), "--gap-ms", str(gap_ms),
            "--siblings", str(siblings), "--others", str(others)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise RuntimeError("%s: stopped after 120 s" % " ".join(argv))
    figs = {m.group(1): {"n": int(m.group(2)), "median_us": int(m.group(3)),
                         "p99_us": int(m.group(4)), "max_us": int(m.group(5))}
            for m in _CONV_LINE.finditer(proc.stdout)}
    failed = re.search(r"(\d+) failed", proc.stdout)
    if "all" not in figs:
        raise RuntimeError("%s printed no figures (rc %d):\n%s%s" % (
            " ".join(argv), proc.returncode, proc.stdout, proc.stderr))
    return {"changes": changes, "gap_ms": gap_ms, "siblings": siblings,
            "others": others,
            "failed": int(failed.group(1)) if failed else None,
            "output": proc.stdout, **figs}


def convergence(bench):
    """The library's own measurement of the time from a join (or leave) in
    one process until every sibling socket of the key in another process
    carries its new share (tests/bench/convergence_bench.cc): 1000 changes
    5 ms apart and back to back."""
    changes = 200 if bench.quick else 1000
    raw, rows = {}, []
    for gap in (5, 0):
        r = run_convergence(bench, gap, changes)
        name = "gap %d ms" % gap
        raw[name] = r
        log("  %s: %s" % (name, "; ".join(
            "%s median %d us, p99 %d us, max %d us" % (
                k, r[k]["median_us"], r[k]["p99_us"], r[k]["max_us"])
            for k in ("join", "leave") if k in r)))
        for k in ("join", "leave"):
            if k not in r:
                continue
            label = "%s, %d changes %s" % (
                k, r[k]["n"] * 2, "%d ms apart" % gap if gap else "back to back")
            # The library's modes share this path: one figure, both columns.
            rows += [row("convergence", "%s: median us" % label,
                         {m: r[k]["median_us"] for m in MODES}, hi=10000, fmt="%.0f"),
                     row("convergence", "%s: p99 us" % label,
                         {m: r[k]["p99_us"] for m in MODES}, hi=10000, fmt="%.0f"),
                     row("convergence", "%s: max us" % label,
                         {m: r[k]["max_us"] for m in MODES}, fmt="%.0f")]
    return rows, raw


SCENARIOS = {
    "convergence": convergence,
    "keepalive": keepalive,
    "accuracy": accuracy,
    "short": short,
    "manyclients": manyclients,
    "slowreader": slowreader,
    "spread24": spread24,
    "joinleave": joinleave,
    "bigmtu": bigmtu,
    "scale": scale,
}
