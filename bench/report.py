"""The benchmark's report: a Markdown page and PNG plots from one results
JSON of bench/budget.py (bench/results/<date>-<commit>[...].json).

  /usr/bin/python3 bench/report.py RESULTS.json [--out-dir DIR]

writes RESULTS.md beside the JSON (or into DIR) and, with Debian's
python3-matplotlib, the plots it shows (RESULTS-<plot>.png):

  * accuracy: the client's per-second totals against the rate, one line per
    tool or mode, a panel per case;
  * accuracy: per-connection rates as a box per tool or mode (as a ratio of
    the fair share rate / N), a panel per case;
  * joinleave: the per-100 ms totals of 2 -> 8 -> 2 connections, one line
    per tool or mode;
  * scale: against the number of connections (1k to 50k over 4 workers),
    the watchers' CPU, the join-to-every-sibling latency and the workers'
    resident memory with and without the library;

and the tables: the budget targets, the accuracy scenario against the
comparators, the adversarial scenarios' totals per tool.

bench/budget.py calls write_report() after every run. Every figure comes
from the JSON; a case or tool missing from it is left out of the plots,
and a run without matplotlib gets the tables and a line saying why the
plots are missing.
"""

import argparse
import json
import re
import sys
from pathlib import Path

import bench_table

RATE_UNITS = {"": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}


def case_target(name):
    """("2w 500k N=4" or "500k N=4") -> (512000, 4); (None, None) if the
    name is not a case."""
    m = re.match(r"(?:\d+w )?(\d+)([kmg]?) N=(\d+)$", name.strip())
    if not m:
        return None, None
    return int(m.group(1)) * RATE_UNITS[m.group(2)], int(m.group(3))


def series(figs):
    """{tool or mode: figures} of one case, those with per-second windows,
    in a stable order (the library's modes first)."""
    named = {k: v for k, v in figs.items()
             if isinstance(v, dict) and v.get("windows")}
    order = [m for m in ("equal", "budget") if m in named]
    return order + sorted(k for k in named if k not in order)


def scale_axis(ax, values):
    """A log y axis when the values span more than 20x (nginx limit_rate's
    N x the rate, trickle's thousands next to trafficrate's 1)."""
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > 20:
        ax.set_yscale("log")


def markdown_table(rows, columns):
    head = ["scenario", "metric"] + columns + ["target", "budget?"]
    lines = ["| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["scenario"], r["metric"]]
        cells += [bench_table.fmt_value(r, c) for c in columns]
        cells += [bench_table.target_text(r), bench_table.verdict(r) or "-"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def row_columns(rows):
    cols = []
    for r in rows:
        for c in r["values"]:
            if c not in cols:
                cols.append(c)
    return cols


def panel_grid(cases, plt, draw, title, path):
    """One panel per (name, figs) case, up to 6 a row (the accuracy
    scenario's N = 1 .. 64 of one worker count and rate): draw(ax, name, figs)
    fills one; each gets the rate's line, its title and a grid. Saves the
    figure at path and returns path."""
    ncol = min(6, len(cases))
    nrow = (len(cases) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.2 * nrow),
                             squeeze=False)
    for ax, (name, figs) in zip(axes.flat, cases):
        draw(ax, name, figs)
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_title(name)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(cases):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def title_of(label):
    """tso9-noshape -> 'tcp_tso_rtt_log 9, shaper off'."""
    tso, _, rest = label.partition("-")
    return "tcp_tso_rtt_log %s, shaper %s" % (
        tso[3:], "off" if rest == "noshape" else "on")


def plot_accuracy(raw, tso, stem, out_dir, plt):
    """Two PNGs per run (windows, per-connection boxes); their paths."""
    cases = [(name, figs) for name, figs in raw.items()
             if isinstance(figs, dict) and case_target(name)[0] is not None]
    if not cases:
        return []

    def windows(ax, name, figs):
        shown = []
        for tool in series(figs):
            w = figs[tool]["windows"]
            shown += w
            ax.plot(range(1, len(w) + 1), w, marker=".", label=tool)
        scale_axis(ax, shown)
        ax.set_xlabel("second of the window")
        ax.set_ylabel("client total / rate")
        if name == cases[0][0]:
            ax.legend(fontsize="small")

    def connections(ax, name, figs):
        target, n = case_target(name)
        tools = [t for t in series(figs) if figs[t].get("per_connection_Bps")]
        data = [[b / (target / n) for b in figs[t]["per_connection_Bps"]]
                for t in tools]
        if data:
            ax.boxplot(data, labels=tools)
            ax.tick_params(axis="x", labelrotation=30, labelsize="small")
            scale_axis(ax, [v for d in data for v in d])
        ax.set_ylabel("connection / (rate / N)")

    return [
        panel_grid(cases, plt, windows,
                   "accuracy (%s): per-second totals" % title_of(tso),
                   out_dir / ("%s-accuracy-windows-%s.png" % (stem, tso))),
        panel_grid(cases, plt, connections,
                   "accuracy (%s): per-connection rates" % title_of(tso),
                   out_dir / ("%s-accuracy-connections-%s.png" % (stem, tso))),
    ]


def plot_joinleave(figs, tso, stem, out_dir, plt):
    """The per-100 ms totals of every tool (per second in results of
    before the 100 ms series)."""
    tools = series(figs)
    if not tools:
        return []
    fig, ax = plt.subplots(figsize=(9, 4))
    shown = []
    for tool in tools:
        w = figs[tool].get("windows_100ms")
        step = 0.1
        if not w:
            w, step = figs[tool]["windows"], 1.0
        shown += w
        ax.plot([(i + 0.5) * step for i in range(len(w))], w, linewidth=1,
                label=tool)
    phases = next((figs[t]["phases_s"] for t in tools if figs[t].get("phases_s")),
                  None)
    if phases:
        for x in (phases[0], phases[0] + phases[1]):
            ax.axvline(x, color="black", linewidth=0.6, linestyle=":")
    # Linear, clipped: nginx limit_rate sends each second's allowance in a
    # burst (20-80x the rate for 100 ms, then nothing), which a log axis
    # would show without its zeros.
    clip = 4.0
    title = "2 -> 8 -> 2 connections (%s)" % title_of(tso)
    if shown and max(shown) > clip:
        ax.set_ylim(0, clip)
        title += ", clipped at %gx (max %.0fx)" % (clip, max(shown))
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("s since the first connection")
    ax.set_ylabel("client total / rate (per 100 ms)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path = out_dir / ("%s-joinleave-%s.png" % (stem, tso))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]


def plot_scale(figs, tso, stem, out_dir, plt):
    """Against the number of connections: the watchers' CPU (per population),
    the time a join takes to reach every sibling, the workers' resident
    memory with and without the library."""
    pops = [(name, label, figs.get(name) or []) for name, label in (
        ("conns", "10 clients"), ("keys", "1 connection per client"))]
    if not any(f for _, _, f in pops):
        return []
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    for _, label, f in pops:
        f = [x for x in f if "watcher_cpu_pct" in x]
        ax.plot([x["connections"] for x in f], [x["watcher_cpu_pct"] for x in f],
                marker="o", label=label)
    n = [x["connections"] for _, _, f in pops for x in f]
    if n:
        top = max(n)
        ax.plot([0, top], [0, top / 10000.0], color="grey", linestyle="--",
                linewidth=0.8, label="target: 1% per 10k")
    ax.set_title("watcher CPU (all 4 workers), steady")
    ax.set_ylabel("% of a core")
    ax = axes[1]
    join = figs.get("join") or []
    for q in ("median_us", "p99_us", "max_us"):
        ax.plot([j["connections"] for j in join if "join" in j],
                [j["join"][q] / 1000.0 for j in join if "join" in j],
                marker="o", label=q.split("_")[0])
    ax.axhline(10.0, color="grey", linestyle="--", linewidth=0.8, label="target 10 ms")
    ax.set_title("join until every sibling has its share")
    ax.set_ylabel("ms")
    ax = axes[2]
    for name, label in (("conns", "with the library"),
                        ("conns_without_library", "without (nginx limit_rate)")):
        f = figs.get(name) or []
        ax.plot([x["connections"] for x in f], [x["rss_total_kb"] / 1024.0 for x in f],
                marker="o", label=label)
    ax.set_title("nginx workers' resident memory")
    ax.set_ylabel("MiB")
    for ax in axes:
        ax.set_xlabel("connections (4 nginx workers)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle("scale (%s)" % title_of(tso))
    fig.tight_layout()
    path = out_dir / ("%s-scale-%s.png" % (stem, tso))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]


def _num(v, fmt="%.3f"):
    return "n/a" if v is None else fmt % v


TOOLS_HEAD = ("case", "tool", "total", "conn min", "conn max", "Jain", "min 1 s",
              "max 1 s", "refused")


def tools_rows(tools):
    """The accuracy scenario against the comparators, one row per case and
    tool (figures / rate, TOOLS_HEAD), and the notes (case, tool, note)."""
    cases = []
    for per_case in tools.values():
        cases += [c for c in per_case if c not in cases]
    rows, notes = [], []
    for case in cases:
        for tool, per_case in tools.items():
            f = per_case.get(case)
            if f is None:
                continue
            if "total" not in f:
                rows.append((case, tool) + ("n/a",) * 7)
            else:
                star = "*" if f.get("basis") == "lifetime" else ""
                rows.append((case, tool, _num(f["total"]) + star, _num(f["conn_min"]),
                             _num(f["conn_max"]), _num(f["jain"], "%.4f"),
                             _num(f["window_min"]), _num(f["window_max"]),
                             "%d/%d" % (f["refused"], f["connections"])))
            if f.get("note"):
                notes.append((case, tool, f["note"]))
    return rows, notes


def adversarial_rows(adversarial):
    """The tools of the adversarial scenarios and one row per scenario:
    (scenario, client total / rate per tool)."""
    tools = []
    for per_tool in adversarial.values():
        tools += [t for t in per_tool if t not in tools]
    rows = [(scenario, [_num((per_tool.get(t) or {}).get("total")) for t in tools])
            for scenario, per_tool in adversarial.items()]
    return tools, rows


def tools_markdown(tools):
    """tools_rows() as Markdown (trickle's notes below); [] if none ran."""
    rows, notes = tools_rows(tools)
    if not rows:
        return []
    lines = ["### Accuracy against the comparators", "",
             "Figures as a ratio of the rate; conn = one connection's rate over "
             "the window; * = whole downloads finished (nothing limited them), "
             "figures over each download's life.", "",
             "| " + " | ".join(TOOLS_HEAD) + " |", "|" + "---|" * len(TOOLS_HEAD)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    notes = ["* %s %s: %s" % n for n in notes if n[1].startswith("trickle")]
    return lines + [""] + notes + ([""] if notes else [])


def adversarial_markdown(adversarial):
    """adversarial_rows() as Markdown; [] if none ran."""
    tools, rows = adversarial_rows(adversarial)
    if not tools:
        return []
    head = ["scenario"] + tools
    lines = ["### Adversarial clients: client total / rate", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join([scenario] + cells) + " |" for scenario, cells in rows]
    return lines + [""]


def load_pyplot():
    """matplotlib.pyplot without a display, or (None, why)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt, None
    except ImportError as e:
        return None, "matplotlib is missing (%s): apt-get install python3-matplotlib" % e


def writepath_markdown(rows):
    """The write path microbenchmark (scripts/bench.sh, bench/write_path.py)."""
    if not rows:
        return []
    out = ["## Write path", "",
           "Google Benchmark, `build/write_path_bench`: ns per call on a governed "
           "loopback socket at a rate that never binds, medians of repetitions in "
           "random order. `library/fast` is the library's own part of a send when "
           "no share changes (target: adds <= 50 ns), `library/share_change_manual` "
           "when one does (a `setsockopt`); `*/governed` and `*/interposed` (the "
           "real interposer under `LD_PRELOAD`) against the raw call, whose spread "
           "on loopback (some 100 ns) is larger than the library's part.", "",
           "| case | ns/call | vs raw | +ns |", "|---|---|---|---|"]
    for r in rows:
        base = r.get("base_ns")
        ratio = "%.3f" % (r["ns"] / base) if base else "-"
        plus = "%+.1f" % (r["ns"] - base) if base else "-"
        note = " (error: %s)" % r["error"] if r.get("error") else ""
        out.append("| %s%s | %.1f | %s | %s |" % (r["case"], note, r["ns"], ratio, plus))
    return out + [""]


def write_report(results, json_path, out_dir=None):
    """Writes the Markdown report (and plots) of `results`; returns its path."""
    json_path = Path(json_path)
    out_dir = Path(out_dir) if out_dir else json_path.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = json_path.stem
    meta = results.get("meta", {})
    plt, why = load_pyplot()
    lines = ["# trafficrate benchmark, %s, commit %s" % (
        meta.get("date", "?"), meta.get("commit", "?")), ""]
    lines.append("Kernel %s, %s CPUs, load %s at the start; %s s%s; scenarios: %s. "
                 "Raw figures: `%s`." % (
                     meta.get("kernel", "?"), meta.get("cpus", "?"),
                     " ".join("%.2f" % x for x in meta.get("loadavg_start", [])),
                     meta.get("seconds", "?"),
                     ", quick" if meta.get("quick") else "",
                     ", ".join(meta.get("scenarios", [])), json_path.name))
    if meta.get("modified_files"):
        lines.append("")
        lines.append("Modified files in the tree measured: %s." %
                     ", ".join(meta["modified_files"]))
    lines.append("")
    lines += writepath_markdown(results.get("writepath"))
    for key, run in sorted(results.get("runs", {}).items()):
        # The run's label (tso9, tso0-noshape, ...): plots are named by it.
        tso = run.get("label") or "tso%s" % run.get("tcp_tso_rtt_log")
        rows = run.get("rows", [])
        lines += ["## %s" % title_of(tso), ""]
        if rows:
            lines += [markdown_table(rows, row_columns(rows)), ""]
        raw = run.get("raw", {})
        plots = []
        if plt is not None:
            if isinstance(raw.get("accuracy"), dict):
                plots += plot_accuracy(raw["accuracy"], tso, stem, out_dir, plt)
            if isinstance(raw.get("joinleave"), dict):
                plots += plot_joinleave(raw["joinleave"], tso, stem, out_dir, plt)
            if isinstance(raw.get("scale"), dict) and "join" in raw["scale"]:
                plots += plot_scale(raw["scale"], tso, stem, out_dir, plt)
        lines += tools_markdown(run.get("tools") or {})
        lines += adversarial_markdown(run.get("adversarial") or {})
        for p in plots:
            lines += ["![%s](%s)" % (p.stem, p.name), ""]
    if why:
        lines += ["No plots: %s." % why, ""]
    for title, items in (("Warnings", meta.get("warnings")),
                         ("Scenario errors", meta.get("errors"))):
        if items:
            lines += ["## " + title, ""] + ["* " + str(i) for i in items] + [""]
    path = out_dir / (stem + ".md")
    path.write_text("\n".join(lines))
    return path


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", help="a results JSON of bench/budget.py")
    p.add_argument("--out-dir", help="where to write (default: beside the JSON)")
    args = p.parse_args(argv)
    try:
        with open(args.results) as f:
            results = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit("report.py: %s: %s" % (args.results, e))
    print(write_report(results, args.results, args.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
