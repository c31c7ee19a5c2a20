"""A Redis server for the trafficrate integration tests (test_cluster_*.py,
issue 13: one client's rate shared across hosts through Redis).

  * RedisServer: Debian's /usr/bin/redis-server (package redis-server) in
    the foreground on 127.0.0.1 and a port of its own, nothing persisted
    (--save "" --appendonly no), its own directory and log; started, killed
    and started again on the same port by pid, with bounded waits;
  * command(): one command over a raw socket (RESP), enough for PING,
    DBSIZE and KEYS in a report; no redis-cli or Python Redis client needed.

Every server is stopped by pid (never by name); leftovers are stopped at
interpreter exit. Standard library only; import it directly
(`import redis_server`), harness.py does not re-export it.
"""

import atexit
import signal
import socket
import subprocess
import time
from pathlib import Path

from netns_env import SERVER_HOST, free_port
from procs import kill_pid

REDIS_SERVER = "/usr/bin/redis-server"

_live = set()


@atexit.register
def _stop_leftovers():
    for server in list(_live):
        server.stop()


class RedisError(Exception):
    """A Redis error reply (-ERR ...)."""


def _encode(args):
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class _Reader:
    """RESP2 replies from a socket, every read bounded by the deadline."""

    def __init__(self, sock, deadline):
        self.sock, self.deadline, self.buf = sock, deadline, b""

    def _fill(self):
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no complete Redis reply")
        self.sock.settimeout(left)
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("Redis closed the connection")
        self.buf += chunk

    def line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exact(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def reply(self, depth=0):
        if depth > 8:
            raise ValueError("Redis reply nested too deep")
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.exact(n)
        if kind == b"*":
            n = int(rest)
            if n > 100000:
                raise ValueError("Redis array of %d elements" % n)
            return None if n < 0 else [self.reply(depth + 1) for _ in range(n)]
        raise ValueError("bad Redis reply %r" % line[:80])


def command(port, *args, host=SERVER_HOST, password=None, timeout=1.0):
    """Send one command to host:port and return its reply (str, int, bytes,
    list or None); AUTH first with a password. Raises OSError,
    TimeoutError (no reply within timeout s) or RedisError."""
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, port), timeout=timeout) as sock:
        requests = ([["AUTH", password]] if password else []) + [list(args)]
        sock.sendall(b"".join(_encode(r) for r in requests))
        reader = _Reader(sock, deadline)
        if password:
            reader.reply()
        return reader.reply()


class RedisServer:
    """redis-server in the foreground, bound to host:port (default: a free
    port on 127.0.0.1), with its own directory under workdir; stderr and
    its log in <dir>/redis.log.

    start() waits (bounded) until it answers PING and may be called again
    after kill()/stop(): same port, an empty data set. Only the pid we
    started is ever signalled."""

    def __init__(self, workdir, host=SERVER_HOST, port=None, password=None):
        self.host = host
        self.port = port or free_port(host)
        self.password = password
        self.dir = Path(workdir) / ("redis-%d" % self.port)
        self.log_path = self.dir / "redis.log"
        self.proc = None
        self.starts = 0

    def url(self, db=None):
        """redis://[:PASSWORD@]HOST:PORT[/DB], as TRAFFICRATE_CLUSTER takes it."""
        auth = ":%s@" % self.password if self.password else ""
        return "redis://%s%s:%d%s" % (auth, self.host, self.port,
                                      "" if db is None else "/%d" % db)

    def argv(self):
        argv = [REDIS_SERVER, "--bind", self.host, "--port", str(self.port),
                "--save", "", "--appendonly", "no", "--daemonize", "no",
                "--dir", str(self.dir), "--logfile", "",  # the log on stdout
                "--protected-mode", "no", "--databases", "16"]
        if self.password:
            argv += ["--requirepass", self.password]
        return argv

    @property
    def pid(self):
        return self.proc.pid if self.proc is not None else None

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout=10.0):
        if self.running():
            raise RuntimeError("redis-server pid %d is still running" % self.pid)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(b"--- start %d (test harness) ---\n" % self.starts)
            log.flush()
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log,
                                         start_new_session=True)
        _live.add(self)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited during start-up\n%s"
                                   % self.describe())
            if self.ping():
                return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("redis-server not answering PING after %.0f s\n%s"
                           % (timeout, self.describe()))

    def ping(self, timeout=0.5):
        """True if it answers PING with PONG within timeout seconds."""
        try:
            return self.command("PING", timeout=timeout) == "PONG"
        except (OSError, ValueError, RedisError):
            return False

    def command(self, *args, timeout=1.0):
        return command(self.port, *args, host=self.host, password=self.password,
                       timeout=timeout)

    def signal(self, sig):
        """Send sig to the server's pid (e.g. SIGSTOP/SIGCONT); False if gone."""
        return self.running() and kill_pid(self.proc.pid, sig)

    def kill(self, timeout=5.0):
        """SIGKILL by pid and reap it (bounded); True once it is gone."""
        if self.proc is None:
            return True
        if self.proc.poll() is None:
            kill_pid(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        _live.discard(self)
        return True

    def stop(self, timeout=5.0):
        """SIGTERM (SIGCONT first, in case it was stopped), then SIGKILL
        after timeout seconds; by pid, bounded."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            kill_pid(self.proc.pid, signal.SIGCONT)
            kill_pid(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill(timeout)
        _live.discard(self)
        return self.proc.poll()

    def output(self):
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def describe(self):
        rc = self.proc.poll() if self.proc else None
        return "redis-server pid %s %s:%d rc %s\n--- log ---\n%s" % (
            self.pid or "-", self.host, self.port, rc, self.output()[-3000:])
