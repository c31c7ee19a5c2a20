"""Measurements for the trafficrate integration tests (part of harness.py):

  * Measurement (rates over a window), bucket_rates() (per-second rates) and
    within() to compare a rate with its target;
  * sleep_until(), window_of() (the measuring window of a DownloadSet),
    ratio_text() and jain() (the fairness index), shared by the rate tests
    and the benchmarks;
  * pauses_in() says where this client process itself stood still
    (PauseWatch), so that a second whose bytes it read late is not judged as
    the server's; on_time(), paused_seconds() and require_on_time() apply
    it to bucket_rates() rows.

Every client (clients.py, budget_clients.py, ftp.py) starts the PauseWatch.
Standard library only; import it through harness (`import harness`).
"""

import threading
import time


class PauseWatch(threading.Thread):
    """Where this client process stood still: a thread that wakes every
    TICK_S and records each gap longer than PAUSE_S between two wakes.

    Every client of these tests is a Python thread of the test process;
    when that process does not run (a thread holding the GIL blocked in the kernel:
    measured under load, an mprotect growing a malloc arena waiting 1-3 s
    in vma_prepare, the whole process with it), bytes that arrived on
    time are read, and so counted, late: a second of 0 then one of 3x,
    for any server and with or without the library. A gap here is such a
    stall, whatever its cause. One per process: pause_watch()."""

    TICK_S = 0.01
    PAUSE_S = 0.1

    def __init__(self):
        super().__init__(daemon=True, name="pause-watch")
        self.pauses = []  # (monotonic start, end) of each gap > PAUSE_S

    def run(self):
        last = time.monotonic()
        while True:
            time.sleep(self.TICK_S)
            now = time.monotonic()
            if now - last > self.PAUSE_S:
                self.pauses.append((last, now))
            last = now


_pause_watch = None
_pause_watch_lock = threading.Lock()


def pause_watch():
    """The process's PauseWatch, started on first use (by every client)."""
    global _pause_watch
    with _pause_watch_lock:
        if _pause_watch is None:
            _pause_watch = PauseWatch()
            _pause_watch.start()
        return _pause_watch


def pauses_in(a, b):
    """The pauses of this client process (PauseWatch) that overlap [a, b],
    as (start, end) pairs: a rate over [a, b] is then not the server's."""
    return [(s, e) for s, e in list(pause_watch().pauses) if s < b and e > a]


class Measurement:
    """Per-download and per-source rates over one window [t0, t1]."""

    def __init__(self, downloads, t0, t1, target=None, owners=None):
        self.downloads, self.t0, self.t1 = list(downloads), t0, t1
        self.target = target
        self.owners = owners or {}
        self.per_download = [(d, d.rate(t0, t1)) for d in self.downloads]
        self.per_source = {}
        for d, r in self.per_download:
            self.per_source[d.source] = self.per_source.get(d.source, 0.0) + r

    def source_rate(self, source):
        return self.per_source[source]

    def download_rates(self, source):
        return [r for d, r in self.per_download if d.source == source]

    def report(self):
        lines = ["window %.2f s (%.2f..%.2f s after start)%s" % (
            self.t1 - self.t0, self.t0 - self.downloads[0].start_at,
            self.t1 - self.downloads[0].start_at,
            "" if self.target is None else ", target %d B/s per source" % self.target)]
        for d, r in self.per_download:
            owner = self.owners.get(d.label)
            lines.append("  %-16s %10.0f B/s%s%s%s" % (
                d.label, r,
                "" if owner is None else "  pid %s" % owner,
                "" if not d.error else "  ERROR %s" % d.error,
                "  (EOF)" if d.eof else ""))
        for source, r in self.per_source.items():
            ratio = "" if not self.target else "  = %.4f x target" % (r / self.target)
            lines.append("  %-16s %10.0f B/s total%s" % (source, r, ratio))
        paused = paused_seconds(self.t0, self.t1)
        if paused:
            lines.append("  the test client stood still %.2f s in this window "
                         "(PauseWatch): its rates are not the server's" % paused)
        return "\n".join(lines)


def bucket_rates(downloads, t0, t1, step=1.0):
    """Consecutive buckets [a, a + step) from t0 up to t1 (monotonic times):
    a list of (a, b, summed B/s, [B/s of each download])."""
    result = []
    n = int(round((t1 - t0) / step))
    for i in range(n):
        a, b = t0 + i * step, t0 + (i + 1) * step
        rates = [d.rate(a, b) for d in downloads]
        result.append((a, b, sum(rates), rates))
    return result


def bucket_text(rows, base, target):
    """A table of bucket_rates() rows, times relative to base, each total
    as a ratio of target; a row a pause of this client process overlaps
    says so (it is not the server's)."""
    lines = ["  second      client B/s   x target"]
    for a, b, total, _ in rows:
        paused = paused_seconds(a, b)
        lines.append("  [%4.1f,%4.1f) %11.0f %10.4f%s" % (
            a - base, b - base, total, total / target,
            "   not judged: the test client stood still %.2f s" % paused
            if paused else ""))
    return "\n".join(lines)


def on_time(rows):
    """The rows of bucket_rates() that no pause of this client process
    overlaps (pauses_in): those whose bytes were read as they came. A
    pause moves bytes from its seconds into the second it ends in, so both
    are left out; the mean of the rest is the rate over the seconds left."""
    return [r for r in rows if not pauses_in(r[0], r[1])]


def paused_seconds(t0, t1):
    """How long this client process stood still within [t0, t1]."""
    return sum(min(e, t1) - max(s, t0) for s, e in pauses_in(t0, t1))


# Of a span's 1 s windows, at least this part must be on time (on_time()).
MIN_ON_TIME = 0.5


def require_on_time(count, on_time_count, report, what="seconds"):
    """Fails (AssertionError) unless at least MIN_ON_TIME of `count` windows
    were read on time: fewer are too few to judge a rate by."""
    if on_time_count < MIN_ON_TIME * count:
        raise AssertionError(
            "the test client stood still in %d of %d %s (PauseWatch): too few "
            "left to judge\n%s" % (count - on_time_count, count, what, report))


def within(value, target, tolerance):
    """|value / target - 1| <= tolerance."""
    return abs(value / target - 1.0) <= tolerance


def sleep_until(t):
    time.sleep(max(0.0, t - time.monotonic()))


def window_of(dset, warmup_s=2.0, window_s=8.0):
    """Waits until dset's downloads started; returns the measuring window
    (t0, t1): from warmup_s after the start, window_s long."""
    started = dset.wait_started(10.0)
    assert started, dset.errors()
    return started + warmup_s, started + warmup_s + window_s


def ratio_text(rate, target):
    return "%.0f B/s = %.4f x target" % (rate, rate / target)


def jain(values):
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all equal, 1/n
    when one has all."""
    values = list(values)
    squares = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * squares) if squares else 0.0
