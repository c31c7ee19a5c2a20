"""Who serves whom, for the trafficrate integration tests (part of
harness.py): socket_owners() (which pid holds which TCP connection, via
ss), established(), and probe_owner() / ports_by_worker() to pick source
ports that land on chosen nginx reuseport workers.

Standard library only; import it through harness (`import harness`).
"""

import re
import socket
import struct
import subprocess

from http_client import _connect
from netns_env import SERVER_HOST
from procs import wait_for


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
