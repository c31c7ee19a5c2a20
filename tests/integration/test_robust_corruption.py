"""Issue 8: whatever is in the shared zone, the library never crashes or
hangs the host server. Real nginx under the library, corruption:

  * random bytes written over the live zone, and every field of
    ZoneHeaderShm set to 0, 1 and its largest value, while nginx serves
    downloads and short requests: every request answered in time, downloads
    keep receiving, no worker dies.

(The soak is in test_robust_soak.py, exhaustion in
test_robust_exhaustion.py, their shared helpers in robust_common.py.)

Each test prints a short report (figures) with -s; every loop is bounded in
time and count.
"""

import os
import random
import re
import subprocess
import threading
import time

import pytest

import harness
from robust_common import MIN_ZONE_SIZE, SMALL_BODY, library_lines


def worker_signals(server):
    """nginx's error log lines about workers that exited on a signal."""
    return [line for line in server.output().splitlines()
            if "exited on signal" in line]


CORRUPT_RATE = "1m"  # per client: downloads flow steadily at 1 MiB/s each
CORRUPT_DOWNLOADERS = ["127.0.3.1", "127.0.3.2", "127.0.3.3"]
CORRUPT_REQUESTERS = ["127.0.3.%d" % i for i in range(10, 30)]
REQUEST_LIMIT_S = 2.0  # each short request answered within this
STALL_LIMIT_S = 2.0  # no download goes longer without a byte


class ShortRequests(threading.Thread):
    """Back-to-back small GETs (Connection: close) from rotating source
    addresses until stopped (at most max_requests); records (start time,
    latency, error or None) of each. A request not answered within its
    timeout counts as failed."""

    def __init__(self, port, sources, timeout=REQUEST_LIMIT_S + 0.5,
                 max_requests=2_000_000):
        super().__init__(daemon=True)
        self.port, self.sources, self.timeout = port, sources, timeout
        self.max_requests = max_requests
        self.records = []
        self._stop_event = threading.Event()

    def stop(self):
        self._stop_event.set()

    def run(self):
        n = 0
        while not self._stop_event.is_set() and n < self.max_requests:
            source = self.sources[n % len(self.sources)]
            n += 1
            t = time.monotonic()
            try:
                status, _, body = harness.http_get(self.port, source=source,
                                                   timeout=self.timeout)
                error = None if (status, body) == (200, SMALL_BODY) else \
                    "status %d, %d body bytes" % (status, len(body))
            except Exception as e:  # reported to the test
                error = "%s: %s" % (type(e).__name__, e)
            self.records.append((t, time.monotonic() - t, error))

    def bad(self, t0=0.0, t1=1e18):
        """Records started in [t0, t1) that failed or took too long."""
        return [r for r in self.records if t0 <= r[0] < t1 and
                (r[2] is not None or r[1] > REQUEST_LIMIT_S)]

    def max_latency(self):
        return max((r[1] for r in self.records), default=0.0)


def max_stall(download, t0, t1):
    """Longest time in [t0, t1] without a byte received by download:
    (seconds, start of that gap). A download that got its whole file (once
    the zone is found corrupt, everything runs unpaced) ends its window."""
    if download.eof and download.finished_at is not None:
        t1 = min(t1, download.finished_at)
    n = min(len(download.times), len(download.totals))
    marks = [t0] + [download.times[i] for i in range(n)
                    if t0 < download.times[i] < t1 and
                    (i == 0 or download.totals[i] > download.totals[i - 1])]
    marks.append(t1)
    gaps = [(b - a, a) for a, b in zip(marks, marks[1:])]
    return max(gaps)


class Traffic:
    """Downloads from CORRUPT_DOWNLOADERS and two ShortRequests threads
    against one server, started together; stop() bounds everything."""

    def __init__(self, server, duration):
        self.server = server
        self.dset = harness.DownloadSet(server.port, CORRUPT_DOWNLOADERS,
                                        duration=duration)
        self.requests = [ShortRequests(server.port, CORRUPT_REQUESTERS[i::2])
                         for i in range(2)]

    def start(self):
        self.dset.start()
        for r in self.requests:
            r.start()
        started = self.dset.wait_started(10.0)
        assert started, self.dset.errors()
        # Every download past its first bytes, so the stall clock is fair.
        assert harness.wait_for(
            lambda: all(d.total > 0 for d in self.dset.downloads), 5.0), \
            self.dset.errors()
        return time.monotonic()

    def pacing(self):
        """label -> the server side's pacing rate / cap and last send of
        each download's connection, from `ss -tni` (for reports)."""
        out = subprocess.run(
            ["ss", "-Htni", "state", "established",
             "( sport = :%d )" % self.server.port],
            capture_output=True, text=True, timeout=10).stdout
        peers = {}
        lines = out.splitlines()
        for head, info in zip(lines[::2], lines[1::2]):
            m = re.search(r":(\d+)\s*$", head)
            if m:
                peers[int(m.group(1))] = " ".join(re.findall(
                    r"(?:pacing_rate|lastsnd|notsent)[: ]\S+", info))
        return {d.label: peers.get(d.local_port, "-")
                for d in self.dset.downloads}

    def stop(self):
        self.dset.stop()
        for r in self.requests:
            r.stop()
        self.dset.join(5.0)
        for r in self.requests:
            r.join(REQUEST_LIMIT_S + 2.0)

    def bad_requests(self, t0=0.0, t1=1e18):
        return sorted(b for r in self.requests for b in r.bad(t0, t1))

    def stalls(self, t0, t1, limit=STALL_LIMIT_S):
        result = []
        for d in self.dset.downloads:
            gap, at = max_stall(d, t0, t1)
            if gap > limit:
                result.append((d.label, gap, at))
        return result

    def summary(self, t0, t1):
        n = sum(len(r.records) for r in self.requests)
        worst = max(r.max_latency() for r in self.requests)
        gaps = [max_stall(d, t0, t1)[0] for d in self.dset.downloads]
        rates = [d.rate(t0, t1) for d in self.dset.downloads]
        return ("%d short requests, max latency %.3f s, %d failed or slower "
                "than %.1f s; downloads' longest gaps %s s, rates %s B/s%s"
                % (n, worst, len(self.bad_requests()), REQUEST_LIMIT_S,
                   " ".join("%.2f" % g for g in gaps),
                   " ".join("%.0f" % r for r in rates),
                   "; download errors %s" % self.dset.errors()
                   if self.dset.errors() else ""))


class Workers:
    """nginx's master and its children, to tell that none died."""

    def __init__(self, server):
        self.server = server
        self.master = server.pid
        self.first = self.now()

    def now(self):
        return sorted(harness.children(self.master))

    def check(self):
        """'' if the master lives with the same children, else what changed."""
        if not harness.pid_alive(self.master):
            return "master %d died" % self.master
        now = self.now()
        if now != self.first:
            return "workers %s -> %s" % (self.first, now)
        return ""


def wchans(pids):
    """pid -> the kernel function each of its threads waits in (e.g.
    futex_wait_queue: blocked on a lock; ep_poll: idle), for reports."""
    result = {}
    for pid in pids:
        names = []
        try:
            for tid in sorted(os.listdir("/proc/%d/task" % pid), key=int):
                with open("/proc/%d/task/%s/wchan" % (pid, tid)) as f:
                    names.append(f.read().strip() or "running")
        except OSError:
            names.append("gone")
        result[pid] = names
    return result


def zone_writer(zone):
    """pwrite(data, offset) into the live zone file."""
    fd = os.open(harness.zone_path(zone), os.O_RDWR)

    def write(offset, data):
        assert os.pwrite(fd, data, offset) == len(data)
    write.close = lambda: os.close(fd)
    write.read = lambda offset, n: os.pread(fd, n, offset)
    return write


# ZoneHeaderShm (src/shm/zone_layout.h): (field, offset, size), pinned by
# tests/shm/zone_layout_test.cc, which test_header_table_matches_the_pinned_layout
# cross-checks. The lock is glibc's x86-64 pthread_mutex_t (40 bytes).
HEADER_FIELDS = [
    ("magic", 0, 8), ("layout_version", 8, 4), ("header_size", 12, 4),
    ("zone_size", 16, 8), ("key_slot_size", 24, 4), ("conn_slot_size", 28, 4),
    ("proc_slot_size", 32, 4), ("bucket_count", 36, 4),
    ("key_capacity", 40, 4), ("conn_capacity", 44, 4),
    ("proc_capacity", 48, 4), ("key_spec", 52, 4), ("buckets_offset", 56, 8),
    ("keys_offset", 64, 8), ("conns_offset", 72, 8), ("procs_offset", 80, 8),
    ("handoffs_offset", 88, 8), ("handoff_capacity", 96, 4),
    ("reserved_geometry", 100, 4),
    ("hash_seed", 104, 16), ("ready", 120, 4), ("change_word", 124, 4),
    ("rate_bytes_per_sec", 128, 8), ("settings_generation", 136, 4),
    ("watchers_waiting", 140, 4), ("lock", 144, 40), ("key_free_head", 184, 4),
    ("conn_free_head", 188, 4), ("keys_used", 192, 4), ("conns_used", 196, 4),
    ("table_full", 200, 8), ("lock_repairs", 208, 8), ("procs_reaped", 216, 8),
    ("conns_reaped", 224, 8), ("share_mode", 232, 4),
    ("procs_high_water", 236, 4), ("burst_bytes", 240, 8),
    ("header_checksum", 248, 8), ("lock_timeouts", 256, 8),
    ("corrupt", 264, 4), ("rules_generation", 268, 4),
    ("handoffs_pending", 272, 4), ("reserved1", 276, 60),
    ("rules", 336, 1024), ("cluster", 1360, 352),
]
HEADER_SIZE = 1712
FIELD = {name: (offset, size) for name, offset, size in HEADER_FIELDS}
LOCK_OFFSET, LOCK_SIZE = FIELD["lock"]
# Fields the library keeps changing (counters, free-list heads, the futex
# word): a case leaves them to the library. The others are put back after
# their case, so that each case meets an otherwise sound zone.
LIBRARY_OWNED = {"change_word", "settings_generation", "watchers_waiting",
                 "key_free_head", "conn_free_head", "keys_used", "conns_used",
                 "table_full", "lock_repairs", "procs_reaped", "conns_reaped",
                 "procs_high_water", "lock_timeouts", "corrupt",
                 "handoffs_pending"}
# The live rate: 0 or 1 there is a rate of 1 B/s for every connection by
# design, so downloads are not expected to flow in its case (it runs last:
# a pace already scheduled cannot be pulled back).
RATE_FIELDS = {"rate_bytes_per_sec"}
EXTREMES = ("0", "1", "max")


def extreme_bytes(size, which):
    """The field as a little-endian unsigned integer of `size` bytes."""
    value = {"0": 0, "1": 1, "max": (1 << (8 * size)) - 1}[which]
    return value.to_bytes(size, "little")


def test_header_table_matches_the_pinned_layout():
    text = (harness.REPO_ROOT / "tests" / "shm" / "zone_layout_test.cc").read_text()
    pinned = {m.group(1): int(m.group(2)) for m in re.finditer(
        r"offsetof\(ZoneHeaderShm, (\w+)\), (\d+)u\)", text)}
    size = int(re.search(r"sizeof\(ZoneHeaderShm\), (\d+)u\)", text).group(1))
    assert pinned == {name: offset for name, offset, _ in HEADER_FIELDS}
    assert size == HEADER_SIZE
    ends = [offset + n for _, offset, n in HEADER_FIELDS]
    assert [offset for _, offset, _ in HEADER_FIELDS[1:]] == ends[:-1]
    assert ends[-1] == HEADER_SIZE



def header_value(write, name):
    offset, size = FIELD[name]
    return int.from_bytes(write.read(offset, size), "little")


def corruption_regions(write, zone_size):
    """Where random writes go, each region equally likely: the header, the
    bucket heads, the first key, connection and process slots (slots are
    handed out from index 0, so the live ones are there), and anywhere.
    (name, start, end) from the zone's own header, read before any write."""
    buckets = header_value(write, "buckets_offset")
    keys = header_value(write, "keys_offset")
    conns = header_value(write, "conns_offset")
    procs = header_value(write, "procs_offset")
    return [("header", 0, HEADER_SIZE), ("buckets", buckets, keys),
            ("keys", keys, keys + 16 * 160), ("conns", conns, conns + 32 * 80),
            ("procs", procs, procs + 4 * 64), ("anywhere", 0, zone_size)]


def overlaps(offset, length, start, size):
    return offset < start + size and start < offset + length


@pytest.mark.parametrize("share", ["equal", "budget"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_bytes_in_the_live_zone_never_stop_service(servers, lib_env,
                                                          zone, seed, share):
    """50 writes of 1-64 random bytes, 20-60 ms apart, at offsets drawn from
    corruption_regions() (so that the header and the live slots are hit,
    not only the empty rest of the zone); then 2.5 s to let a hang or a
    stall show."""
    server = servers.nginx(env=lib_env(CORRUPT_RATE, ZONE_SIZE=MIN_ZONE_SIZE,
                                       SHARE=share), workers=2)
    workers = Workers(server)
    assert len(workers.first) == 2, server.describe()
    write = zone_writer(zone)
    zone_size = harness.zone_path(zone).stat().st_size
    regions = corruption_regions(write, zone_size)
    rng = random.Random(seed)
    traffic = Traffic(server, duration=20.0)
    writes = []
    try:
        t_start = traffic.start()
        time.sleep(0.5)
        for _ in range(50):
            name, start, end = rng.choice(regions)
            offset = rng.randrange(start, end)
            length = min(rng.randint(1, 64), zone_size - offset)
            data = bytes(rng.getrandbits(8) for _ in range(length))
            writes.append((time.monotonic(), name, offset, length))
            write(offset, data)
            time.sleep(rng.uniform(0.02, 0.06))
        time.sleep(STALL_LIMIT_S + 0.5)
        t_end = time.monotonic()
        changed = workers.check()
        pacing = traffic.pacing()
        waits = wchans(workers.first)
    finally:
        traffic.stop()
        write.close()
    lock_hits = [w for w in writes if overlaps(w[2], w[3], LOCK_OFFSET, LOCK_SIZE)]
    header_hits = [w for w in writes if w[2] < HEADER_SIZE]
    bad = traffic.bad_requests()
    stalls = traffic.stalls(t_start, t_end)
    stat = harness.run_cli("stat", "--zone", zone, "--json", timeout=10.0)
    report = "\n".join([
        "seed %d, share %s: 50 writes of 1-64 random bytes in %.2f s into a "
        "%d-byte zone; by region %s" % (
            seed, share, writes[-1][0] - writes[0][0], zone_size,
            {r[0]: sum(1 for w in writes if w[1] == r[0]) for r in regions}),
        "header writes (offset+length): %s" % " ".join(
            "%d+%d" % (w[2], w[3]) for w in header_hits),
        "over the lock (bytes %d-%d): %s" % (
            LOCK_OFFSET, LOCK_OFFSET + LOCK_SIZE - 1,
            " ".join("%d+%d at %+.2f s" % (w[2], w[3], w[0] - t_start)
                     for w in lock_hits) or "none"),
        traffic.summary(t_start, t_end),
        "first bad requests: %s" % [
            ("%+.2f s" % (b[0] - t_start), round(b[1], 3), b[2])
            for b in bad[:5]],
        "stalls over %.1f s: %s" % (STALL_LIMIT_S, [
            (label, round(gap, 2), "%+.2f s" % (at - t_start))
            for label, gap, at in stalls]),
        "writes in the second before each stall: %s" % [
            ["%s %d+%d at %+.2f s" % (w[1], w[2], w[3], w[0] - t_start)
             for w in writes if at - 1.0 <= w[0] <= at] for _, _, at in stalls],
        "pacing at the end (ss): %s" % pacing,
        "workers: %s; %s" % (changed or "unchanged %s" % workers.first,
                             worker_signals(server) or "no worker exited on a signal"),
        "workers' threads wait in: %s" % waits,
        "trafficrate stat afterwards: rc %d %s" % (
            stat.returncode, stat.stderr.strip()[:200]),
        library_lines(server)])
    print("\n" + report)
    assert not changed and not worker_signals(server), report
    assert not bad, report
    assert not stalls and not traffic.dset.errors(), report


def test_each_header_field_at_an_extreme_never_stops_service(servers,
                                                            lib_env, zone):
    """Every ZoneHeaderShm field but the lock, in turn, at 0, 1 and all
    ones, each held 0.35 s, on one nginx serving all along; the live rate
    last (0 and 1 mean 1 B/s, so downloads are checked up to it)."""
    server = servers.nginx(env=lib_env(CORRUPT_RATE, ZONE_SIZE=MIN_ZONE_SIZE),
                           workers=2)
    workers = Workers(server)
    assert len(workers.first) == 2, server.describe()
    write = zone_writer(zone)
    fields = [f for f in HEADER_FIELDS if f[0] != "lock" and f[0] not in RATE_FIELDS]
    fields += [f for f in HEADER_FIELDS if f[0] in RATE_FIELDS]
    hold_s = 0.35
    cases = []  # (field, extreme, t0, t1, worker change)
    traffic = Traffic(server, duration=len(fields) * 3 * hold_s + 15.0)
    try:
        t_start = traffic.start()
        t_quiet = None
        for name, offset, size in fields:
            if name in RATE_FIELDS and t_quiet is None:
                time.sleep(STALL_LIMIT_S + 0.5)  # a late stall shows
                t_quiet = time.monotonic()
            original = write.read(offset, size)
            for which in EXTREMES:
                t0 = time.monotonic()
                write(offset, extreme_bytes(size, which))
                time.sleep(hold_s)
                change = workers.check()
                if change:
                    workers.first = workers.now()
                cases.append((name, which, t0, time.monotonic(), change))
            if name not in LIBRARY_OWNED:
                write(offset, original)
        time.sleep(STALL_LIMIT_S + 0.5)
        t_end = time.monotonic()
    finally:
        traffic.stop()
        write.close()
    t_quiet = t_quiet or t_end

    def case_at(t):
        for case in cases:
            if case[2] <= t < case[3]:
                return "%s=%s" % case[:2]
        return "after the last case"
    bad = traffic.bad_requests()
    stalls = traffic.stalls(t_start, t_quiet)
    deaths = [c for c in cases if c[4]]
    report = "\n".join([
        "%d fields x %s, each held %.2f s, in %.1f s (the lock is "
        "test_lock_extreme_in_the_live_zone's)" % (
            len(fields), "/".join(EXTREMES), hold_s, t_end - t_start),
        traffic.summary(t_start, t_quiet),
        "bad requests by case: %s" % [
            (case_at(b[0]), round(b[1], 3), b[2]) for b in bad[:10]],
        "download stalls (before the rate's case) by case: %s" % [
            (label, round(gap, 2), case_at(at)) for label, gap, at in stalls],
        "worker changes by case: %s" % [("%s=%s" % c[:2], c[4]) for c in deaths],
        "%s" % (worker_signals(server) or "no worker exited on a signal"),
        library_lines(server)])
    print("\n" + report)
    assert not deaths and not worker_signals(server), report
    assert not bad, report
    assert not stalls and not traffic.dset.errors(), report


# A lock word of 1 is a lock held by pid 1, which never lets go; an all-zero
# pthread_mutex_t is a plain process-private mutex, whose wake-ups do not
# reach the other processes; all ones is a mutex of no valid kind. Before the
# zone lock was taken with a bound (issue 8) the first two hung nginx workers
# for good in pthread_mutex_lock (futex_do_wait).
@pytest.mark.parametrize("which", ["0", "1", "max"])
def test_lock_extreme_in_the_live_zone_never_stops_service(servers, lib_env,
                                                          zone, which):
    server = servers.nginx(env=lib_env(CORRUPT_RATE, ZONE_SIZE=MIN_ZONE_SIZE),
                           workers=2)
    workers = Workers(server)
    assert len(workers.first) == 2, server.describe()
    write = zone_writer(zone)
    traffic = Traffic(server, duration=15.0)
    try:
        t_start = traffic.start()
        time.sleep(0.5)
        t_write = time.monotonic()
        write(LOCK_OFFSET, extreme_bytes(LOCK_SIZE, which))
        time.sleep(STALL_LIMIT_S + 3.0)
        t_end = time.monotonic()
        changed = workers.check()
        pacing = traffic.pacing()
        waits = wchans(workers.first)
    finally:
        traffic.stop()
        write.close()
    bad = traffic.bad_requests()
    stalls = traffic.stalls(t_start, t_end)
    report = "\n".join([
        "lock (bytes %d-%d) = %s at %+.2f s, observed for %.1f s" % (
            LOCK_OFFSET, LOCK_OFFSET + LOCK_SIZE - 1, which,
            t_write - t_start, t_end - t_write),
        traffic.summary(t_start, t_end),
        "first bad requests: %s" % [
            ("%+.2f s" % (b[0] - t_write), round(b[1], 3), b[2])
            for b in bad[:5]],
        "stalls: %s" % [(label, round(gap, 2), "%+.2f s" % (at - t_write))
                        for label, gap, at in stalls],
        "pacing at the end (ss): %s" % pacing,
        "workers: %s; %s" % (changed or "unchanged %s" % workers.first,
                             worker_signals(server) or "no worker exited on a signal"),
        "workers' threads wait in: %s" % waits,
        library_lines(server)])
    print("\n" + report)
    assert not changed and not worker_signals(server), report
    assert not bad, report
    assert not stalls and not traffic.dset.errors(), report
