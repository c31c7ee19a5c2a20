"""vsftpd (Debian's) under the library, and an FTP download client, for
test_vsftpd.py.

  * VsftpdServer: /usr/sbin/vsftpd standalone (listen=YES) as root, as
    Debian's service runs it, anonymous downloads from the webroot, passive
    mode only, with a config file of its own. isolate=True keeps Debian's
    compiled defaults (isolate=YES, isolate_network=YES: each session is
    made with a raw clone system call in new PID and network namespaces);
    isolate=False turns both off (sessions are made with fork, and the
    privileged process passes each data socket to the session's transfer
    process over a Unix socket, SCM_RIGHTS).
  * FtpDownload: a clients.Download that fetches a file with RETR over a
    passive data connection, both connections from one source address
    (e.g. 127.0.0.2); the data connection's bytes are recorded and checked
    (bodies.Body) as an HTTP body's are.

Standard library only; import it next to harness (`import ftp`).
"""

import re
import socket
import time

from bodies import Body
from clients import Download
from http_client import _connect
from netns_env import SERVER_HOST, free_port
from server_base import Server

VSFTPD = "/usr/sbin/vsftpd"
PASV_PORTS = 16


class VsftpdServer(Server):
    """vsftpd standalone on SERVER_HOST:port; one process per FTP session."""

    name = "vsftpd"

    def __init__(self, workdir, webroot, env, isolate=True, port=None):
        super().__init__(workdir, port=port, env=env)
        self.isolate = isolate
        self.title = "vsftpd, %s" % (
            "Debian's defaults (isolate, isolate_network)" if isolate
            else "isolate=NO, isolate_network=NO")
        # secure_chroot_dir: empty, owned by root, not writable by others.
        empty = self.workdir / ("vsftpd-empty-%d" % self.port)
        empty.mkdir(mode=0o755, exist_ok=True)
        pasv = pasv_range(PASV_PORTS, avoid={self.port} | _PASV_TAKEN)
        # Servers started together must not share passive ports.
        _PASV_TAKEN.update(range(pasv[0], pasv[1] + 1))
        lines = [
            "listen=YES", "listen_ipv6=NO",
            "listen_address=%s" % SERVER_HOST, "listen_port=%d" % self.port,
            "background=NO", "anonymous_enable=YES", "local_enable=NO",
            "no_anon_password=YES", "anon_root=%s" % webroot,
            "write_enable=NO", "pasv_enable=YES", "port_enable=NO",
            "pasv_min_port=%d" % pasv[0], "pasv_max_port=%d" % pasv[1],
            "secure_chroot_dir=%s" % empty, "xferlog_enable=NO",
            "syslog_enable=NO", "dirmessage_enable=NO",
            "max_clients=0", "max_per_ip=0",
            # Debian's /etc/vsftpd.conf as shipped, where it matters here.
            "use_localtime=YES", "connect_from_port_20=YES",
            "pam_service_name=vsftpd", "ssl_enable=NO",
        ]
        if not isolate:
            lines += ["isolate=NO", "isolate_network=NO"]
        self.conf_path = self.workdir / ("vsftpd-%d.conf" % self.port)
        self.conf_path.write_text("\n".join(lines) + "\n")
        self.conf_path.chmod(0o600)
        self.argv = [VSFTPD, str(self.conf_path)]

    def ready(self):
        try:
            with _connect(self.port, timeout=1.0) as sock:
                return read_reply(sock, time.monotonic() + 1.0)[0] == 220
        except (OSError, ValueError):
            return False


# Passive ports given to the servers of this run (pasv_range avoids them).
_PASV_TAKEN = set()


def pasv_range(count, avoid=()):
    """A run of `count` free ports (none in `avoid`) for passive data
    connections."""
    for _ in range(50):
        base = free_port()
        ports = range(base, base + count)
        if base + count > 65535 or any(p in avoid for p in ports):
            continue
        if all(_port_free(p) for p in ports):
            return base, base + count - 1
    raise RuntimeError("no run of %d free ports" % count)


def _port_free(port):
    with socket.socket() as s:
        try:
            s.bind((SERVER_HOST, port))
        except OSError:
            return False
    return True


def read_reply(sock, deadline):
    """One FTP reply (multi-line ones included): (code, text)."""
    data = b""
    code = None
    while True:
        while b"\r\n" not in data:
            if time.monotonic() > deadline:
                raise TimeoutError("no FTP reply")
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = sock.recv(4096)
            if not chunk:
                raise ConnectionError("FTP control connection closed")
            data += chunk
        line, data = data.split(b"\r\n", 1)
        m = re.match(rb"(\d{3})([ -])", line)
        if code is None:
            if not m:
                raise ValueError("not an FTP reply: %r" % line[:80])
            code = int(m.group(1))
            if m.group(2) == b" ":
                return code, line.decode("latin-1")
        elif m and int(m.group(1)) == code and m.group(2) == b" ":
            return code, line.decode("latin-1")


def command(sock, text, expect):
    """Sends one command; the reply's code must be in `expect`."""
    sock.sendall(text.encode("latin-1") + b"\r\n")
    code, reply = read_reply(sock, time.monotonic() + 10.0)
    if code not in expect:
        raise RuntimeError("FTP %s: %s" % (text.split()[0], reply))
    return reply


class FtpDownload(Download):
    """RETR of `path` (e.g. "/big.bin") as an anonymous user, passive mode,
    control and data connections from `source`; reads the data connection
    flat out and records its bytes like a Download's body."""

    def __init__(self, port, source, path, size, **kw):
        super().__init__(port, source, path, **kw)
        self.size = size

    def _exchange(self, control):
        code, text = read_reply(control, time.monotonic() + 10.0)
        if code != 220:
            raise RuntimeError("no FTP greeting: %s" % text)
        command(control, "USER anonymous", (230, 331))
        if command(control, "PASS trafficrate@", (230,)) is None:
            return
        command(control, "TYPE I", (200,))
        reply = command(control, "PASV", (227,))
        m = re.search(r"(\d+),(\d+),(\d+),(\d+),(\d+),(\d+)", reply)
        host = ".".join(m.group(i) for i in range(1, 5))
        port = int(m.group(5)) * 256 + int(m.group(6))
        with _connect(port, self.source, host) as data:
            control.sendall(("RETR %s\r\n" % self.path).encode("latin-1"))
            code, text = read_reply(control, time.monotonic() + 10.0)
            if code not in (125, 150):
                raise RuntimeError("FTP RETR: %s" % text)
            self.status = 200
            self.body = Body(self.path, {"content-length": str(self.size)},
                             label=self.label,
                             url="ftp://%s:%d%s" % (SERVER_HOST, self.port,
                                                    self.path))
            self.bodies.append(self.body)
            data.settimeout(self.recv_timeout)
            self._read_body(data)
        if self.eof:
            # The server ended the transfer: it must say it completed it.
            code, text = read_reply(control, time.monotonic() + 5.0)
            if code != 226 or self.total != self.size:
                raise RuntimeError("FTP transfer ended after %d bytes: %s"
                                   % (self.total, text))
