"""Issue 13: one client's rate shared by the hosts of a fleet through Redis,
its settings.

`trafficrate check` refuses bad cluster settings in one line naming the
variable and never echoes the password or the secret. (The fleet's tests
are test_cluster_sharing.py and test_cluster_failover.py; this module needs
no server. It runs under the small_gso_packets fixture, as they do.)
"""

import pytest

import harness
from cluster_fleet import RATE, SECRET

pytestmark = pytest.mark.usefixtures("small_gso_packets")


# ---------------------------------------------------------------------- tests

PASSWORD = "pw-never-echoed-7731"


def check_refused(zone, env, variable, hidden=()):
    cp = harness.run_cli("check", "--rate", RATE, "--zone", zone, env=env)
    report = "env %s: rc %d\nstdout: %s\nstderr: %s" % (env, cp.returncode,
                                                         cp.stdout, cp.stderr)
    assert cp.returncode == 1, report
    assert cp.stderr.count("\n") == 1, report
    assert cp.stderr.startswith("trafficrate: %s: " % variable), report
    for text in hidden:
        assert text not in cp.stdout + cp.stderr, report


def test_check_refuses_bad_cluster_settings_in_one_line(zone, cli):
    """A bad URL names TRAFFICRATE_CLUSTER (the password not echoed); a
    missing or short secret names TRAFFICRATE_CLUSTER_SECRET (not echoed); a
    decay over 10m names TRAFFICRATE_CLUSTER_DECAY; good settings pass and
    show neither the password nor the secret."""
    url = "redis://127.0.0.1:6379"
    short = "fifteen-chars15"
    for bad in ("http://x", "redis://:%s@host:notaport" % PASSWORD,
                "rediss://:%s@127.0.0.1:6379" % PASSWORD):
        check_refused(zone, {"TRAFFICRATE_CLUSTER": bad,
                             "TRAFFICRATE_CLUSTER_SECRET": SECRET},
                      "TRAFFICRATE_CLUSTER", hidden=(PASSWORD, SECRET))
    check_refused(zone, {"TRAFFICRATE_CLUSTER": url}, "TRAFFICRATE_CLUSTER_SECRET")
    check_refused(zone, {"TRAFFICRATE_CLUSTER": url,
                         "TRAFFICRATE_CLUSTER_SECRET": short},
                  "TRAFFICRATE_CLUSTER_SECRET", hidden=(short,))
    check_refused(zone, {"TRAFFICRATE_CLUSTER": url,
                         "TRAFFICRATE_CLUSTER_SECRET": SECRET,
                         "TRAFFICRATE_CLUSTER_DECAY": "11m"},
                  "TRAFFICRATE_CLUSTER_DECAY", hidden=(SECRET,))
    good = {"TRAFFICRATE_CLUSTER": "redis://:%s@127.0.0.1:6379/2" % PASSWORD,
            "TRAFFICRATE_CLUSTER_SECRET": SECRET,
            "TRAFFICRATE_CLUSTER_NAME": "fleet-it",
            "TRAFFICRATE_CLUSTER_DECAY": "500ms",
            "TRAFFICRATE_CLUSTER_HOST": "web-7.example"}
    cp = harness.run_cli("check", "--rate", RATE, "--zone", zone, env=good)
    report = "rc %d\nstdout: %s\nstderr: %s" % (cp.returncode, cp.stdout, cp.stderr)
    assert cp.returncode == 0, report
    assert PASSWORD not in cp.stdout + cp.stderr, report
    assert SECRET not in cp.stdout + cp.stderr, report
    lines = [l for l in cp.stdout.splitlines() if l.split()[:1] == ["cluster"]]
    assert len(lines) == 1 and "fleet-it" in lines[0], report
    assert "127.0.0.1:6379/2" in lines[0], report
    assert "this host web-7.example/%s:" % zone in lines[0], report
