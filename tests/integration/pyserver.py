#!/usr/bin/python3
"""A small blocking-socket HTTP file server for the integration tests.

It plays the "any multi-threaded / forking TCP server" of the design: every
connection is served by plain blocking `send` calls, from a thread
(`--mode thread`, socketserver.ThreadingMixIn) or from a forked child process
(`--mode fork`, socketserver.ForkingMixIn). It is started under LD_PRELOAD by
harness.PythonServer; it needs nothing but the standard library.

    pyserver.py --port 8080 --dir /srv/www [--bind 127.0.0.1] [--mode thread|fork]
                [--sendfile] [--pace 131072 | --pace 127.0.0.2=128000,127.0.0.3=512000]

Responses use HTTP/1.1 with Content-Length, so clients may keep connections
alive. Disconnects by clients are expected and are not logged. --sendfile
sends file bodies with sendfile(2) instead of send(2). --pace sets a static
SO_MAX_PACING_RATE on each accepted socket (by client IP): a stand-in for the
library with which the harness checks its own measurements.
"""

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
