#!/usr/bin/python3
"""Run a command with a /dev/log of the test's own, in a private mount
namespace (for test_syslog.py; the host's /dev is never touched).

    unshare --mount --propagation private -- /usr/bin/python3 devlog_ns.py \
        --scratch DIR [--socket SOCKET] -- COMMAND ARGS...

Mounts a tmpfs over /dev holding everything the real /dev holds (each entry
bind-mounted from a recursive bind of the real /dev at DIR, symlinks copied,
so /dev/shm, where the zones live, is the real one), plus /dev/log: SOCKET
bind-mounted there (an AF_UNIX socket the test bound), or nothing without
--socket. Then execs COMMAND, keeping this process's pid, with
$DEVLOG_NS_LD_PRELOAD moved to LD_PRELOAD (so unshare and this script run
without the library, and only COMMAND logs).

Standard library only; Linux, root.
"""

import argparse
import ctypes
import ctypes.util
import os
import sys

MS_BIND = 0x1000
MS_REC = 0x4000

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def mount(source, target, fstype=None, flags=0, data=None):
    rc = _libc.mount(source.encode() if source else None, target.encode(),
                     fstype.encode() if fstype else None, ctypes.c_ulong(flags),
                     data.encode() if data else None)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, "mount %s on %s: %s" % (source, target,
                                                   os.strerror(err)))


def private_dev(scratch, socket_path):
    real = os.path.join(scratch, "real-dev")
    os.makedirs(real, exist_ok=True)
    mount("/dev", real, flags=MS_BIND | MS_REC)
    mount("tmpfs", "/dev", "tmpfs", 0, "mode=755")
    for entry in os.scandir(real):
        target = os.path.join("/dev", entry.name)
        if entry.name == "log":
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), target)
        elif entry.is_dir(follow_symlinks=False):
            os.mkdir(target)
            mount(entry.path, target, flags=MS_BIND | MS_REC)
        else:
            open(target, "w").close()
            mount(entry.path, target, flags=MS_BIND)
    if socket_path:
        open("/dev/log", "w").close()
        mount(socket_path, "/dev/log", flags=MS_BIND)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--scratch", required=True)
    parser.add_argument("--socket")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command")
    private_dev(args.scratch, args.socket)
    env = dict(os.environ)
    preload = env.pop("DEVLOG_NS_LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
    sys.stdout.flush()
    os.execve(command[0], command, env)


if __name__ == "__main__":
    main()
