"""Issue 8: whatever is in the shared zone, the library never crashes or
hangs the host server. Real nginx under the library, exhaustion:

  * a 64 KiB zone (the smallest) filled past its connection capacity from
    several processes and threads at once; table_full counts exactly the
    refused registrations, every connection is served, the counts return
    to 0.

(The soak is in test_robust_soak.py, corruption in
test_robust_corruption.py, their shared helpers in robust_common.py.)

Each test prints a short report (figures) with -s. Client processes are
forked with multiprocessing; every loop is bounded in time and count.
"""

import threading
import time

import pytest

import harness
from robust_common import (MIN_ZONE_SIZE, MP, SMALL_BODY, library_lines,
                           wait_zone_empty)


FILL_PROCESSES = 4
FILL_THREADS = 4  # per process
FILL_PER_THREAD = 25  # connections each thread opens and keeps open
FILL_TOTAL = FILL_PROCESSES * FILL_THREADS * FILL_PER_THREAD


def fill_source(n, distinct):
    """Source address of the n-th connection: 8 addresses shared by all
    connections, or one address per connection."""
    if distinct:
        return "127.0.%d.%d" % (4 + n // 250, 1 + n % 250)
    return "127.0.2.%d" % (1 + n % 8)


def fill_client(index, port, distinct, go, second, close, out):
    """One client process: FILL_THREADS threads open FILL_PER_THREAD keep-
    alive connections each (one complete request on each), all at once
    once `go` is set; then a second request on every connection when
    `second` is set; then close all when `close` is set. Reports through
    the pipe `out` after each phase: (phase, served, errors)."""
    socks = [None] * (FILL_THREADS * FILL_PER_THREAD)
    errors = []

    def run(thread, phase):
        for j in range(FILL_PER_THREAD):
            slot = thread * FILL_PER_THREAD + j
            n = (index * FILL_THREADS + thread) * FILL_PER_THREAD + j
            try:
                if phase == "open":
                    socks[slot] = harness.open_keepalive(
                        port, source=fill_source(n, distinct), timeout=5.0)
                elif socks[slot] is not None:
                    body = harness.keepalive_get(socks[slot], port, timeout=5.0)
                    if body != SMALL_BODY:
                        raise ValueError("body of %d bytes differs" % len(body))
            except Exception as e:  # reported to the test
                errors.append("%s #%d: %s: %s" % (phase, n, type(e).__name__, e))

    for phase, event in (("open", go), ("second", second)):
        if not event.wait(30.0):
            break
        threads = [threading.Thread(target=run, args=(t, phase))
                   for t in range(FILL_THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30.0)
        out.send((phase, sum(1 for s in socks if s is not None), list(errors)))
    close.wait(30.0)
    for s in socks:
        if s is not None:
            s.close()
    out.send(("closed", 0, []))
    out.close()


@pytest.mark.parametrize("distinct", [False, True],
                         ids=["8-addresses", "one-address-each"])
def test_exhaustion_refuses_exactly_the_overflow_and_serves_all(
        servers, lib_env, zone, distinct):
    server = servers.nginx(env=lib_env("10m", ZONE_SIZE=MIN_ZONE_SIZE),
                           workers=4)
    assert wait_zone_empty(zone, 5.0)[0] is not None  # the readiness probe
    doc0 = harness.stat_json(zone)
    capacity = doc0["capacity"]
    full0 = doc0["counters"]["table_full"]
    events = [MP.Event() for _ in range(3)]  # go, second, close
    procs, pipes = [], []
    for i in range(FILL_PROCESSES):
        rx, tx = MP.Pipe(duplex=False)
        p = MP.Process(target=fill_client,
                       args=(i, server.port, distinct, *events, tx), daemon=True)
        p.start()
        tx.close()
        procs.append(p)
        pipes.append(rx)

    def phase(event, name):
        t = time.monotonic()
        event.set()
        got = []
        for rx in pipes:
            if rx.poll(40.0):
                got.append(rx.recv())
        assert [g[0] for g in got] == [name] * FILL_PROCESSES, got
        return (sum(g[1] for g in got), [e for g in got for e in g[2]],
                time.monotonic() - t)

    try:
        opened, open_errors, open_s = phase(events[0], "open")
        full_doc = harness.stat_json(zone)
        served2, errors2, second_s = phase(events[1], "second")
        after_doc = harness.stat_json(zone)
        phase(events[2], "closed")
        emptied, end_doc = wait_zone_empty(zone, 5.0)
    finally:
        for e in events:
            e.set()
        for p in procs:
            p.join(5.0)
            if p.is_alive():
                harness.kill_pid(p.pid)
                p.join(5.0)
    refused = full_doc["counters"]["table_full"] - full0
    report = "\n".join([
        "zone %s: capacity %s (%d bytes)" % (MIN_ZONE_SIZE, capacity,
                                             doc0["size"]),
        "%d connections opened in %.2f s by %d processes x %d threads from %s "
        "(%d errors); used then: %s; table_full +%d (expected %d)" % (
            opened, open_s, FILL_PROCESSES, FILL_THREADS,
            "one address each" if distinct else "8 addresses",
            len(open_errors), full_doc["used"], refused,
            FILL_TOTAL - capacity["connections"]),
        "second request on each: %d served in %.2f s (%d errors); used %s, "
        "table_full +%d" % (
            served2, second_s, len(errors2), after_doc["used"],
            after_doc["counters"]["table_full"] - full0),
        "after closing: %s, used %s" % (
            "empty after %.2f s" % emptied if emptied is not None
            else "NOT EMPTY after 5 s", end_doc["used"]),
        library_lines(server)] + (open_errors + errors2)[:10])
    print("\n" + report)
    assert FILL_TOTAL > capacity["connections"] + 100, report
    assert opened == FILL_TOTAL and not open_errors, report
    assert served2 == FILL_TOTAL and not errors2, report
    assert full_doc["used"]["connections"] == capacity["connections"], report
    assert full_doc["used"]["keys"] == (
        capacity["connections"] if distinct else 8), report
    assert refused == FILL_TOTAL - capacity["connections"], report
    # Requests on open connections register nothing more.
    assert after_doc["counters"]["table_full"] - full0 == refused, report
    assert after_doc["used"] == full_doc["used"] or \
        after_doc["used"]["connections"] == capacity["connections"], report
    assert emptied is not None, report
