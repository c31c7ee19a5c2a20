"""Servers that supervise forked workers, under LD_PRELOAD, for the
trafficrate integration tests (part of harness.py):

  * SupervisedServer: a parent process that forks the workers that serve;
  * ApacheServer: the real Debian Apache httpd (apache2 -DFOREGROUND, a
    self-contained config), prefork or event MPM;
  * LighttpdServer: the real Debian lighttpd (-D), server.max-worker N;
  * NodeServer: a Node.js `cluster` file server (NODE_CLUSTER_JS, written
    into the workdir), N workers, round-robin or workers-accept scheduling.

Each is a server_base.Server: stopped by pid, with every descendant.
Standard library only; import it through harness (`import harness`).
"""

import grp
import os
import pwd
import subprocess
from pathlib import Path

from netns_env import SERVER_HOST
from procs import children
from server_base import Server

APACHE = "/usr/sbin/apache2"
APACHE_MODULES = Path("/usr/lib/apache2/modules")
LIGHTTPD = "/usr/sbin/lighttpd"
NODE = "/usr/bin/node"


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
