"""Servers under LD_PRELOAD for the trafficrate integration tests (part of
harness.py).

  * NginxServer: the real Debian nginx, master + N workers, daemon off (so we
    own the master's pid) or daemon on (the master then comes from the pid
    file, see server_base.PidProcess);
  * PythonServer: pyserver.py, threaded or forking http.server;
  * ServerFactory: starts servers in one workdir and stops them all; besides
    these two it starts those of supervised_servers.py (ApacheServer,
    LighttpdServer, NodeServer).

Every server is a server_base.Server: stopped by pid, with every descendant
it ever had (also after its main process died), with bounded waits;
leftovers are stopped at interpreter exit.

Standard library only; import it through harness (`import harness`).
"""

from pathlib import Path

from netns_env import NGINX, PYSERVER, PYTHON, SERVER_HOST
from procs import children, pid_alive, proc_cmdline, wait_for
from server_base import PidProcess, Server
from supervised_servers import ApacheServer, LighttpdServer, NodeServer


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
