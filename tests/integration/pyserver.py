#!/usr/bin/python3
"""A small blocking-socket HTTP file server for the integration tests.

It plays the "any multi-threaded / forking TCP server" of the design: every
connection is served by plain blocking `send` calls, from a thread
(`--mode thread`, socketserver.ThreadingMixIn) or from a forked child process
(`--mode fork`, socketserver.ForkingMixIn). It is started under LD_PRELOAD by
harness.PythonServer; it needs nothing but the standard library.

    pyserver.py --port 8080 --dir /srv/www [--bind 127.0.0.1] [--mode thread|fork]
                [--sendfile] [--pace 131072 | --pace 127.0.0.2=128000,127.0.0.3=512000]
                [--fd-chain]

Responses use HTTP/1.1 with Content-Length, so clients may keep connections
alive. Disconnects by clients are expected and are not logged. --sendfile
sends file bodies with sendfile(2) instead of send(2). --pace sets a static
SO_MAX_PACING_RATE on each accepted socket (by client IP): a stand-in for the
library with which the harness checks its own measurements. --fd-chain moves
each accepted socket to another fd number before serving it, through every
call that duplicates or closes fds (dup, fcntl F_DUPFD_CLOEXEC, dup3,
close_range, close, and dup2 of /dev/null over a spare duplicate), so that
the library's fd table is exercised the way inetd-style servers use it.
"""

import fcntl

import argparse
import http.server
import os
import signal
import socketserver
import socket
import sys

_PARENT_PID = os.getpid()
SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - stdlib signature
        pass

    def setup(self):
        if self.server.fd_chain:
            self.request = move_through_fd_calls(self.request)
        pace = self.server.pace
        rate = pace.get(self.client_address[0], pace.get(None))
        if rate:
            self.request.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, rate)
        super().setup()

    def copyfile(self, source, outputfile):
        if self.server.use_sendfile:
            outputfile.flush()
            self.connection.sendfile(source)
        else:
            super().copyfile(source, outputfile)

    def handle(self):
        try:
            super().handle()
        except (ConnectionError, TimeoutError, OSError):
            pass

    def finish(self):
        try:
            super().finish()
        finally:
            if self.server.fd_chain:
                self.request.close()  # the moved socket; socketserver has the old


def move_through_fd_calls(sock):
    """Returns a socket object for the same connection on a new fd number,
    reached by dup, fcntl(F_DUPFD_CLOEXEC), dup3 and close_range; a spare
    duplicate is replaced by /dev/null with dup2 and closed."""
    original = sock.detach()
    a = os.dup(original)                                 # dup
    b = fcntl.fcntl(a, fcntl.F_DUPFD_CLOEXEC, 200)       # fcntl
    target = os.dup(b)  # a free number for dup3 to replace
    os.dup2(b, target, inheritable=False)                # dup3 onto it
    os.closerange(original, original + 1)                # close_range
    os.close(a)                                          # close
    os.close(b)
    spare = os.dup(target)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, spare)                                 # dup2 over it
    os.close(null)
    os.close(spare)
    return socket.socket(fileno=target)


class QuietErrors:
    """Clients hang up mid-download on purpose: no tracebacks for that."""

    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class ThreadingServer(QuietErrors, socketserver.ThreadingMixIn,
                      http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


class ForkingServer(QuietErrors, socketserver.ForkingMixIn,
                    http.server.HTTPServer):
    allow_reuse_address = True
    request_queue_size = 128
    max_children = 256


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--mode", choices=("thread", "fork"), default="thread")
    parser.add_argument("--sendfile", action="store_true")
    parser.add_argument("--fd-chain", action="store_true",
                        help="serve each socket from a new fd (see above)")
    parser.add_argument("--pace", default="",
                        help="BPS, or IP=BPS,... : static SO_MAX_PACING_RATE")
    args = parser.parse_args()
    pace = {}
    for item in filter(None, args.pace.split(",")):
        ip, _, rate = item.rpartition("=")
        pace[ip or None] = int(rate)

    os.chdir(args.dir)
    server_class = ThreadingServer if args.mode == "thread" else ForkingServer
    server = server_class((args.bind, args.port), QuietHandler)
    server.pace = pace
    server.use_sendfile = args.sendfile
    server.fd_chain = args.fd_chain

    def on_term(signum, frame):
        # Forked children inherit this handler: they just leave.
        if os.getpid() == _PARENT_PID:
            for pid in list(getattr(server, "active_children", None) or ()):
                try:
                    os.kill(pid, signal.SIGTERM)
                except OSError:
                    pass
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    print(f"pyserver: {args.mode} mode, pid {os.getpid()}, "
          f"http://{args.bind}:{args.port}/", file=sys.stderr, flush=True)
    server.serve_forever(poll_interval=0.2)


if __name__ == "__main__":
    main()
