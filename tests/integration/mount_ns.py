"""A private mount namespace for tests that need filesystems of their own
where zones live: a fresh (small) tmpfs on /dev/shm, /run as a tmpfs or on
disk. It is held by a sleeping process we start (`unshare --mount`); every
command of the test that must see those filesystems (servers, the CLI, a
squatting user) enters it with nsenter, and runs as any user with setpriv.
The network namespace stays the test's own.

    ns = MountNamespace()
    ns.tmpfs("/dev/shm", "64m")
    ns.run_on_disk("/run")             # root's zones then go to /dev/shm
    server.argv = ns.command(server.argv, env=lib_env)   # server.env = {}
    ns.run(["sh", "-c", "..."], user=65534)
    ns.close()                         # by pid

Standard library only; import it directly (`import mount_ns`).
"""

import os
import shutil
import subprocess
import tempfile

from procs import kill_pid, wait_for


class MountNamespace:
    def __init__(self):
        self.holder = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--",
             "sleep", "3600"], stdin=subprocess.DEVNULL,
            start_new_session=True)
        self._disk_dirs = []
        mine = os.readlink("/proc/self/ns/mnt")

        def entered():
            try:
                return os.readlink("/proc/%d/ns/mnt" % self.holder.pid) != mine
            except OSError:
                return False
        if not wait_for(entered, 5.0):
            self.close()
            raise RuntimeError("unshare --mount did not start")

    def prefix(self, user=None):
        """argv prefix that runs a command in the namespace, as `user` (a
        uid, or (uid, gid)) when given."""
        argv = ["nsenter", "-t", str(self.holder.pid), "-m", "--"]
        if user is not None:
            uid, gid = user if isinstance(user, tuple) else (user, user)
            argv += ["setpriv", "--reuid", str(uid), "--regid", str(gid),
                     "--clear-groups", "--"]
        return argv

    def command(self, argv, user=None, env=None):
        """argv that runs `argv` in the namespace as `user`, with `env` added
        to its environment only: nsenter and setpriv must not run under
        LD_PRELOAD (they would make zones of their own, root's, on the way)."""
        extra = ["%s=%s" % kv for kv in (env or {}).items()]
        return self.prefix(user) + (["env"] + extra if extra else []) + \
            [str(a) for a in argv]

    def run(self, argv, user=None, check=True, timeout=30.0, env=None):
        cp = subprocess.run(self.command(argv, user, env), capture_output=True,
                            text=True, timeout=timeout)
        if check and cp.returncode != 0:
            raise RuntimeError("%s: rc %d\n%s%s" % (argv, cp.returncode,
                                                    cp.stdout, cp.stderr))
        return cp

    def tmpfs(self, path, size, mode="1777"):
        self.run(["mount", "-t", "tmpfs", "-o", "size=%s,mode=%s" % (size, mode),
                  "tmpfs", path])

    def run_on_disk(self, path="/run"):
        """Puts an empty directory of a disk filesystem over `path`, so that
        the library finds it is no memory filesystem (as /run is in many
        containers)."""
        disk = tempfile.mkdtemp(prefix="trafficrate-it-disk-", dir="/var/tmp")
        os.chmod(disk, 0o755)
        self._disk_dirs.append(disk)
        self.run(["mount", "--bind", disk, path])

    def close(self):
        if self.holder.poll() is None:
            kill_pid(self.holder.pid)
            try:
                self.holder.wait(5.0)
            except subprocess.TimeoutExpired:
                pass
        for disk in self._disk_dirs:
            shutil.rmtree(disk, ignore_errors=True)
        self._disk_dirs = []
