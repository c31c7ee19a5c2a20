"""Helpers shared by the issue 8 robustness tests (test_robust_soak.py,
test_robust_exhaustion.py, test_robust_corruption.py): small.txt's exact
bytes, the fork context of their client processes, the smallest zone size,
waiting for an empty zone, and the library's lines in nginx's output for
reports.
"""

import multiprocessing
import time

import harness

SMALL_BODY = ("trafficrate small file\n" * 100).encode()  # make_webroot()
MP = multiprocessing.get_context("fork")
MIN_ZONE_SIZE = "64k"  # src/shm/zone.h kMinZoneSize


def zone_counts(zone):
    doc = harness.stat_json(zone)
    return doc["used"]["keys"], doc["used"]["connections"], doc


def wait_zone_empty(zone, timeout):
    """(seconds waited or None, last stat document)."""
    t0 = time.monotonic()
    last = {}

    def empty():
        keys, conns, doc = zone_counts(zone)
        last["doc"] = doc
        return keys == 0 and conns == 0
    ok = harness.wait_for(empty, timeout, interval=0.1)
    return (time.monotonic() - t0 if ok else None), last["doc"]


def library_lines(server, limit=12):
    lines = server.trafficrate_lines()
    text = "\n".join("  " + line for line in lines[:limit])
    if len(lines) > limit:
        text += "\n  (%d more)" % (len(lines) - limit)
    return "%d trafficrate: lines in nginx's stderr/error log%s" % (
        len(lines), ":\n" + text if lines else "")
