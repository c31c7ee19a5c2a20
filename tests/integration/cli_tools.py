"""The trafficrate CLI for the trafficrate integration tests (part of
harness.py): run_cli() runs build/trafficrate with a clean environment,
stat_json() parses `trafficrate stat --json`, key_stat() picks one key.

Standard library only; import it through harness (`import harness`).
"""

import json
import subprocess

from netns_env import cli_path, server_environment


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
