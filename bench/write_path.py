#!/usr/bin/python3
"""Summary of write_path_bench (scripts/bench.sh --only writepath).

    write_path.py [--json SUMMARY.json] PLAIN.json [PRELOADED.json]

Reads Google Benchmark JSON (run with --benchmark_repetitions and
--benchmark_report_aggregates_only) and prints, per case and write size, the
median ns per call, the ratio to the raw call of the same size measured the
same way, and the difference in ns: */governed and */interposed against
*/raw, send/*_manual against send/raw_manual, library/share_change_manual
against library/clock_manual (the cost of the timing itself). --json also
writes those rows as JSON (bench/budget.py --writepath puts them into the
results and the report).
"""
import json
import sys


def medians(path):
    with open(path) as f:
        data = json.load(f)
    out = {}
    for b in data["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        name = b["run_name"].replace("/manual_time", "")
        unit = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[b["time_unit"]]
        out[name] = (b["real_time"] * unit, b.get("applied"), b.get("error_message"))
    return out


def baseline(name):
    parts = name.split("/")
    if parts[0] == "library":
        return "library/clock_manual" if parts[1].endswith("_manual") else None
    kind = parts[1]
    if kind.endswith("_manual"):
        base = "raw_manual"
    elif kind in ("governed", "interposed"):
        base = "raw"
    else:
        return None
    return "/".join([parts[0], base] + parts[2:])


def summary(results):
    """Rows (case, ns, base_ns or None, applied, error), by case then size."""
    def order(name):  # by case, then by write size
        parts = name.split("/")
        size = int(parts[-1]) if parts[-1].isdigit() else -1
        return (parts[0], "/".join(parts[1:-1] if size >= 0 else parts[1:]), size)

    rows = []
    for name in sorted(results, key=order):
        ns, applied, error = results[name]
        base = baseline(name)
        base_ns = results[base][0] if base in results and base != name else None
        rows.append({"case": name, "ns": ns, "base_ns": base_ns,
                     "applied": applied if "share_change" in name else None,
                     "error": error})
    return rows


def main(argv):
    args = argv[1:]
    json_out = None
    if args[:1] == ["--json"]:
        if len(args) < 2:
            sys.exit("write_path.py: --json needs a path")
        json_out, args = args[1], args[2:]
    if not args:
        sys.exit("usage: write_path.py [--json SUMMARY.json] PLAIN.json [PRELOADED.json]")
    results = {}
    for path in args:
        results.update(medians(path))
    rows = summary(results)
    print(f"{'case':34} {'ns/call':>9} {'vs raw':>7} {'+ns':>7}")
    for r in rows:
        line = f"{r['case']:34} {r['ns']:9.1f}"
        if r["base_ns"]:
            line += f" {r['ns'] / r['base_ns']:7.3f} {r['ns'] - r['base_ns']:+7.1f}"
        if r["applied"] is not None:
            line += f"   applied={r['applied']:.3f}"
        if r["error"]:
            line += f"   ERROR: {r['error']}"
        print(line)
    if json_out:
        with open(json_out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
