"""Figures of the shared-budget benchmark (bench/budget.py): total_rate(),
windows() (1 s buckets), jain(), spread(), median(), percentile(), over the
client's own byte counts (bench_client.Conn, or harness.Download).

Standard library only (Debian's /usr/bin/python3).
"""

import statistics

from benchlib import harness

# One home for each, tests/integration/measurement.py.
jain = harness.jain
sleep_until = harness.sleep_until


def total_rate(conns, t0, t1):
    return sum(c.rate(t0, t1) for c in conns)


def windows(conns, t0, t1, step=1.0):
    """Summed B/s of conns in consecutive windows [t0 + i, t0 + i + 1)."""
    return [total for _, _, total, _ in harness.bucket_rates(conns, t0, t1, step)]


def spread(values):
    """max / min - 1 (0 = all equal; inf if one is 0)."""
    values = list(values)
    lo = min(values)
    return max(values) / lo - 1.0 if lo > 0 else float("inf")


def median(values):
    return statistics.median(values) if values else None


def percentile(values, p):
    values = sorted(values)
    if not values:
        return None
    k = (len(values) - 1) * p / 100.0
    i = int(k)
    j = min(i + 1, len(values) - 1)
    return values[i] + (values[j] - values[i]) * (k - i)
