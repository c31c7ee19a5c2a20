"""Rows of the shared-budget benchmark's final table (bench/budget.py,
bench/report.py): row() builds one line (values of every share mode, the
target interval); target_text(), verdict() (PASS/FAIL of the budget
column) and fmt_value() print it.

Standard library only (Debian's /usr/bin/python3).
"""


def row(scenario, metric, values, lo=None, hi=None, fmt="%.3f"):
    """One table line: values {mode: figure or None}; [lo, hi] is the target
    for the budget column (None: no bound on that side; both None: info)."""
    return {"scenario": scenario, "metric": metric, "values": dict(values),
            "lo": lo, "hi": hi, "fmt": fmt}


def target_text(r):
    lo, hi, fmt = r["lo"], r["hi"], r["fmt"]
    if lo is None and hi is None:
        return "-"
    if lo is None:
        return "<= " + fmt % hi
    if hi is None:
        return ">= " + fmt % lo
    return (fmt + "-" + fmt) % (lo, hi)


def verdict(r, mode="budget"):
    if r["lo"] is None and r["hi"] is None:
        return ""
    v = r["values"].get(mode)
    if v is None:
        return "ERROR"
    ok = (r["lo"] is None or v >= r["lo"]) and (r["hi"] is None or v <= r["hi"])
    return "PASS" if ok else "FAIL"


def fmt_value(r, mode):
    v = r["values"].get(mode)
    if v is None:
        return "n/a"
    if v == float("inf"):
        return "inf"
    return r["fmt"] % v
