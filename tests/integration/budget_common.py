"""Helpers shared by the tests of the shared byte budget (issue 7,
TRAFFICRATE_SHARE=budget): test_budget_fairness.py, test_budget_drains.py,
test_budget_level.py and test_budget_config.py.

Their setting: real nginx (2 workers, `listen ... reuseport`, nginx2())
under the library, rate 500k (512000 B/s) per client IP unless a test says
otherwise, real clients bound to 127.0.0.2; rates are measured by the
clients, windows are WINDOW_S after a WARMUP_S warm-up (window_of()).
"""

import time

import harness

RATE = "500k"
TARGET = 512000  # B/s per client IP
CLIENT = "127.0.0.2"
WARMUP_S = 2.0
WINDOW_S = 8.0
SHARE_VALUES = ("budget", "equal")


def nginx2(servers, env, **kw):
    """nginx, 2 workers, one reuseport listening socket per worker."""
    server = servers.nginx(env=env, workers=2, reuseport=True, **kw)
    workers = server.worker_pids()
    assert len(workers) == 2, server.describe()
    assert not [l for l in server.trafficrate_lines() if "TRAFFICRATE_SHARE" in l], \
        server.describe()
    return server, workers


def key_entry(zone, key=CLIENT):
    """(the key's entry in stat --json or None, its connections, the whole
    document)."""
    doc = harness.stat_json(zone)
    entry = next((k for k in doc["keys"] if k["key"] == key), None)
    return entry, [c for c in doc["connections"] if c["key"] == key], doc


def share_env(lib_env, share, rate=RATE, **kw):
    return lib_env(rate, SHARE=share, **kw)


def stop_all(*things):
    for t in things:
        t.stop()
    deadline = time.monotonic() + 10.0
    for t in things:
        t.join(max(0.0, deadline - time.monotonic()))


sleep_until = harness.sleep_until


def window_of(dset):
    return harness.window_of(dset, WARMUP_S, WINDOW_S)


def ratio_text(rate, target=TARGET):
    return harness.ratio_text(rate, target)
