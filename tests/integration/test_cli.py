"""The trafficrate CLI against a real server's zone: stat and gc, and its
exit codes (0 ok, 1 failed, 2 usage)."""

import signal
import socket
import subprocess

import harness

RATE = "500k"
CLIENT = "127.0.0.2"


def test_gc_releases_the_connections_of_a_killed_server(servers, lib_env, zone, cli):
    """A single-process server killed with SIGKILL leaves no watcher to heal
    the zone: `trafficrate gc` must release what it held."""
    server = servers.python(env=lib_env(RATE), mode="thread")
    dset = harness.DownloadSet(server.port, [CLIENT] * 2, duration=30.0).start()
    try:
        assert dset.wait_started(10.0), dset.errors()
        held = harness.wait_for(
            lambda: harness.key_stat(zone, CLIENT)["connections"] == 2, 5.0)
        before = harness.stat_json(zone)
        assert held, before
        assert [p["alive"] for p in before["processes"]] == [True], before
        assert harness.kill_pid(server.pid, signal.SIGKILL)
        dead = harness.wait_for(
            lambda: [p["alive"] for p in harness.stat_json(zone)["processes"]]
            == [False], 5.0)
        after_kill = harness.stat_json(zone)
        assert dead, after_kill
        assert harness.key_stat(zone, CLIENT)["connections"] == 2, after_kill
        cp = harness.run_cli("gc", "--zone", zone)
        after_gc = harness.stat_json(zone)
    finally:
        dset.stop()
        dset.join(5.0)
    report = "gc: rc %d: %s%s\nafter: %s" % (cp.returncode, cp.stdout, cp.stderr,
                                             after_gc)
    print("\n" + report)
    assert cp.returncode == 0, report
    assert "released 2 connection(s) of 1 dead process(es)" in cp.stdout, report
    assert after_gc["keys"] == [] and after_gc["connections"] == [], report
    assert after_gc["processes"] == [], report
    assert after_gc["counters"]["connections_reaped"] == 2, report


def test_stat_of_a_missing_zone_fails_with_exit_code_1(zone, cli):
    cp = harness.run_cli("stat", "--zone", zone)
    assert cp.returncode == 1, cp
    assert "no zone %s (" % zone in cp.stderr, cp


def test_usage_errors_exit_with_code_2(cli):
    for args in (["stat", "--bogus"], ["frobnicate"], ["stat", "--zone", "a/b"],
                 ["run", "--rate", "12x", "--", "true"], ["run", "--", "true"]):
        cp = harness.run_cli(*args)
        assert cp.returncode == 2, (args, cp)
        assert cp.stderr.startswith("trafficrate: "), (args, cp)


def test_run_loads_the_library_into_the_server(zone, cli, webroot):
    """`trafficrate run --rate R --zone Z -- server` governs the server."""
    port = harness.free_port()
    argv = [str(harness.cli_path()), "run", "--rate", RATE, "--zone", zone, "--",
            harness.PYTHON, str(harness.PYSERVER), "--port", str(port),
            "--bind", harness.SERVER_HOST, "--dir", str(webroot)]
    proc = subprocess.Popen(argv, stderr=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL,
                            env=harness.server_environment(None))
    dset = None
    try:
        up = harness.wait_for(lambda: _accepts(port), 10.0)
        assert up, "server under `trafficrate run` did not start"
        dset = harness.DownloadSet(port, [CLIENT], duration=4.0).start()
        assert dset.wait_started(10.0), dset.errors()
        counted = harness.wait_for(
            lambda: harness.key_stat(zone, CLIENT)["active"] == 1, 5.0)
        assert counted, harness.stat_json(zone)
    finally:
        if dset is not None:
            dset.stop()
            dset.join(5.0)
        proc.kill()
        proc.wait(5.0)


def _accepts(port):
    try:
        with socket.create_connection((harness.SERVER_HOST, port), timeout=0.5):
            return True
    except OSError:
        return False
