#!/usr/bin/python3
"""Benchmark of the shared budget (issue 7): TRAFFICRATE_SHARE=equal against
TRAFFICRATE_SHARE=budget, side by side, in a private network namespace.

    bench/budget.py [--quick] [--only NAME[,NAME]] [--tso 9|0|both]
                    [--tools TOOL[,TOOL]|none] [--serial] [--build-dir DIR]
                    [--out FILE]

Scenarios: keepalive, accuracy, short, manyclients, slowreader, joinleave,
bigmtu (see bench/README.md for what each measures and how). Every scenario runs
once with net.ipv4.tcp_tso_rtt_log=9 (the default) and once with 0, set in
the benchmark's own network namespace. Run as root; when not already in a
private namespace with lo up at MTU 1500, the script re-executes itself in
one: unshare -n sh -c 'ip link set lo up mtu 1500 && exec python3 budget.py ...'.

The accuracy scenario also measures what operators use instead (issue 10,
--tools, default all): nginx limit_rate, limit_conn per IP + limit_rate,
trickle (sendfile on and off).

Prints progress, then one table per tso setting (the PASS/FAIL column judges
the budget column against the target) and, after it, the comparators table
of the accuracy scenario, and writes the raw figures to
bench/results/<date>-<commit>[-quick].json.
"""

import argparse
import datetime
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import benchlib
import report
from bench_table import fmt_value, target_text, verdict
from benchlib import LIB_MODES, REPO_ROOT, TOOL_TEXT, TOOLS, harness, log
from scenarios import SCENARIOS

RESULTS_DIR = benchlib.BENCH_DIR / "results"
TSO_SYSCTL = "net.ipv4.tcp_tso_rtt_log"
REEXEC_MARK = "TRAFFICRATE_BENCH_NETNS"
# Handled by scripts/bench.sh (build/write_path_bench, build/cluster_bench),
# accepted here.
EXTERNAL = ("writepath", "cluster")
# Run in the first tso setting only: overhead at a rate that never binds
# and the watcher's CPU, which the setting does not change (the whole run
# must stay under 20 minutes).
FIRST_SETTING_ONLY = ("convergence", "keepalive", "manyclients", "scale")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="fewer pairs and shorter windows (checks the script works)")
    p.add_argument("--only", default="",
                   help="comma list of scenarios: " + ",".join(SCENARIOS))
    p.add_argument("--tso", choices=("9", "0", "both"), default="both",
                   help="net.ipv4.tcp_tso_rtt_log setting(s) to run (default both)")
    p.add_argument("--shape", choices=("on", "off", "both"), default="on",
                   help="the packet shaper (TRAFFICRATE_SHAPE): on (the default), "
                   "off, or both, each setting its own tables (both: twice the time)")
    p.add_argument("--tools", default=",".join(TOOLS),
                   help="comparators measured in the accuracy scenario besides "
                   "equal and budget: comma list of %s, or none (default all)"
                   % ",".join(TOOLS))
    p.add_argument("--serial", action="store_true",
                   help="run the tools of a case one after the other, each alone, "
                   "instead of side by side (slower; checks side by side)")
    p.add_argument("--cases", default="",
                   help="accuracy cases to run, a comma list of WORKERS:RATE:N "
                   "(e.g. 2:500k:4,4:5m:16; default the scenario's own)")
    p.add_argument("--build-dir", help="build with libtrafficrate.so and trafficrate "
                   "(default $TRAFFICRATE_BUILD_DIR or build/)")
    p.add_argument("--out", help="results JSON path (default bench/results/...)")
    p.add_argument("--writepath", help="bench/write_path.py --json summary to put "
                   "into the results and report (scripts/bench.sh passes it)")
    args = p.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS and n not in EXTERNAL]
    if unknown:
        p.error("unknown scenario(s) %s; choose from %s" % (
            ",".join(unknown), ",".join(list(SCENARIOS) + list(EXTERNAL))))
    args.scenarios = [n for n in SCENARIOS if not names or n in names]
    args.tso_values = {"9": [9], "0": [0], "both": [9, 0]}[args.tso]
    args.shape_values = {"on": ["1"], "off": ["0"], "both": ["1", "0"]}[args.shape]
    tools = [t.strip() for t in args.tools.split(",") if t.strip() not in ("", "none")]
    bad = [t for t in tools if t not in TOOLS]
    if bad:
        p.error("unknown tool(s) %s; choose from %s or none" % (
            ",".join(bad), ",".join(TOOLS)))
    args.tool_list = [t for t in TOOLS if t in tools]
    args.case_list = []
    for text in (c.strip() for c in args.cases.split(",") if c.strip()):
        parts = text.split(":")
        try:
            workers, rate, n = int(parts[0]), parts[1], int(parts[2])
            harness.parse_rate(rate)
            if len(parts) != 3 or workers < 1 or n < 1:
                raise ValueError(text)
        except (ValueError, IndexError):
            p.error("--cases: %r is not WORKERS:RATE:N (e.g. 2:500k:4)" % text)
        args.case_list.append((workers, rate, n))
    return args


def ensure_namespace(argv):
    """Re-exec inside `unshare -n` unless already in a usable namespace."""
    problems = harness.namespace_problems()
    if not problems:
        return
    if os.environ.get(REEXEC_MARK) or os.geteuid() != 0:
        sys.exit("budget.py: %s.\nRun as root (scripts/bench.sh does it): "
                 "unshare -n sh -c 'ip link set lo up mtu 1500 && "
                 "/usr/bin/python3 bench/budget.py'" % "; ".join(problems))
    os.environ[REEXEC_MARK] = "1"
    os.execvp("unshare", ["unshare", "-n", "sh", "-c",
                          'ip link set lo up mtu 1500 && exec "$0" "$@"',
                          sys.executable, os.path.abspath(__file__)] + argv)


def git(*args):
    try:
        return subprocess.run(["git", "-C", str(REPO_ROOT)] + list(args),
                              capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def build_source(lib):
    """The source tree the library's build directory was configured from."""
    try:
        for line in (lib.parent / "CMakeCache.txt").read_text().splitlines():
            if line.startswith("CMAKE_HOME_DIRECTORY:"):
                return os.path.realpath(line.split("=", 1)[1])
    except OSError:
        pass
    return None


def results_path(args, commit):
    if args.out:
        return Path(args.out)
    stem = "%s-%s%s" % (datetime.date.today().isoformat(), commit or "nogit",
                        "-quick" if args.quick else "")
    path = RESULTS_DIR / (stem + ".json")
    n = 2
    while path.exists():
        path = RESULTS_DIR / ("%s-%d.json" % (stem, n))
        n += 1
    return path


def log_columns(lines):
    """Logs a table: lines[0] is the head, underlined; the first two columns
    flush left, the others right."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    for i, line in enumerate(lines):
        log("  ".join(cell.ljust(w) if j < 2 else cell.rjust(w)
                      for j, (cell, w) in enumerate(zip(line, widths))).rstrip())
        if i == 0:
            log("  ".join("-" * w for w in widths))


def print_table(tso, rows, shape="1"):
    head = ("scenario", "metric", "equal", "budget", "target", "budget?")
    lines = [head] + [(r["scenario"], r["metric"], fmt_value(r, "equal"),
                       fmt_value(r, "budget"), target_text(r), verdict(r))
                      for r in rows]
    log("\n== tcp_tso_rtt_log=%d, packet shaper %s: equal = rate/active per "
        "connection, budget = TRAFFICRATE_SHARE=budget"
        % (tso, "on" if shape == "1" else "off (TRAFFICRATE_SHAPE=0)"))
    log_columns(lines)
    judged = [verdict(r) for r in rows if verdict(r)]
    log("budget column: %d PASS, %d FAIL, %d ERROR" % (
        judged.count("PASS"), judged.count("FAIL"), judged.count("ERROR")))


def print_tools(tso, tools):
    """The accuracy scenario's comparators: one line per case and tool."""
    rows, notes = report.tools_rows(tools)
    if not rows:
        return
    log("\n== tcp_tso_rtt_log=%d, accuracy against the comparators (figures / "
        "rate; conn = one connection's rate over the window)" % tso)
    log_columns([report.TOOLS_HEAD] + rows)
    if any(f.get("basis") == "lifetime" for per_case in tools.values()
           for f in per_case.values()):
        log("  * whole downloads finished (nothing limited them): figures over "
            "each download's life, first connect to last EOF, not the window")
    for n in notes:
        log("  %s %s: %s" % n)


def print_adversarial(tso, adversarial, serial=False):
    tools, rows = report.adversarial_rows(adversarial)
    if tools:
        log("\n== tcp_tso_rtt_log=%d, adversarial clients: client total / rate "
            "per tool, %s" % (tso, "one after the other" if serial else "side by side"))
        log_columns([("scenario", "") + tuple(tools)] +
                    [(scenario, "total") + tuple(cells) for scenario, cells in rows])


def main(argv):
    args = parse_args(argv)
    if args.build_dir:
        os.environ["TRAFFICRATE_BUILD_DIR"] = os.path.abspath(args.build_dir)
    if not args.scenarios or (args.only and all(
            n in EXTERNAL for n in args.only.split(","))):
        log("budget.py: no scenario of its own selected")
        return 0
    ensure_namespace(argv)
    lib = harness.library_path()
    if not lib.is_file():
        sys.exit("budget.py: %s missing: build first (scripts/bench.sh does)" % lib)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    commit = git("rev-parse", "--short", "HEAD").strip()
    dirty = [line for line in git("status", "--porcelain", "--untracked-files=no")
             .splitlines() if line]
    source = build_source(lib)
    foreign = source is not None and source != os.path.realpath(REPO_ROOT)
    if foreign:
        # The commit and modified files below are this tree's, not the build's.
        commit = "ext-" + (commit or "nogit")
    out_path = results_path(args, commit)
    started = time.monotonic()
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"),
            "commit": commit, "modified_files": dirty, "quick": args.quick,
            "library": str(lib), "library_source": source,
            "library_mtime": datetime.datetime.fromtimestamp(
                lib.stat().st_mtime).isoformat(timespec="seconds"),
            "kernel": platform.release(), "cpus": os.cpu_count(),
            "loadavg_start": os.getloadavg(), "nofile": hard,
            "modes": list(LIB_MODES), "scenarios": args.scenarios,
            "tools": args.tool_list, "serial": args.serial,
            "shape": args.shape,
            "tool_text": {t: TOOL_TEXT[t] for t in list(LIB_MODES) + args.tool_list}}
    log("trafficrate shared-budget benchmark: %s%s, library %s, commit %s%s" % (
        ",".join(args.scenarios), " (quick)" if args.quick else "", lib, commit,
        " + %d modified files" % len(dirty) if dirty else ""))
    if foreign:
        log("NOTE: the library was built from %s, not from this tree" % source)
    results = {"meta": meta, "runs": {}}
    failed = []
    if args.writepath:
        try:
            with open(args.writepath) as f:
                results["writepath"] = json.load(f)
        except (OSError, ValueError) as e:
            failed.append("writepath: %s" % e)
    bench = benchlib.Bench(quick=args.quick)
    bench.tools = args.tool_list
    bench.serial = args.serial
    bench.cases = args.case_list
    old_tso = harness.sysctl(TSO_SYSCTL)
    tables = []
    try:
        settings = [(shape, tso) for shape in args.shape_values
                    for tso in args.tso_values]
        for k, (shape, tso) in enumerate(settings):
            bench.shape = shape
            label = "tso%d%s" % (tso, "" if shape == "1" else "-noshape")
            assert not harness.namespace_problems()  # never the host's sysctl
            harness.sysctl(TSO_SYSCTL, tso)
            rows, raw = [], {}
            bench.tool_results = {}
            bench.adversarial = {}
            # The comparators in the first setting only (the kernel's default
            # unless --tso says otherwise): they do not depend on it.
            bench.tools = args.tool_list if k == 0 else []
            for name in args.scenarios:
                if tso != args.tso_values[0] and name in FIRST_SETTING_ONLY:
                    continue
                t = time.monotonic()
                log("\n-- [%s] %s" % (label, name))
                try:
                    r, data = SCENARIOS[name](bench)
                    rows += r
                    raw[name] = data
                except Exception as e:  # one broken scenario must not hide the rest
                    failed.append("%s (%s): %s" % (name, label, e))
                    raw[name] = {"error": traceback.format_exc()}
                    log("  ERROR %s: %s" % (name, traceback.format_exc()))
                log("  (%s took %.0f s)" % (name, time.monotonic() - t))
            # tools: tool -> accuracy case -> figures (equal and budget too),
            # ratios of the rate; windows = per-second totals, per_connection_Bps
            # = each connection's rate over the window.
            results["runs"][label] = {"tcp_tso_rtt_log": tso, "shape": shape,
                                      "label": label, "rows": rows, "raw": raw,
                                      "tools": bench.tool_results,
                                      "adversarial": bench.adversarial}
            tables.append((tso, shape, rows, bench.tool_results, bench.adversarial))
    finally:
        harness.sysctl(TSO_SYSCTL, old_tso)
        bench.close()
        meta["warnings"] = bench.warnings
        meta["errors"] = failed
        meta["seconds"] = round(time.monotonic() - started, 1)
        meta["loadavg_end"] = os.getloadavg()
        out_path.parent.mkdir(parents=True, exist_ok=True)
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1, default=str)
    for tso, shape, rows, tools, adversarial in tables:
        print_table(tso, rows, shape)
        print_tools(tso, tools)
        print_adversarial(tso, adversarial, args.serial)
    for w in bench.warnings:
        log("warning: " + w)
    for e in failed:
        log("scenario error: " + e)
    log("\nresults: %s (%.0f s)" % (out_path, meta["seconds"]))
    try:
        log("report: %s" % report.write_report(results, out_path))
    except Exception:  # the figures are saved; a plot must not lose them
        log("report.py failed (the JSON is kept): %s" % traceback.format_exc())
    return 1 if failed else 0


def _interrupt_on_sigterm(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    # Ctrl-C or SIGTERM: stop the servers (by pid), write what was measured.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    sys.exit(main(sys.argv[1:]))
