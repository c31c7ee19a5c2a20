"""Helpers shared by the tests of the packet shaper (issue 33, its send
path): test_shaper_mtu.py, test_shaper_rates.py and test_shaper_bytes.py.

A governed connection whose level is low (under ~40 x 64 KiB/s) hands its
bytes to the kernel as MSG_EOR pieces of about level/40 bytes, varied per
connection, so that no 64 KiB TSO packet (nor a 64 KiB-MTU segment) leaves
at once and the connections of a key stay out of phase; every connection's
first bytes go out as ~10 tiny pieces, so that the kernel's 10 unpaced
initial segments carry ~1 KB; sendfile goes through pread + send(MSG_EOR);
splice from a pipe passes through. TRAFFICRATE_SHAPE=1 (the default) | 0.
See docs/design.md, "Packet granularity".

Each of those modules runs at the kernel's default
net.ipv4.tcp_tso_rtt_log = 9 (conftest.py's default_tso fixture sets it
and restores it), as users have it, in phases: each a module fixture that
runs its scenarios at once in a Run (servers, zones and a workdir) and
returns what the tests then check.
"""

import shutil
import time

import pytest

import harness
from harness import ratio_text, sleep_until  # noqa: F401 (for the shaper tests)


def need_library():
    lib = harness.library_path()
    if not lib.is_file():
        pytest.fail("%s is missing: build the library first or set "
                    "TRAFFICRATE_BUILD_DIR" % lib, pytrace=False)
    return lib


class Run:
    """Servers, zones and a workdir for one phase; close() stops the
    servers by pid and removes the zones and the workdir."""

    def __init__(self, webroot, tag):
        self.lib = need_library()
        self.tag = tag
        self.workdir = harness.make_workdir()
        self.factory = harness.ServerFactory(self.workdir, webroot)
        self.zones = []
        self.threads = []

    def zone(self, name):
        zone = harness.unique_zone("shaper-%s-%s" % (self.tag, name))
        harness.remove_zone(zone)
        self.zones.append(zone)
        return zone

    def env(self, zone, rate, share=None, shape=None):
        """share, shape: TRAFFICRATE_SHARE, TRAFFICRATE_SHAPE (None: unset)."""
        return harness.preload_env(zone, rate, library=self.lib, SHARE=share,
                                   SHAPE=shape)

    def nginx(self, zone, rate, share=None, shape=None, **kw):
        server = self.factory.nginx(env=self.env(zone, rate, share, shape), workers=2,
                                    **kw)
        server.zone = zone
        assert len(server.worker_pids()) == 2, server.describe()
        assert server.trafficrate_lines() == [], server.describe()
        return server

    def started(self, *things):
        """Start clients (threads); stop() stops and joins them."""
        for t in things:
            t.start()
            self.threads.append(t)

    def stop(self):
        for t in self.threads:
            t.stop()
        deadline = time.monotonic() + 10.0
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def close(self):
        self.stop()
        self.factory.stop_all()
        for zone in self.zones:
            harness.remove_zone(zone)
        shutil.rmtree(self.workdir, ignore_errors=True)


def shaped(counts, min_pieces=100):
    """The shaper cut calls into at least min_pieces pieces. (Not "more
    pieces than calls": on a full non-blocking socket a cut call may send
    nothing, EAGAIN, and it still counts.)"""
    return counts["shaped_calls"] > 0 and counts["shaped_pieces"] >= min_pieces


def mean(values):
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def on_time_rate(rows):
    """The mean rate over the seconds read on time (harness.on_time): the
    total over the span when no pause touched it."""
    return mean(r[2] for r in harness.on_time(rows))


def enough_on_time(rows, report):
    harness.require_on_time(len(rows), len(harness.on_time(rows)), report)
