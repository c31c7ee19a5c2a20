#!/usr/bin/python3
"""Integration harness for trafficrate: servers under LD_PRELOAD and clients.

Standard library only, so it serves both the pytest suite (conftest.py wraps
it in fixtures) and scripts/demo.sh (`harness.py demo ...`).

Pieces:
  * environment: build_dir(), library_path(), cli_path(), namespace_problems()
  * zones: unique_zone(), zone_path(), remove_zone()
  * files: make_workdir(), make_webroot() (big.bin is a sparse 1 GiB file)
  * servers: NginxServer (real Debian nginx, master + N workers, daemon off,
    so we own the master's pid), PythonServer (pyserver.py, thread or fork
    mode); both stopped by pid, with every descendant, and bounded waits.
  * clients: Download (one HTTP GET from a chosen source address, e.g.
    127.0.0.2, recording cumulative body bytes against time.monotonic()),
    DownloadSet / run_downloads() to run many in parallel, Measurement for
    rates over a window, open_keepalive() for idle keep-alive connections.
  * inspection: socket_owners() (which pid holds which TCP connection, via
    ss), descendants(), run_cli(), stat_json().

Throughput runs must happen in a private network namespace whose loopback has
MTU 1500 (see DESIGN.md, "Facts measured on these machines"):
    unshare -n sh -c 'ip link set lo up mtu 1500 && /usr/bin/python3 -m pytest tests/integration'
"""

import argparse
import array
import atexit
import bisect
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NGINX = "/usr/sbin/nginx"
PYTHON = "/usr/bin/python3"
PYSERVER = Path(__file__).resolve().with_name("pyserver.py")
SERVER_HOST = "127.0.0.1"
BIG_FILE = "/big.bin"
SMALL_FILE = "/small.txt"
BIG_FILE_SIZE = 1 << 30
RUN_HINT = ("run the suite via scripts/test.sh, or: cd %s && unshare -n sh -c "
            "'ip link set lo up mtu 1500 && /usr/bin/python3 -m pytest "
            "tests/integration'" % REPO_ROOT)


# ---------------------------------------------------------------- environment

def build_dir():
    """$TRAFFICRATE_BUILD_DIR, or <repo>/build."""
    return Path(os.environ.get("TRAFFICRATE_BUILD_DIR") or REPO_ROOT / "build")


def library_path():
    return build_dir() / "libtrafficrate.so"


def cli_path():
    return build_dir() / "trafficrate"


def parse_rate(text):
    """'500k' -> 512000 (nginx units: k = 1024, m = 1024**2)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kKmM]?)\s*", str(text))
    if not m:
        raise ValueError("bad rate %r" % (text,))
    return int(m.group(1)) * {"": 1, "k": 1024, "m": 1 << 20}[m.group(2).lower()]


_SIOCGIFFLAGS = 0x8913
_SIOCGIFMTU = 0x8921
_IFF_UP = 0x1


def interface_mtu(name="lo"):
    """MTU of an interface in *this* network namespace.

    Asks the kernel through a socket (ioctl): /sys/class/net shows the
    namespace that mounted sysfs, not ours, so it is wrong after `unshare -n`.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16si12x", name.encode(), 0)
        return struct.unpack("16si12x", fcntl.ioctl(s.fileno(), _SIOCGIFMTU, req))[1]


def interface_up(name="lo"):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", name.encode(), 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req))[1]
        return bool(flags & _IFF_UP)


def namespace_problems():
    """Why this process cannot run throughput tests; [] when it can."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not running as root (euid %d)" % os.geteuid())
    names = sorted(name for _, name in socket.if_nameindex())
    if names != ["lo"]:
        problems.append("not in a private network namespace (interfaces: %s)"
                        % ", ".join(names))
    try:
        if not interface_up("lo"):
            problems.append("lo is down")
        mtu = interface_mtu("lo")
        if mtu != 1500:
            problems.append("lo has MTU %d, need 1500 (the kernel's unpaced "
                            "first 10 segments would skew the rates)" % mtu)
    except OSError as e:
        problems.append("cannot query lo: %s" % e)
    return problems


def sysctl(name, value=None):
    """Read (and with value, set) a sysctl via /proc/sys; returns the old
    value. net.* settings belong to this network namespace only."""
    path = Path("/proc/sys") / name.replace(".", "/")
    old = path.read_text().strip()
    if value is not None:
        path.write_text("%s\n" % value)
    return old


# ---------------------------------------------------------------------- zones

_zone_counter = 0


def unique_zone(tag="test"):
    """A zone name no other test or run uses: it-<pid>-<tag>-<n>."""
    global _zone_counter
    _zone_counter += 1
    clean = re.sub(r"[^A-Za-z0-9_-]+", "-", tag).strip("-")[:48] or "zone"
    return "it-%d-%s-%d" % (os.getpid(), clean, _zone_counter)


def zone_path(zone):
    return Path("/dev/shm/trafficrate.%s" % zone)


def remove_zone(zone):
    try:
        zone_path(zone).unlink()
    except FileNotFoundError:
        pass


def preload_env(zone, rate=None, library=None, **variables):
    """The environment that puts a server under the library.

    `rate` None leaves TRAFFICRATE_RATE unset (library inactive). Extra keyword
    arguments are TRAFFICRATE_* names without the prefix, e.g. STRICT="1";
    a value of None leaves that variable out.
    """
    env = {"LD_PRELOAD": str(library or library_path()), "TRAFFICRATE_ZONE": zone}
    if rate is not None:
        env["TRAFFICRATE_RATE"] = str(rate)
    for name, value in variables.items():
        if value is not None:
            env["TRAFFICRATE_" + name.upper()] = str(value)
    return env


def server_environment(extra):
    """os.environ without any LD_PRELOAD / TRAFFICRATE_* leaking in, plus extra."""
    env = {k: v for k, v in os.environ.items()
           if k != "LD_PRELOAD" and not k.startswith("TRAFFICRATE_")}
    env.update(extra or {})
    return env


# ---------------------------------------------------------------------- files

def make_workdir(prefix="trafficrate-it-"):
    """A fresh directory under /tmp that unprivileged nginx workers can read.

    pytest's tmp_path is 0700, which `nobody` cannot traverse.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    return path


def make_webroot(parent, big_size=BIG_FILE_SIZE):
    """parent/www with big.bin (sparse) and small.txt, world-readable."""
    www = Path(parent) / "www"
    www.mkdir(mode=0o755, exist_ok=True)
    www.chmod(0o755)
    with open(www / "big.bin", "wb") as f:
        f.truncate(big_size)
    (www / "small.txt").write_text("trafficrate small file\n" * 100)
    for name in ("big.bin", "small.txt"):
        (www / name).chmod(0o644)
    return www


def free_port(host=SERVER_HOST):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ processes

def wait_for(predicate, timeout, interval=0.02):
    """Poll predicate() until true or timeout seconds; returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def _ppid(pid):
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name is in parentheses and may contain spaces.
    fields = stat[stat.rindex(b")") + 2:].split()
    if fields[0] == b"Z":
        return None  # zombie: no longer a process to stop
    return int(fields[1])


def proc_cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def proc_starttime(pid):
    """The process's start time (clock ticks since boot), or None if gone.

    With the pid it identifies a process for good: a reused pid has a later
    start time. (Its command line does not: nginx retitles its processes,
    e.g. "worker process is shutting down".)
    """
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[19])


def pid_alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:][:1] != b"Z"


def children(pid):
    """Live direct children of pid, from /proc."""
    return sorted(int(e) for e in os.listdir("/proc")
                  if e.isdigit() and _ppid(int(e)) == pid)


def descendants(pid):
    """All live descendants of pid (children first), from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = _ppid(int(entry))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry))
    result, frontier = [], [pid]
    while frontier:
        nxt = []
        for p in frontier:
            nxt.extend(sorted(children.get(p, ())))
        result.extend(nxt)
        frontier = nxt
    return result


def kill_pid(pid, sig=signal.SIGKILL):
    """Signal one process by pid; False if it is already gone."""
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def socket_owners(port, host=SERVER_HOST):
    """Established TCP connections on local host:port and the pids holding them.

    Returns a list of dicts {peer: (ip, port), pids: [..], fds: [..]}, from
    `ss -Htnp`. Useful to see which nginx worker serves which download.
    """
    out = subprocess.run(
        ["ss", "-Htnp", "state", "established", "( sport = :%d )" % port],
        capture_output=True, text=True, timeout=10).stdout
    result = []
    for line in out.splitlines():
        m = re.search(r"(\S+):(\d+)\s+(\S+):(\d+)\s+(users:.*)?$", line)
        if not m or m.group(1) != host:
            continue
        users = m.group(5) or ""
        result.append({
            "peer": (m.group(3), int(m.group(4))),
            "pids": [int(p) for p in re.findall(r"pid=(\d+)", users)],
            "fds": [int(f) for f in re.findall(r"fd=(\d+)", users)],
        })
    return result


def established(port, source=None, host=SERVER_HOST):
    """How many established connections to host:port (from source) exist."""
    return len([o for o in socket_owners(port, host)
                if source is None or o["peer"][0] == source])


# Source ports for probe_owner()/ports_by_worker(): below the kernel's
# ephemeral range (ip_local_port_range 32768-60999), so bind(0) never picks them.
PROBE_PORT_FIRST, PROBE_PORT_LAST = 20000, 32000
_next_probe_port = PROBE_PORT_FIRST


def probe_owner(port, source, source_port, host=SERVER_HOST, timeout=2.0):
    """Which pid accepts a connection from source:source_port to host:port?

    Connects, waits until `ss` shows the accepting process, then resets the
    connection (SO_LINGER 0: no TIME_WAIT, the port is free again at once).
    The probe sends nothing, so it never joins a key. With nginx `listen ...
    reuseport` the kernel picks the worker's socket by a hash of the 4-tuple,
    so a later connection from the same source port lands on the same worker
    (as long as the worker set is the same).
    """
    sock = _connect(port, source, host, timeout, source_port=source_port)
    try:
        def owner():
            for o in socket_owners(port, host):
                if o["peer"] == (source, source_port) and o["pids"]:
                    return o["pids"]
            return None
        pids = wait_for(owner, timeout, 0.005)
    finally:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    return pids[0] if pids else None


def ports_by_worker(port, source, wanted, host=SERVER_HOST, max_probes=200):
    """Source ports whose connections land on chosen worker processes.

    wanted: {pid: how many ports}. Returns {pid: [source ports]}. Needs a
    server whose workers each listen on their own reuseport socket (nginx
    `listen ... reuseport`). Raises RuntimeError if the probes do not find
    enough ports for every pid.
    """
    global _next_probe_port
    found = {pid: [] for pid in wanted}
    seen = {}
    for _ in range(max_probes):
        if all(len(found[pid]) >= n for pid, n in wanted.items()):
            return found
        sport = _next_probe_port
        _next_probe_port += 1
        if _next_probe_port > PROBE_PORT_LAST:
            _next_probe_port = PROBE_PORT_FIRST
        try:
            pid = probe_owner(port, source, sport, host)
        except OSError:
            continue  # port busy: try the next one
        seen[pid] = seen.get(pid, 0) + 1
        if pid in found and len(found[pid]) < wanted[pid]:
            found[pid].append(sport)
    raise RuntimeError("ports_by_worker: wanted %s, found %s after %d probes "
                       "(accepting pids seen: %s)" % (wanted, found, max_probes, seen))


# -------------------------------------------------------------------- servers

_live_servers = set()


@atexit.register
def _stop_leftover_servers():
    for server in list(_live_servers):
        server.stop()


class PidProcess:
    """Popen-like handle (pid, poll, wait) on a process that is not our child,
    e.g. a daemonized nginx master. Its exit status is unknown: 0 once gone."""

    def __init__(self, pid):
        self.pid = pid
        self.start = proc_starttime(pid)
        self.returncode = None

    def poll(self):
        if self.returncode is None and not (
                pid_alive(self.pid) and proc_starttime(self.pid) == self.start):
            self.returncode = 0
        return self.returncode

    def wait(self, timeout=None):
        if not wait_for(lambda: self.poll() is not None,
                        1e9 if timeout is None else timeout):
            raise subprocess.TimeoutExpired("pid %d" % self.pid, timeout)
        return self.returncode


class Server:
    """A server process we started (pid known), with captured output.

    Subclasses set self.argv and self.env, then call start().
    """

    name = "server"

    def __init__(self, workdir, port=None, env=None):
        self.workdir = Path(workdir)
        self.port = port or free_port()
        self.env = dict(env or {})
        self.proc = None
        self.stderr_path = self.workdir / ("%s-%d.stderr" % (self.name, self.port))
        self.argv = []
        self.title = self.name
        self._seen = {}  # pid -> start time of descendants seen so far

    def family(self):
        """Live descendants (workers, forked children), remembered so they can
        still be stopped after the main process died (e.g. SIGKILLed master)."""
        if self.proc is not None and self.proc.poll() is None:
            self.remember(descendants(self.proc.pid))
        return [pid for pid, start in self._seen.items()
                if pid_alive(pid) and proc_starttime(pid) == start]

    def _still_ours(self, pid):
        return pid_alive(pid) and proc_starttime(pid) == self._seen.get(pid)

    def remember(self, pids):
        """Count these processes (and, while alive, their descendants) as
        this server's: stop() stops them too. For processes that are not
        descendants of the main one, e.g. a new nginx master after USR2
        once the old master has exited."""
        for pid in pids:
            for p in [pid] + descendants(pid):
                start = proc_starttime(p)
                if start is not None:
                    self._seen.setdefault(p, start)

    @property
    def pid(self):
        return self.proc.pid

    def start(self, wait_ready=True, timeout=10.0):
        self.stderr_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                self.argv, env=server_environment(self.env),
                stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                start_new_session=True)  # Ctrl-C is ours to handle
        _live_servers.add(self)
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def output(self):
        """Everything the server wrote to stderr (and logs, see subclasses)."""
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def trafficrate_lines(self):
        return [line for line in self.output().splitlines()
                if line.startswith("trafficrate: ")]

    def describe(self):
        rc = self.proc.poll() if self.proc else None
        return "%s pid %s port %d rc %s\n--- output ---\n%s" % (
            self.name, self.proc.pid if self.proc else "-", self.port, rc,
            self.output()[-4000:])

    def exited(self):
        return self.proc is not None and self.proc.poll() is not None

    def wait_exit(self, timeout):
        """Return code, or None if still running after timeout seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def ready(self):
        try:
            status, _, _ = http_get(self.port, SMALL_FILE, timeout=1.0)
            return status == 200
        except (OSError, ValueError, IndexError):
            return False

    def wait_ready(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.exited():
                raise RuntimeError("%s exited during start-up\n%s"
                                   % (self.name, self.describe()))
            if self.ready() and self.extra_ready():
                return
            time.sleep(0.05)
        raise RuntimeError("%s not ready after %.0f s\n%s"
                           % (self.name, timeout, self.describe()))

    def extra_ready(self):
        return True

    def stop(self, sig=signal.SIGTERM, timeout=5.0):
        """Stop the server and all its descendants, by pid; bounded."""
        if self.proc is None:
            return None
        family = self.family()
        if self.proc.poll() is None:
            kill_pid(self.proc.pid, sig)
        rc = self.wait_exit(timeout)
        if rc is None:
            kill_pid(self.proc.pid, signal.SIGKILL)
            rc = self.wait_exit(timeout)
        # Orphaned workers / forked children (e.g. after a SIGKILLed master).
        for pid in family:
            if self._still_ours(pid):
                kill_pid(pid, signal.SIGTERM)
        for pid in family:
            if not wait_for(lambda: not self._still_ours(pid), 2.0):
                kill_pid(pid, signal.SIGKILL)
        _live_servers.discard(self)
        return rc


class NginxServer(Server):
    """Real Debian nginx: master_process on, daemon off (we own the master pid).

    Workers run as `user` and serve webroot (which must be readable by it).
    Its own stderr (where the library's constructor writes) goes to
    <workdir>/nginx-<port>/stderr; nginx later points stderr at its error log,
    so output() returns both.
    """

    name = "nginx"

    def __init__(self, workdir, webroot, port=None, env=None, workers=2,
                 sendfile=True, limit_rate=None, keepalive_timeout="65s",
                 reuseport=False, env_directives=(), user="nobody nogroup",
                 extra_http="", extra_server="", detached=False):
        super().__init__(workdir, port, env)
        self.webroot = Path(webroot)
        self.detached = detached
        self.workers = workers
        self.prefix = self.workdir / ("nginx-%d" % self.port)
        self.conf_path = self.prefix / "nginx.conf"
        self.error_log = self.prefix / "error.log"
        self.stderr_path = self.prefix / "stderr"
        settings = dict(sendfile=sendfile, limit_rate=limit_rate,
                        keepalive_timeout=keepalive_timeout, reuseport=reuseport,
                        env_directives=env_directives, user=user,
                        extra_http=extra_http, extra_server=extra_server)
        self.settings = settings
        self.title = "nginx (%d workers, sendfile %s%s)" % (
            workers, "on" if sendfile else "off",
            ", limit_rate %s" % limit_rate if limit_rate else "")
        self.argv = [NGINX, "-p", str(self.prefix) + "/", "-c", str(self.conf_path),
                     "-e", str(self.error_log)]

    def conf_text(self):
        s = self.settings
        tmp = self.prefix / "tmp"
        lines = ["user %s;" % s["user"] if s["user"] else "",
                 "worker_processes %d;" % self.workers,
                 "master_process on;",
                 "daemon %s;" % ("on" if self.detached else "off"),
                 "pid %s;" % (self.prefix / "nginx.pid"),
                 "error_log %s notice;" % self.error_log]
        lines += ["env %s;" % name for name in s["env_directives"]]
        lines += [
            "events { worker_connections 1024; }",
            "http {",
            "  access_log off;",
            "  default_type application/octet-stream;",
            "  sendfile %s;" % ("on" if s["sendfile"] else "off"),
            "  keepalive_timeout %s;" % s["keepalive_timeout"],
        ]
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
            lines.append("  %s_temp_path %s;" % (kind, tmp / kind))
        lines += [
            s["extra_http"],
            "  server {",
            "    listen %s:%d%s;" % (SERVER_HOST, self.port,
                                     " reuseport" if s["reuseport"] else ""),
            "    root %s;" % self.webroot,
            "    location / {",
            ("      limit_rate %s;" % s["limit_rate"]) if s["limit_rate"] else "",
            "    }",
            s["extra_server"],
            "  }",
            "}",
        ]
        return "\n".join(line for line in lines if line) + "\n"

    def start(self, wait_ready=True, timeout=10.0):
        (self.prefix / "tmp").mkdir(parents=True, exist_ok=True)
        self.conf_path.write_text(self.conf_text())
        if not self.detached:
            return super().start(wait_ready, timeout)
        # daemon on: the process we start forks the master and exits.
        super().start(wait_ready=False)
        rc = self.wait_exit(timeout)
        if rc != 0:
            raise RuntimeError("nginx (daemon on) did not start: rc %s\n%s"
                               % (rc, self.describe()))
        pid = wait_for(self.pid_from_file, timeout)
        if not pid:
            raise RuntimeError("nginx wrote no pid file\n%s" % self.describe())
        self.proc = PidProcess(pid)
        if wait_ready:
            self.wait_ready(timeout)
        return self

    def pid_from_file(self, suffix=""):
        """The live pid in nginx.pid (suffix ".oldbin": the old master's
        during a binary upgrade), or None."""
        try:
            pid = int((self.prefix / ("nginx.pid" + suffix)).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None

    def output(self):
        text = super().output()
        try:
            text += self.error_log.read_text(errors="replace")
        except FileNotFoundError:
            pass
        return text

    def worker_pids(self, master=None, shutting_down=False):
        """Live worker processes of this master (or of another master pid,
        e.g. a new one after USR2), by pid. nginx retitles a worker that
        finishes gracefully "worker process is shutting down": those are
        left out unless shutting_down=True (then only those are listed)."""
        if master is None:
            if self.proc is None or self.proc.poll() is not None:
                return []
            self.family()
            master = self.proc.pid
        else:
            self.remember([master])
        result = []
        for pid in children(master):
            cmd = proc_cmdline(pid) or ""
            if "worker process" in cmd and (
                    "shutting down" in cmd) == bool(shutting_down):
                result.append(pid)
        return result

    def extra_ready(self):
        return len(self.worker_pids()) >= self.workers


class PythonServer(Server):
    """pyserver.py (ThreadingMixIn or ForkingMixIn http.server) on webroot."""

    name = "pyserver"

    def __init__(self, workdir, webroot, port=None, env=None, mode="thread",
                 sendfile=False, pace=None, fd_chain=False):
        """mode: "thread" or "fork"; sendfile: bodies via sendfile(2);
        pace: static SO_MAX_PACING_RATE, an int or {client_ip: B/s} (harness
        self-checks only); fd_chain: serve each socket from a new fd number
        reached through dup/fcntl/dup3/close_range (pyserver --fd-chain)."""
        super().__init__(workdir, port, env)
        self.name = "pyserver-%s%s" % (mode, "-sendfile" if sendfile else "")
        self.title = "python %s server (%s)" % (
            "threaded" if mode == "thread" else "forking",
            "sendfile" if sendfile else "send")
        self.stderr_path = self.workdir / ("%s-%d.stderr" % (self.name, self.port))
        self.argv = [PYTHON, str(PYSERVER), "--port", str(self.port), "--bind",
                     SERVER_HOST, "--dir", str(webroot), "--mode", mode]
        if sendfile:
            self.argv.append("--sendfile")
        if fd_chain:
            self.argv.append("--fd-chain")
            self.title += " serving each socket from a duplicate fd"
        if pace:
            spec = (",".join("%s=%d" % kv for kv in pace.items())
                    if isinstance(pace, dict) else str(int(pace)))
            self.argv += ["--pace", spec]


class ServerFactory:
    """Starts servers in one workdir and stops them all at the end."""

    def __init__(self, workdir, webroot):
        self.workdir, self.webroot = Path(workdir), Path(webroot)
        self.servers = []

    def nginx(self, env=None, start=True, wait_ready=True, timeout=10.0, **kw):
        """NginxServer(**kw) under env; start=False to start it yourself."""
        server = NginxServer(self.workdir, self.webroot, env=env, **kw)
        self.servers.append(server)
        return server.start(wait_ready, timeout) if start else server

    def python(self, env=None, mode="thread", start=True, wait_ready=True,
               timeout=10.0, **kw):
        server = PythonServer(self.workdir, self.webroot, env=env, mode=mode, **kw)
        self.servers.append(server)
        return server.start(wait_ready, timeout) if start else server

    def stop_all(self):
        for server in reversed(self.servers):
            server.stop()


def within(value, target, tolerance):
    """|value / target - 1| <= tolerance."""
    return abs(value / target - 1.0) <= tolerance


# ---------------------------------------------------------------- HTTP client

def _connect(port, source=None, host=SERVER_HOST, timeout=5.0, source_port=0):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        if source or source_port:
            if source_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((source or "0.0.0.0", source_port or 0))
        sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _request(path, host, port, keepalive):
    return ("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: trafficrate-it\r\n"
            "Connection: %s\r\n\r\n" % (path, host, port,
                                        "keep-alive" if keepalive else "close")
            ).encode()


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
        length = int(headers.get("content-length", max_body))
        while len(body) < min(length, max_body) and time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                continue
            if not chunk:
                break
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
        body += chunk
    return body


class Download(threading.Thread):
    """One HTTP GET of a big file from a chosen source address, read flat out.

    Starts at monotonic time `start_at`, stops (closes) at `stop_at` or when
    stop() is called. Records (monotonic time, cumulative body bytes) after
    every recv; bytes_at()/rate() turn that into rates over any window. With
    repeat=True a finished response is followed by a new connection (for
    unlimited downloads that may finish the file).
    """

    RECV_SIZE = 256 * 1024

    def __init__(self, port, source=None, path=BIG_FILE, label=None,
                 start_at=None, stop_at=None, host=SERVER_HOST, repeat=False,
                 recv_timeout=0.25, source_port=0):
        super().__init__(daemon=True)
        self.port, self.source, self.path, self.host = port, source, path, host
        self.source_port = source_port  # 0: any (see ports_by_worker)
        self.label = label or (source or "default")
        self.start_at = start_at if start_at is not None else time.monotonic()
        self.stop_at = stop_at if stop_at is not None else self.start_at + 10.0
        self.repeat = repeat
        self.recv_timeout = recv_timeout
        self.times = array.array("d")
        self.totals = array.array("q")
        self.total = 0
        self.connected_at = None
        self.first_byte_at = None
        self.finished_at = None
        self.local_port = None
        self.status = None
        self.error = None
        self.eof = False
        self._stop_event = threading.Event()

    def stop(self):
        self._stop_event.set()

    def _running(self):
        return not self._stop_event.is_set() and time.monotonic() < self.stop_at

    def run(self):
        try:
            delay = self.start_at - time.monotonic()
            if delay > 0 and self._stop_event.wait(delay):
                return
            while self._running():
                self._one_request()
                if not self.repeat:
                    break
        except Exception as e:  # reported through .error
            self.error = "%s: %s" % (type(e).__name__, e)
        finally:
            self.finished_at = time.monotonic()

    def _note(self, now):
        self.times.append(now)
        self.totals.append(self.total)

    def _one_request(self):
        with _connect(self.port, self.source, self.host,
                      source_port=self.source_port) as sock:
            now = time.monotonic()
            if self.connected_at is None:
                self.connected_at = now
            self.local_port = sock.getsockname()[1]
            self._note(now)
            sock.settimeout(self.recv_timeout)
            sock.sendall(_request(self.path, self.host, self.port, keepalive=False))
            self.status, _, body = _read_head(sock, time.monotonic() + 10.0)
            if self.status != 200:
                raise RuntimeError("HTTP status %d" % self.status)
            buf = bytearray(self.RECV_SIZE)
            if body:
                self.total += len(body)
                self._note(time.monotonic())
            while self._running():
                try:
                    n = sock.recv_into(buf)
                except socket.timeout:
                    continue
                now = time.monotonic()
                if n == 0:
                    self.eof = True
                    return
                if self.first_byte_at is None:
                    self.first_byte_at = now
                self.total += n
                self.times.append(now)
                self.totals.append(self.total)

    def bytes_at(self, t):
        """Body bytes received by monotonic time t (as last seen by recv)."""
        n = min(len(self.times), len(self.totals))
        i = bisect.bisect_right(self.times, t, 0, n)
        return self.totals[i - 1] if i else 0

    def rate(self, t0, t1):
        """Bytes per second received in [t0, t1]."""
        return (self.bytes_at(t1) - self.bytes_at(t0)) / (t1 - t0)


class Measurement:
    """Per-download and per-source rates over one window [t0, t1]."""

    def __init__(self, downloads, t0, t1, target=None, owners=None):
        self.downloads, self.t0, self.t1 = list(downloads), t0, t1
        self.target = target
        self.owners = owners or {}
        self.per_download = [(d, d.rate(t0, t1)) for d in self.downloads]
        self.per_source = {}
        for d, r in self.per_download:
            self.per_source[d.source] = self.per_source.get(d.source, 0.0) + r

    def source_rate(self, source):
        return self.per_source[source]

    def download_rates(self, source):
        return [r for d, r in self.per_download if d.source == source]

    def report(self):
        lines = ["window %.2f s (%.2f..%.2f s after start)%s" % (
            self.t1 - self.t0, self.t0 - self.downloads[0].start_at,
            self.t1 - self.downloads[0].start_at,
            "" if self.target is None else ", target %d B/s per source" % self.target)]
        for d, r in self.per_download:
            owner = self.owners.get(d.label)
            lines.append("  %-16s %10.0f B/s%s%s%s" % (
                d.label, r,
                "" if owner is None else "  pid %s" % owner,
                "" if not d.error else "  ERROR %s" % d.error,
                "  (EOF)" if d.eof else ""))
        for source, r in self.per_source.items():
            ratio = "" if not self.target else "  = %.4f x target" % (r / self.target)
            lines.append("  %-16s %10.0f B/s total%s" % (source, r, ratio))
        return "\n".join(lines)


def bucket_rates(downloads, t0, t1, step=1.0):
    """Consecutive buckets [a, a + step) from t0 up to t1 (monotonic times):
    a list of (a, b, summed B/s, [B/s of each download])."""
    result = []
    n = int(round((t1 - t0) / step))
    for i in range(n):
        a, b = t0 + i * step, t0 + (i + 1) * step
        rates = [d.rate(a, b) for d in downloads]
        result.append((a, b, sum(rates), rates))
    return result


class DownloadSet:
    """Parallel downloads, all from one start time."""

    def __init__(self, port, sources, path=BIG_FILE, duration=10.0,
                 start_delay=0.05, repeat=False, host=SERVER_HOST,
                 source_ports=None):
        """source_ports: optional list parallel to sources (0 = any), e.g.
        from ports_by_worker() to choose which reuseport worker serves each."""
        self.start_at = time.monotonic() + start_delay
        self.stop_at = self.start_at + duration
        counts = {}
        self.downloads = []
        source_ports = list(source_ports or [])
        for i, source in enumerate(sources):
            counts[source] = counts.get(source, 0) + 1
            self.downloads.append(Download(
                port, source, path, label="%s#%d" % (source, counts[source]),
                start_at=self.start_at, stop_at=self.stop_at, host=host,
                repeat=repeat,
                source_port=source_ports[i] if i < len(source_ports) else 0))
        self.port, self.host = port, host
        self.owners = {}

    def start(self):
        for d in self.downloads:
            d.start()
        return self

    def add(self, source, start_after=0.0, stop_after=None, path=BIG_FILE,
            source_port=0):
        """Start one more download `start_after` s after this set's start,
        ending `stop_after` s after the set's start (default: with the set).
        For join/leave scenarios; returns the started Download."""
        count = 1 + sum(1 for d in self.downloads if d.source == source)
        d = Download(self.port, source, path, label="%s#%d" % (source, count),
                     start_at=self.start_at + start_after,
                     stop_at=self.start_at + stop_after if stop_after else self.stop_at,
                     host=self.host, source_port=source_port)
        self.downloads.append(d)
        d.start()
        return d

    def stop(self):
        for d in self.downloads:
            d.stop()

    def join(self, timeout=None):
        """Wait for all downloads; bounded by stop_at + a margin by default."""
        deadline = time.monotonic() + (timeout if timeout is not None else
                                       max(0.0, self.stop_at - time.monotonic()) + 5.0)
        for d in self.downloads:
            d.join(max(0.0, deadline - time.monotonic()))
        return all(not d.is_alive() for d in self.downloads)

    def all_started(self):
        """Monotonic time by which every download had connected, or None."""
        times = [d.connected_at for d in self.downloads]
        return None if None in times else max(times)

    def wait_started(self, timeout=10.0):
        return wait_for(self.all_started, timeout)

    def record_owners(self):
        """Map each download's label to the pid(s) serving it (via ss)."""
        by_port = {o["peer"]: o["pids"] for o in socket_owners(self.port)}
        for d in self.downloads:
            pids = by_port.get((d.source or "127.0.0.1", d.local_port))
            if pids:
                self.owners[d.label] = ",".join(str(p) for p in sorted(set(pids)))
        return self.owners

    def errors(self):
        return ["%s: %s" % (d.label, d.error) for d in self.downloads if d.error]

    def measure(self, t0, t1, target=None):
        return Measurement(self.downloads, t0, t1, target, self.owners)


def run_downloads(port, sources, warmup=2.0, window=8.0, target=None,
                  path=BIG_FILE, repeat=False, host=SERVER_HOST):
    """Run parallel downloads and measure [all started + warmup, + window].

    `sources` lists one source address per download, e.g.
    ["127.0.0.2"] * 4 + ["127.0.0.3"]. Returns a Measurement; raises if the
    downloads could not all start.
    """
    dset = DownloadSet(port, sources, path, duration=warmup + window + 1.0,
                       repeat=repeat, host=host).start()
    try:
        started = dset.wait_started(10.0)
        if not started:
            raise RuntimeError("downloads did not all connect: %s"
                               % (dset.errors() or "timeout"))
        t0 = started + warmup
        t1 = t0 + window
        # Who serves whom, looked up while all connections are open.
        time.sleep(min(warmup, 1.0))
        dset.record_owners()
        time.sleep(max(0.0, t1 + 0.05 - time.monotonic()))
    finally:
        dset.stop()
        dset.join(10.0)
    return dset.measure(t0, t1, target)


# ------------------------------------------------------------------------ CLI

def run_cli(*args, timeout=10.0, env=None):
    """Run build/trafficrate with args; returns subprocess.CompletedProcess."""
    return subprocess.run([str(cli_path())] + [str(a) for a in args],
                          capture_output=True, text=True, timeout=timeout,
                          env=server_environment(env))


def key_stat(zone, key):
    """The stat entry of one key: {key, active, connections, share, bytes};
    zeros when the zone has no such key (no registered connection)."""
    for entry in stat_json(zone)["keys"]:
        if entry["key"] == key:
            return entry
    return {"key": key, "active": 0, "connections": 0, "share": 0, "bytes": 0}


def stat_json(zone, timeout=10.0):
    """`trafficrate stat --zone ZONE --json`, parsed."""
    cp = run_cli("stat", "--zone", zone, "--json", timeout=timeout)
    if cp.returncode != 0:
        raise RuntimeError("trafficrate stat failed (%d): %s"
                           % (cp.returncode, cp.stderr.strip()))
    return json.loads(cp.stdout)


# ----------------------------------------------------------------------- demo

def _demo(args):
    problems = namespace_problems()
    if problems:
        print("demo: " + "; ".join(problems) + "\n" + RUN_HINT, file=sys.stderr)
        return 2
    plan = []
    for item in args.clients.split(","):
        source, _, count = item.partition(":")
        plan += [source] * int(count or 1)
    sources = list(dict.fromkeys(plan))
    target = parse_rate(args.rate) if args.rate else None

    env = {}
    if not args.no_preload:
        lib = Path(args.library) if args.library else library_path()
        if not lib.is_file():
            print("demo: %s not found; build first" % lib, file=sys.stderr)
            return 1
        env = preload_env(args.zone, args.rate, library=lib)
    workdir = make_workdir("trafficrate-demo-")
    server = None
    dset = None
    try:
        webroot = make_webroot(workdir)
        server = NginxServer(workdir, webroot, env=env, workers=args.workers,
                             sendfile=args.sendfile == "on",
                             limit_rate=args.nginx_limit_rate)
        server.start()
        print("nginx master pid %d, workers %s, http://%s:%d%s, sendfile %s" % (
            server.pid, " ".join(map(str, server.worker_pids())), SERVER_HOST,
            server.port, BIG_FILE, args.sendfile))
        if env:
            print("environment: " + " ".join("%s=%s" % kv for kv in sorted(env.items())))
        for line in server.trafficrate_lines():
            print("nginx said: " + line)
        print("clients: " + ", ".join("%d connection(s) from %s" % (plan.count(s), s)
                                      for s in sources))
        if target:
            print("target: %d B/s (%.1f KiB/s) per client IP, shared by its "
                  "connections" % (target, target / 1024.0))
        print()

        dset = DownloadSet(server.port, plan, duration=args.duration).start()
        if not dset.wait_started(10.0):
            print("demo: downloads did not start: %s" % dset.errors(), file=sys.stderr)
            return 1
        time.sleep(0.5)
        dset.record_owners()
        labels = [d.label for d in dset.downloads]
        width = max(9, max(len(l) for l in labels + sources)) + 1

        def row(first, cells, totals):
            return ("%7s |" % first + "".join("%*s" % (width, c) for c in cells)
                    + "  |" + "".join("%*s" % (width, c) for c in totals))

        print("rate of each connection over the last second, and of each "
              "client IP, in KiB/s:")
        print(row("worker", [dset.owners.get(l, "?") for l in labels],
                  ["" for _ in sources]))
        header = row("time", labels, sources)
        print(header)
        print("-" * len(header))
        base = dset.start_at
        tick = 1
        stat_text = None
        while time.monotonic() < dset.stop_at - 0.05:
            time.sleep(max(0.0, base + tick - time.monotonic()))
            now = time.monotonic()
            rates = [d.rate(now - 1.0, now) for d in dset.downloads]
            totals = [sum(r for d, r in zip(dset.downloads, rates) if d.source == s)
                      for s in sources]
            print(row("%.0fs" % (now - base), ["%.1f" % (r / 1024.0) for r in rates],
                      ["%.1f" % (t / 1024.0) for t in totals]), flush=True)
            if tick == int(args.duration / 2) and env and cli_path().exists():
                # While every download runs: what the zone itself says.
                cp = run_cli("stat", "--zone", args.zone, timeout=5.0)
                if cp.returncode == 0 and cp.stdout.strip():
                    stat_text = "`trafficrate stat --zone %s` at %ds:\n%s" % (
                        args.zone, tick, cp.stdout.rstrip())
            tick += 1
        dset.join(10.0)
        started = dset.all_started()
        t0, t1 = started + args.warmup, dset.stop_at - 0.1
        m = dset.measure(t0, t1, target)
        print()
        print("averages over %.1f s .. %.1f s:" % (t0 - base, t1 - base))
        for d, r in m.per_download:
            print("  %-14s %9.0f B/s %8.1f KiB/s%s" % (d.label, r, r / 1024.0,
                                                       "  " + d.error if d.error else ""))
        for s in sources:
            r = m.source_rate(s)
            print("  %-14s %9.0f B/s %8.1f KiB/s  total%s" % (
                s, r, r / 1024.0,
                "  (%.3f x target %d B/s, %+.1f%%)" % (r / target, target,
                                                       100.0 * (r / target - 1))
                if target else ""))
        if stat_text:
            print("\n" + stat_text)
        return 0
    except KeyboardInterrupt:
        print("\ndemo: interrupted, cleaning up", file=sys.stderr)
        return 130
    finally:
        if dset:
            dset.stop()
            dset.join(3.0)
        if server:
            server.stop()
        if env:
            remove_zone(args.zone)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description="trafficrate integration harness")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="nginx under the library, live rate table "
                          "(run inside `unshare -n` with lo at MTU 1500)")
    demo.add_argument("--rate", default="500k", help="TRAFFICRATE_RATE")
    demo.add_argument("--zone", default="demo-%d" % os.getpid())
    demo.add_argument("--clients", default="127.0.0.2:4,127.0.0.3:1",
                      help="source:connections,...")
    demo.add_argument("--duration", type=float, default=15.0)
    demo.add_argument("--warmup", type=float, default=2.0)
    demo.add_argument("--workers", type=int, default=2)
    demo.add_argument("--sendfile", choices=("on", "off"), default="on")
    demo.add_argument("--library", help="default: $TRAFFICRATE_BUILD_DIR/libtrafficrate.so")
    demo.add_argument("--no-preload", action="store_true",
                      help="run nginx without the library (harness check)")
    demo.add_argument("--nginx-limit-rate", help="nginx limit_rate (harness check)")
    sub.add_parser("check", help="is this a usable test namespace?")
    args = parser.parse_args(argv)
    if args.command == "check":
        problems = namespace_problems()
        print("ok" if not problems else "; ".join(problems))
        return 1 if problems else 0
    return _demo(args)


def _interrupt_on_sigterm(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    # Clean up on Ctrl-C even if started with SIGINT ignored (background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    sys.exit(main())
