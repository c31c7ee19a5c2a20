"""Processes by pid for the trafficrate integration tests (part of harness.py).

Bounded polling (wait_for()) and /proc helpers: a process's command line and
start time (pid + start time identify a process for good), liveness
(zombies count as gone), children(), descendants(), and kill_pid(). Servers
use them to stop every process they started, by pid, and tests to follow
workers and forked children.

Standard library only; import it through harness (`import harness`).
"""

import os
import signal
import time


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
