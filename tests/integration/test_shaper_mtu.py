"""Issue 33: the packet shaper in the send path, lo at its default MTU.

A governed connection whose level is low (under ~40 x 64 KiB/s) hands its
bytes to the kernel as MSG_EOR pieces of about level/40 bytes, varied per
connection, so that no 64 KiB TSO packet (nor a 64 KiB-MTU segment) leaves
at once and the connections of a key stay out of phase; every connection's
first bytes go out as ~10 tiny pieces, so that the kernel's 10 unpaced
initial segments carry ~1 KB; sendfile goes through pread + send(MSG_EOR);
splice from a pipe passes through. TRAFFICRATE_SHAPE=1 (the default) | 0.
See docs/design.md, "Packet granularity".

The module runs at the kernel's default net.ipv4.tcp_tso_rtt_log = 9
(conftest.py's default_tso fixture sets it and restores it), as users
have it, in one phase, a module fixture that runs its
scenarios at once and returns what the tests then check:

  * big_mtu: lo at its default MTU 65 536 (set for this phase only, then
    1500 again): nginx (2 workers) at 200k, one client, 3 downloads, 12 s
    from the start: the total <= 1.05x (issue: 1.03) and no 1 s window
    above 1.15x (issue: 1.10). Without the shaper: 1.42x and 5.9x in the
    first second (10 unpaced 64 KiB segments per connection).

The precision scenario also runs with TRAFFICRATE_SHAPE=0 at the same
time, its own nginx, zone and client: that control must show the burst
that the shaper removes, so that the shaped run cannot pass for want of
one; the shaper's counters in stat must show it cut the shaped run's sends
and none of the control's.

Every rate is judged over the 1 s windows in which the test client itself
ran (harness.on_time): a second in which the client process stood still
(measurement.PauseWatch; measured under load: 1-6 s, a Python thread
holding the GIL blocked in the kernel) is shown and not judged, and at
least half of a span's seconds must be left.

Run with -s to see the figures; they are in every assertion message too.
(Shared helpers in shaper_common.py.)
"""

import pytest

import harness
from shaper_common import (Run, enough_on_time, on_time_rate, ratio_text,
                           shaped, sleep_until)

pytestmark = pytest.mark.usefixtures("default_tso")


BIG_MTU = 65536
BIG_MTU_RATE, BIG_MTU_TARGET = "200k", 200 * 1024
BIG_MTU_SECONDS = 12
BIG_MTU_TOTAL_MAX = 1.05  # issue: 1.03
BIG_MTU_TOTAL_MIN = 0.95
BIG_MTU_SECOND_MAX = 1.15  # issue: 1.10
# The control, TRAFFICRATE_SHAPE=0: 10 unpaced 64 KiB segments a connection
# make the first second several times the rate (measured 5.9-6.2x).
BIG_MTU_UNSHAPED_FIRST_MIN = 2.0
# variant -> (TRAFFICRATE_SHAPE, client address)
BIG_MTU_VARIANTS = {"shaped": (None, "127.0.0.2"), "unshaped": ("0", "127.0.0.3")}


@pytest.fixture(scope="module")
def big_mtu(test_namespace, webroot):
    """lo at MTU 65 536 for this phase only: nginx (2 workers) at 200k, one
    client with 3 downloads for 12 s; at the same time the same with
    TRAFFICRATE_SHAPE=0 (its own nginx, zone and client). Returns {variant:
    {rows, total, first, report, ...}}."""
    assert not harness.namespace_problems()  # only our own namespace's lo
    run = Run(webroot, "mtu")
    old_mtu = harness.interface_mtu("lo")
    results = {}
    try:
        harness.set_interface_mtu(BIG_MTU)
        assert harness.interface_mtu("lo") == BIG_MTU
        for variant, (shape, client) in BIG_MTU_VARIANTS.items():
            server = run.nginx(run.zone(variant), BIG_MTU_RATE, shape=shape)
            results[variant] = dict(server=server, client=client, shape=shape)
        for r in results.values():
            r["dset"] = harness.DownloadSet(r["server"].port, [r["client"]] * 3,
                                            duration=BIG_MTU_SECONDS + 0.5,
                                            start_delay=0.1)
        run.started(*[r["dset"] for r in results.values()])
        for r in results.values():
            assert r["dset"].wait_started(10.0), r["dset"].errors()
            r["base"] = min(d.connected_at for d in r["dset"].downloads)
        sleep_until(max(r["base"] for r in results.values()) + BIG_MTU_SECONDS + 0.1)
        run.stop()
        for r in results.values():
            r["shaper"] = harness.shaper_counts(r["server"].zone)
        tso = harness.sysctl("net.ipv4.tcp_tso_rtt_log")
        for r in results.values():
            dset, base = r["dset"], r["base"]
            rows = harness.bucket_rates(dset.downloads, base, base + BIG_MTU_SECONDS)
            total = on_time_rate(rows)
            r["found"], summary = harness.body_problems(dset.downloads)
            r.update(
                rows=rows, total=total, errors=dset.errors(),
                first=rows[0][2] / BIG_MTU_TARGET,
                worst=max((row[2] for row in harness.on_time(rows)),
                          default=0.0) / BIG_MTU_TARGET,
                report="%s, TRAFFICRATE_SHAPE %s, lo MTU %d, tcp_tso_rtt_log %s, "
                       "client %s: 3 downloads, %d s from the first connect\n%s\n"
                       "client total %s\nshaper: %s\n%s\n%s" % (
                           r["server"].title, r["shape"] or "unset (on)", BIG_MTU,
                           tso, r["client"], BIG_MTU_SECONDS,
                           harness.bucket_text(rows, base, BIG_MTU_TARGET),
                           ratio_text(total, BIG_MTU_TARGET), r["shaper"], summary,
                           "\n".join(dset.errors())))
    finally:
        run.close()
        harness.set_interface_mtu(old_mtu)
    assert not harness.namespace_problems(), "lo not restored to MTU 1500"
    return results


def big_mtu_report(r):
    print("\n" + r["report"])
    assert not r["errors"], r["report"]
    assert not r["found"], "\n".join(r["found"]) + "\n" + r["report"]
    return r["report"]


def test_default_mtu_loopback_holds_the_rate_from_the_first_second(big_mtu):
    r = big_mtu["shaped"]
    report = big_mtu_report(r)
    assert shaped(r["shaper"]), report
    enough_on_time(r["rows"], report)
    ratio = r["total"] / BIG_MTU_TARGET
    assert BIG_MTU_TOTAL_MIN <= ratio <= BIG_MTU_TOTAL_MAX, report
    assert r["worst"] <= BIG_MTU_SECOND_MAX, "a second at %.4f x\n%s" % (
        r["worst"], report)


def test_default_mtu_loopback_without_the_shaper_bursts_in_the_first_second(big_mtu):
    """The control: with TRAFFICRATE_SHAPE=0 the scenario shows what the
    shaper removes (so the test above cannot pass for want of a burst)."""
    r = big_mtu["unshaped"]
    report = big_mtu_report(r)
    assert r["shaper"]["shaped_calls"] == 0, report
    assert r["first"] >= BIG_MTU_UNSHAPED_FIRST_MIN, report
