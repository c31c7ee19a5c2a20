"""Servers that pass sockets between processes over Unix sockets (SCM_RIGHTS),
for test_passed.py. Standard library only (ctypes for sendmmsg/recvmmsg).

  passing_server.py serve --port P --root DIR [--workers N] [--mmsg]
      An acceptor/worker HTTP server: the acceptor process accepts every
      connection, passes the socket to one of its worker processes (started
      with exec, each its own program) and closes its copy at once; the
      workers serve GET /<name> from DIR with sendfile. --mmsg passes with
      sendmmsg and receives with recvmmsg (called through libc, so that a
      preloaded library sees them), else socket.send_fds / recv_fds
      (sendmsg / recvmsg).
  passing_server.py upstream --connect HOST:PORT --bytes N
      A socket this process connects itself (like a proxy's upstream
      connection), passed to a child process that sends N bytes on it.

Prints "ready" on stdout once it serves (serve) or has passed the socket
(upstream).
"""

import argparse
import ctypes
import os
import socket
import subprocess
import sys
import threading

from msghdr import Iovec, Mmsghdr  # beside this script

MSG_WAITFORONE = 0x10000
SOL_SOCKET = socket.SOL_SOCKET
SCM_RIGHTS = socket.SCM_RIGHTS


class Cmsg1(ctypes.Structure):
    """A control message carrying one fd (CMSG_SPACE(sizeof(int)) bytes)."""
    _fields_ = [("cmsg_len", ctypes.c_size_t), ("cmsg_level", ctypes.c_int),
                ("cmsg_type", ctypes.c_int), ("fd", ctypes.c_int),
                ("pad", ctypes.c_int)]


LIBC = ctypes.CDLL(None, use_errno=True)  # the global scope: LD_PRELOAD first
LIBC.sendmmsg.argtypes = [ctypes.c_int, ctypes.POINTER(Mmsghdr), ctypes.c_uint,
                          ctypes.c_int]
LIBC.recvmmsg.argtypes = [ctypes.c_int, ctypes.POINTER(Mmsghdr), ctypes.c_uint,
                          ctypes.c_int, ctypes.c_void_p]


def _message(byte_buf, cmsg):
    iov = Iovec(ctypes.cast(byte_buf, ctypes.c_void_p), 1)
    m = Mmsghdr()
    m.msg_hdr.msg_iov = ctypes.pointer(iov)
    m.msg_hdr.msg_iovlen = 1
    m.msg_hdr.msg_control = ctypes.cast(ctypes.pointer(cmsg), ctypes.c_void_p)
    m.msg_hdr.msg_controllen = ctypes.sizeof(cmsg)
    return m, iov


def sendmmsg_fd(unix_fd, fd):
    byte_buf = ctypes.create_string_buffer(b"p", 1)
    cmsg = Cmsg1(ctypes.sizeof(ctypes.c_size_t) + 8 + 4, SOL_SOCKET,
                 SCM_RIGHTS, fd, 0)
    m, _iov = _message(byte_buf, cmsg)
    if LIBC.sendmmsg(unix_fd, ctypes.byref(m), 1, 0) != 1:
        raise OSError(ctypes.get_errno(), "sendmmsg")


def recvmmsg_fds(unix_fd, batch=4):
    """Blocks for at least one message; returns the fds received."""
    msgs = (Mmsghdr * batch)()
    keep = []
    for i in range(batch):
        byte_buf = ctypes.create_string_buffer(1)
        cmsg = Cmsg1()
        m, iov = _message(byte_buf, cmsg)
        msgs[i] = m
        keep.append((byte_buf, cmsg, iov))
    n = LIBC.recvmmsg(unix_fd, msgs, batch, MSG_WAITFORONE, None)
    if n < 0:
        raise OSError(ctypes.get_errno(), "recvmmsg")
    fds = []
    for i in range(n):
        if msgs[i].msg_len == 0:
            return []  # end of stream: the acceptor went away
        if msgs[i].msg_hdr.msg_controllen >= 20:
            fds.append(keep[i][1].fd)
    return fds


# ------------------------------------------------------------------ serve

def serve_one(sock, root):
    with sock:
        sock.settimeout(30.0)
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 8192:
            chunk = sock.recv(4096)
            if not chunk:
                return
            head += chunk
        parts = head.split(b"\r\n", 1)[0].split()
        name = os.path.basename(parts[1].decode()) if len(parts) > 1 else ""
        path = os.path.join(root, name)
        if not name or not os.path.isfile(path):
            sock.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n"
                         b"Connection: close\r\n\r\n")
            return
        size = os.path.getsize(path)
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n"
                     b"Content-Type: application/octet-stream\r\n"
                     b"Connection: close\r\n\r\n" % size)
        with open(path, "rb") as f:
            sock.sendfile(f)  # os.sendfile, waiting while the socket is full


def worker(unix_fd, root, mmsg):
    unix = socket.socket(fileno=unix_fd)
    while True:
        if mmsg:
            fds = recvmmsg_fds(unix_fd)
        else:
            _, fds, _, _ = socket.recv_fds(unix, 1, 4)
        if not fds:
            return  # the acceptor went away (end of the seqpacket stream)
        for fd in fds:
            sock = socket.socket(fileno=fd)
            threading.Thread(target=serve_one, args=(sock, root),
                             daemon=True).start()


def serve(args):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.port))
    listener.listen(128)
    channels, procs = [], []
    for _ in range(args.workers):
        ours, theirs = socket.socketpair(socket.AF_UNIX,
                                         socket.SOCK_SEQPACKET)
        cmd = [sys.executable, os.path.abspath(__file__), "worker",
               "--fd", str(theirs.fileno()), "--root", args.root]
        if args.mmsg:
            cmd.append("--mmsg")
        procs.append(subprocess.Popen(cmd, pass_fds=[theirs.fileno()]))
        theirs.close()
        channels.append(ours)
    print("ready pids %s" % " ".join(str(p.pid) for p in procs), flush=True)
    n = 0
    while True:
        conn, _ = listener.accept()
        channel = channels[n % len(channels)]
        n += 1
        if args.mmsg:
            sendmmsg_fd(channel.fileno(), conn.fileno())
        else:
            socket.send_fds(channel, [b"p"], [conn.fileno()])
        conn.close()  # at once, as Node's primary does


# --------------------------------------------------------------- upstream

def upstream(args):
    host, port = args.connect.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)))
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "send",
         "--fd", str(theirs.fileno()), "--bytes", str(args.bytes)],
        pass_fds=[theirs.fileno()])
    theirs.close()
    socket.send_fds(ours, [b"p"], [sock.fileno()])
    sock.close()
    print("ready", flush=True)
    sys.exit(child.wait(timeout=60))


def send(args):
    unix = socket.socket(fileno=args.fd)
    _, fds, _, _ = socket.recv_fds(unix, 1, 1)
    with socket.socket(fileno=fds[0]) as sock:
        block = b"u" * 65536
        left = args.bytes
        while left > 0:
            sock.sendall(block[:min(left, len(block))])
            left -= min(left, len(block))
        # Kept open until the peer closes, so that a test can look at the
        # zone while the connection still exists.
        sock.settimeout(30.0)
        while sock.recv(4096):
            pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["serve", "worker", "upstream", "send"])
    p.add_argument("--port", type=int)
    p.add_argument("--root")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--mmsg", action="store_true")
    p.add_argument("--fd", type=int)
    p.add_argument("--connect")
    p.add_argument("--bytes", type=int, default=0)
    args = p.parse_args()
    if args.mode == "serve":
        serve(args)
    elif args.mode == "worker":
        worker(args.fd, args.root, args.mmsg)
    elif args.mode == "upstream":
        upstream(args)
    else:
        send(args)


if __name__ == "__main__":
    main()
