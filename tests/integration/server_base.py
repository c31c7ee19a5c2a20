"""The server process handle of the trafficrate integration tests (part of
harness.py):

  * Server: a server process we started (pid known), with captured output,
    stopped by pid with every descendant it ever had (also after its main
    process died), with bounded waits; leftovers are stopped at
    interpreter exit. NginxServer and PythonServer (servers.py),
    ApacheServer, LighttpdServer and NodeServer (supervised_servers.py) are
    Servers, and so are the tests' own (ftp.py, test_inherited.py ...);
  * PidProcess: a Popen-like handle on a process that is not our child
    (e.g. a daemonized nginx master).

Standard library only; import it through harness (`import harness`).
"""

import atexit
import signal
import subprocess
import time
from pathlib import Path

from http_client import http_get
from netns_env import SMALL_FILE, free_port, server_environment
from procs import descendants, kill_pid, pid_alive, proc_starttime, wait_for

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
