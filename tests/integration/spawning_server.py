#!/usr/bin/python3
"""A threaded HTTP file server that starts helper processes, for
test_spawning.py. Standard library only.

    spawning_server.py --port P --dir DIR [--bind 127.0.0.1]

  * GET /<name>: the file, sent by the server's own thread (send);
  * GET /spawn: runs /bin/true with subprocess.run (Python starts it with
    vfork and, in the child, closes every fd above 2 and dup2s the pipes
    through libc before its exec), then answers "ok";
  * GET /cgi/<name>: the server sends the response head, exec'd helpers
    the body, as a CGI script's would: `sh -c 'cat FILE; exit $?'` with the
    client's socket as its stdout (a shell that never writes, and cat, per
    request), started with posix_spawn.

Every response ends with the connection (HTTP/1.0 style).
"""

import argparse
import http.server
import os
import socketserver
import subprocess
import sys

class Handler(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, format, *args):  # noqa: A002 - stdlib signature
        pass

    def do_GET(self):
        if self.path == "/spawn":
            subprocess.run(["/bin/true"], check=True)
            body = b"ok\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path.startswith("/cgi/"):
            self.cgi(os.path.basename(self.path[len("/cgi/"):]))
            return
        super().do_GET()

    def cgi(self, name):
        path = os.path.join(self.directory, name)
        if not os.path.isfile(path):
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(os.path.getsize(path)))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        self.wfile.flush()
        # A shell that runs cat and waits for it (never writing itself),
        # started with posix_spawn: glibc's child dup2s the socket to fd 1
        # through its own internal calls.
        pid = os.posix_spawn(
            "/bin/sh", ["sh", "-c", 'cat "$1"; exit $?', "cgi", path],
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, self.connection.fileno(), 1)])
        os.waitpid(pid, 0)
        self.close_connection = True


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()

    def handler(*a, **kw):
        return Handler(*a, directory=args.dir, **kw)

    with Server((args.bind, args.port), handler) as server:
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
