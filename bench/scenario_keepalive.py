"""The keepalive scenario of the shared-budget benchmark (issue 7; see
README.md): the library's cost per request and per byte against nginx
without it, both measured in the same seconds (wrk_side_by_side()).
"""

import os
import re
import subprocess
from contextlib import ExitStack

from bench_cpu import process_cpu
from bench_figures import median
from bench_table import row
from benchlib import (BIG_FILE, IDLE_THREAD, IDLE_THREAD_LIB, NO_SHAPE, SERVER_HOST,
                      SMALL_FILE_4K, log)
from scenario_common import MODES


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
