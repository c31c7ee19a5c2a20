"""The live demo and the command line of harness.py (part of harness.py).

`python3 tests/integration/harness.py demo ...` (run by scripts/demo.sh
inside `unshare -n` with lo at MTU 1500) starts a real nginx under the
library, downloads from several client addresses at once and prints a live
per-second rate table, then the averages against the target.
`harness.py check` tells whether this is a usable test namespace.

Standard library only; harness.py calls main().
"""

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from cli_tools import run_cli
from clients import DownloadSet
from netns_env import (BIG_FILE, RUN_HINT, SERVER_HOST, cli_path, library_path,
                       make_webroot, make_workdir, namespace_problems,
                       parse_rate, preload_env, remove_zone)
from servers import NginxServer


def _demo(args):
    problems = namespace_problems()
    if problems:
        print("demo: " + "; ".join(problems) + "\n" + RUN_HINT, file=sys.stderr)
        return 2
    plan = []
    for item in args.clients.split(","):
        source, _, count = item.partition(":")
        plan += [source] * int(count or 1)
    sources = list(dict.fromkeys(plan))
    target = parse_rate(args.rate) if args.rate else None

    env = {}
    if not args.no_preload:
        lib = Path(args.library) if args.library else library_path()
        if not lib.is_file():
            print("demo: %s not found; build first" % lib, file=sys.stderr)
            return 1
        env = preload_env(args.zone, args.rate, library=lib)
    workdir = make_workdir("trafficrate-demo-")
    server = None
    dset = None
    try:
        webroot = make_webroot(workdir)
        server = NginxServer(workdir, webroot, env=env, workers=args.workers,
                             sendfile=args.sendfile == "on",
                             limit_rate=args.nginx_limit_rate)
        server.start()
        print("nginx master pid %d, workers %s, http://%s:%d%s, sendfile %s" % (
            server.pid, " ".join(map(str, server.worker_pids())), SERVER_HOST,
            server.port, BIG_FILE, args.sendfile))
        if env:
            print("environment: " + " ".join("%s=%s" % kv for kv in sorted(env.items())))
        for line in server.trafficrate_lines():
            print("nginx said: " + line)
        print("clients: " + ", ".join("%d connection(s) from %s" % (plan.count(s), s)
                                      for s in sources))
        if target:
            print("target: %d B/s (%.1f KiB/s) per client IP, shared by its "
                  "connections" % (target, target / 1024.0))
        print()

        # repeat: an unpaced download (--no-preload) may finish the file.
        dset = DownloadSet(server.port, plan, duration=args.duration,
                           repeat=True).start()
        if not dset.wait_started(10.0):
            print("demo: downloads did not start: %s" % dset.errors(), file=sys.stderr)
            return 1
        time.sleep(0.5)
        dset.record_owners()
        labels = [d.label for d in dset.downloads]
        width = max(9, max(len(l) for l in labels + sources)) + 1

        def row(first, cells, totals):
            return ("%7s |" % first + "".join("%*s" % (width, c) for c in cells)
                    + "  |" + "".join("%*s" % (width, c) for c in totals))

        print("rate of each connection over the last second, and of each "
              "client IP, in KiB/s:")
        print(row("worker", [dset.owners.get(l, "?") for l in labels],
                  ["" for _ in sources]))
        header = row("time", labels, sources)
        print(header)
        print("-" * len(header))
        base = dset.start_at
        tick = 1
        stat_text = None
        while time.monotonic() < dset.stop_at - 0.05:
            time.sleep(max(0.0, base + tick - time.monotonic()))
            now = time.monotonic()
            rates = [d.rate(now - 1.0, now) for d in dset.downloads]
            totals = [sum(r for d, r in zip(dset.downloads, rates) if d.source == s)
                      for s in sources]
            print(row("%.0fs" % (now - base), ["%.1f" % (r / 1024.0) for r in rates],
                      ["%.1f" % (t / 1024.0) for t in totals]), flush=True)
            if tick == int(args.duration / 2) and env and cli_path().exists():
                # While every download runs: what the zone itself says.
                cp = run_cli("stat", "--zone", args.zone, timeout=5.0)
                if cp.returncode == 0 and cp.stdout.strip():
                    stat_text = "`trafficrate stat --zone %s` at %ds:\n%s" % (
                        args.zone, tick, cp.stdout.rstrip())
            tick += 1
        dset.join(10.0)
        started = dset.all_started()
        t0, t1 = started + args.warmup, dset.stop_at - 0.1
        m = dset.measure(t0, t1, target)
        print()
        print("averages over %.1f s .. %.1f s:" % (t0 - base, t1 - base))
        for d, r in m.per_download:
            print("  %-14s %9.0f B/s %8.1f KiB/s%s" % (d.label, r, r / 1024.0,
                                                       "  " + d.error if d.error else ""))
        for s in sources:
            r = m.source_rate(s)
            print("  %-14s %9.0f B/s %8.1f KiB/s  total%s" % (
                s, r, r / 1024.0,
                "  (%.3f x target %d B/s, %+.1f%%)" % (r / target, target,
                                                       100.0 * (r / target - 1))
                if target else ""))
        if stat_text:
            print("\n" + stat_text)
        return 0
    except KeyboardInterrupt:
        print("\ndemo: interrupted, cleaning up", file=sys.stderr)
        return 130
    finally:
        if dset:
            dset.stop()
            dset.join(3.0)
        if server:
            server.stop()
        if env:
            remove_zone(args.zone)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description="trafficrate integration harness")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="nginx under the library, live rate table "
                          "(run inside `unshare -n` with lo at MTU 1500)")
    demo.add_argument("--rate", default="500k", help="TRAFFICRATE_RATE")
    demo.add_argument("--zone", default="demo-%d" % os.getpid())
    demo.add_argument("--clients", default="127.0.0.2:4,127.0.0.3:1",
                      help="source:connections,...")
    demo.add_argument("--duration", type=float, default=15.0)
    demo.add_argument("--warmup", type=float, default=2.0)
    demo.add_argument("--workers", type=int, default=2)
    demo.add_argument("--sendfile", choices=("on", "off"), default="on")
    demo.add_argument("--library", help="default: $TRAFFICRATE_BUILD_DIR/libtrafficrate.so")
    demo.add_argument("--no-preload", action="store_true",
                      help="run nginx without the library (harness check)")
    demo.add_argument("--nginx-limit-rate", help="nginx limit_rate (harness check)")
    sub.add_parser("check", help="is this a usable test namespace?")
    args = parser.parse_args(argv)
    if args.command == "check":
        problems = namespace_problems()
        print("ok" if not problems else "; ".join(problems))
        return 1 if problems else 0
    return _demo(args)
