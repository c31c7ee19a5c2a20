"""Issue 7: the shared byte budget (TRAFFICRATE_SHARE=budget), its
settings and the CLI.

A bad TRAFFICRATE_SHARE is reported in one line and nginx serves unpaced
(or, with TRAFFICRATE_STRICT=1, stops at start-up); `trafficrate check`
prints the share mode (budget by default) and refuses a bad one;
`trafficrate run --share MODE` sets the variable.

Real nginx (2 workers) under the library, in the private namespace of
conftest.py (lo MTU 1500), with net.ipv4.tcp_tso_rtt_log = 0 for the whole
module (the small_gso_packets fixture, as for the other test_budget_*.py
files). (Shared helpers in budget_common.py.)
"""

import pytest

import harness
from budget_common import CLIENT, RATE, SHARE_VALUES, TARGET, share_env

pytestmark = pytest.mark.usefixtures("small_gso_packets")


# --------------------------------------------- configuration and the CLI

def share_complaints(server):
    return [l for l in server.trafficrate_lines() if "TRAFFICRATE_SHARE" in l]


def check_share_complaint(lines, ending):
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("trafficrate: TRAFFICRATE_SHARE: "), line
    assert "budget" in line and "equal" in line, line
    assert line.endswith(ending), line


def test_bad_share_is_reported_and_nginx_serves_unpaced(servers, lib_env):
    server = servers.nginx(env=share_env(lib_env, "fair"), workers=2)
    check_share_complaint(share_complaints(server), "the server runs unpaced")
    m = harness.run_downloads(server.port, [CLIENT], warmup=0.5, window=2.0,
                              repeat=True)
    report = "%s\n%s" % (server.title, m.report())
    print("\n" + report)
    assert not [d for d in m.downloads if d.error], report
    assert m.source_rate(CLIENT) > 20 * TARGET, report


def test_strict_bad_share_stops_nginx_at_startup(servers, lib_env):
    server = servers.nginx(env=share_env(lib_env, "fair", STRICT=1), workers=2,
                           start=False)
    server.start(wait_ready=False)
    rc = server.wait_exit(10.0)
    assert rc == 1, server.describe()
    check_share_complaint(share_complaints(server), "exiting (TRAFFICRATE_STRICT=1)")


def share_lines(out):
    """Lines of `trafficrate check` output whose first word is `share`."""
    return [l.strip() for l in out.splitlines() if l.split()[:1] == ["share"]]


def test_check_prints_the_share_mode(cli):
    cp = harness.run_cli("check", "--rate", "500k")
    assert cp.returncode == 0, cp.stderr
    lines = share_lines(cp.stdout)
    # The default is budget (issue 33), equal stays for comparison.
    assert len(lines) == 1 and "budget" in lines[0], cp.stdout
    for args, env in ((["--share", "equal"], None), ([], {"TRAFFICRATE_SHARE": "equal"}),
                      (["--share", "budget"], {"TRAFFICRATE_SHARE": "equal"}),
                      (["--share", "equal"], {"TRAFFICRATE_SHARE": "budget"})):
        cp = harness.run_cli("check", "--rate", "500k", *args, env=env)
        assert cp.returncode == 0, (args, env, cp.stderr)
        lines = share_lines(cp.stdout)
        mode = args[1] if args else env["TRAFFICRATE_SHARE"]
        assert len(lines) == 1 and mode in lines[0], (args, env, cp.stdout)
    for args, env in ((["--share", "fair"], None), ([], {"TRAFFICRATE_SHARE": "fair"})):
        cp = harness.run_cli("check", "--rate", "500k", *args, env=env)
        assert cp.returncode == 1, (args, env, cp.stdout, cp.stderr)
        assert cp.stderr.count("\n") == 1, cp.stderr
        assert cp.stderr.startswith("trafficrate: TRAFFICRATE_SHARE: "), cp.stderr
        assert "budget" in cp.stderr and "equal" in cp.stderr, cp.stderr


def test_run_share_sets_the_variable(zone, cli):
    """`trafficrate run --share MODE -- env` execs env with
    TRAFFICRATE_SHARE=MODE (overriding the environment's); a bad mode is a
    usage error (2) and nothing runs."""
    for mode in SHARE_VALUES:
        other = "equal" if mode == "budget" else "budget"
        cp = harness.run_cli("run", "--rate", RATE, "--zone", zone, "--share", mode,
                             "--", "/usr/bin/env", env={"TRAFFICRATE_SHARE": other})
        assert cp.returncode == 0, (mode, cp.stderr)
        assert "TRAFFICRATE_SHARE=%s" % mode in cp.stdout.splitlines(), cp.stdout
        assert not [l for l in cp.stderr.splitlines() if "TRAFFICRATE_SHARE" in l], \
            cp.stderr
    cp = harness.run_cli("run", "--rate", RATE, "--zone", zone, "--share", "fair",
                         "--", "/usr/bin/env")
    assert cp.returncode == 2, (cp.stdout, cp.stderr)
    assert cp.stdout == "", cp.stdout
    assert cp.stderr.count("\n") == 1, cp.stderr
    assert cp.stderr.startswith("trafficrate: run: --share: "), cp.stderr
    assert "budget" in cp.stderr and "equal" in cp.stderr, cp.stderr
