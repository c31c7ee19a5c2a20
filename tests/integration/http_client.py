"""The HTTP client underneath the trafficrate integration tests' clients
(part of harness.py):

  * http_get() (one small complete GET), open_keepalive() and
    keepalive_get() for idle keep-alive connections;
  * the pieces the Download clients (clients.py, budget_clients.py, ftp.py)
    are made of: _connect() (a socket from a chosen source address and
    port), _request(), _read_head() and _body(), the bodies.Body that checks
    a 200 or 206 response's bytes after each test (conftest.py).

Standard library only; import it through harness (`import harness`).
"""

import socket
import time

from bodies import Body
from netns_env import SERVER_HOST, SMALL_FILE


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
