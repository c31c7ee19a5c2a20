#!/usr/bin/python3
"""An HTTP file server that sends each response body through the system call
its URL names and checks every value that call returns (for
test_shaper_bytes.py: the packet shaper of issue 33 must hand the host
exactly what the kernel would have, whatever way the host sends).

    send_paths_server.py --port P --dir DIR [--bind 127.0.0.1] [--sndbuf BYTES]

GET /WAY/NAME serves DIR/NAME (HTTP/1.1, Content-Length, keep-alive until the
client closes or asks Connection: close), the body sent by WAY:

  send          socket.send of slices of varied sizes (send(2))
  write         os.write of slices (write(2))
  writev        os.writev of several buffers of varied sizes, the response
                head the first buffer of the first call (writev(2))
  sendmsg       socket.sendmsg of several buffers, the head likewise
  sendmmsg      sendmmsg(2) through libc (ctypes: the preloaded symbol),
                several messages of one to three buffers each, the head the
                first buffer of the first message (blocking sockets only)
  sendfile      os.sendfile with an offset; the file's own position, set to
                an odd value first, must never move
  sendfile-pos  os.sendfile with offset None (the file's position): after
                every call the position must have moved by exactly what the
                call returned (not at all on EAGAIN)
  splice        os.splice from a pipe that a thread fills with the file

WAY-nb (every way but sendmmsg): the socket is made non-blocking with
SO_SNDBUF --sndbuf (default 4096) before the response, and at EAGAIN the
server waits with a selector, then sends the rest.

Every call's result is checked: a count must be > 0 and at most what was
asked; on a blocking socket it must be all that was asked (Linux returns a
short count there only on a signal, and none is sent); the only error a
non-blocking call may raise is EAGAIN (BlockingIOError). Anything else is a
problem. When a connection ends the server writes one JSON line to stderr:

  {"shape_server": "conn", "client": IP, "client_port": N, "way": WAY,
   "responses": complete responses, "body_bytes": N, "calls": N,
   "partial": short counts, "eagain": N, "problems": [text, ...]}

Standard library only (ctypes for sendmmsg). SIGTERM ends it at once.
"""

import argparse
import ctypes
import errno
import json
import os
import selectors
import signal
import socket
import sys
import threading

from msghdr import Iovec, Mmsghdr  # beside this script
import time

WAYS = ("send", "write", "writev", "sendmsg", "sendmmsg", "sendfile",
        "sendfile-pos", "splice")
BLOCKING_ONLY = ("sendmmsg",)
# Slice and buffer sizes, cycled: odd ones, one byte, an MSS, over 64 KiB.
SIZES = (1, 17, 1448, 4096, 65541, 3, 9000, 700, 32768, 100)
BUFFERS_PER_CALL = 5
MESSAGES_PER_CALL = 4
SPLICE_CHUNK = 1 << 20
RESPONSE_LIMIT_S = 60.0  # one response may take at most this long
HEAD_LIMIT = 16384
SENDFILE_POSITION = 7  # "sendfile": the file's own position, never moved


LIBC = ctypes.CDLL(None, use_errno=True)  # the global scope: LD_PRELOAD first
LIBC.sendmmsg.argtypes = [ctypes.c_int, ctypes.POINTER(Mmsghdr), ctypes.c_uint,
                          ctypes.c_int]
LIBC.sendmmsg.restype = ctypes.c_int


class Problem(Exception):
    """A return value the kernel would not have given: ends the connection."""


class Conn:
    """One accepted connection: its socket, how it sends, what it saw."""

    def __init__(self, sock, addr, sndbuf):
        self.sock, self.addr, self.sndbuf = sock, addr, sndbuf
        self.fd = sock.fileno()
        self.way = None
        self.nonblocking = False
        self.stats = {"responses": 0, "body_bytes": 0, "calls": 0,
                      "partial": 0, "eagain": 0}
        self.problems = []
        self.deadline = None
        self.selector = selectors.DefaultSelector()

    # ----------------------------------------------------------- checks

    def result(self, name, n, asked, partial_ok=False):
        """A call returned n of `asked` bytes: count and check it."""
        self.stats["calls"] += 1
        if not isinstance(n, int) or n <= 0:
            raise Problem("%s returned %r (asked %d)" % (name, n, asked))
        if n > asked:
            raise Problem("%s returned %d, more than the %d asked" % (name, n, asked))
        if n < asked and not partial_ok:
            self.stats["partial"] += 1
            if not self.nonblocking:
                raise Problem("%s on a blocking socket returned %d of %d"
                              % (name, n, asked))
        return n

    def eagain(self, name, e):
        """A call raised BlockingIOError e: fine once non-blocking, if EAGAIN."""
        self.stats["calls"] += 1
        if not self.nonblocking:
            raise Problem("%s on a blocking socket raised %r" % (name, e))
        if e.errno != errno.EAGAIN:
            raise Problem("%s raised %r, not EAGAIN" % (name, e))
        self.stats["eagain"] += 1

    def wait(self, fileobj, events):
        """Wait until fileobj is ready (bounded by the response deadline)."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Problem("response not sent within %.0f s" % RESPONSE_LIMIT_S)
        self.selector.register(fileobj, events)
        try:
            self.selector.select(min(left, 1.0))
        finally:
            self.selector.unregister(fileobj)

    def wait_writable(self):
        self.wait(self.sock, selectors.EVENT_WRITE)

    # ---------------------------------------------------------- request

    def read_head(self, pending):
        """The next request head (bytes) and what follows it; None at EOF."""
        while b"\r\n\r\n" not in pending:
            if len(pending) > HEAD_LIMIT:
                raise Problem("request head over %d bytes" % HEAD_LIMIT)
            try:
                chunk = self.sock.recv(4096)
            except BlockingIOError:
                self.deadline = time.monotonic() + RESPONSE_LIMIT_S
                self.wait(self.sock, selectors.EVENT_READ)
                continue
            if not chunk:
                return None, b""
            pending += chunk
        head, rest = pending.split(b"\r\n\r\n", 1)
        return head, rest

    def serve(self, root):
        pending = b""
        while True:
            head, pending = self.read_head(pending)
            if head is None:
                return
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split()
            close = any(l.lower().replace(" ", "") == "connection:close"
                        for l in lines[1:])
            way, name = self.parse_path(parts[1] if len(parts) > 1 else "")
            path = os.path.join(root, name) if name else ""
            if not way or not os.path.isfile(path):
                self.send_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                continue
            self.start_way(way)
            self.deadline = time.monotonic() + RESPONSE_LIMIT_S
            size = os.path.getsize(path)
            head_out = (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n"
                        b"Content-Type: application/octet-stream\r\n"
                        b"Connection: %s\r\n\r\n"
                        % (size, b"close" if close else b"keep-alive"))
            with open(path, "rb") as f:
                base = self.way[:-3] if self.nonblocking else self.way
                getattr(self, "body_" + base.replace("-", "_"))(f, size, head_out)
            self.stats["responses"] += 1
            self.stats["body_bytes"] += size
            if close:
                return

    @staticmethod
    def parse_path(url):
        """'/writev-nb/shape.bin' -> ('writev-nb', 'shape.bin')."""
        bits = url.split("?", 1)[0].strip("/").split("/")
        if len(bits) != 2 or "." == bits[1][:1]:
            return None, None
        way = bits[0][:-3] if bits[0].endswith("-nb") else bits[0]
        if way not in WAYS or (way in BLOCKING_ONLY and way != bits[0]):
            return None, None
        return bits[0], bits[1]

    def start_way(self, way):
        if self.way is not None and self.way != way:
            raise Problem("way changed from %s to %s" % (self.way, way))
        if self.way is None:
            self.way = way
            if way.endswith("-nb"):
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.sndbuf)
                self.sock.setblocking(False)
                self.nonblocking = True

    # ----------------------------------------------------- plain sends

    def send_all(self, data, name="send"):
        view = memoryview(data)
        while view:
            try:
                n = self.result(name, self.sock.send(view), len(view))
            except BlockingIOError as e:
                self.eagain(name, e)
                self.wait_writable()
                continue
            view = view[n:]

    def body_send(self, f, size, head):
        self.send_all(head)
        self._slices(f, size, lambda v: self.sock.send(v), "send")

    def body_write(self, f, size, head):
        self.send_all(head)
        self._slices(f, size, lambda v: os.write(self.fd, v), "write")

    def _slices(self, f, size, call, name):
        view = memoryview(f.read())
        if len(view) != size:
            raise Problem("read %d of %d file bytes" % (len(view), size))
        k = 0
        while view:
            asked = min(len(view), SIZES[k % len(SIZES)] * 4)
            try:
                n = self.result(name, call(view[:asked]), asked)
            except BlockingIOError as e:
                self.eagain(name, e)
                self.wait_writable()
                continue
            view = view[n:]
            k += 1

    # ---------------------------------------------- several buffers

    def buffers(self, f, size, head):
        """The head and the body cut into SIZES-sized memoryviews."""
        data = f.read()
        if len(data) != size:
            raise Problem("read %d of %d file bytes" % (len(data), size))
        out, view, k = [memoryview(head)], memoryview(data), 0
        while view:
            n = SIZES[k % len(SIZES)]
            out.append(view[:n])
            view = view[n:]
            k += 1
        return out

    @staticmethod
    def advance(bufs, n):
        """Drop n bytes from the front of the buffer list bufs (in place)."""
        while n:
            if n >= len(bufs[0]):
                n -= len(bufs[0])
                bufs.pop(0)
            else:
                bufs[0] = bufs[0][n:]
                n = 0

    def _vectored(self, f, size, head, call, name):
        bufs = self.buffers(f, size, head)
        while bufs:
            batch = bufs[:BUFFERS_PER_CALL]
            asked = sum(len(b) for b in batch)
            try:
                n = self.result(name, call(batch), asked)
            except BlockingIOError as e:
                self.eagain(name, e)
                self.wait_writable()
                continue
            self.advance(bufs, n)

    def body_writev(self, f, size, head):
        self._vectored(f, size, head, lambda b: os.writev(self.fd, b), "writev")

    def body_sendmsg(self, f, size, head):
        self._vectored(f, size, head, lambda b: self.sock.sendmsg(b), "sendmsg")

    def body_sendmmsg(self, f, size, head):
        bufs = [bytes(b) for b in self.buffers(f, size, head)]
        while bufs:
            groups, k = [], 0
            while k < len(bufs) and len(groups) < MESSAGES_PER_CALL:
                take = 1 + len(groups) % 3
                groups.append(bufs[k:k + take])
                k += take
            msgs = (Mmsghdr * len(groups))()
            keep = []
            for m, group in zip(msgs, groups):
                iovs = (Iovec * len(group))()
                for iov, b in zip(iovs, group):
                    cbuf = ctypes.create_string_buffer(b, len(b))
                    keep.append(cbuf)
                    iov.iov_base = ctypes.cast(cbuf, ctypes.c_void_p)
                    iov.iov_len = len(b)
                keep.append(iovs)
                m.msg_hdr.msg_iov = ctypes.cast(iovs, ctypes.POINTER(Iovec))
                m.msg_hdr.msg_iovlen = len(group)
            sent = LIBC.sendmmsg(self.fd, msgs, len(groups), 0)
            self.stats["calls"] += 1
            if sent < 0:
                raise Problem("sendmmsg failed: %s" % os.strerror(ctypes.get_errno()))
            if not 0 < sent <= len(groups):
                raise Problem("sendmmsg returned %d for %d messages"
                              % (sent, len(groups)))
            if sent < len(groups):
                raise Problem("sendmmsg on a blocking socket sent %d of %d messages"
                              % (sent, len(groups)))
            for m, group in zip(msgs, groups):
                want = sum(len(b) for b in group)
                if m.msg_len != want:
                    raise Problem("sendmmsg: a message's msg_len %d, not %d"
                                  % (m.msg_len, want))
            bufs = bufs[k:]

    # ------------------------------------------------------- sendfile

    def body_sendfile(self, f, size, head):
        self.send_all(head)
        fd = f.fileno()
        os.lseek(fd, SENDFILE_POSITION, os.SEEK_SET)
        offset = 0
        while offset < size:
            asked = size - offset
            try:
                n = self.result("sendfile", os.sendfile(self.fd, fd, offset, asked),
                                asked)
            except BlockingIOError as e:
                self.eagain("sendfile", e)
                n = 0
            position = os.lseek(fd, 0, os.SEEK_CUR)
            if position != SENDFILE_POSITION:
                raise Problem("sendfile with an offset moved the file position "
                              "from %d to %d" % (SENDFILE_POSITION, position))
            offset += n
            if not n:
                self.wait_writable()

    def body_sendfile_pos(self, f, size, head):
        self.send_all(head)
        fd = f.fileno()
        done = 0
        while done < size:
            asked = size - done
            before = os.lseek(fd, 0, os.SEEK_CUR)
            if before != done:
                raise Problem("file position %d after %d bytes sent" % (before, done))
            try:
                n = self.result("sendfile", os.sendfile(self.fd, fd, None, asked),
                                asked)
            except BlockingIOError as e:
                self.eagain("sendfile", e)
                n = 0
            after = os.lseek(fd, 0, os.SEEK_CUR)
            if after != before + n:
                raise Problem("sendfile(offset None) returned %d but moved the file "
                              "position from %d to %d" % (n, before, after))
            done += n
            if not n:
                self.wait_writable()

    # --------------------------------------------------------- splice

    def body_splice(self, f, size, head):
        self.send_all(head)
        r, w = os.pipe()
        feeder = threading.Thread(target=feed_pipe, args=(f, size, w), daemon=True)
        feeder.start()
        try:
            self._splice(r, size)
        finally:
            os.close(r)  # a feeder still writing gets EPIPE and stops
            feeder.join(5.0)

    def _splice(self, r, size):
        flags = os.SPLICE_F_MOVE | (os.SPLICE_F_NONBLOCK if self.nonblocking else 0)
        left = size
        while left:
            asked = min(left, SPLICE_CHUNK)
            try:
                n = os.splice(r, self.fd, asked, flags=flags)
            except BlockingIOError as e:
                self.eagain("splice", e)
                if pipe_empty(r):
                    self.wait(r, selectors.EVENT_READ)
                else:
                    self.wait_writable()
                continue
            # Fewer bytes than asked are normal: the pipe held no more.
            left -= self.result("splice", n, asked, partial_ok=True)

    # --------------------------------------------------------- report

    def report(self):
        line = dict(shape_server="conn", client=self.addr[0], client_port=self.addr[1],
                    way=self.way, problems=self.problems, **self.stats)
        sys.stderr.write(json.dumps(line) + "\n")
        sys.stderr.flush()


def pipe_empty(fd):
    sel = selectors.DefaultSelector()
    try:
        sel.register(fd, selectors.EVENT_READ)
        return not sel.select(0)
    finally:
        sel.close()


def feed_pipe(f, size, w):
    """Writes the file's `size` bytes into the pipe's write end w, closes it."""
    try:
        left = size
        while left:
            data = f.read(min(left, 1 << 16))
            if not data:
                return
            view = memoryview(data)
            while view:
                view = view[os.write(w, view):]
            left -= len(data)
    except OSError:
        pass  # the reading end was closed: the response was given up
    finally:
        os.close(w)


def handle(sock, addr, root, sndbuf):
    conn = Conn(sock, addr, sndbuf)
    try:
        conn.serve(root)
    except Problem as e:
        conn.problems.append(str(e))
    except Exception as e:  # noqa: BLE001 - every error is reported
        conn.problems.append("%s: %s (way %s, %s)" % (
            type(e).__name__, e, conn.way, conn.stats))
    finally:
        conn.report()
        conn.selector.close()
        sock.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--sndbuf", type=int, default=4096)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, lambda *_: os._exit(0))
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.bind, args.port))
    listener.listen(128)
    root = os.path.abspath(args.dir)
    print("send_paths_server: pid %d, http://%s:%d/" % (os.getpid(), args.bind,
                                                       args.port),
          file=sys.stderr, flush=True)
    while True:
        sock, addr = listener.accept()
        threading.Thread(target=handle, args=(sock, addr, root, args.sndbuf),
                         daemon=True).start()


if __name__ == "__main__":
    main()
