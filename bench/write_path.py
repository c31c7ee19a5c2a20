#!/usr/bin/python3
"""Summary of write_path_bench (scripts/bench.sh --only writepath).

    write_path.py PLAIN.json [PRELOADED.json]

Reads Google Benchmark JSON (run with --benchmark_repetitions and
--benchmark_report_aggregates_only) and prints, per case and write size, the
median ns per call, the ratio to the raw call of the same size measured the
same way, and the difference in ns: */governed and */interposed against
*/raw, send/*_manual against send/raw_manual, library/share_change_manual
against library/clock_manual (the cost of the timing itself).
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


def main(argv):
    results = {}
    for path in argv[1:]:
        results.update(medians(path))
    print(f"{'case':34} {'ns/call':>9} {'vs raw':>7} {'+ns':>7}")
    def order(name):  # by case, then by write size
        parts = name.split("/")
        size = int(parts[-1]) if parts[-1].isdigit() else -1
        return (parts[0], "/".join(parts[1:-1] if size >= 0 else parts[1:]), size)

    for name in sorted(results, key=order):
        ns, applied, error = results[name]
        base = baseline(name)
        line = f"{name:34} {ns:9.1f}"
        if base in results and base != name:
            base_ns = results[base][0]
            line += f" {ns / base_ns:7.3f} {ns - base_ns:+7.1f}"
        if applied is not None and "share_change" in name:
            line += f"   applied={applied:.3f}"
        if error:
            line += f"   ERROR: {error}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
