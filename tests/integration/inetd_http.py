"""One HTTP/1.0 response per process, on a client socket the process
inherited, as inetd, xinetd and systemd's Accept=yes run a service:

  * inetd style (systemd-socket-activate --inetd, xinetd): the socket is
    fd 0 and fd 1;
  * systemd Accept=yes without inetd style: the socket is fd 3
    (SD_LISTEN_FDS_START), announced by LISTEN_FDS=1 and LISTEN_PID.

Serves GET /name from --root with os.sendfile (as a C server would; under
the library the sendfile call is paced), then exits. Used by
test_inherited.py:

  systemd-socket-activate -l 127.0.0.1:PORT --accept [--inetd] \\
      -E LD_PRELOAD=... python3 inetd_http.py --root DIR
"""

import argparse
import os
import socket
import sys

SD_LISTEN_FDS_START = 3


def inherited_socket():
    """(read fd, write fd) of the client connection."""
    if (os.environ.get("LISTEN_FDS") == "1"
            and os.environ.get("LISTEN_PID") == str(os.getpid())):
        return SD_LISTEN_FDS_START, SD_LISTEN_FDS_START
    return 0, 1


def read_request(fd, limit=16384):
    data = b""
    while b"\r\n\r\n" not in data and len(data) < limit:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data


def send_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True)
    args = parser.parse_args()
    rfd, wfd = inherited_socket()
    request = read_request(rfd)
    parts = request.split(b"\r\n", 1)[0].split()
    if len(parts) < 2 or parts[0] != b"GET":
        return 0  # a readiness probe that closed, or not HTTP: nothing to do
    name = os.path.basename(parts[1].decode("ascii", "replace").split("?")[0])
    path = os.path.join(args.root, name)
    try:
        f = open(path, "rb")
    except OSError:
        send_all(wfd, b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        return 0
    with f:
        size = os.fstat(f.fileno()).st_size
        send_all(wfd, b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n"
                 b"Content-Type: application/octet-stream\r\n\r\n" % size)
        offset = 0
        try:
            while offset < size:
                sent = os.sendfile(wfd, f.fileno(), offset, size - offset)
                if sent == 0:
                    break
                offset += sent
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading and closed
    if wfd == SD_LISTEN_FDS_START:
        socket.socket(fileno=wfd).shutdown(socket.SHUT_WR)
    return 0


if __name__ == "__main__":
    sys.exit(main())
