"""The accuracy scenario of the shared-budget benchmark (issue 7; see
README.md): one client, N downloads over every worker, for the library's
modes and the comparators (nginx limit_rate, limit_conn + limit_rate,
trickle), each case's tools side by side.
"""

import traceback

from bench_client import drive
from bench_figures import jain
from bench_figures import windows as windows_of
from bench_table import row
from benchlib import LIMIT_CONN, TOOL_TEXT, harness, log, trickle_evidence
from scenario_common import (MODES, _mode_line, _r, failed_run, long_specs,
                             parallel_tools, refused, server_info, side_by_side)


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
