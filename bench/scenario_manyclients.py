"""The manyclients scenario of the shared-budget benchmark (issue 7; see
README.md): 1000 clients x 9 connections at 16 KiB/s each, and the
watchers' CPU, inside and outside interrupts.
"""

from bench_client import drive
from bench_cpu import (InterruptTrace, outside_interrupts, outside_interrupts_sampled,
                       thread_cpu, watcher_tids)
from bench_figures import jain, median, percentile
from bench_table import row
from benchlib import harness
from scenario_common import MODES, _mode_line, _r


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
