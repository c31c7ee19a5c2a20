"""Issue 4: the trafficrate CLI against a real nginx started with
`trafficrate run`: stat (table, JSON, Prometheus), set, top, check, rm.

Rates are measured by the clients; the namespace is the suite's (lo MTU
1500). The one-second bucket checks need small TSO packets, as in
test_dynamics.py.
"""

import os
import pty
import select
import signal
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

import harness

RATE = "500k"
TARGET = 512000
CLIENT = "127.0.0.2"


pytestmark = pytest.mark.usefixtures("small_gso_packets")

def nginx_under_run(servers, zone, *options):
    """nginx (2 workers) started as `trafficrate run --rate 500k --zone Z
    OPTIONS -- nginx ...`, with no LD_PRELOAD or TRAFFICRATE_* of its own."""
    server = servers.nginx(env={}, workers=2, reuseport=True, start=False)
    server.argv = [str(harness.cli_path()), "run", "--rate", RATE, "--zone",
                   zone] + list(options) + ["--"] + server.argv
    server.title += " under `trafficrate run`"
    return server.start()


def ctl(*args, **kw):
    """(exit code, stdout, stderr) of `trafficrate ARGS`."""
    cp = harness.run_cli(*args, **kw)
    return cp.returncode, cp.stdout, cp.stderr


def test_stat_shows_the_client_in_every_format(servers, zone, cli):
    server = nginx_under_run(servers, zone)
    dset = harness.DownloadSet(server.port, [CLIENT] * 4, duration=20.0).start()
    try:
        assert dset.wait_started(10.0), dset.errors()
        counted = harness.wait_for(
            lambda: harness.key_stat(zone, CLIENT)["active"] == 4, 5.0)
        doc = harness.stat_json(zone)
        rc_table, table, err_table = ctl("stat", "--zone", zone)
        rc_prom, prom, err_prom = ctl("stat", "--zone", zone, "--prometheus")
        rc_top, top1, _ = ctl("stat", "--zone", zone, "--json", "--top", "1",
                              "--sort", "bytes")
    finally:
        dset.stop()
        dset.join(5.0)
    report = "json: %s\ntable:\n%s%s\nprometheus:\n%s%s" % (
        doc, table, err_table, prom, err_prom)
    print("\n" + report)
    assert counted, report
    key = [k for k in doc["keys"] if k["key"] == CLIENT]
    assert len(key) == 1, report
    assert (key[0]["active"], key[0]["connections"]) == (4, 4), report
    assert key[0]["share"] == TARGET // 4 and key[0]["served"] == 4, report
    assert key[0]["idle_seconds"] == 0 and key[0]["bytes"] > 0, report
    assert doc["rate"] == TARGET and doc["key"] == "peer", report
    # Which worker accepts each download is the kernel's choice (reuseport);
    # a worker registers with the zone at its first accept (maybe the
    # readiness probe's) and stays registered.
    owners = {c["pid"] for c in doc["connections"]}
    processes = doc["used"]["processes"]
    assert doc["used"]["active"] == 4, report
    assert 1 <= len(owners) <= processes <= 2, report
    # The table is for people: the client and human units.
    assert rc_table == 0 and CLIENT in table, report
    assert "500 KiB/s per client" in table and "125 KiB/s" in table, report
    # Prometheus text exposition, parsed by the reference parser.
    assert rc_prom == 0, report
    samples = {}
    for family in text_string_to_metric_families(prom):
        for sample in family.samples:
            samples[(sample.name, sample.labels.get("key"))] = sample.value
    assert samples[("trafficrate_rate_bytes_per_second", None)] == TARGET, report
    assert samples[("trafficrate_key_active_connections", CLIENT)] == 4, report
    assert samples[("trafficrate_key_share_bytes_per_second", CLIENT)] == \
        TARGET // 4, report
    assert samples[("trafficrate_processes", None)] == processes, report
    assert rc_top == 0 and '"key": "127.0.0.2"' in top1, top1


def test_set_raises_a_running_clients_total_within_2_s(servers, zone, cli):
    server = nginx_under_run(servers, zone)
    dset = harness.DownloadSet(server.port, [CLIENT] * 4, duration=14.0).start()
    try:
        started = dset.wait_started(10.0)
        assert started, dset.errors()
        time.sleep(max(0.0, started + 4.0 - time.monotonic()))
        t_set = time.monotonic()
        rc, out, err = ctl("set", "--zone", zone, "1m")
        time.sleep(max(0.0, t_set + 8.2 - time.monotonic()))
        before = dset.measure(started + 1.5, t_set, TARGET)
        after = dset.measure(t_set + 2.0, t_set + 8.0, 1048576)
        buckets = harness.bucket_rates(dset.downloads, t_set - 2.0, t_set + 8.0)
    finally:
        dset.stop()
        dset.join(5.0)
    table = "\n".join("  [%+5.1f,%+5.1f) s from set: %8.0f B/s" % (a - t_set, b - t_set, r)
                      for a, b, r, _ in buckets)
    report = "set: rc %d %s%s\nbefore:\n%s\nafter (from 2 s after set):\n%s\n%s" % (
        rc, out, err, before.report(), after.report(), table)
    print("\n" + report)
    assert rc == 0 and "-> 1 MiB/s (1048576 B/s)" in out, report
    assert harness.within(before.source_rate(CLIENT), TARGET, 0.05), report
    assert harness.within(after.source_rate(CLIENT), 1048576, 0.07), report
    assert harness.stat_json(zone)["rate"] == 1048576, report


def test_check_validates_and_explains(zone, cli):
    rc, out, err = ctl("check", "--rate", "12x")
    assert rc == 1, (out, err)
    assert err.startswith('trafficrate: TRAFFICRATE_RATE: "12x" is not a byte '
                          "count"), err
    assert err.count("\n") == 1, err
    rc, out, err = ctl("check", "--rate", "500k", "--key", "peer/24",
                       "--zone", zone, "--zone-size", "2m")
    assert rc == 0, err
    assert "500 KiB/s (512000 B/s)" in out, out
    assert "IPv4 /24" in out, out
    assert "2 MiB: room for" in out and "not created yet" in out, out
    rc, out, err = ctl("check", env={"TRAFFICRATE_ZONE_SIZE": "1x"})
    assert rc == 1 and "TRAFFICRATE_ZONE_SIZE" in err, err


def test_top_shows_the_busy_client_and_quits_on_q(servers, zone, cli):
    server = nginx_under_run(servers, zone)
    dset = harness.DownloadSet(server.port, [CLIENT] * 2, duration=15.0).start()
    pid, fd = pty.fork()
    if pid == 0:  # the child: top on the pty
        try:
            os.execve(str(harness.cli_path()),
                      [str(harness.cli_path()), "top", "--zone", zone,
                       "--interval", "0.5"],
                      dict(harness.server_environment(None), TERM="xterm",
                           COLUMNS="120", LINES="30"))
        finally:
            os._exit(127)
    screen = b""
    status = None
    try:
        assert dset.wait_started(10.0), dset.errors()
        deadline = time.monotonic() + 6.0
        while time.monotonic() < deadline and not (
                CLIENT.encode() in screen and b"KiB/s [" in screen
                and b"#" in screen.split(CLIENT.encode())[-1]):
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    screen += os.read(fd, 65536)
                except OSError:
                    break
        os.write(fd, b"q")
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    screen += os.read(fd, 65536)
                except OSError:
                    pass
    finally:
        dset.stop()
        dset.join(5.0)
        if status is None:
            harness.kill_pid(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
    text = screen.decode(errors="replace")
    print("\n" + text[-1500:])
    assert "trafficrate top - zone %s" % zone in text, text[-3000:]
    assert CLIENT in text and "500 KiB/s per client" in text, text[-3000:]
    assert status is not None and os.WIFEXITED(status) and \
        os.WEXITSTATUS(status) == 0, (status, text[-3000:])
    assert text.rstrip().endswith("\x1b[?1049l") or "\x1b[?1049l" in text[-200:], \
        "terminal not restored: %r" % text[-200:]


def test_set_and_rm_of_a_missing_zone_fail_without_creating_it(zone, cli):
    rc, out, err = ctl("set", "--zone", zone, "1m")
    assert rc == 1 and "no zone %s (" % zone in err, (out, err)
    assert not harness.zone_path(zone).exists()
    rc, out, err = ctl("rm", "--zone", zone)
    assert rc == 1 and "no zone" in err, (out, err)


def test_rm_refuses_a_zone_in_use_unless_forced(servers, zone, cli):
    server = nginx_under_run(servers, zone)
    dset = harness.DownloadSet(server.port, [CLIENT], duration=10.0).start()
    try:
        assert dset.wait_started(10.0), dset.errors()
        assert harness.wait_for(
            lambda: harness.key_stat(zone, CLIENT)["active"] == 1, 5.0)
        rc, out, err = ctl("rm", "--zone", zone)
        assert rc == 1 and "in use by" in err, (out, err)
        path = harness.zone_path(zone)
        assert path.exists(), path
        rc, out, err = ctl("rm", "--zone", zone, "--force")
        assert rc == 0 and "removed zone" in out and "keep using it" in out, \
            (out, err)
        assert not path.exists(), path
    finally:
        dset.stop()
        dset.join(5.0)
