"""Issue 8 (concurrency): the preload library built with AddressSanitizer +
UndefinedBehaviorSanitizer, inside a real multi-threaded (and a forking)
server.

The library comes from the ASan build (scripts/test.sh builds build-asan with
TRAFFICRATE_SANITIZE=address,undefined); $TRAFFICRATE_ASAN_BUILD_DIR names
it (default <repo>/build-asan), and the tests are SKIPPED when its
libtrafficrate.so does not exist (scripts/test.sh --quick). It is linked
against GCC's shared runtimes (libasan.so.8, libubsan.so.1), so the server
runs with LD_PRELOAD="<libasan.so> <build-asan>/libtrafficrate.so": the ASan
runtime must be the first object loaded. The CLI stays the normal build's.

pyserver.py in thread mode with --fd-chain (every accepted socket moved
through dup, fcntl, dup3, close_range, close and dup2; see test_fds.py), and
in fork mode (one process per connection, sharing the zone), serves
downloads from two client addresses at 500k (512000 B/s) per address, one
download that leaves mid-window, and short requests (Connection: close, and
keep-alive connections closed by the client) from both addresses
throughout, under the default split (TRAFFICRATE_SHARE unset). Then:
  * no ASan or UBSan report: no file at the log_path prefixes in the test's
    workdir, nothing matching AddressSanitizer / runtime error in the
    server's stderr, the server still alive and answering (halt_on_error=1
    would have ended it);
  * the rate still holds, instrumented: each address within 10% of 512000 B/s
    over an 8 s window after a 2 s warm-up;
  * the zone is empty (0 keys, 0 connections) once the clients have closed.

The short requests join and leave the downloads' keys several times a
second, so the module runs with net.ipv4.tcp_tso_rtt_log = 0 (the
small_gso_packets fixture, see test_dynamics.py): with loopback's 64 KiB GSO
packets a share lowered for a few milliseconds holds a connection back for
the whole gap of a packet: without it the same runs measured 0.88-0.90x the
rate with the plain library and 0.84-0.92x with the ASan one; with it,
0.98-0.99x. (Under TRAFFICRATE_SHARE=budget the forking case measured
0.91-0.99x, the plain library as low as the ASan one: too close to the
tolerance to be checked here; test_budget_*.py cover that mode.)

ASAN_OPTIONS has detect_leaks=0 (CPython does not free everything at exit by
design) and abort_on_error=0, so a report ends the server with exit code 1
rather than a core dump. ASan writes its report to <workdir>/sanitizer/
asan.<pid>; UBSan (GCC 12's libubsan beside libasan) was seen to ignore
log_path and print "runtime error: ..." to the server's stderr, which is why
that is checked too (the library is built with -fno-sanitize-recover=all, so
UBSan also ends the server). Each test prints its figures with -s.
"""

import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

import harness

RATE = "500k"
TARGET = 512000  # B/s per client IP
CLIENT_A = "127.0.0.2"
CLIENT_B = "127.0.0.3"
pytestmark = pytest.mark.usefixtures("small_gso_packets")
REPORT_PATTERN = re.compile(r"AddressSanitizer|LeakSanitizer|runtime error")


# ----------------------------------------------------------------- helpers

def asan_build_dir():
    """$TRAFFICRATE_ASAN_BUILD_DIR, or <repo>/build-asan."""
    return Path(os.environ.get("TRAFFICRATE_ASAN_BUILD_DIR")
                or harness.REPO_ROOT / "build-asan")


def asan_runtime(library):
    """Path of the libasan the library was linked against (ldd), else GCC's
    (gcc -print-file-name); None if neither names an existing file."""
    try:
        out = subprocess.run(["ldd", str(library)], capture_output=True,
                             text=True, timeout=10.0).stdout
        m = re.search(r"^\s*libasan\.so\S*\s+=>\s+(\S+)", out, re.M)
        if m and Path(m.group(1)).is_file():
            return Path(m.group(1)).resolve()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        out = subprocess.run(["gcc", "-print-file-name=libasan.so"],
                             capture_output=True, text=True, timeout=10.0).stdout
        path = Path(out.strip())
        if path.is_absolute() and path.is_file():
            return path.resolve()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


@pytest.fixture
def asan_library():
    """(libasan path, ASan-built libtrafficrate.so); SKIPS without them."""
    library = asan_build_dir() / "libtrafficrate.so"
    if not library.is_file():
        pytest.skip("%s does not exist: build it with cmake -S . -B build-asan "
                    "-G Ninja -DTRAFFICRATE_SANITIZE=address,undefined && "
                    "cmake --build build-asan, or set TRAFFICRATE_ASAN_BUILD_DIR"
                    % library)
    runtime = asan_runtime(library)
    if runtime is None:
        pytest.skip("no libasan.so found (ldd %s, gcc -print-file-name)" % library)
    return runtime, library


def asan_env(zone, runtime, library, log_dir):
    """lib_env(RATE) with the ASan library, libasan first, sanitizer reports
    to files under log_dir."""
    env = harness.preload_env(zone, RATE, library=library)
    env["LD_PRELOAD"] = "%s %s" % (runtime, library)
    env["ASAN_OPTIONS"] = ":".join([
        "detect_leaks=0", "abort_on_error=0", "halt_on_error=1",
        "log_path=%s" % (log_dir / "asan")])
    env["UBSAN_OPTIONS"] = ":".join([
        "print_stacktrace=1", "halt_on_error=1",
        "log_path=%s" % (log_dir / "ubsan")])
    return env


def report_files(log_dir):
    """Sanitizer reports written so far (log_path gives <prefix>.<pid>)."""
    return sorted(p for p in log_dir.iterdir()
                  if p.name.startswith(("asan.", "ubsan.")))


def mapped(pid, paths):
    """Which of paths are mapped into pid (empty if it is gone)."""
    try:
        with open("/proc/%d/maps" % pid) as f:
            maps = f.read()
    except OSError:
        return []
    return [p for p in paths if str(p) in maps]


class ShortRequests(threading.Thread):
    """Until stopped (bounded by `duration`): alternately from each source a
    Connection: close GET of small.txt, and a keep-alive connection with two
    GETs that the client then closes; about `per_second` requests a second.
    Counts successes; keeps the first few errors."""

    def __init__(self, port, sources, duration, per_second=4.0):
        super().__init__(daemon=True)
        self.port, self.sources = port, list(sources)
        self.deadline = time.monotonic() + duration
        self.interval = 1.0 / per_second
        self.ok = 0
        self.errors = []
        self._stop_event = threading.Event()

    def stop(self):
        self._stop_event.set()

    def run(self):
        i = 0
        while not self._stop_event.is_set() and time.monotonic() < self.deadline:
            source = self.sources[i % len(self.sources)]
            try:
                if i % 2 == 0:
                    status, _, _ = harness.http_get(self.port, source=source)
                    if status != 200:
                        raise RuntimeError("HTTP status %d" % status)
                else:
                    sock = harness.open_keepalive(self.port, source=source)
                    try:
                        harness.keepalive_get(sock, self.port)
                    finally:
                        sock.close()
                self.ok += 1
            except Exception as e:  # reported through .errors
                if len(self.errors) < 5:
                    self.errors.append("%s: %s: %s" % (source, type(e).__name__, e))
            i += 1
            self._stop_event.wait(self.interval)


def zone_empty(zone):
    doc = harness.stat_json(zone)
    return doc["used"]["keys"] == 0 and doc["used"]["connections"] == 0


def answers(server):
    """HTTP status of one small GET, or None if the server is gone."""
    if server.exited():
        return None
    try:
        return harness.http_get(server.port, source=CLIENT_A)[0]
    except (OSError, ValueError, IndexError):
        return None


def findings(server, log_dir):
    """(report files, their text, sanitizer lines in the server's stderr)."""
    files = report_files(log_dir)
    text = "\n".join("--- %s\n%s" % (p.name, p.read_text(errors="replace")[-6000:])
                     for p in files)
    lines = [line for line in server.output().splitlines()
             if REPORT_PATTERN.search(line)]
    return files, text, lines


# ------------------------------------------------------------------- tests

@pytest.mark.parametrize("mode", ["thread", "fork"])
def test_asan_library_under_a_server_reports_nothing_and_holds_the_rate(
        servers, workdir, zone, asan_library, mode):
    runtime, library = asan_library
    log_dir = workdir / "sanitizer"
    log_dir.mkdir()
    server = servers.python(env=asan_env(zone, runtime, library, log_dir),
                            mode=mode, fd_chain=(mode == "thread"))
    loaded = mapped(server.pid, [runtime, library])
    warmup, window = 2.0, 8.0
    plan = [CLIENT_A] * 3 + [CLIENT_B] * 2
    dset = harness.DownloadSet(server.port, plan,
                               duration=warmup + window + 0.6).start()
    dset.add(CLIENT_B, stop_after=warmup + window / 2)  # leaves mid-window
    shorts = ShortRequests(server.port, [CLIENT_A, CLIENT_B],
                           duration=warmup + window + 5.0)
    shorts.start()
    try:
        started = dset.wait_started(10.0)
        assert started, dset.errors()
        t0, t1 = started + warmup, started + warmup + window
        time.sleep(max(0.0, t1 + 0.1 - time.monotonic()))
        m = dset.measure(t0, t1, TARGET)
    finally:
        shorts.stop()
        dset.stop()
        dset.join(5.0)
        shorts.join(5.0)
    emptied = harness.wait_for(lambda: zone_empty(zone), 5.0, interval=0.1)
    used = harness.stat_json(zone)["used"]
    status = answers(server)
    files, text, stderr_lines = findings(server, log_dir)
    report = "\n".join([
        server.title,
        "LD_PRELOAD %s (mapped: %s)" % (
            server.env["LD_PRELOAD"], ", ".join(str(p) for p in loaded)),
        m.report(),
        "short requests: %d ok, errors %s" % (shorts.ok, shorts.errors),
        "zone after close: %d keys, %d connections (%s)" % (
            used["keys"], used["connections"],
            "empty" if emptied else "NOT EMPTY after 5 s"),
        "server alive %s, answers %s" % (not server.exited(), status),
        "sanitizer reports: %s" % ([p.name for p in files] or "none"),
    ] + ([text] if text else []))
    print("\n" + report)
    assert not files, report
    assert not stderr_lines, "%s\n--- server stderr\n%s" % (
        report, server.output()[-6000:])
    assert loaded == [runtime, library], report
    assert status == 200, report + "\n" + server.describe()
    assert not dset.errors(), report
    assert not shorts.errors and shorts.ok > 0, report
    assert harness.within(m.source_rate(CLIENT_A), TARGET, 0.10), report
    assert harness.within(m.source_rate(CLIENT_B), TARGET, 0.10), report
    assert emptied, report
