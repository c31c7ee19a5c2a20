"""Shared code of the shared-budget benchmark (bench/budget.py).

  * Bench: one benchmark run's working directory, web root and nginx servers
    under a share mode ("none": no library, "equal", "budget"), started and
    stopped by pid with their zones removed (server()); place() picks client
    source ports that land on each nginx reuseport worker.
  * Conn / Reader: a single-threaded epoll HTTP client. Every connection
    records (monotonic time, cumulative bytes received) after each recv, so
    rates over any window come from the client's own byte counts. One Reader
    holds thousands of sockets, opens connections at scheduled times, closes
    them at scheduled times, and can read a connection slowly (a token bucket
    on the client side with a small SO_RCVBUF).
  * Figures: total_rate(), windows() (1 s buckets), jain(), spread(),
    median(); thread_cpu() / watcher_tids() for CPU time from /proc.
  * Metric rows: row() builds one line of the final table (values of every
    share mode, the target interval, PASS/FAIL of the budget column).
  * Comparators (issue 10): Bench.server() also starts nginx the way
    operators limit it without the library, TOOLS: "limit_rate" (nginx's
    per-connection limit_rate), "limit_conn" (limit_conn per IP plus
    limit_rate), "trickle" / "trickle-nosendfile" (nginx run under
    `trickle -s -u KB`); trickle_evidence() says why trickle cannot see
    nginx's sockets.

Standard library only (Debian's /usr/bin/python3). It imports the
integration harness from tests/integration (harness.NginxServer,
ports_by_worker(), preload_env(), ...) without modifying it.
"""

import array
import bisect
import errno
import heapq
import os
import pickle
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))

import harness  # noqa: E402  (needs the sys.path entry above)

SERVER_HOST = harness.SERVER_HOST  # 127.0.0.1
BIG_FILE = harness.BIG_FILE        # /big.bin, 256 MiB of pseudo-random bytes
SMALL_FILE_4K = "/4k.bin"
LIB_MODES = ("equal", "budget")    # the table's columns
# A library mode with this suffix runs with the packet shaper off
# (TRAFFICRATE_SHAPE=0) whatever the run's --shape: keepalive measures the
# shaper on against off in the same seconds.
NO_SHAPE = "-noshape"
# What operators use instead of the library (bench/README.md, "Comparators"),
# measured in the accuracy scenario next to LIB_MODES. Every one runs nginx
# without the library.
LIMIT_CONN = 1  # connections per client IP under the limit_conn tool
TOOLS = ("limit_rate", "limit_conn", "trickle", "trickle-nosendfile")
TOOL_TEXT = {
    "equal": "trafficrate, TRAFFICRATE_SHARE=equal",
    "budget": "trafficrate, TRAFFICRATE_SHARE=budget",
    "limit_rate": "nginx limit_rate {rate} (per connection), no library",
    "limit_conn": "nginx limit_conn_zone $binary_remote_addr; limit_conn addr %d;"
                  " limit_rate {rate}; no library" % LIMIT_CONN,
    "trickle": "trickle -s -u {rate_kb} nginx (sendfile on), no library",
    "idle-thread": "nginx with a preload that only starts one idle thread, no library",
    "trickle-nosendfile": "trickle -s -u {rate_kb} nginx with sendfile off, no library",
}
# The overhead scenario's floor: nginx with a preload that only starts one
# idle thread (tests/bench/idle_thread_preload.cc), no library.
IDLE_THREAD = "idle-thread"
IDLE_THREAD_LIB = "idle_thread_preload.so"
TRICKLE = "/usr/bin/trickle"
TRICKLE_LIB = "trickle-overload.so"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def log(text):
    print(text, flush=True)


# -------------------------------------------------------------------- servers

class BenchNginx(harness.NginxServer):
    """harness.NginxServer with room for many connections: worker_connections,
    worker_rlimit_nofile and a listen backlog (servers.py hard-codes 1024
    connections and nginx's default backlog of 511)."""

    def __init__(self, *args, connections=1024, **kw):
        super().__init__(*args, **kw)
        self.connections = connections

    def conf_text(self):
        text = super().conf_text()
        if self.connections <= 1024:
            return text
        old_events = "events { worker_connections 1024; }"
        assert old_events in text, "servers.py's nginx.conf changed:\n" + text
        # multi_accept: thousands of connections arrive at once, and a
        # worker accepts all that wait at each turn of its event loop, not
        # one. Without it, once thousands of paced connections made each
        # turn long (512 events, up to a second on 2 cores), the last
        # hundreds of 10 000 waited in the accept queue for a minute.
        text = text.replace(old_events, "worker_rlimit_nofile %d;\nevents { "
                            "worker_connections %d; multi_accept on; }" % (
                                min(20000, 2 * self.connections + 100),
                                self.connections + 100))
        if self.connections > 10000:
            # One open file shared by a worker's downloads, not one each:
            # 12 500 sockets and as many files would pass 20 000 fds.
            text = text.replace("http {\n", "http {\n  open_file_cache max=64 "
                                "inactive=600s;\n", 1)
            assert "open_file_cache" in text, "servers.py's nginx.conf changed"
        # A deep accept queue: thousands of connections arrive at once.
        return text.replace(" reuseport;", " reuseport backlog=4096;")


class Bench:
    """One benchmark run: work directory, web root, library, quick flag."""

    def __init__(self, quick=False):
        self.quick = quick
        self.workdir = harness.make_workdir("trafficrate-bench-")
        self.webroot = harness.make_webroot(self.workdir)
        small = self.webroot / SMALL_FILE_4K.lstrip("/")
        small.write_bytes(b"x" * 4096)
        small.chmod(0o644)
        self.library = harness.library_path()
        self.cli = harness.cli_path()
        self.warnings = []
        self.tools = TOOLS     # comparators the accuracy scenario measures
        self.tool_results = {}  # tool -> case -> figures (accuracy fills it)
        # scenario -> tool -> client total / rate, 1 s windows (short,
        # slowreader, spread24 fill it)
        self.adversarial = {}
        self.serial = False  # --serial: tools one after the other, not side by side
        self.cases = []  # --cases: (workers, rate, N) of the accuracy scenario

    def close(self):
        shutil.rmtree(self.workdir, ignore_errors=True)

    def idle_thread_lib(self):
        """The idle-thread preload beside the library, or None if not built."""
        path = Path(self.library).parent / IDLE_THREAD_LIB
        return str(path) if path.is_file() else None

    def env_for(self, mode, rate, zone, **variables):
        if mode == IDLE_THREAD:
            return {"LD_PRELOAD": self.idle_thread_lib()}
        share = lib_mode(mode)
        if share is None:
            return {}
        if mode != share:
            variables["SHAPE"] = "0"
        variables.setdefault("SHAPE", getattr(self, "shape", None))
        return harness.preload_env(zone, rate, library=self.library,
                                   SHARE=share, **variables)

    @contextmanager
    def server(self, mode, rate, workers=2, connections=1024, **variables):
        """nginx (reuseport, sendfile on) under share `mode` at `rate`;
        TRAFFICRATE_<NAME> variables as keywords (e.g. ZONE_SIZE="32m").
        mode may also be "none" (no library, no limit) or one of TOOLS (no
        library, nginx limited by that tool at `rate`).
        Yields the server; stops it (by pid) and removes its zone after."""
        zone = harness.unique_zone("bench-%s" % mode)
        harness.remove_zone(zone)
        lib = lib_mode(mode) is not None
        nginx_kw = {}
        if mode in ("limit_rate", "limit_conn"):
            nginx_kw["limit_rate"] = rate
        if mode == "limit_conn":
            nginx_kw["extra_http"] = (
                "  limit_conn_zone $binary_remote_addr zone=addr:10m;")
            nginx_kw["extra_server"] = ("    limit_conn addr %d;\n"
                                        "    limit_conn_status 503;" % LIMIT_CONN)
        if mode == "trickle-nosendfile":
            nginx_kw["sendfile"] = False
        srv = BenchNginx(self.workdir, self.webroot, workers=workers,
                         reuseport=True, connections=connections,
                         env=self.env_for(mode, rate, zone, **variables),
                         **nginx_kw)
        if mode.startswith("trickle"):
            # trickle sets LD_PRELOAD=trickle-overload.so and execs nginx:
            # the pid we start is nginx's master. -u is in KB/s (1024 B).
            srv.argv = [TRICKLE, "-s", "-u", str(max(1, harness.parse_rate(rate)
                                                   // 1024))] + srv.argv
        srv.zone = zone if lib else None
        srv.mode = mode
        try:
            srv.start(timeout=15.0)
            for pid in srv.worker_pids():
                if _maps_library(pid) != lib:
                    raise RuntimeError("nginx worker %d (mode %s): libtrafficrate.so"
                                       " is%s mapped" % (pid, mode, "" if not lib
                                                         else " not"))
            if mode == IDLE_THREAD and not all(
                    _maps_library(pid, IDLE_THREAD_LIB) for pid in srv.worker_pids()):
                raise RuntimeError("nginx (%s): %s is not mapped" % (mode, IDLE_THREAD_LIB))
            if mode.startswith("trickle"):
                srv.trickle_mapped = {str(pid): _maps_library(pid, TRICKLE_LIB)
                                      for pid in srv.worker_pids()}
            for line in srv.trafficrate_lines():
                self.warn("nginx (%s): %s" % (mode, line))
            yield srv
        finally:
            srv.stop()
            harness.remove_zone(zone)

    def warn(self, text):
        if text not in self.warnings:
            self.warnings.append(text)
            log("  WARNING " + text)

    def place(self, srv, source, n):
        """n source ports for `source`, taking the workers in turn (first
        port on worker 0, second on worker 1, ...): nginx listens with
        reuseport, so the kernel picks the worker by a hash of the 4-tuple
        (harness.ports_by_worker probes it)."""
        workers = srv.worker_pids()
        if n < 2 or len(workers) < 2:
            return [0] * n
        workers = workers[:n]
        k = len(workers)
        want = {w: (n - i + k - 1) // k for i, w in enumerate(workers)}
        found = harness.ports_by_worker(srv.port, source, want,
                                        max_probes=max(200, 8 * n * k))
        ports = []
        for i in range(n):
            ports.append(found[workers[i % k]][i // k])
        # The probes registered with the zone (never sent); wait until the
        # workers have seen their resets.
        if srv.zone and self.cli.is_file():
            harness.wait_for(lambda: harness.key_stat(srv.zone, source)
                             ["connections"] == 0, 5.0, 0.05)
        else:
            time.sleep(0.2)
        return ports

    def stat(self, srv, key=None):
        """The zone's stat entry for key (or the used counts), {} if none."""
        if not srv.zone or not self.cli.is_file():
            return {}
        try:
            # The used counts need no key: one is read, not thousands.
            st = harness.stat_json(srv.zone, top=1 if key is None else None)
        except (RuntimeError, ValueError, OSError) as e:
            return {"error": str(e)}
        if key is None:
            return st.get("used", {})
        for entry in st["keys"]:
            if entry["key"] == key:
                return entry
        return {}


def _maps_library(pid, name="libtrafficrate.so"):
    try:
        with open("/proc/%d/maps" % pid) as f:
            return name in f.read()
    except OSError:
        return False


def _dynsyms(path, defined):
    """Dynamic symbol names of an ELF file (nm -D), defined or undefined
    ones; None if nm is missing or fails."""
    argv = ["nm", "-D", "--defined-only" if defined else "--undefined-only", path]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return {line.split()[-1].split("@")[0] for line in out.stdout.splitlines()
            if line.split()}


# The socket calls a shaper must intercept to see and pace nginx's sending.
_SOCKET_CALLS = ("accept", "accept4", "socket", "send", "sendto", "sendmsg",
                 "write", "writev", "sendfile", "sendfile64", "select", "poll",
                 "epoll_wait")


def trickle_evidence():
    """Which of the socket calls nginx imports trickle-overload.so hooks and
    which it does not (from nm -D), or why that could not be read."""
    lib = Path("/usr/lib/x86_64-linux-gnu/trickle") / TRICKLE_LIB
    hooked = _dynsyms(str(lib), True) if lib.is_file() else None
    used = _dynsyms(harness.NGINX, False)
    if hooked is None or used is None:
        return {"error": "nm -D of %s / %s failed" % (lib, harness.NGINX)}
    calls = [c for c in _SOCKET_CALLS if c in used]
    return {"library": str(lib), "nginx": harness.NGINX,
            "nginx_calls_hooked": [c for c in calls if c in hooked],
            "nginx_calls_not_hooked": [c for c in calls if c not in hooked]}


def shaper_cost(srv):
    """What the packet shaper cost srv so far: its processes' shaper counters
    (stat --json) and the packets the kernel sent on srv's open client
    connections (ss: segs_out, since each connection began). {} if unknown
    (no zone, no stat)."""
    if not srv.zone:
        return {}
    try:
        cost = harness.shaper_counts(srv.zone)
    except (RuntimeError, ValueError, OSError, KeyError):
        return {}
    out = subprocess.run(["ss", "-tinH", "state", "established",
                          "( sport = :%d )" % srv.port],
                         capture_output=True, text=True, timeout=20).stdout
    cost["segs_out"] = sum(int(m) for m in re.findall(r"\bsegs_out:(\d+)", out))
    cost["connections"] = len(re.findall(r"\bsegs_out:", out))
    return cost


def worker_split(srv, conns):
    """{worker pid: number of conns it serves} via ss, while conns are open."""
    by_peer = {o["peer"]: o["pids"] for o in harness.socket_owners(srv.port)}
    split = {}
    for c in conns:
        pids = by_peer.get((c.source, c.local_port))
        if pids:
            split[pids[0]] = split.get(pids[0], 0) + 1
    return {str(k): v for k, v in sorted(split.items())}


# ------------------------------------------------------------------- requests

def http_request(port, path=BIG_FILE, byte_range=None, keepalive=False):
    head = "GET %s HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: trafficrate-bench\r\n" % (
        path, SERVER_HOST, port)
    if byte_range:
        head += "Range: bytes=%d-%d\r\n" % byte_range
    head += "Connection: %s\r\n\r\n" % ("keep-alive" if keepalive else "close")
    return head.encode()


# --------------------------------------------------------------------- client

class Conn:
    """One client connection of a Reader and its byte record.

    Bytes are everything received on the socket (response head + body): the
    server's kernel paces both. bytes_at() / rate() have the same meaning as
    harness.Download's, so harness.bucket_rates() works on Conns too.
    """

    __slots__ = ("source", "request", "start_at", "stop_at", "source_port",
                 "rcvbuf", "read_rate", "label", "group", "sock", "fd", "state",
                 "connected_at", "first_byte_at", "done_at", "local_port",
                 "status", "error", "eof", "total", "times", "totals", "credit",
                 "credit_at")

    def __init__(self, source, request, start_at, stop_at=None, source_port=0,
                 rcvbuf=None, read_rate=None, label=None, group=None):
        self.source, self.request = source, request
        self.start_at, self.stop_at = start_at, stop_at
        self.source_port, self.rcvbuf, self.read_rate = source_port, rcvbuf, read_rate
        self.label, self.group = label, group
        self.sock = self.fd = None
        self.state = "pending"  # -> connecting -> open -> done
        self.connected_at = self.first_byte_at = self.done_at = None
        self.local_port = self.status = self.error = None
        self.eof = False
        self.total = 0
        self.times = array.array("d")
        self.totals = array.array("q")
        self.credit = 0.0
        self.credit_at = None

    def bytes_at(self, t):
        i = bisect.bisect_right(self.times, t)
        return self.totals[i - 1] if i else 0

    def rate(self, t0, t1):
        return (self.bytes_at(t1) - self.bytes_at(t0)) / (t1 - t0)


class Reader:
    """Single-threaded epoll client for many HTTP connections to one port.

    add() schedules a Conn (opened at its start_at, closed at its stop_at or
    when the server closes); run(until) serves every socket until a monotonic
    time, bounded. At most max_opening connections may be between connect
    and their first response byte at once (so thousands of connections do not
    overflow the server's accept queue).
    """

    RECV_SIZE = 256 * 1024
    SLOW_CHUNK = 1024  # a slow reader reads once it has this much credit

    def __init__(self, port, host=SERVER_HOST, max_opening=256):
        self.port, self.host = port, host
        self.max_opening = max_opening
        self.ep = select.epoll()
        self.by_fd = {}
        self.pending = []  # heap (start_at, seq, conn)
        self.stops = []    # heap (stop_at, seq, conn)
        self.slow = set()
        self.conns = []
        self.opening = 0
        self.first_bytes = 0
        self.finished = 0
        self._seq = 0
        self._buf = memoryview(bytearray(self.RECV_SIZE))

    def add(self, conn):
        self._seq += 1
        heapq.heappush(self.pending, (conn.start_at, self._seq, conn))
        if conn.stop_at is not None:
            heapq.heappush(self.stops, (conn.stop_at, self._seq, conn))
        self.conns.append(conn)
        return conn

    # ---- the loop

    def run(self, until, stop_when=None):
        """Serve sockets until monotonic time `until` (or stop_when() is
        true, checked every 20 ms)."""
        ep, by_fd = self.ep, self.by_fd
        checked = 0.0
        while True:
            now = time.monotonic()
            if now >= until:
                return
            if stop_when is not None and now - checked >= 0.02:
                checked = now
                if stop_when():
                    return
            self._start_due(now)
            self._stop_due(now)
            timeout = min(until - now, 0.05)
            if self.slow:
                timeout = min(timeout, 0.01)
            if self.pending and self.opening < self.max_opening:
                timeout = min(timeout, max(0.0, self.pending[0][0] - now))
            if self.stops:
                timeout = min(timeout, max(0.0, self.stops[0][0] - now))
            for fd, _ in ep.poll(max(timeout, 0.0005)):
                c = by_fd.get(fd)
                if c is None:
                    continue
                if c.state == "connecting":
                    self._connected(c)
                else:
                    self._recv(c, self.RECV_SIZE)
            if self.slow:
                self._read_slow(time.monotonic())

    def close_all(self):
        for c in list(self.by_fd.values()):
            self._close(c)
        self.pending.clear()
        self.stops.clear()
        self.ep.close()

    # ---- internals

    def _start_due(self, now):
        while (self.pending and self.pending[0][0] <= now
               and self.opening < self.max_opening):
            c = heapq.heappop(self.pending)[2]
            if c.stop_at is not None and c.stop_at <= now:
                c.state = "done"
                continue
            self._open(c)

    def _stop_due(self, now):
        while self.stops and self.stops[0][0] <= now:
            c = heapq.heappop(self.stops)[2]
            if c.state in ("connecting", "open"):
                self._close(c)

    def _open(self, c):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            if c.rcvbuf:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, c.rcvbuf)
            if c.source_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if c.source or c.source_port:
                sock.bind((c.source or "0.0.0.0", c.source_port))
            rc = sock.connect_ex((self.host, self.port))
            if rc not in (0, errno.EINPROGRESS):
                raise OSError(rc, os.strerror(rc))
        except OSError as e:
            sock.close()
            c.error = "connect: %s" % e
            c.state = "done"
            return
        c.sock, c.fd, c.state = sock, sock.fileno(), "connecting"
        self.by_fd[c.fd] = c
        self.ep.register(c.fd, select.EPOLLOUT)
        self.opening += 1

    def _connected(self, c):
        err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self._fail(c, "connect: %s" % os.strerror(err))
            return
        c.connected_at = time.monotonic()
        c.local_port = c.sock.getsockname()[1]
        try:
            sent = c.sock.send(c.request)
        except OSError as e:
            self._fail(c, "send: %s" % e)
            return
        if sent != len(c.request):
            self._fail(c, "request only partly sent")
            return
        c.state = "open"
        c.times.append(c.connected_at)
        c.totals.append(0)
        if c.read_rate:
            self.ep.unregister(c.fd)  # read by _read_slow() on the clock
            c.credit, c.credit_at = 0.0, c.connected_at
            self.slow.add(c)
        else:
            self.ep.modify(c.fd, select.EPOLLIN)

    def _recv(self, c, size):
        try:
            n = c.sock.recv_into(self._buf, size)
        except BlockingIOError:
            return 0
        except OSError as e:
            self._fail(c, "recv: %s" % e)
            return 0
        now = time.monotonic()
        if n == 0:
            c.eof = True
            self._close(c)
            return 0
        if c.first_byte_at is None:
            c.first_byte_at = now
            self.first_bytes += 1
            self.opening -= 1
            if n >= 12:
                try:
                    c.status = int(bytes(self._buf[9:12]))
                except ValueError:
                    c.status = -1
        c.total += n
        c.times.append(now)
        c.totals.append(c.total)
        return n

    def _read_slow(self, now):
        for c in list(self.slow):
            c.credit = min(c.credit + (now - c.credit_at) * c.read_rate,
                           max(self.SLOW_CHUNK, 0.1 * c.read_rate))
            c.credit_at = now
            if c.credit >= self.SLOW_CHUNK:
                c.credit -= self._recv(c, int(c.credit))

    def _fail(self, c, text):
        c.error = text
        self._close(c)

    def _close(self, c):
        if c.state in ("connecting", "open"):
            if c.first_byte_at is None:
                self.opening -= 1
            self.slow.discard(c)
            self.by_fd.pop(c.fd, None)
            try:
                self.ep.unregister(c.fd)
            except (OSError, ValueError):
                pass  # slow readers are not registered
            c.sock.close()
            c.done_at = time.monotonic()
            self.finished += 1
        c.state = "done"
        c.sock = None


class Run:
    """What drive() measured: conns (parallel to the specs), base (the
    scheduled start), t0..t1 (the measurement window), split (connections
    per worker pid, from ss at t1), stat (the zone's entry for the first
    spec's source at t1), marks (what the hooks returned)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def rate(self, conns=None):
        return total_rate(self.conns if conns is None else conns, self.t0, self.t1)

    def windows(self, conns=None):
        return windows(self.conns if conns is None else conns, self.t0, self.t1)


def drive(bench, srv, specs, duration, warm=None, max_opening=256,
          connect_timeout=10.0, hook=None, split_at=None, ports=None):
    """Run client connections against srv and measure them.

    specs: dicts with source (client address), and optionally start / stop
    (seconds after the scheduled start; default 0 / the end), request (bytes;
    default a GET of the big file), read_rate and rcvbuf (a slow reader),
    place (default True: connections of one source alternate between the two
    nginx workers, see Bench.place), label, group.
    With warm: the window starts `warm` s after every connection with start 0
    has connected and lasts `duration` s; without: base .. base + duration.
    hook(when) with when "start" / "end" of the window returns a dict kept
    in marks (e.g. CPU times). split_at: seconds after base at which to
    record which worker serves which connection (ss, in a thread so the
    reader keeps reading); default at the end of the window. ports: the
    source ports, one per spec (placed()), if already chosen. Every wait is
    bounded.
    """
    if ports is None:
        ports = placed(bench, srv, specs)
    reader = Reader(srv.port, max_opening=max_opening)
    base = time.monotonic() + 0.05
    conns = []
    for i, spec in enumerate(specs):
        stop = spec.get("stop")
        conns.append(reader.add(Conn(
            spec["source"], spec.get("request") or http_request(srv.port),
            base + spec.get("start", 0.0),
            None if stop is None else base + stop, source_port=ports[i],
            rcvbuf=spec.get("rcvbuf"), read_rate=spec.get("read_rate"),
            label=spec.get("label") or "%s#%d" % (spec["source"], i),
            group=spec.get("group"))))
    marks = {}
    try:
        if warm is None:
            t0 = base
        else:
            initial = [c for c, s in zip(conns, specs) if not s.get("start")]
            reader.run(base + connect_timeout, stop_when=lambda: all(
                c.connected_at is not None or c.state == "done" for c in initial))
            connected = [c.connected_at for c in initial if c.connected_at]
            if len(connected) < len(initial):
                bench.warn("%d of %d connections did not connect within %.0f s"
                           % (len(initial) - len(connected), len(initial),
                              connect_timeout))
            t0 = (max(connected) if connected else time.monotonic()) + warm
        t1 = t0 + duration
        events = [(t0, 1, "start"), (t1 + 0.02, 2, "end")]
        if split_at is not None:
            events.append((base + split_at, 0, "split"))
        split, stat, helper = {}, {}, None
        for when, _, what in sorted(events):
            reader.run(when)
            if what == "split":
                # ss and stat in a thread: the reader keeps timestamping.
                open_now = [c for c in conns if c.state == "open"]

                def look(open_now=open_now):
                    split.update(worker_split(srv, open_now))
                    stat.update(bench.stat(srv, specs[0]["source"]))
                helper = threading.Thread(target=look, daemon=True)
                helper.start()
            else:
                cpu = os.times()
                marks["client_cpu_" + what] = cpu.user + cpu.system
                if hook:
                    marks[what] = hook(what)
        if helper is None:
            split = worker_split(srv, [c for c in conns if c.state == "open"])
            stat = bench.stat(srv, specs[0]["source"])
        else:
            helper.join(10.0)
        shaping = shaper_cost(srv)
        shaping["seconds"] = time.monotonic() - base
    finally:
        reader.close_all()
    # How busy the reader itself was (near 100: it may have lagged).
    client_cpu = 100.0 * (marks["client_cpu_end"] - marks["client_cpu_start"]) / (
        t1 + 0.02 - t0)
    return Run(conns=conns, specs=specs, base=base, t0=t0, t1=t1, split=split,
               stat=stat, marks=marks, errors=errors(conns), shaping=shaping,
               client_cpu_pct=round(client_cpu, 1))


def placed(bench, srv, specs):
    """Source ports for specs (0: any): the specs of one source with place
    (default True) take srv's workers in turn (Bench.place)."""
    by_source = {}
    for i, spec in enumerate(specs):
        if spec.get("place", True):
            by_source.setdefault(spec["source"], []).append(i)
    ports = [0] * len(specs)
    for source, idx in by_source.items():
        for i, port in zip(idx, bench.place(srv, source, len(idx))):
            ports[i] = port
    return ports


def drive_parallel(bench, jobs, duration, limit_s=120.0, **kw):
    """drive() for several servers at once: jobs is a list of (srv, specs);
    returns their Runs in order, or for a job that failed the exception's
    text (a str). Source ports are chosen here first, one server after the
    other (the probes must not collide); then each job's client runs in a
    process of its own, forked, so that one Python reader's work never
    delays another's timestamps. Warnings of the children reach bench.warn.
    Every child is waited for at most limit_s and killed (by pid) after."""
    ports = [placed(bench, srv, specs) for srv, specs in jobs]
    children = []
    try:
        for (srv, specs), job_ports in zip(jobs, ports):
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: drive, send back the Run, exit
                os.close(r)
                try:
                    bench.warnings = []
                    run = drive(bench, srv, specs, duration, ports=job_ports, **kw)
                    for c in run.conns:
                        c.sock = None
                    data = pickle.dumps((run, bench.warnings))
                except BaseException:
                    data = pickle.dumps(("drive failed: " + traceback.format_exc(),
                                         bench.warnings))
                try:
                    with os.fdopen(w, "wb") as f:
                        f.write(data)
                finally:
                    os._exit(0)
            os.close(w)
            children.append([pid, r, bytearray(), False])
        deadline = time.monotonic() + limit_s
        while not all(ch[3] for ch in children):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            open_fds = [ch[1] for ch in children if not ch[3]]
            ready, _, _ = select.select(open_fds, [], [], min(left, 1.0))
            for ch in children:
                if ch[1] in ready:
                    chunk = os.read(ch[1], 1 << 20)
                    if chunk:
                        ch[2] += chunk
                    else:
                        ch[3] = True
    finally:
        for ch in children:
            if not ch[3]:
                os.kill(ch[0], 9)
            os.close(ch[1])
            os.waitpid(ch[0], 0)
    runs = []
    for (srv, _), ch in zip(jobs, children):
        if not ch[3]:
            runs.append("its client did not finish within %.0f s" % limit_s)
            continue
        if not ch[2]:
            runs.append("its client exited without a result")
            continue
        result, warnings = pickle.loads(bytes(ch[2]))
        for text in warnings:
            bench.warn(text)
        runs.append(result)
    return runs


def errors(conns):
    return ["%s: %s" % (c.label or c.source, c.error) for c in conns if c.error]


def bad_status(conns, ok=(200, 206)):
    return [c for c in conns if c.status is not None and c.status not in ok]


# -------------------------------------------------------------------- figures

def total_rate(conns, t0, t1):
    return sum(c.rate(t0, t1) for c in conns)


def windows(conns, t0, t1, step=1.0):
    """Summed B/s of conns in consecutive windows [t0 + i, t0 + i + 1)."""
    return [total for _, _, total, _ in harness.bucket_rates(conns, t0, t1, step)]


def jain(values):
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 = all equal."""
    values = list(values)
    sq = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * sq) if sq else 0.0


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


def thread_cpu(pid, tid=None):
    """CPU time of a process (or one of its threads) in seconds; None if
    gone. A thread's comes from /proc/<pid>/task/<tid>/schedstat (its run
    time in ns: stat's utime + stime count whole clock ticks, 10 ms, which
    is a tenth of the watcher's allowance at 9 000 connections over 10 s);
    a process's from /proc/<pid>/stat."""
    if tid is not None:
        try:
            with open("/proc/%d/task/%d/schedstat" % (pid, tid), "rb") as f:
                return int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            pass
    path = "/proc/%d/stat" % pid if tid is None else "/proc/%d/task/%d/stat" % (pid, tid)
    try:
        with open(path, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14, 15 of stat


def process_cpu(pid):
    """CPU time of all of a process's threads in seconds, from their
    schedstat run times (ns); None if it is gone."""
    total = 0
    try:
        tids = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return None
    for tid in tids:
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, tid), "rb") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass  # a thread that ended in between
    return total / 1e9


# Hard and soft interrupt entry/exit tracepoints (x86). Without IRQ time
# accounting (Debian's kernels, this one) a thread's run time includes the
# interrupts handled while it runs: on loopback, the kernel sending paced
# packets and the client receiving them, work that would run anyway and that
# the kernel charges to whatever is on the CPU.
IRQ_EVENTS = ("irq:softirq", "irq:irq_handler", "irq_vectors:local_timer",
              "irq_vectors:call_function", "irq_vectors:call_function_single",
              "irq_vectors:reschedule")


# Frames that put a sampled stack in interrupt context: a hard interrupt's
# entry (and the softirqs run on its exit), or softirqs run where a thread
# enables them again (local_bh_enable), all through handle_softirqs.
IRQ_FRAMES = ("asm_sysvec_", "sysvec_", "asm_common_interrupt",
              "common_interrupt", "__irq_exit_rcu", "irq_exit_rcu",
              "handle_softirqs", "__do_softirq", "do_softirq")
# Stack samples per second of a traced thread's run time.
SAMPLE_HZ = 4999


class InterruptTrace:
    """The time some threads spend in interrupt context, two ways, from start
    until stop(), in one `perf record` on just those threads:
    - bracketed: the kernel's irq and softirq entry/exit tracepoints, nested
      interrupts (a timer during a softirq) counted once. Exact for what they
      bracket, but not all interrupt work lies between them: the entry and
      exit paths, and handle_softirqs' own work between softirq actions
      (on this machine's paravirtualised kernel, interrupts held back while
      a softirq ran are delivered at its irq-enable there: 16% of the
      watchers' samples at 10 000 keys, outside every bracket);
    - sampled: stack samples (SAMPLE_HZ of run time), each in interrupt
      context if an IRQ_FRAMES frame is on its stack (`samples`).
    If perf is missing or refuses, stop() returns None and `error` says
    why."""

    def __init__(self, tids, workdir):
        self.tids = [int(t) for t in tids]
        self.error = None
        self.proc = None
        self.samples = None  # {tid: [samples, in interrupt context]}
        self.data = Path(workdir) / ("irq-%d.perf" % os.getpid())
        self.perf = shutil.which("perf")
        if not self.tids:
            self.error = "no threads to trace"
        elif self.perf is None:
            self.error = "perf not found (Debian package linux-perf)"
        else:
            events = []
            for e in IRQ_EVENTS:
                events += ["-e", e + "_entry", "-e", e + "_exit"]
            events += ["-e", "cpu-clock/freq=%d,call-graph=fp/" % SAMPLE_HZ]
            self.proc = subprocess.Popen(
                [self.perf, "record", "-q", "-o", str(self.data), "-t",
                 ",".join(str(t) for t in self.tids)] + events,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            # Attached once it has written its header (bounded wait).
            deadline = time.monotonic() + 3.0
            while (self.proc.poll() is None and time.monotonic() < deadline
                   and not (self.data.exists() and self.data.stat().st_size > 0)):
                time.sleep(0.05)
            if self.proc.poll() is not None:
                self._failed(self.proc.stderr.read())

    def _failed(self, stderr):
        lines = [x for x in stderr.decode(errors="replace").splitlines() if x.strip()]
        self.error = "perf record failed: %s" % " ".join(lines[:2])
        self.proc = None

    def stop(self):
        """{tid: seconds in interrupt context}, or None (see error)."""
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.error = "perf record did not stop"
            return None
        if self.proc.returncode not in (0, -signal.SIGINT) or b"Error" in err:
            self._failed(err)
            return None
        try:
            out = subprocess.run(
                [self.perf, "script", "-i", str(self.data), "--ns", "-F",
                 "tid,time,event,ip,sym"], capture_output=True, text=True,
                timeout=300).stdout
        except (OSError, subprocess.SubprocessError) as e:
            self.error = "perf script: %s" % e
            return None
        finally:
            try:
                self.data.unlink()
            except OSError:
                pass
        depth, since, spent = {}, {}, {t: 0.0 for t in self.tids}
        self.samples = {t: [0, 0] for t in self.tids}
        sample = None  # [tid, in interrupt context] of the stack being read

        def count(sample):
            if sample is not None:
                counts = self.samples.setdefault(sample[0], [0, 0])
                counts[0] += 1
                counts[1] += sample[1]

        for line in out.splitlines():
            if line.startswith("\t"):
                # A frame of the last stack sample: "<ip> <symbol>" (the
                # other lines begin with the tid, padded with spaces).
                frame = line.split()
                if (sample is not None and not sample[1] and len(frame) > 1
                        and frame[1].startswith(IRQ_FRAMES)):
                    sample[1] = 1
                continue
            count(sample)
            sample = None
            parts = line.split()
            if len(parts) < 3:
                continue
            try:
                tid, at = int(parts[0]), float(parts[1].rstrip(":"))
            except ValueError:
                continue
            event = parts[2].rstrip(":")
            if event.startswith("cpu-clock"):
                sample = [tid, 0]
            elif event.endswith("_entry"):
                if depth.get(tid, 0) == 0:
                    since[tid] = at
                depth[tid] = depth.get(tid, 0) + 1
            elif event.endswith("_exit") and depth.get(tid, 0) > 0:
                depth[tid] -= 1
                if depth[tid] == 0:
                    spent[tid] = spent.get(tid, 0.0) + at - since.pop(tid)
        count(sample)
        # No event at all: no interrupt came while they ran (an upper bound
        # for their own CPU either way).
        return spent

    def sample_totals(self):
        """[stack samples, in interrupt context] over all threads, or None
        before stop() counted them."""
        if self.samples is None:
            return None
        return [sum(n for n, _ in self.samples.values()),
                sum(i for _, i in self.samples.values())]


def lib_mode(mode):
    """The share mode of a library mode (LIB_MODES, or one of them with
    NO_SHAPE), or None if mode runs no library."""
    base = mode[:-len(NO_SHAPE)] if mode.endswith(NO_SHAPE) else mode
    return base if base in LIB_MODES else None


def outside_interrupts(run_s, irq_s):
    """Threads' CPU seconds outside interrupts: their run time run_s less
    what InterruptTrace.stop() returned for them; None if that is None."""
    return None if irq_s is None else max(0.0, run_s - sum(irq_s.values()))


def outside_interrupts_sampled(run_s, trace):
    """Threads' CPU seconds outside interrupts by their stack samples: run_s
    times the part of trace's samples (InterruptTrace, stopped) not in
    interrupt context; None without samples."""
    totals = None if trace is None else trace.sample_totals()
    if not totals or totals[0] == 0:
        return None
    return run_s * (totals[0] - totals[1]) / totals[0]


def watcher_tids(pid, name="trafficrate"):
    """Threads of pid named `name` (the library's watcher sets it)."""
    tids = []
    try:
        for entry in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/comm" % (pid, entry)) as f:
                    if f.read().strip() == name:
                        tids.append(int(entry))
            except OSError:
                pass
    except OSError:
        pass
    return tids


def sleep_until(t):
    time.sleep(max(0.0, t - time.monotonic()))


# ---------------------------------------------------------------- table rows

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
