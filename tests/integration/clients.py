"""Clients for the trafficrate integration tests (part of harness.py).

  * Download: one HTTP GET of a big file from a chosen source address, e.g.
    127.0.0.2, recording cumulative body bytes against time.monotonic();
    DownloadSet / run_downloads() run many in parallel; KeepaliveDownload
    (many GETs, one after the other, on one keep-alive connection) and
    PausingDownload (stops reading for a while, then goes on);
  * every client here hands each response's body to a bodies.Body, which
    undoes chunked framing and gzip, hashes the content and is checked
    after each test (conftest.py): every byte must be the served file's;
  * the HTTP client underneath (http_get(), open_keepalive(),
    keepalive_get()) is in http_client.py; Measurement, bucket_rates(),
    within() and the PauseWatch (pauses_in()) in measurement.py; who serves
    whom (socket_owners(), ports_by_worker()) in who_serves.py;
  * the shared-budget scenarios' clients (a slow reader, Range requests,
    small keep-alive requests) are in budget_clients.py.

Standard library only; import it through harness (`import harness`).
"""

import array
import bisect
import fcntl
import socket
import struct
import termios
import threading
import time

from http_client import _body, _connect, _read_head, _request
from measurement import Measurement, pause_watch
from netns_env import BIG_FILE, MEDIUM_FILE, SERVER_HOST
from procs import wait_for
from who_serves import socket_owners


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
