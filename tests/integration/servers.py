"""Servers under LD_PRELOAD for the trafficrate integration tests (part of
harness.py).

  * NginxServer: the real Debian nginx, master + N workers, daemon off (so we
    own the master's pid) or daemon on (the master then comes from the pid
    file, see PidProcess);
  * PythonServer: pyserver.py, threaded or forking http.server;
  * ApacheServer: the real Debian Apache httpd (apache2 -DFOREGROUND, a
    self-contained config), prefork or event MPM;
  * LighttpdServer: the real Debian lighttpd (-D), server.max-worker N;
  * NodeServer: a Node.js `cluster` file server (NODE_CLUSTER_JS, written
    into the workdir), N workers, round-robin or workers-accept scheduling;
  * ServerFactory: starts servers in one workdir and stops them all.

Every server is stopped by pid, with every descendant it ever had (also
after its main process died), with bounded waits; leftovers are stopped at
interpreter exit.

Standard library only; import it through harness (`import harness`).
"""

import atexit
import grp
import os
import pwd
import signal
import subprocess
import time
from pathlib import Path

from http_client import http_get
from netns_env import (NGINX, PYSERVER, PYTHON, SERVER_HOST, SMALL_FILE,
                       free_port, server_environment)
from procs import (children, descendants, kill_pid, pid_alive, proc_cmdline,
                   proc_starttime, wait_for)

APACHE = "/usr/sbin/apache2"
APACHE_MODULES = Path("/usr/lib/apache2/modules")
LIGHTTPD = "/usr/sbin/lighttpd"
NODE = "/usr/bin/node"

_live_servers = set()


def unprivileged_user():
    """(user, group) that servers started as root switch to: www-data if
    this machine has it, else nobody/nogroup."""
    for user, group in (("www-data", "www-data"), ("nobody", "nogroup")):
        try:
            pwd.getpwnam(user)
            grp.getgrnam(group)
            return user, group
        except KeyError:
            continue
    raise RuntimeError("neither www-data nor nobody/nogroup exists")


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
                 extra_http="", extra_server="", detached=False,
                 extra_ports=()):
        """extra_ports: more ports the same server block listens on (besides
        `port`, which readiness checks and self.port use)."""
        super().__init__(workdir, port, env)
        self.extra_ports = [int(p) for p in extra_ports]
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
        self.title = "nginx (%d workers, sendfile %s%s%s)" % (
            workers, "on" if sendfile else "off",
            ", limit_rate %s" % limit_rate if limit_rate else "",
            "".join(", also port %d" % p for p in self.extra_ports))
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
        ]
        lines += ["    listen %s:%d%s;" % (SERVER_HOST, port,
                                          " reuseport" if s["reuseport"] else "")
                  for port in [self.port] + self.extra_ports]
        lines += [
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


class SupervisedServer(Server):
    """A parent process that forks the workers that serve (Apache, lighttpd,
    a Node.js cluster): ready once `expected_workers` children live.
    Subclasses give config_file() -> (path, text), written at start()."""

    expected_workers = 1

    def config_file(self):
        return None

    def start(self, wait_ready=True, timeout=10.0):
        config = self.config_file()
        if config is not None:
            path, text = config
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return super().start(wait_ready, timeout)

    def worker_pids(self):
        """Live children of the parent (the processes that serve)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        self.family()
        return children(self.proc.pid)

    def extra_ready(self):
        return len(self.worker_pids()) >= self.expected_workers


class ApacheServer(SupervisedServer):
    """Real Debian Apache httpd, `apache2 -f CONF -DFOREGROUND` (the parent
    stays in the foreground, so we own its pid; not -X, which would serve
    from that one process).

    The config is self-contained (written into <workdir>/apache-<mpm>-<port>/,
    no /etc/apache2): the MPM and mod_authz_core from /usr/lib/apache2/modules,
    Listen SERVER_HOST:port, DocumentRoot webroot. mpm "prefork": `processes`
    children are started and kept (one connection each); "event": exactly
    `processes` children of `threads` threads each. As root the children run
    as www-data (or nobody). output() is its stderr and its error log.
    """

    def __init__(self, workdir, webroot, port=None, env=None, mpm="prefork",
                 processes=6, threads=8, sendfile=False):
        if mpm not in ("prefork", "event"):
            raise ValueError("mpm %r: prefork or event" % (mpm,))
        self.name = "apache-%s" % mpm
        super().__init__(workdir, port, env)
        self.webroot = Path(webroot)
        self.mpm, self.processes, self.threads = mpm, processes, threads
        self.sendfile = sendfile
        self.prefix = self.workdir / ("%s-%d" % (self.name, self.port))
        self.conf_path = self.prefix / "httpd.conf"
        self.error_log = self.prefix / "error.log"
        self.stderr_path = self.prefix / "stderr"
        self.title = "apache2 (%s MPM, %d processes%s, sendfile %s)" % (
            mpm, processes,
            " x %d threads" % threads if mpm == "event" else "",
            "on" if sendfile else "off")
        self.argv = [APACHE, "-f", str(self.conf_path), "-DFOREGROUND"]

    def conf_text(self):
        lines = [
            "LoadModule mpm_%s_module %s" % (
                self.mpm, APACHE_MODULES / ("mod_mpm_%s.so" % self.mpm)),
            "LoadModule authz_core_module %s" % (
                APACHE_MODULES / "mod_authz_core.so"),
            "ServerRoot %s" % self.prefix,
            "ServerName localhost",
            "Listen %s:%d" % (SERVER_HOST, self.port),
            "PidFile %s" % (self.prefix / "httpd.pid"),
            "DefaultRuntimeDir %s" % self.prefix,
            "ErrorLog %s" % self.error_log,
            "LogLevel notice",
            "DocumentRoot %s" % self.webroot,
            "<Directory %s>" % self.webroot,
            "  Require all granted",
            "</Directory>",
            "EnableSendfile %s" % ("On" if self.sendfile else "Off"),
        ]
        if os.geteuid() == 0:
            user, group = unprivileged_user()
            lines += ["User %s" % user, "Group %s" % group]
        n = self.processes
        if self.mpm == "prefork":
            lines += ["StartServers %d" % n, "MinSpareServers %d" % n,
                      "MaxSpareServers %d" % (n + 4),
                      "MaxRequestWorkers %d" % (n + 16)]
        else:
            t = self.threads
            # Spare-thread bounds that never start or stop a child.
            lines += ["StartServers %d" % n, "ServerLimit %d" % n,
                      "ThreadLimit %d" % t, "ThreadsPerChild %d" % t,
                      "MaxRequestWorkers %d" % (n * t),
                      "MinSpareThreads %d" % t,
                      "MaxSpareThreads %d" % (n * t)]
        return "\n".join(lines) + "\n"

    def config_file(self):
        return self.conf_path, self.conf_text()

    @property
    def expected_workers(self):
        return self.processes

    def output(self):
        text = super().output()
        try:
            text += self.error_log.read_text(errors="replace")
        except FileNotFoundError:
            pass
        return text


class LighttpdServer(SupervisedServer):
    """Real Debian lighttpd, `lighttpd -D -f CONF` (foreground), with
    server.max-worker = workers: the process we start supervises that many
    forked workers, which all accept on the one listening socket. As root it
    switches to www-data (or nobody) after binding. It logs to stderr."""

    name = "lighttpd"

    def __init__(self, workdir, webroot, port=None, env=None, workers=2):
        super().__init__(workdir, port, env)
        self.webroot = Path(webroot)
        self.workers = workers
        self.prefix = self.workdir / ("lighttpd-%d" % self.port)
        self.conf_path = self.prefix / "lighttpd.conf"
        self.stderr_path = self.prefix / "stderr"
        self.title = "lighttpd (%d workers)" % workers
        self.argv = [LIGHTTPD, "-D", "-f", str(self.conf_path)]

    def conf_text(self):
        lines = ['server.document-root = "%s"' % self.webroot,
                 'server.bind = "%s"' % SERVER_HOST,
                 "server.port = %d" % self.port,
                 "server.max-worker = %d" % self.workers]
        if os.geteuid() == 0:
            user, group = unprivileged_user()
            lines += ['server.username = "%s"' % user,
                      'server.groupname = "%s"' % group]
        return "\n".join(lines) + "\n"

    def config_file(self):
        return self.conf_path, self.conf_text()

    @property
    def expected_workers(self):
        return self.workers


# The Node.js cluster file server NodeServer runs (node FILE PORT ROOT
# WORKERS). Only APIs that both Debian's Node 18 and later ones have.
NODE_CLUSTER_JS = r"""'use strict';
// trafficrate integration test: a cluster HTTP file server.
// node cluster.js PORT ROOT WORKERS; NODE_CLUSTER_SCHED_POLICY picks who
// accepts (rr: the primary, passing each socket to a worker; none: workers).
const cluster = require('cluster');
const fs = require('fs');
const http = require('http');
const path = require('path');

const [port, root, workers] = process.argv.slice(2);

if (cluster.isPrimary) {
  let listening = 0;
  for (let i = 0; i < Number(workers); i++) {
    cluster.fork();
  }
  cluster.on('listening', () => {
    listening += 1;
    if (listening === Number(workers)) {
      console.error('cluster: %d workers listening, scheduling %s', listening,
                    cluster.schedulingPolicy === cluster.SCHED_RR ? 'rr' : 'none');
    }
  });
  cluster.on('exit', (worker, code, signal) => {
    console.error('cluster: worker %d exited (%s)', worker.process.pid,
                  signal || code);
  });
  const stop = () => {
    for (const id in cluster.workers) {
      cluster.workers[id].process.kill('SIGTERM');
    }
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
} else {
  http.createServer((req, res) => {
    const name = path.normalize(decodeURIComponent(req.url.split('?')[0]));
    const file = path.join(root, name);
    if (!file.startsWith(root + path.sep)) {
      res.writeHead(403);
      res.end();
      return;
    }
    fs.stat(file, (err, st) => {
      if (err || !st.isFile()) {
        res.writeHead(404);
        res.end();
        return;
      }
      res.writeHead(200, {'Content-Type': 'application/octet-stream',
                          'Content-Length': st.size});
      const stream = fs.createReadStream(file);
      stream.on('error', () => res.destroy());
      res.on('close', () => stream.destroy());
      stream.pipe(res);
    });
  }).listen(Number(port), '%s');
}
""".replace("'%s'", "'" + SERVER_HOST + "'")


class NodeServer(SupervisedServer):
    """Node.js `cluster` file server (NODE_CLUSTER_JS, written into the
    workdir as node-cluster-PORT.js): a primary and `workers` forked
    workers, each serving webroot with fs.createReadStream piped to the
    response. sched "rr" (Node's default on Linux): the primary accepts
    every connection and passes the socket to a worker over their IPC
    channel (SCM_RIGHTS); "none": the workers accept on the shared listening
    socket themselves. Set through NODE_CLUSTER_SCHED_POLICY."""

    def __init__(self, workdir, webroot, port=None, env=None, workers=2,
                 sched="rr"):
        if sched not in ("rr", "none"):
            raise ValueError("sched %r: rr or none" % (sched,))
        self.name = "node-cluster-%s" % sched
        env = dict(env or {}, NODE_CLUSTER_SCHED_POLICY=sched)
        super().__init__(workdir, port, env)
        self.webroot = Path(webroot)
        self.workers, self.sched = workers, sched
        self.script = self.workdir / ("node-cluster-%d.js" % self.port)
        self.title = "node %s cluster (%d workers, %s)" % (
            self.version(), workers,
            "round-robin: the primary accepts and passes sockets" if sched == "rr"
            else "workers accept")
        self.argv = [NODE, str(self.script), str(self.port), str(self.webroot),
                     str(workers)]

    @staticmethod
    def version():
        try:
            return subprocess.run([NODE, "--version"], capture_output=True,
                                  text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return "?"

    def config_file(self):
        return self.script, NODE_CLUSTER_JS

    @property
    def expected_workers(self):
        return self.workers

    def extra_ready(self):
        return ("cluster: %d workers listening" % self.workers in self.output()
                and super().extra_ready())


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

    def apache(self, env=None, mpm="prefork", start=True, wait_ready=True,
               timeout=10.0, **kw):
        """ApacheServer(mpm=..., **kw) under env."""
        return self._add(ApacheServer(self.workdir, self.webroot, env=env,
                                      mpm=mpm, **kw), start, wait_ready, timeout)

    def lighttpd(self, env=None, start=True, wait_ready=True, timeout=10.0,
                 **kw):
        """LighttpdServer(**kw) under env."""
        return self._add(LighttpdServer(self.workdir, self.webroot, env=env,
                                        **kw), start, wait_ready, timeout)

    def node(self, env=None, sched="rr", start=True, wait_ready=True,
             timeout=10.0, **kw):
        """NodeServer(sched=..., **kw) under env."""
        return self._add(NodeServer(self.workdir, self.webroot, env=env,
                                    sched=sched, **kw), start, wait_ready, timeout)

    def _add(self, server, start, wait_ready, timeout):
        self.servers.append(server)
        return server.start(wait_ready, timeout) if start else server

    def stop_all(self):
        for server in reversed(self.servers):
            server.stop()
