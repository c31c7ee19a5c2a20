"""The trafficrate CLI for the trafficrate integration tests (part of
harness.py): run_cli() runs build/trafficrate with a clean environment,
stat_json() parses `trafficrate stat --json`, key_stat() picks one key,
wait_key_count() polls it, placed_ports() picks client ports served by
chosen workers once their probes have left the zone.

Standard library only; import it through harness (`import harness`).
"""

import json
import subprocess
import time

from netns_env import cli_path, server_environment
from who_serves import ports_by_worker


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


def stat_json(zone, timeout=10.0, top=None):
    """`trafficrate stat --zone ZONE --json`, parsed; with top, only the
    first `top` keys (cheap where a zone holds thousands)."""
    extra = ("--top", top) if top is not None else ()
    cp = run_cli("stat", "--zone", zone, "--json", *extra, timeout=timeout)
    if cp.returncode != 0:
        raise RuntimeError("trafficrate stat failed (%d): %s"
                           % (cp.returncode, cp.stderr.strip()))
    return json.loads(cp.stdout)


# The packet shaper's counters in each process of `stat --json`.
SHAPER_COUNTERS = ("shaped_calls", "shaped_pieces", "shaper_syscalls")


def shaper_counts(zone):
    """The packet shaper's counters in `trafficrate stat --json`, summed over
    the zone's processes: the host's calls it cut, the MSG_EOR pieces they
    went out as, the system calls it made. Read while the server runs."""
    procs = stat_json(zone)["processes"]
    return {k: sum(p.get(k, 0) for p in procs) for k in SHAPER_COUNTERS}


def wait_key_count(zone, key, connections, timeout):
    """Poll stat until the key has `connections` connections; returns
    (seconds waited or None on timeout, last key entry)."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while True:
        entry = key_stat(zone, key)
        if entry["connections"] == connections:
            return time.monotonic() - t0, entry
        if time.monotonic() >= deadline:
            return None, entry
        time.sleep(0.02)


def placed_ports(server, zone, source, wanted):
    """ports_by_worker(), then wait until the probes' connections are gone
    from the zone (they register on accept, never send)."""
    ports = ports_by_worker(server.port, source, wanted)
    waited, entry = wait_key_count(zone, source, 0, 5.0)
    assert waited is not None, "probe connections still counted: %s" % entry
    return ports
