"""Clients for the shared-budget scenarios of test_budget_*.py (part of
harness.py; harness re-exports PacedDownload, import the others from here):

  * PacedDownload: a Download read slowly (small SO_RCVBUF, paced reads);
  * RangeFetches: Range requests, each on a new connection with
    Connection: close, in parallel at a fixed pace or back to back;
  * KeepaliveRequests: sequential small Range requests on one keep-alive
    connection.

Like every client of clients.py they hand each response body to a
bodies.Body, so every byte is checked after the test.

Standard library only.
"""

import array
import bisect
import socket
import threading
import time

from clients import Download
from http_client import _body, _connect, _read_head
from netns_env import BIG_FILE, SERVER_HOST


def _range_request(path, host, port, size, keepalive):
    """GET of the first `size` bytes of path (206 Partial Content)."""
    return ("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: trafficrate-it\r\n"
            "Range: bytes=0-%d\r\nConnection: %s\r\n\r\n"
            % (path, host, port, size - 1, "keep-alive" if keepalive else "close")
            ).encode()


class PacedDownload(Download):
    """A Download read slowly: SO_RCVBUF is set to `rcvbuf` before connecting
    (the kernel doubles it) so that little waits on the client's side, and
    the body is read at `read_rate` B/s at most (a token bucket of
    READ_CHUNK-byte reads holding at most 2 chunks of credit). The server's
    send queue stays full, so its connection keeps sending, slowly."""

    READ_CHUNK = 2048

    def __init__(self, port, source=None, read_rate=20480, rcvbuf=16384, **kw):
        super().__init__(port, source, **kw)
        self.read_rate, self.rcvbuf = read_rate, rcvbuf

    def _connect(self):
        return _connect(self.port, self.source, self.host,
                        source_port=self.source_port, rcvbuf=self.rcvbuf)

    def _read_body(self, sock):
        buf = bytearray(self.READ_CHUNK * 2)
        credit, last = 0.0, time.monotonic()
        while self._running():
            now = time.monotonic()
            credit = min(credit + (now - last) * self.read_rate, 2.0 * self.READ_CHUNK)
            last = now
            if credit < self.READ_CHUNK:
                self._stop_event.wait((self.READ_CHUNK - credit) / self.read_rate)
                continue
            n = self._recv_into(sock, buf, int(credit))
            if n == 0:
                return
            if n:  # None: a receive timeout, nothing came
                credit -= n


class _Fetch:
    """One Range GET on its own connection (RangeFetches)."""

    def __init__(self):
        self.times = array.array("d")
        self.totals = array.array("q")
        self.total = 0
        self.started_at = None
        self.ended_at = None
        self.status = None
        self.complete = False  # the whole range, then EOF
        self.error = None
        self.body = None  # its bodies.Body

    def bytes_at(self, t):
        n = min(len(self.times), len(self.totals))
        i = bisect.bisect_right(self.times, t, 0, n)
        return self.totals[i - 1] if i else 0


class RangeFetches(threading.Thread):
    """New connections from one source, each one GET of the first `size`
    bytes of `path` (a Range request, Connection: close), read flat out to
    the server's FIN.

    interval: start one every `interval` s, each on its own thread, in
    parallel; None: back to back, one at a time, the next as soon as the
    previous one ended. From start_at until stop_at, at most max_fetches.
    Like a Download it has source, label, error, eof, bytes_at() and rate(),
    over the body bytes of all its fetches, so Measurement and bucket_rates()
    take it.
    """

    RECV_SIZE = 256 * 1024

    def __init__(self, port, source=None, size=64 * 1024, interval=0.1,
                 path=BIG_FILE, label=None, start_at=None, stop_at=None,
                 max_fetches=200, host=SERVER_HOST, recv_timeout=0.25):
        super().__init__(daemon=True)
        self.port, self.source, self.path, self.host = port, source, path, host
        self.size, self.interval, self.max_fetches = size, interval, max_fetches
        self.label = label or "%s ranges" % (source or "default")
        self.start_at = start_at if start_at is not None else time.monotonic()
        self.stop_at = stop_at if stop_at is not None else self.start_at + 10.0
        self.recv_timeout = recv_timeout
        self.fetches = []
        self.threads = []
        self.eof = False
        self._stop_event = threading.Event()

    @property
    def error(self):
        errors = [f.error for f in self.fetches if f.error]
        return ("%d of %d fetches failed, first: %s" % (
            len(errors), len(self.fetches), errors[0])) if errors else None

    def stop(self):
        self._stop_event.set()

    def _running(self):
        return not self._stop_event.is_set() and time.monotonic() < self.stop_at

    def run(self):
        delay = self.start_at - time.monotonic()
        if delay > 0 and self._stop_event.wait(delay):
            return
        while self._running() and len(self.fetches) < self.max_fetches:
            fetch = _Fetch()
            self.fetches.append(fetch)
            if self.interval is None:
                self._fetch(fetch)
                continue
            t = threading.Thread(target=self._fetch, args=(fetch,), daemon=True)
            self.threads.append(t)
            t.start()
            next_at = self.start_at + len(self.fetches) * self.interval
            self._stop_event.wait(max(0.0, next_at - time.monotonic()))

    def join(self, timeout=None):
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        super().join(timeout)
        for t in list(self.threads):
            t.join(max(0.0, deadline - time.monotonic()))

    def _fetch(self, fetch):
        fetch.started_at = time.monotonic()
        try:
            with _connect(self.port, self.source, self.host) as sock:
                sock.settimeout(self.recv_timeout)
                sock.sendall(_range_request(self.path, self.host, self.port,
                                            self.size, keepalive=False))
                fetch.status, headers, body = _read_head(
                    sock, time.monotonic() + 10.0)
                if fetch.status != 206:
                    raise RuntimeError("HTTP status %d" % fetch.status)
                fetch.body = _body(self.path, self.host, self.port, fetch.status,
                                   headers, label=self.label)
                fetch.body.feed(body)
                fetch.total = len(body)
                fetch.times.append(time.monotonic())
                fetch.totals.append(fetch.total)
                buf = bytearray(self.RECV_SIZE)
                while self._running():
                    try:
                        n = sock.recv_into(buf)
                    except socket.timeout:
                        continue
                    if n == 0:
                        fetch.body.end()
                        fetch.complete = fetch.total == self.size
                        break
                    fetch.body.feed(buf, 0, n)
                    fetch.total += n
                    fetch.times.append(time.monotonic())
                    fetch.totals.append(fetch.total)
        except Exception as e:  # reported through .error
            fetch.error = "%s: %s" % (type(e).__name__, e)
        finally:
            fetch.ended_at = time.monotonic()

    def bytes_at(self, t):
        return sum(f.bytes_at(t) for f in list(self.fetches))

    def rate(self, t0, t1):
        return (self.bytes_at(t1) - self.bytes_at(t0)) / (t1 - t0)

    def in_flight(self, t):
        """Fetches started by t and not yet ended at t."""
        return sum(1 for f in list(self.fetches) if f.started_at is not None
                   and f.started_at <= t and (f.ended_at is None or f.ended_at > t))

    def summary(self):
        done = [f for f in self.fetches if f.complete]
        durations = sorted(f.ended_at - f.started_at for f in done)
        return ("%s: %d fetches of %d B, %d complete (duration median %.2f s, "
                "max %.2f s), %d failed" % (
                    self.label, len(self.fetches), self.size, len(done),
                    durations[len(durations) // 2] if durations else 0.0,
                    durations[-1] if durations else 0.0,
                    sum(1 for f in self.fetches if f.error)))


class KeepaliveRequests(threading.Thread):
    """One keep-alive connection from `source` doing sequential GETs of the
    first `size` bytes of `path` (Range requests), each read completely
    before the next is sent, from start_at until stop_at, at most
    max_requests. Counts requests and body bytes."""

    def __init__(self, port, source=None, size=4096, path=BIG_FILE,
                 start_at=None, stop_at=None, max_requests=1000000,
                 host=SERVER_HOST):
        super().__init__(daemon=True)
        self.port, self.source, self.path, self.host = port, source, path, host
        self.size, self.max_requests = size, max_requests
        self.start_at = start_at if start_at is not None else time.monotonic()
        self.stop_at = stop_at if stop_at is not None else self.start_at + 10.0
        self.requests = 0
        self.total = 0
        self.error = None
        self._stop_event = threading.Event()

    def stop(self):
        self._stop_event.set()

    def run(self):
        try:
            delay = self.start_at - time.monotonic()
            if delay > 0 and self._stop_event.wait(delay):
                return
            request = _range_request(self.path, self.host, self.port, self.size,
                                     keepalive=True)
            with _connect(self.port, self.source, self.host) as sock:
                sock.settimeout(2.0)
                while (not self._stop_event.is_set() and self.requests < self.max_requests
                       and time.monotonic() < self.stop_at):
                    sock.sendall(request)
                    status, headers, body = _read_head(sock, time.monotonic() + 5.0)
                    if status != 206:
                        raise RuntimeError("HTTP status %d" % status)
                    checked = _body(self.path, self.host, self.port, status,
                                    headers, label=self.source)
                    checked.feed(body)
                    length = int(headers["content-length"])
                    while len(body) < length:
                        chunk = sock.recv(length - len(body))
                        if not chunk:
                            raise ConnectionError("keep-alive connection closed")
                        checked.feed(chunk)
                        body += chunk
                    self.requests += 1
                    self.total += len(body)
        except Exception as e:  # reported through .error
            self.error = "%s: %s" % (type(e).__name__, e)
