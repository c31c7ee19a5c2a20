"""What the scenarios of the shared-budget benchmark share (issue 7; see
README.md): the client and rate most of them use, their downloads
(long_specs()), one nginx per tool with their clients at the same time
(side_by_side()), and the checks and log lines of their runs.

Each scenario is a function (bench) -> (rows, raw), in scenario_*.py;
scenarios.py maps names to them.
"""

import traceback
from contextlib import ExitStack

from bench_client import drive, drive_parallel
from benchlib import LIB_MODES, log

RATE = "500k"
TARGET = 512000
CLIENT = "127.0.0.2"
MODES = LIB_MODES


def _r(values, nd=4):
    return [round(v, nd) for v in values]


def _mode_line(name, mode, text):
    log("  %-12s %-6s %s" % (name, mode, text))


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


def failed_run(bench, name, tool, run):
    """True (after a warning) if side_by_side() has no Run for tool."""
    if isinstance(run, str):
        bench.warn("%s %s: %s" % (name, tool, run.splitlines()[-1]))
        return True
    # limit_conn's refusals are what it does, not errors.
    for e in [e for e in run.errors if tool != "limit_conn" or "reset" not in e][:5]:
        bench.warn("%s %s: %s" % (name, tool, e))
    return False
