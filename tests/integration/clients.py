"""Clients and measurements for the trafficrate integration tests (part of
harness.py).

  * HTTP: http_get() (one small complete GET), open_keepalive() and
    keepalive_get() for idle keep-alive connections;
  * Download: one HTTP GET of a big file from a chosen source address, e.g.
    127.0.0.2, recording cumulative body bytes against time.monotonic();
    DownloadSet / run_downloads() run many in parallel; KeepaliveDownload
    (many GETs, one after the other, on one keep-alive connection) and
    PausingDownload (stops reading for a while, then goes on);
  * every client here hands each response's body to a bodies.Body, which
    undoes chunked framing and gzip, hashes the content and is checked
    after each test (conftest.py): every byte must be the served file's;
  * Measurement (rates over a window), bucket_rates() (per-second rates) and
    within() to compare a rate with its target; pauses_in() says where this
    client process itself stood still (PauseWatch), so that a second whose
    bytes it read late is not judged as the server's;
  * who serves whom: socket_owners() (which pid holds which TCP connection,
    via ss), established(), and probe_owner() / ports_by_worker() to pick
    source ports that land on chosen nginx reuseport workers.
  * the shared-budget scenarios' clients (a slow reader, Range requests,
    small keep-alive requests) are in budget_clients.py.

Standard library only; import it through harness (`import harness`).
"""

import array
import bisect
import fcntl
import re
import socket
import struct
import subprocess
import termios
import threading
import time

from bodies import Body
from netns_env import BIG_FILE, MEDIUM_FILE, SERVER_HOST, SMALL_FILE
from procs import wait_for

# ---------------------------------------------------------------- HTTP client

def _connect(port, source=None, host=SERVER_HOST, timeout=5.0, source_port=0,
             rcvbuf=None):
    v6 = ":" in host  # an IPv6 server address: so is the source
    sock = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET,
                         socket.SOCK_STREAM)
    try:
        if rcvbuf is not None:  # before connect, so the window is sized by it
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.settimeout(timeout)
        if source or source_port:
            if source_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((source or ("::" if v6 else "0.0.0.0"), source_port or 0))
        sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _host(host):
    return "[%s]" % host if ":" in host else host  # IPv6 in brackets


def _url(host, port, path):
    return "http://%s:%d%s" % (_host(host), port, path)


def _request(path, host, port, keepalive, headers=None):
    """A GET request; headers: more header lines, {name: value}."""
    extra = "".join("%s: %s\r\n" % kv for kv in (headers or {}).items())
    return ("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: trafficrate-it\r\n"
            "%sConnection: %s\r\n\r\n" % (path, _host(host), port, extra,
                                          "keep-alive" if keepalive else "close")
            ).encode()


def _body(path, host, port, status, headers, label=None, verify=True):
    """The bodies.Body of a 200 or 206 response (None for other statuses,
    whose bodies are not the file's)."""
    if status not in (200, 206):
        return None
    return Body(path, headers, status, label=label,
                url=_url(host, port, path), verify=verify)


def _read_head(sock, deadline):
    """Read a response head; returns (status, headers, leftover body bytes)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        if time.monotonic() > deadline or len(buf) > 65536:
            raise TimeoutError("no complete response head")
        try:
            chunk = sock.recv(65536)
        except socket.timeout:
            continue
        if not chunk:
            raise ConnectionError("connection closed before response head")
        buf += chunk
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, rest


def http_get(port, path=SMALL_FILE, source=None, host=SERVER_HOST, timeout=5.0,
             max_body=1 << 20):
    """A small complete GET (Connection: close): (status, headers, body)."""
    deadline = time.monotonic() + timeout
    with _connect(port, source, host, timeout) as sock:
        sock.settimeout(min(timeout, 0.5))
        sock.sendall(_request(path, host, port, keepalive=False))
        status, headers, body = _read_head(sock, deadline)
        checked = _body(path, host, port, status, headers, label=source)
        if checked:
            checked.feed(body)
        length = int(headers.get("content-length", max_body))
        while len(body) < min(length, max_body) and time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                if checked:
                    checked.end()
                break
            if checked:
                checked.feed(chunk)
            body += chunk
        return status, headers, body


def open_keepalive(port, path=SMALL_FILE, source=None, host=SERVER_HOST,
                   timeout=5.0):
    """Complete one keep-alive GET and return the still-open, idle socket.

    The caller owns the socket (close it). Reuse it with keepalive_get().
    """
    sock = _connect(port, source, host, timeout)
    try:
        keepalive_get(sock, port, path, host, timeout)
    except BaseException:
        sock.close()
        raise
    return sock


def keepalive_get(sock, port, path=SMALL_FILE, host=SERVER_HOST, timeout=5.0):
    """Another complete GET on an open keep-alive socket; returns the body."""
    deadline = time.monotonic() + timeout
    sock.settimeout(0.5)
    sock.sendall(_request(path, host, port, keepalive=True))
    status, headers, body = _read_head(sock, deadline)
    if status != 200 or "content-length" not in headers:
        raise RuntimeError("unexpected response %d %r" % (status, headers))
    checked = _body(path, host, port, status, headers)
    checked.feed(body)
    length = int(headers["content-length"])
    while len(body) < length:
        if time.monotonic() > deadline:
            raise TimeoutError("keep-alive body incomplete")
        try:
            chunk = sock.recv(min(65536, length - len(body)))
        except socket.timeout:
            continue
        if not chunk:
            raise ConnectionError("keep-alive connection closed")
        checked.feed(chunk)
        body += chunk
    return body


class PauseWatch(threading.Thread):
    """Where this client process stood still: a thread that wakes every
    TICK_S and records each gap longer than PAUSE_S between two wakes.

    Every client here is a Python thread of the test process; when that
    process does not run (a thread holding the GIL blocked in the kernel:
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


class Download(threading.Thread):
    """One HTTP GET of a big file from a chosen source address, read flat out.

    Starts at monotonic time `start_at`, stops (closes) at `stop_at` or when
    stop() is called. Records (monotonic time, cumulative body bytes) after
    every recv; bytes_at()/rate() turn that into rates over any window.
    These are the body's bytes as they come on the wire (after the response
    head; a chunked or gzip body's framing and compressed bytes). With
    repeat=True a finished response is followed by a new connection (for
    unlimited downloads that may finish the file). headers: more request
    headers, e.g. {"Accept-Encoding": "gzip"}.

    Each response's body goes to a bodies.Body (self.bodies, the current
    one self.body), which checks after the test that every byte is the
    served file's; verify=False leaves it out of that check (skipped).
    """

    RECV_SIZE = 256 * 1024
    KEEPALIVE = False  # Connection: close, the body read to the server's FIN

    def __init__(self, port, source=None, path=BIG_FILE, label=None,
                 start_at=None, stop_at=None, host=SERVER_HOST, repeat=False,
                 recv_timeout=0.25, source_port=0, headers=None, verify=True):
        super().__init__(daemon=True)
        self.port, self.source, self.path, self.host = port, source, path, host
        self.source_port = source_port  # 0: any (see ports_by_worker)
        self.label = label or (source or "default")
        self.start_at = start_at if start_at is not None else time.monotonic()
        self.stop_at = stop_at if stop_at is not None else self.start_at + 10.0
        self.repeat = repeat
        self.recv_timeout = recv_timeout
        self.headers = dict(headers or {})
        self.verify = verify
        self.times = array.array("d")
        self.totals = array.array("q")
        self.total = 0
        self.bodies = []
        self.body = None
        self.connected_at = None
        self.first_byte_at = None
        self.finished_at = None
        self.local_port = None
        self.status = None
        self.response_headers = None
        self.error = None
        self.eof = False
        self._stop_event = threading.Event()

    def start(self):
        pause_watch()
        super().start()

    def stop(self):
        self._stop_event.set()

    def _running(self):
        return not self._stop_event.is_set() and time.monotonic() < self.stop_at

    def run(self):
        try:
            delay = self.start_at - time.monotonic()
            if delay > 0 and self._stop_event.wait(delay):
                return
            while self._running():
                self._one_request()
                if not self.repeat:
                    break
        except Exception as e:  # reported through .error
            self.error = "%s: %s" % (type(e).__name__, e)
        finally:
            self.finished_at = time.monotonic()

    def _note(self, now):
        self.times.append(now)
        self.totals.append(self.total)

    def _connect(self):
        return _connect(self.port, self.source, self.host,
                        source_port=self.source_port)

    def _one_request(self):
        with self._connect() as sock:
            now = time.monotonic()
            if self.connected_at is None:
                self.connected_at = now
            self.local_port = sock.getsockname()[1]
            self._note(now)
            sock.settimeout(self.recv_timeout)
            self._exchange(sock)

    def _exchange(self, sock):
        """Sends the request, reads the response head and then the body."""
        sock.sendall(_request(self.path, self.host, self.port,
                              keepalive=self.KEEPALIVE, headers=self.headers))
        self.status, self.response_headers, rest = _read_head(
            sock, time.monotonic() + 10.0)
        if self.status not in (200, 206):
            raise RuntimeError("HTTP status %d" % self.status)
        self.body = _body(self.path, self.host, self.port, self.status,
                          self.response_headers, label=self.label,
                          verify=self.verify)
        self.bodies.append(self.body)
        if rest:
            self._take(rest, len(rest), time.monotonic())
        self._read_body(sock)

    def _take(self, buf, n, now):
        """n bytes of the body arrived in buf at `now`: count and check them."""
        if self.first_byte_at is None:
            self.first_byte_at = now
        used = self.body.feed(buf, 0, n)
        if used < n:
            raise RuntimeError("%d bytes after the end of a response body"
                               % (n - used))
        self.total += n
        self._note(now)

    def _read_body(self, sock):
        buf = bytearray(self.RECV_SIZE)
        while self._running() and not (self.KEEPALIVE and self.body.complete):
            if self._recv_into(sock, buf) == 0:
                return

    def _recv_into(self, sock, buf, size=0):
        """One recv of the body (at most `size` bytes, 0: the buffer's
        length): counts and notes what came and returns its length; at the
        end of the body sets eof and returns 0; None on a receive timeout."""
        try:
            n = sock.recv_into(buf, size)
        except socket.timeout:
            return None
        if n == 0:
            self.eof = True
            self.body.end()
            return 0
        self._take(buf, n, time.monotonic())
        return n

    def bytes_at(self, t):
        """Body bytes received by monotonic time t (as last seen by recv)."""
        n = min(len(self.times), len(self.totals))
        i = bisect.bisect_right(self.times, t, 0, n)
        return self.totals[i - 1] if i else 0

    def rate(self, t0, t1):
        """Bytes per second received in [t0, t1]."""
        return (self.bytes_at(t1) - self.bytes_at(t0)) / (t1 - t0)


class KeepaliveDownload(Download):
    """GETs of `path` (default medium.bin) one after the other on one
    keep-alive connection, each body read to its end before the next
    request is sent, from start_at until stop_at, at most max_requests.
    Rates are over all their bodies' bytes, as for a Download; `requests`
    counts the complete responses. The server must keep the connection
    open (nginx's keepalive_requests is 1000 by default)."""

    KEEPALIVE = True

    def __init__(self, port, source=None, path=MEDIUM_FILE, max_requests=1000,
                 **kw):
        super().__init__(port, source, path, **kw)
        self.max_requests = max_requests
        self.requests = 0

    def _exchange(self, sock):
        while self._running() and self.requests < self.max_requests:
            super()._exchange(sock)
            if not self.body.complete:
                return
            self.requests += 1


class PausingDownload(Download):
    """A Download that stops reading at monotonic time pause_at for pause_s
    seconds, then reads flat out again. Meanwhile the server goes on
    sending until the client's receive buffer (and its own send buffer) is
    full. At the resume it notes resumed_at, the body bytes received by
    then (at_resume) and how many the kernel held in the client's receive
    queue (queued_at_resume, SIOCINQ): those arrive at once on the first
    reads. drained_at() is when they had been read; a rate measured from
    then on is the server's sending rate again."""

    def __init__(self, port, source=None, pause_at=None, pause_s=3.0, **kw):
        super().__init__(port, source, **kw)
        self.pause_at = pause_at if pause_at is not None else self.start_at + 2.0
        self.pause_s = pause_s
        self.paused_at = self.resumed_at = None
        self.at_pause = self.at_resume = self.queued_at_resume = None

    def _read_body(self, sock):
        buf = bytearray(self.RECV_SIZE)
        while self._running():
            if self.paused_at is None and time.monotonic() >= self.pause_at:
                self.paused_at, self.at_pause = time.monotonic(), self.total
                if self._stop_event.wait(self.pause_s):
                    return
                queued = fcntl.ioctl(sock.fileno(), termios.FIONREAD,
                                     struct.pack("i", 0))
                self.queued_at_resume = struct.unpack("i", queued)[0]
                self.at_resume, self.resumed_at = self.total, time.monotonic()
            if self._recv_into(sock, buf) == 0:
                return

    def drained_at(self):
        """When the bytes queued at the resume had been read (None: not
        resumed, or not read yet)."""
        if self.resumed_at is None:
            return None
        goal = self.at_resume + self.queued_at_resume
        n = min(len(self.times), len(self.totals))
        i = bisect.bisect_left(self.totals, goal, 0, n)
        return self.times[i] if i < n else None


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


class DownloadSet:
    """Parallel downloads, all from one start time."""

    def __init__(self, port, sources, path=BIG_FILE, duration=10.0,
                 start_delay=0.05, repeat=False, host=SERVER_HOST,
                 source_ports=None):
        """source_ports: optional list parallel to sources (0 = any), e.g.
        from ports_by_worker() to choose which reuseport worker serves each."""
        self.start_at = time.monotonic() + start_delay
        self.stop_at = self.start_at + duration
        counts = {}
        self.downloads = []
        source_ports = list(source_ports or [])
        for i, source in enumerate(sources):
            counts[source] = counts.get(source, 0) + 1
            self.downloads.append(Download(
                port, source, path, label="%s#%d" % (source, counts[source]),
                start_at=self.start_at, stop_at=self.stop_at, host=host,
                repeat=repeat,
                source_port=source_ports[i] if i < len(source_ports) else 0))
        self.port, self.host = port, host
        self.owners = {}

    def start(self):
        for d in self.downloads:
            d.start()
        return self

    def add(self, source, start_after=0.0, stop_after=None, path=BIG_FILE,
            source_port=0):
        """Start one more download `start_after` s after this set's start,
        ending `stop_after` s after the set's start (default: with the set).
        For join/leave scenarios; returns the started Download."""
        count = 1 + sum(1 for d in self.downloads if d.source == source)
        d = Download(self.port, source, path, label="%s#%d" % (source, count),
                     start_at=self.start_at + start_after,
                     stop_at=self.start_at + stop_after if stop_after else self.stop_at,
                     host=self.host, source_port=source_port)
        self.downloads.append(d)
        d.start()
        return d

    def stop(self):
        for d in self.downloads:
            d.stop()

    def join(self, timeout=None):
        """Wait for all downloads; bounded by stop_at + a margin by default."""
        deadline = time.monotonic() + (timeout if timeout is not None else
                                       max(0.0, self.stop_at - time.monotonic()) + 5.0)
        for d in self.downloads:
            d.join(max(0.0, deadline - time.monotonic()))
        return all(not d.is_alive() for d in self.downloads)

    def all_started(self):
        """Monotonic time by which every download had connected, or None."""
        times = [d.connected_at for d in self.downloads]
        return None if None in times else max(times)

    def wait_started(self, timeout=10.0):
        return wait_for(self.all_started, timeout)

    def record_owners(self):
        """Map each download's label to the pid(s) serving it (via ss)."""
        by_port = {o["peer"]: o["pids"] for o in socket_owners(self.port)}
        for d in self.downloads:
            pids = by_port.get((d.source or "127.0.0.1", d.local_port))
            if pids:
                self.owners[d.label] = ",".join(str(p) for p in sorted(set(pids)))
        return self.owners

    def pids_by_label(self):
        """label -> set of pids holding that download's connection now."""
        self.owners.clear()
        self.record_owners()
        return {label: {int(p) for p in pids.split(",")}
                for label, pids in self.owners.items()}

    def errors(self):
        return ["%s: %s" % (d.label, d.error) for d in self.downloads if d.error]

    def measure(self, t0, t1, target=None):
        return Measurement(self.downloads, t0, t1, target, self.owners)


def run_downloads(port, sources, warmup=2.0, window=8.0, target=None,
                  path=BIG_FILE, repeat=False, host=SERVER_HOST):
    """Run parallel downloads and measure [all started + warmup, + window].

    `sources` lists one source address per download, e.g.
    ["127.0.0.2"] * 4 + ["127.0.0.3"]. Returns a Measurement; raises if the
    downloads could not all start.
    """
    dset = DownloadSet(port, sources, path, duration=warmup + window + 1.0,
                       repeat=repeat, host=host).start()
    try:
        started = dset.wait_started(10.0)
        if not started:
            raise RuntimeError("downloads did not all connect: %s"
                               % (dset.errors() or "timeout"))
        t0 = started + warmup
        t1 = t0 + window
        # Who serves whom, looked up while all connections are open.
        time.sleep(min(warmup, 1.0))
        dset.record_owners()
        time.sleep(max(0.0, t1 + 0.05 - time.monotonic()))
    finally:
        dset.stop()
        dset.join(10.0)
    return dset.measure(t0, t1, target)


# ------------------------------------------------------------- who serves whom

def socket_owners(port, host=SERVER_HOST):
    """Established TCP connections on local host:port and the pids holding them.

    Returns a list of dicts {peer: (ip, port), pids: [..], fds: [..]}, from
    `ss -Htnp`. Useful to see which nginx worker serves which download.
    """
    out = subprocess.run(
        ["ss", "-Htnp", "state", "established", "( sport = :%d )" % port],
        capture_output=True, text=True, timeout=10).stdout
    result = []
    for line in out.splitlines():
        m = re.search(r"(\S+):(\d+)\s+(\S+):(\d+)\s+(users:.*)?$", line)
        if not m or m.group(1) != host:
            continue
        users = m.group(5) or ""
        result.append({
            "peer": (m.group(3), int(m.group(4))),
            "pids": [int(p) for p in re.findall(r"pid=(\d+)", users)],
            "fds": [int(f) for f in re.findall(r"fd=(\d+)", users)],
        })
    return result


def established(port, source=None, host=SERVER_HOST):
    """How many established connections to host:port (from source) exist."""
    return len([o for o in socket_owners(port, host)
                if source is None or o["peer"][0] == source])


# Source ports for probe_owner()/ports_by_worker(): below the kernel's
# ephemeral range (ip_local_port_range 32768-60999), so bind(0) never picks them.
PROBE_PORT_FIRST, PROBE_PORT_LAST = 20000, 32000
_next_probe_port = PROBE_PORT_FIRST


def probe_owner(port, source, source_port, host=SERVER_HOST, timeout=2.0):
    """Which pid accepts a connection from source:source_port to host:port?

    Connects, waits until `ss` shows the accepting process, then resets the
    connection (SO_LINGER 0: no TIME_WAIT, the port is free again at once).
    The probe sends nothing, so it never joins a key. With nginx `listen ...
    reuseport` the kernel picks the worker's socket by a hash of the 4-tuple,
    so a later connection from the same source port lands on the same worker
    (as long as the worker set is the same).
    """
    sock = _connect(port, source, host, timeout, source_port=source_port)
    try:
        def owner():
            for o in socket_owners(port, host):
                if o["peer"] == (source, source_port) and o["pids"]:
                    return o["pids"]
            return None
        pids = wait_for(owner, timeout, 0.005)
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    return pids[0] if pids else None


def ports_by_worker(port, source, wanted, host=SERVER_HOST, max_probes=200):
    """Source ports whose connections land on chosen worker processes.

    wanted: {pid: how many ports}. Returns {pid: [source ports]}. Needs a
    server whose workers each listen on their own reuseport socket (nginx
    `listen ... reuseport`). Raises RuntimeError if the probes do not find
    enough ports for every pid.
    """
    global _next_probe_port
    found = {pid: [] for pid in wanted}
    seen = {}
    for _ in range(max_probes):
        if all(len(found[pid]) >= n for pid, n in wanted.items()):
            return found
        sport = _next_probe_port
        _next_probe_port += 1
        if _next_probe_port > PROBE_PORT_LAST:
            _next_probe_port = PROBE_PORT_FIRST
        try:
            pid = probe_owner(port, source, sport, host)
        except OSError:
            continue  # port busy: try the next one
        seen[pid] = seen.get(pid, 0) + 1
        if pid in found and len(found[pid]) < wanted[pid]:
            found[pid].append(sport)
    raise RuntimeError("ports_by_worker: wanted %s, found %s after %d probes "
                       "(accepting pids seen: %s)" % (wanted, found, max_probes, seen))


def within(value, target, tolerance):
    """|value / target - 1| <= tolerance."""
    return abs(value / target - 1.0) <= tolerance
