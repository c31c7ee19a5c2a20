"""Issue 7: the shared byte budget (TRAFFICRATE_SHARE=budget), fairness.

A client's connections share its rate by what actually leaves their sockets,
not by a static rate/active each: a slow reader's unused share goes to its
siblings, short connections' unpaced first segments are counted, many
connections of one client share its rate fairly, and after a leave every
second holds the rate. The static split stays available as
TRAFFICRATE_SHARE=equal, and splits the rate as before.

Real nginx (2 workers, `listen ... reuseport`) under the library, rate 500k
(512000 B/s) per client IP, real clients bound to 127.0.0.2, in the private
namespace of conftest.py (lo MTU 1500), with net.ipv4.tcp_tso_rtt_log = 0
for the whole module (the small_gso_packets fixture, see test_dynamics.py):
the leave test checks 1 s windows, and the fairness checks (16 and 64
connections of 8-32 KB/s each, three fast connections within 5% of each
other) would otherwise see 64 KiB TSO packets released one at a time, i.e.
whole seconds of silence per connection.

Rates are measured by the clients; windows are 8 s after a 2 s warm-up. The
slow reader test is parametrised over TRAFFICRATE_SHARE=budget and =equal:
the equal case asserts the static split's known shortfall, which shows that
the scenario tells the modes apart. Run with -s to see the figures; they are
in every assertion message too. (A closed connection still draining is in
test_budget_drains.py, the key's level in test_budget_level.py, settings and
the CLI in test_budget_config.py; shared helpers in budget_common.py.)
"""

import os
import signal
import statistics
import time

import pytest

import harness
from harness import jain
# The shared-budget clients (harness re-exports only PacedDownload).
from budget_clients import PacedDownload, RangeFetches
from budget_common import (CLIENT, SHARE_VALUES, TARGET, WARMUP_S, WINDOW_S,
                           key_entry, nginx2, ratio_text, share_env, sleep_until,
                           stop_all, window_of)

SLOW_READ_RATE = 20 * 1024  # B/s, the slow reader

pytestmark = pytest.mark.usefixtures("small_gso_packets")


def run_window(dset, zone):
    """Waits until dset's downloads started, then WARMUP_S; notes which pids
    serve them and the key's stat at that moment; waits out WINDOW_S; stops
    dset. Returns (t0, t1, pids by label, key_entry() at t0)."""
    try:
        t0, t1 = window_of(dset)
        sleep_until(t0)
        seen = dset.pids_by_label()
        stat = key_entry(zone)
        sleep_until(t1 + 0.05)
    finally:
        stop_all(dset)
    return t0, t1, seen, stat


def start_slow_reader_set(server, zone, w0, w1):
    """Starts 3 downloads of CLIENT read flat out and one read at
    SLOW_READ_RATE, 2 on each worker (the slow one on w0); returns (the
    DownloadSet, the slow one)."""
    ports = harness.placed_ports(server, zone, CLIENT, {w0: 2, w1: 2})
    duration = WARMUP_S + WINDOW_S + 1.0
    dset = harness.DownloadSet(server.port, [CLIENT] * 3, duration=duration,
                               source_ports=[ports[w0][1], ports[w1][0], ports[w1][1]])
    slow = PacedDownload(server.port, CLIENT, read_rate=SLOW_READ_RATE,
                         label="%s#slow" % CLIENT, start_at=dset.start_at,
                         stop_at=dset.stop_at, source_port=ports[w0][0])
    dset.downloads.append(slow)
    dset.start()
    return dset, slow


# ------------------------------------------------------------ a slow reader

@pytest.mark.parametrize("share", SHARE_VALUES)
def test_slow_reader_leaves_its_unused_share_to_its_siblings(servers, lib_env, zone,
                                                              share):
    """4 downloads of one client, 2 on each worker; one is read at 20 KiB/s
    (small SO_RCVBUF, paced reads), three flat out.
    budget: the client total is >= 0.95x (<= 1.05x) the rate and the three
    fast ones are within 5% of each other. equal: the static split leaves the
    slow reader's unused share unused: each fast one gets rate/4 (+-10%) and
    the client total stays <= 0.90x (expected ~0.80x)."""
    server, (w0, w1) = nginx2(servers, share_env(lib_env, share))
    dset, slow = start_slow_reader_set(server, zone, w0, w1)
    t0, t1, seen, (entry, _, _) = run_window(dset, zone)
    m = dset.measure(t0, t1, TARGET)
    total = m.source_rate(CLIENT)
    fast = [r for d, r in m.per_download if d is not slow]
    slow_rate = slow.rate(t0, t1)
    spread = max(fast) / min(fast) - 1.0 if min(fast) > 0 else float("inf")
    report = ("%s, TRAFFICRATE_SHARE=%s, client %s: 3 fast downloads + 1 read at "
              "%d B/s\n%s\nclient total %s; fast ones spread %.1f%%; slow one %.0f B/s\n"
              "owners: %s\nstat at warm-up end: %s\n%s"
              % (server.title, share, CLIENT, SLOW_READ_RATE, m.report(),
                 ratio_text(total), 100 * spread, slow_rate,
                 {l: sorted(p) for l, p in seen.items()}, entry,
                 "\n".join(dset.errors())))
    print("\n" + report)
    assert not dset.errors(), report
    # The scenario is what it says: both workers, a slow reader that is slow
    # and still counted as sending.
    assert sorted(min(p) for p in seen.values()) == sorted([w0, w0, w1, w1]), report
    assert entry is not None and entry["connections"] == 4, report
    assert harness.within(slow_rate, SLOW_READ_RATE, 0.15), report
    if share == "budget":
        assert 0.95 * TARGET <= total <= 1.05 * TARGET, report
        assert spread <= 0.05, report
    else:
        # The slow reader has data queued, so it keeps a full share.
        assert entry["active"] == 4, report
        for rate in fast:
            assert harness.within(rate, TARGET / 4, 0.10), report
        assert total <= 0.90 * TARGET, report


def test_a_worker_that_stands_still_for_half_a_second_costs_no_rate(servers, lib_env,
                                                                    zone):
    """The slow-reader scenario (budget), and twice in the window one nginx
    worker (the slow reader's and one fast download's) is stopped for
    0.5 s (SIGSTOP): as its watcher is when the machine gives it no CPU
    for that long. Its connections go on sending what they hold, and the
    other worker's watcher decides the client's level meanwhile: it must
    wait for the stopped one's count (BudgetInput::count_late_ns), not take
    the missing bytes for unused and their arrival for a burst, nor take
    the stopped worker's connections for idle (Governor::NoteWatcherLate),
    nor decide on the resumed watcher's first count (TickBudget's
    recount). Before, the client got 0.936x over the window and
    0.80-0.86x in the seconds after each stop (0.79-0.88 in 4 of 20 runs
    with only the first); now the total is >= 0.965x (0.985-0.993) and the
    seconds after the stops 0.95x or more in 36 runs. A second elsewhere
    in the window dipped to 0.83-0.90x in about 1 run of 10, stops or not:
    the slow reader took a lump when its window opened, and BudgetTick's
    burst rule gave the equal share for it. That rule now needs a boost
    over 1.5 (none in 26 runs since); the bound stays 0.85x until more
    runs say so."""
    server, (w0, w1) = nginx2(servers, share_env(lib_env, "budget"))
    dset, _ = start_slow_reader_set(server, zone, w0, w1)
    stops = []
    try:
        t0, t1 = window_of(dset)
        for at in (t0 + 2.3, t0 + 5.1):
            sleep_until(at)
            os.kill(w0, signal.SIGSTOP)
            stopped = time.monotonic()
            try:
                time.sleep(0.5)
            finally:
                os.kill(w0, signal.SIGCONT)
            stops.append((stopped - t0, time.monotonic() - t0))
        sleep_until(t1 + 0.05)
    finally:
        os.kill(w0, signal.SIGCONT)
        stop_all(dset)
    m = dset.measure(t0, t1, TARGET)
    rows = harness.bucket_rates(dset.downloads, t0, t1)
    report = ("%s, TRAFFICRATE_SHARE=budget, client %s: 3 downloads + 1 read at %d B/s, "
              "2 per worker; worker %d stopped at %s s\n%s\n1 s windows:\n%s\n%s"
              % (server.title, CLIENT, SLOW_READ_RATE, w0,
                 ", ".join("%.2f-%.2f" % s for s in stops), m.report(),
                 harness.bucket_text(rows, t0, TARGET),
                 "\n".join(dset.errors())))
    print("\n" + report)
    assert not dset.errors(), report
    on_time = harness.on_time(rows)
    harness.require_on_time(len(rows), len(on_time), report)
    total = sum(r[2] for r in on_time) / len(on_time)
    assert total >= 0.965 * TARGET, "%s\n%s" % (ratio_text(total), report)
    low = [r for r in on_time if r[2] < 0.85 * TARGET]
    assert not low, "1 s windows under 0.85x: %s\n%s" % (
        ["%.3f" % (r[2] / TARGET) for r in low], report)


# ----------------------------------------------------- short connections

def test_short_connections_next_to_long_ones_keep_the_client_total(servers, lib_env,
                                                                   zone):
    """4 long downloads plus 10 new connections a second, each a 64 KiB
    Range request with Connection: close, all from one client: the client's
    total over 8 s, short ones' bytes included, is within 5% of the rate.
    The short ones alone ask for 640 KiB/s, more than the rate; each sends
    its first 10 segments unpaced, and nginx queues its whole 64 KiB at once
    and closes, so under the static split it leaves the key while the kernel
    still sends it: measured 2.2x (each short one paced at the rate/active
    of its join, ~6 of them in flight, none counted as active)."""
    server, _ = nginx2(servers, share_env(lib_env, "budget"))
    duration = WARMUP_S + WINDOW_S + 1.0
    dset = harness.DownloadSet(server.port, [CLIENT] * 4, duration=duration)
    shorts = RangeFetches(server.port, CLIENT, size=64 * 1024, interval=0.1,
                          start_at=dset.start_at, stop_at=dset.stop_at,
                          max_fetches=int(duration * 10) + 1)
    dset.start()
    shorts.start()
    try:
        t0, t1 = window_of(dset)
        sleep_until(t0 + WINDOW_S / 2)
        entry, _, _ = key_entry(zone)
        sleep_until(t1 + 0.05)
        in_flight = [shorts.in_flight(t) for t in (t0, (t0 + t1) / 2, t1)]
    finally:
        stop_all(dset, shorts)
    longs = dset.measure(t0, t1, TARGET)
    long_rate = longs.source_rate(CLIENT)
    short_rate = shorts.rate(t0, t1)
    total = long_rate + short_rate
    n_window = sum(1 for f in shorts.fetches if t0 <= f.started_at < t1)
    report = ("%s, client %s: 4 long downloads + 64 KiB Range requests, 10/s, "
              "each on a new connection\n%s\nshort ones %.0f B/s (%d started in "
              "the window; in flight at window start/middle/end %s)\n%s\n"
              "client total %s\nstat mid-window: %s\n%s"
              % (server.title, CLIENT, longs.report(), short_rate, n_window, in_flight,
                 shorts.summary(), ratio_text(total), entry,
                 "\n".join(dset.errors() + [shorts.error or ""])))
    print("\n" + report)
    assert not dset.errors() and not shorts.error, report
    assert n_window >= 0.9 * WINDOW_S * 10, report  # the client kept its pace
    # Whole 64 KiB bodies arrive (the client is overloading the key, so most
    # are still in flight at the end under a budget).
    assert sum(1 for f in shorts.fetches if f.complete) >= 5, report
    assert 0.95 * TARGET <= total <= 1.05 * TARGET, report


# ------------------------------------------------------ many connections

@pytest.mark.parametrize("n, tolerance", [
    pytest.param(16, 0.05, id="16"),
    pytest.param(64, 0.08, id="64"),
])
def test_many_connections_of_one_client_share_the_rate_fairly(servers, lib_env, zone,
                                                              n, tolerance):
    """16 and 64 downloads of one client (the kernel spreads them over both
    workers): total within 5% (8% at 64) of the rate over 8 s, Jain index of
    the connections' rates >= 0.98."""
    server, _ = nginx2(servers, share_env(lib_env, "budget"))
    dset = harness.DownloadSet(server.port, [CLIENT] * n,
                               duration=WARMUP_S + WINDOW_S + 3.0).start()
    t0, t1, seen, (entry, _, _) = run_window(dset, zone)
    m = dset.measure(t0, t1, TARGET)
    rates = [r for _, r in m.per_download]
    total = m.source_rate(CLIENT)
    index = jain(rates)
    per_pid = {}
    for pids in seen.values():
        for p in pids:
            per_pid[p] = per_pid.get(p, 0) + 1
    report = ("%s, client %s: %d downloads\nclient total %s; Jain %.4f; "
              "connections min %.0f median %.0f max %.0f B/s (rate/n %.0f)\n"
              "per worker %s\nstat: %s\n%s"
              % (server.title, CLIENT, n, ratio_text(total), index, min(rates),
                 statistics.median(rates), max(rates), TARGET / n, per_pid, entry,
                 "\n".join(dset.errors())))
    print("\n" + report)
    assert not dset.errors(), report
    assert entry is not None and entry["connections"] == n, report
    assert harness.within(total, TARGET, tolerance), report
    assert index >= 0.98, report


# -------------------------------------------------- equal works as before

def test_equal_share_splits_the_rate_statically(servers, lib_env, zone):
    """TRAFFICRATE_SHARE=equal, 4 downloads of one client over both workers:
    total within 5% of the rate, each connection within 10% of rate/4, and
    stat shows share rate/4 for the key and each of its connections."""
    server, (w0, w1) = nginx2(servers, share_env(lib_env, "equal"))
    ports = harness.placed_ports(server, zone, CLIENT, {w0: 2, w1: 2})
    dset = harness.DownloadSet(server.port, [CLIENT] * 4,
                               duration=WARMUP_S + WINDOW_S + 1.0,
                               source_ports=ports[w0] + ports[w1]).start()
    t0, t1, seen, (entry, conns, _) = run_window(dset, zone)
    m = dset.measure(t0, t1, TARGET)
    total = m.source_rate(CLIENT)
    report = ("%s, TRAFFICRATE_SHARE=equal, client %s: 4 downloads\n%s\nclient total "
              "%s\nowners %s\nstat: %s\nconnections' shares %s"
              % (server.title, CLIENT, m.report(), ratio_text(total),
                 {l: sorted(p) for l, p in seen.items()}, entry,
                 [c["share"] for c in conns]))
    print("\n" + report)
    assert not dset.errors(), report
    assert sorted(min(p) for p in seen.values()) == sorted([w0, w0, w1, w1]), report
    assert harness.within(total, TARGET, 0.05), report
    for rate in m.download_rates(CLIENT):
        assert harness.within(rate, TARGET / 4, 0.10), report
    assert entry is not None and (entry["active"], entry["share"]) == (4, TARGET // 4), \
        report
    assert [c["share"] for c in conns] == [TARGET // 4] * 4, report


# --------------------------------------------- a leave, 1 s windows (last)

def test_after_a_leave_every_second_holds_the_rate(servers, lib_env, zone):
    """8 downloads, 4 on each worker; 6 of them (3 on each) close at 5 s:
    from 1 s after the leave (6 s to 14 s) the client's total is within 5%
    of the rate, and every 1 s window within 15% (the survivors must not
    wait out their old pacing gaps: that read 0.70 in the second after such
    a leave). The per-second target itself (5%) is the benchmark's
    (joinleave): on this host single 1 s windows right after the leave
    read 1.05-1.13 at the last landed commit too, so a timed test of it
    measures the host."""
    server, (w0, w1) = nginx2(servers, share_env(lib_env, "budget"))
    ports = harness.placed_ports(server, zone, CLIENT, {w0: 4, w1: 4})
    sports = ports[w0] + ports[w1]
    dset = harness.DownloadSet(server.port, [CLIENT] * 2, duration=14.3,
                               source_ports=[ports[w0][0], ports[w1][0]])
    dset.start()
    leavers = [dset.add(CLIENT, start_after=0.0, stop_after=5.0, source_port=p)
               for p in ports[w0][1:] + ports[w1][1:]]
    try:
        base = dset.start_at
        sleep_until(base + 3.0)
        seen = dset.pids_by_label()
        entry8, _, _ = key_entry(zone)
        sleep_until(base + 8.0)
        entry2, _, _ = key_entry(zone)
        sleep_until(base + 14.1)
    finally:
        stop_all(dset)
    rows = []  # (from, to, B/s, x target, read on time: harness.on_time)
    for a, b, total, _ in harness.bucket_rates(dset.downloads, base + 2.0, base + 14.0):
        rows.append((a - base, b - base, total, total / TARGET,
                     not harness.pauses_in(a, b)))
    table = "\n".join("  [%4.1f,%4.1f) %10.0f B/s %8.4f x%s" % (
        a, b, r, x, "" if a < 6.0 else "  checked" if on_time else
        "  not judged: the test client stood still") for a, b, r, x, on_time in rows)
    report = ("%s, client %s: 8 downloads (4 per worker), 6 close at 5 s\n%s\n"
              "owners %s\nstat at 3 s: %s\nstat at 8 s: %s\n%s"
              % (server.title, CLIENT, table, {l: sorted(p) for l, p in seen.items()},
                 entry8, entry2, "\n".join(dset.errors())))
    print("\n" + report)
    assert not dset.errors(), report
    assert len(leavers) == 6 and len(sports) == 8
    assert sorted(min(p) for p in seen.values()) == sorted([w0] * 4 + [w1] * 4), report
    assert entry8 is not None and entry8["active"] == 8, report
    assert entry2 is not None and entry2["active"] == 2, report
    after = [r for r in rows if r[0] >= 6.0]
    assert len(after) == 8, report
    after = [r for r in after if r[4]]
    harness.require_on_time(8, len(after), report)
    total = sum(r[3] for r in after) / len(after)
    assert abs(total - 1.0) <= 0.05, "total %.4f x over 6-14 s\n%s" % (total, report)
    bad = [r for r in after if abs(r[3] - 1.0) > 0.15]
    assert not bad, "1 s windows off by more than 15%%: %s\n%s" % (bad, report)
