"""Issue 9, more real servers: Apache httpd (prefork and event MPMs),
lighttpd, a Node.js `cluster` server (round-robin and workers-accept
scheduling) and, as a client, aria2c with 16 connections to one file from
nginx, each under the built library.

For each server: one client's 4 downloads share the rate, another client's
1 download gets its own, `trafficrate stat` counts the first client's 4
connections, and every byte that arrives is the served file's (SHA-256 of
the body received equals that of the file's prefix of the same length; the
file is random bytes). aria2c's whole download takes size / rate and its
file hashes to the served one.

To keep the suite short, one module fixture starts every server at once
(each on its own port with its own zone, and its own client addresses
127.0.N.2 and 127.0.N.3) and runs all the downloads in one 12 s span,
measured over 8 s after 2 s of warm-up; aria2c runs in the same span. Each
test then checks one server's results.
"""

import hashlib
import os
import shutil
import subprocess
import threading
import time

import pytest

import harness

RATE = "500k"
TARGET = 512000
FILE_NAME = "servers.bin"
FILE_SIZE = 16 << 20  # a lone client takes 32 s at the rate: never finishes
DURATION = 12.0
WARMUP, WINDOW = 2.0, 8.0
STAT_AT = 6.0  # s after all downloads started: `trafficrate stat` sample

# name -> (factory method, its keyword arguments, third octet of its clients)
SERVERS = {
    "apache-prefork": ("apache", dict(mpm="prefork", processes=6,
                                      sendfile=True), 1),
    "apache-event": ("apache", dict(mpm="event", processes=2, threads=8), 2),
    "lighttpd": ("lighttpd", dict(workers=2), 3),
    "node-cluster-rr": ("node", dict(sched="rr", workers=2), 4),
    "node-cluster-none": ("node", dict(sched="none", workers=2), 5),
}

ARIA2C = "/usr/bin/aria2c"
ARIA_RATE = "2m"
ARIA_TARGET = 2 << 20
ARIA_FILE = "aria.bin"
ARIA_SIZE = 20 << 20  # 10 s at the rate; 16 segments of at least -k1M
# aria2c fetches 20 pieces of 1 MiB over its 16 connections: after the first
# 16 pieces, 12 connections wait, still counted active (taking a share) for
# TRAFFICRATE_IDLE (default 200 ms) after their last write, while 4 fetch the
# rest. One idle period of the rate is the tail the equal share costs here
# (measured 10.05-10.25 s on an idle machine), so the expected time is
# size / rate + IDLE, within the usual 5 %.
ARIA_IDLE_S = 0.2
ARIA_SOURCE = "127.0.6.2"
ARIA_STAT_AT = 3.0  # s after aria2c started
ARIA_TIMEOUT = 40.0


def clients(octet):
    """(4-download client, 1-download client) of one server."""
    return "127.0.%d.2" % octet, "127.0.%d.3" % octet


def brief(keys):
    """`trafficrate stat` keys in short: key connections/active share bytes."""
    return "; ".join("%s %d conn %d active share %d bytes %d" % (
        k["key"], k["connections"], k["active"], k["share"], k["bytes"])
        for k in keys) or "no keys"


class Aria2c(threading.Thread):
    """aria2c with 16 connections to one URL, bound to one source address;
    records its wall time from start to exit (bounded: killed, by pid,
    after `timeout` s)."""

    def __init__(self, url, source, outdir, name, timeout=ARIA_TIMEOUT):
        super().__init__(daemon=True)
        self.argv = [ARIA2C, "-x16", "-s16", "-k1M", "--interface=" + source,
                     "--disable-ipv6=true", "-d", str(outdir), "-o", name,
                     "--allow-overwrite=true", "--auto-file-renaming=false",
                     "--file-allocation=none", "--console-log-level=warn",
                     "--summary-interval=0", "--download-result=hide",
                     "--max-tries=1", "--connect-timeout=5", "--timeout=10",
                     url]
        self.path = outdir / name
        self.timeout = timeout
        self.started_at = self.ended_at = self.returncode = None
        self.output = ""

    def run(self):
        self.started_at = time.monotonic()
        proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=harness.server_environment({}),
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            harness.kill_pid(proc.pid)
            out, _ = proc.communicate(timeout=5.0)
        self.ended_at = time.monotonic()
        self.returncode = proc.returncode
        self.output = out.decode(errors="replace")

    @property
    def elapsed(self):
        if self.started_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.started_at


class Run:
    """One server's part of the span: its server, zone, downloads, results."""

    def __init__(self, name, octet):
        self.name = name
        self.client_a, self.client_b = clients(octet)
        self.zone = harness.unique_zone(name)
        self.server = None
        self.error = None
        self.dset = None
        self.started = None
        self.stat_keys = []  # `trafficrate stat` at STAT_AT: every key
        self.stat_a = self.stat_b = None
        self.owners = {}
        self.measurement = None

    def report(self):
        lines = [self.server.title if self.server else self.name]
        if self.error:
            lines.append("ERROR " + self.error)
        if self.measurement is not None:
            lines.append(self.measurement.report())
        for d in self.dset.downloads if self.dset else ():
            if d.connected_at is not None:
                last = d.times[-1] if len(d.times) else d.connected_at
                lines.append("  %-16s %10d B in %.2f s after connecting "
                             "(%.0f B/s)%s%s" % (
                                 d.label, d.total, last - d.connected_at,
                                 d.total / max(1e-3, last - d.connected_at),
                                 "  EOF" if d.eof else "",
                                 "  pid %s" % self.owners[d.label]
                                 if d.label in self.owners else ""))
        lines.append("stat %.0f s in: %s" % (STAT_AT, brief(self.stat_keys)))
        if self.server is not None:
            lines += self.server.trafficrate_lines()[-10:]
            if self.error:
                lines.append("--- server output ---\n" + self.server.output()[-3000:])
        return "\n".join(lines)

    def sample_stat(self):
        self.stat_keys = harness.stat_json(self.zone)["keys"]
        by_key = {entry["key"]: entry for entry in self.stat_keys}
        none = dict(active=0, connections=0, share=0, bytes=0)
        self.stat_a = by_key.get(self.client_a, dict(none, key=self.client_a))
        self.stat_b = by_key.get(self.client_b, dict(none, key=self.client_b))


class Span:
    """Everything the module fixture ran, for the tests to check."""

    def __init__(self):
        self.runs = {}
        self.content = b""
        self.aria = None
        self.aria_server = None
        self.aria_zone = harness.unique_zone("aria2c")
        self.aria_stat = None
        self.aria_error = None
        self.wall = None


@pytest.fixture(scope="module")
def span(test_namespace):
    lib = harness.library_path()
    if not lib.is_file():
        pytest.fail("%s is missing: build the library first or set "
                    "TRAFFICRATE_BUILD_DIR" % lib, pytrace=False)
    t_begin = time.monotonic()
    workdir = harness.make_workdir()
    webroot = harness.make_webroot(workdir, big_size=1 << 20)
    result = Span()
    result.content = os.urandom(FILE_SIZE)
    (webroot / FILE_NAME).write_bytes(result.content)
    harness.register_content("/" + FILE_NAME, result.content)
    (webroot / ARIA_FILE).write_bytes(os.urandom(ARIA_SIZE))
    for name in (FILE_NAME, ARIA_FILE):
        (webroot / name).chmod(0o644)
    factory = harness.ServerFactory(workdir, webroot)
    runs = result.runs
    try:
        # Start every server, then wait for each to be ready.
        for name, (method, kw, octet) in SERVERS.items():
            run = runs[name] = Run(name, octet)
            harness.remove_zone(run.zone)
            try:
                run.server = getattr(factory, method)(
                    env=harness.preload_env(run.zone, RATE, library=lib),
                    wait_ready=False, **kw)
            except Exception as e:
                run.error = "did not start: %s: %s" % (type(e).__name__, e)
        harness.remove_zone(result.aria_zone)
        try:
            result.aria_server = factory.nginx(
                env=harness.preload_env(result.aria_zone, ARIA_RATE, library=lib),
                workers=2, wait_ready=False)
        except Exception as e:
            result.aria_error = "nginx did not start: %s: %s" % (type(e).__name__, e)
        for run in runs.values():
            if run.error is None:
                try:
                    run.server.wait_ready(15.0)
                except RuntimeError as e:
                    run.error = str(e)
        if result.aria_error is None:
            try:
                result.aria_server.wait_ready(15.0)
            except RuntimeError as e:
                result.aria_error = str(e)

        # All downloads from one start time.
        start_at = time.monotonic() + 0.1
        live = [run for run in runs.values() if run.error is None]
        for run in live:
            run.dset = harness.DownloadSet(run.server.port, [], duration=DURATION)
            run.dset.start_at, run.dset.stop_at = start_at, start_at + DURATION
            for n, source in enumerate([run.client_a] * 4 + [run.client_b]):
                run.dset.downloads.append(harness.Download(
                    run.server.port, source, "/" + FILE_NAME,
                    label="%s#%d" % (source, n + 1), start_at=start_at,
                    stop_at=start_at + DURATION))
            run.dset.start()
        if result.aria_error is None:
            result.aria = Aria2c("http://%s:%d/%s" % (
                harness.SERVER_HOST, result.aria_server.port, ARIA_FILE),
                ARIA_SOURCE, workdir, "aria-out.bin")
            time.sleep(max(0.0, start_at - time.monotonic()))
            result.aria.start()
        try:
            for run in live:
                run.started = run.dset.wait_started(
                    max(0.5, start_at + 10.0 - time.monotonic()))
                if not run.started:
                    run.error = "downloads did not all connect: %s" % (
                        run.dset.errors() or "timeout")
            started = max([run.started for run in live if run.started]
                          or [start_at])
            aria_stat_at = start_at + ARIA_STAT_AT
            time.sleep(max(0.0, aria_stat_at - time.monotonic()))
            if result.aria is not None:
                result.aria_stat = harness.stat_json(result.aria_zone)["keys"]
            time.sleep(max(0.0, started + STAT_AT - time.monotonic()))
            for run in live:
                if run.started:
                    run.sample_stat()
                    run.owners = run.dset.record_owners()
            time.sleep(max(0.0, started + WARMUP + WINDOW + 0.2 - time.monotonic()))
            for run in live:
                if run.started:
                    run.measurement = run.dset.measure(
                        started + WARMUP, started + WARMUP + WINDOW, TARGET)
        finally:
            for run in live:
                run.dset.stop()
            for run in live:
                run.dset.join(5.0)
        if result.aria is not None:
            result.aria.join(max(0.0, start_at + ARIA_TIMEOUT + 10.0
                                 - time.monotonic()))
        result.wall = time.monotonic() - t_begin
        print("\ntest_servers: servers started and all downloads done in %.1f s"
              % result.wall)
        yield result
    finally:
        factory.stop_all()
        for run in runs.values():
            harness.remove_zone(run.zone)
        harness.remove_zone(result.aria_zone)
        shutil.rmtree(workdir, ignore_errors=True)


def check_server(span, name):
    """One server's checks; returns its Run."""
    run = span.runs[name]
    report = run.report()
    print("\n" + report)
    assert run.error is None, report
    assert not run.dset.errors(), report
    m = run.measurement
    assert harness.within(m.source_rate(run.client_a), TARGET, 0.05), report
    assert harness.within(m.source_rate(run.client_b), TARGET, 0.05), report
    assert (run.stat_a["connections"], run.stat_a["active"]) == (4, 4), report
    # Every byte received is the file's, in order (judged here, so that
    # each server's test says it; the ledger leaves these bodies out).
    assert all(d.total > 0 for d in run.dset.downloads), report
    found, summary = harness.body_problems(run.dset.downloads)
    print(summary)
    assert not found, "%s\n%s" % ("\n".join(found), report)
    return run


def test_apache_prefork(span):
    run = check_server(span, "apache-prefork")
    # prefork serves one connection per process: the 5 downloads were
    # served by 5 processes sharing the zone.
    assert len(set(run.owners.values())) == 5, run.report()


def test_apache_event(span):
    check_server(span, "apache-event")


def test_lighttpd(span):
    check_server(span, "lighttpd")


def test_node_cluster_round_robin(span):
    """Node's default on Linux: the primary accepts and passes each socket
    to a worker (SCM_RIGHTS), which then serves it."""
    check_server(span, "node-cluster-rr")


def test_node_cluster_workers_accept(span):
    """NODE_CLUSTER_SCHED_POLICY=none: the workers accept themselves."""
    check_server(span, "node-cluster-none")


def test_aria2c_16_connections(span):
    aria = span.aria
    expected = ARIA_SIZE / ARIA_TARGET + ARIA_IDLE_S
    report = "aria2c -x16 -s16 -k1M from %s, %s under the library at %s: " % (
        ARIA_SOURCE, span.aria_server.title if span.aria_server else "nginx",
        ARIA_RATE)
    if aria is not None and aria.elapsed is not None:
        report += "%d B in %.2f s (expected %.2f s, %.4f x), rc %s\n" % (
            ARIA_SIZE, aria.elapsed, expected, aria.elapsed / expected,
            aria.returncode)
    report += "stat %s %.0f s in: %s\n%s" % (
        ARIA_SOURCE, ARIA_STAT_AT, brief(span.aria_stat or []),
        aria.output[-2000:] if aria else span.aria_error)
    print("\n" + report)
    assert span.aria_error is None, report
    assert aria.returncode == 0, report
    assert harness.within(aria.elapsed, expected, 0.05), report
    # Its connections were one client key, the zone's only one.
    assert [k["key"] for k in span.aria_stat] == [ARIA_SOURCE], report
    # All 16 at once (20 MiB: 16 segments of at least -k1M).
    assert span.aria_stat[0]["connections"] == 16, report
    with open(aria.path, "rb") as got, open(
            span.aria_server.webroot / ARIA_FILE, "rb") as served:
        assert (hashlib.sha256(got.read()).hexdigest()
                == hashlib.sha256(served.read()).hexdigest()), report
