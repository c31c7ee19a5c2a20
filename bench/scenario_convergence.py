"""The convergence scenario of the shared-budget benchmark (issue 7; see
README.md): build/convergence_bench's time from a join or leave until every
sibling socket of the key carries its new share (run_convergence(), which
the scale scenario runs too).
"""

import re
import subprocess

from bench_table import row
from benchlib import harness, log
from scenario_common import MODES


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
