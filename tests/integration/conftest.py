"""Fixtures for the trafficrate integration tests (see harness.py).

The suite must run as root in a private network namespace whose loopback has
MTU 1500; scripts/test.sh does:
    unshare -n sh -c 'ip link set lo up mtu 1500 && /usr/bin/python3 -m pytest tests/integration'
The library comes from $TRAFFICRATE_BUILD_DIR (default <repo>/build); a test
that needs it fails (never skips) when libtrafficrate.so is missing.

Every byte checked: every response body a client of clients.py receives is
judged (bodies.py: the SHA-256 of what arrived against the served file's
bytes at the same place, partial bodies as far as they came). Right after
each test's call the bodies it made (in its function fixtures too) are
collected, and a test with a body that is not intact fails with one line per
such body (URL, client, bytes, both digests). Bodies made in module
fixtures are collected when the module ends (an error there).
"""

import shutil

import pytest

import cluster_fleet
import harness
import redis_server

_BODY_MARK = pytest.StashKey()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "harness: checks of the test harness itself (no library needed); "
        "deselect with -m 'not harness'")
    harness.LEDGER.enabled = True


def _not_intact(found, summary):
    return "bytes not intact in %d response bodies; %s:\n%s" % (
        len(found), summary, "\n".join("  " + line for line in found[:20])
        + ("\n  (%d more)" % (len(found) - 20) if len(found) > 20 else ""))


@pytest.fixture(autouse=True)
def _body_mark(request):
    """Where this test's response bodies begin in the ledger (autouse, so
    before the test's other function fixtures)."""
    request.node.stash[_BODY_MARK] = harness.LEDGER.mark()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_call(item):
    """After the test ran: its bodies must all be intact (see the module
    docstring). A test that failed anyway gets them as a report section."""
    outcome = yield
    found, summary = harness.LEDGER.collect(item.stash.get(_BODY_MARK, 0))
    if found:
        text = _not_intact(found, summary)
        if outcome.excinfo is None:
            pytest.fail(text, pytrace=False)
        item.add_report_section("call", "bytes", text)


@pytest.fixture(scope="module", autouse=True)
def _module_bodies():
    """Bodies made in module fixtures: judged when the module ends."""
    mark = harness.LEDGER.mark()
    yield
    found, summary = harness.LEDGER.collect(mark)
    if found:
        pytest.fail(_not_intact(found, summary), pytrace=False)


def pytest_report_header(config):
    lib = harness.library_path()
    problems = harness.namespace_problems()
    return ["trafficrate library: %s (%s)" % (lib, "present" if lib.is_file() else "MISSING"),
            "test namespace: %s" % ("ok" if not problems else "; ".join(problems))]


@pytest.fixture(scope="session", autouse=True)
def test_namespace():
    """Every integration test needs root, a private netns and lo at MTU 1500."""
    problems = harness.namespace_problems()
    if problems:
        pytest.fail("integration tests need a private network namespace with a "
                    "1500-byte loopback: %s.\nRun them via scripts/test.sh, or: "
                    "unshare -n sh -c 'ip link set lo up mtu 1500 && "
                    "/usr/bin/python3 -m pytest tests/integration'"
                    % "; ".join(problems), pytrace=False)


@pytest.fixture(scope="module")
def small_gso_packets(test_namespace):
    """net.ipv4.tcp_tso_rtt_log = 0 in the test namespace while a module runs,
    restored afterwards: Linux 5.18+ builds 64 KiB packets on sub-512 us RTT
    paths (all of loopback) whatever the pacing rate, which makes one-second
    buckets lumpy (see test_dynamics.py's docstring). Modules that check
    buckets use it with pytestmark = pytest.mark.usefixtures(...)."""
    assert not harness.namespace_problems()  # never touch the host's netns
    old = harness.sysctl("net.ipv4.tcp_tso_rtt_log", 0)
    yield
    harness.sysctl("net.ipv4.tcp_tso_rtt_log", old)


DEFAULT_TSO_RTT_LOG = 9


@pytest.fixture(scope="module")
def default_tso(test_namespace):
    """net.ipv4.tcp_tso_rtt_log at the kernel's default (9) while a module
    runs, whatever an earlier module left; restored after. The
    test_shaper_*.py modules use it with pytestmark =
    pytest.mark.usefixtures(...), as users have the default."""
    assert not harness.namespace_problems()  # never touch the host's netns
    old = harness.sysctl("net.ipv4.tcp_tso_rtt_log", DEFAULT_TSO_RTT_LOG)
    yield
    harness.sysctl("net.ipv4.tcp_tso_rtt_log", old)


@pytest.fixture(scope="module")
def fleet_servers(test_namespace, webroot):
    """Redis and the two nginx hosts of the issue 13 tests
    (cluster_fleet.Fleet), shared by a module's tests, stopped by pid after
    them."""
    for path in (harness.library_path(), harness.cli_path()):
        if not path.is_file():
            pytest.fail("%s is missing: build first or set TRAFFICRATE_BUILD_DIR"
                        % path, pytrace=False)
    workdir = harness.make_workdir()
    redis = redis_server.RedisServer(workdir)
    fleet = cluster_fleet.Fleet(workdir, webroot, redis)
    try:
        redis.start()
        fleet.start()
        yield fleet
    finally:
        fleet.stop()
        redis.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def fleet(fleet_servers):
    """The module's fleet, made whole again (see Fleet.ensure)."""
    fleet_servers.ensure()
    return fleet_servers


@pytest.fixture(scope="session")
def session_dir():
    path = harness.make_workdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def webroot(session_dir):
    """World-readable directory with big.bin (256 MiB), medium.bin and
    small.txt (netns_env.make_webroot)."""
    return harness.make_webroot(session_dir)


@pytest.fixture
def workdir():
    """Per-test directory for configs and logs (readable by nginx workers)."""
    path = harness.make_workdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def preload():
    """Path of the built libtrafficrate.so; FAILS the test if it is missing."""
    lib = harness.library_path()
    if not lib.is_file():
        pytest.fail("%s is missing: build the library first (cmake -S . -B build "
                    "-G Ninja && cmake --build build) or set TRAFFICRATE_BUILD_DIR"
                    % lib, pytrace=False)
    return lib


@pytest.fixture
def cli():
    """Path of the built trafficrate CLI; FAILS the test if it is missing."""
    path = harness.cli_path()
    if not path.is_file():
        pytest.fail("%s is missing: build first or set TRAFFICRATE_BUILD_DIR" % path,
                    pytrace=False)
    return path


@pytest.fixture
def zone(request):
    """A zone name unique to this test; its file is removed after."""
    name = harness.unique_zone(request.node.name)
    harness.remove_zone(name)
    yield name
    harness.remove_zone(name)


@pytest.fixture
def lib_env(preload, zone):
    """lib_env(rate=None, **TRAFFICRATE_vars) -> env dict with LD_PRELOAD and
    this test's zone; e.g. lib_env("500k", STRICT=1)."""
    def make(rate=None, **variables):
        return harness.preload_env(zone, rate, library=preload, **variables)
    return make


@pytest.fixture
def servers(workdir, webroot, zone):
    """ServerFactory: servers.nginx(env=..., sendfile=...), servers.python(env=...).

    Every server is stopped (by pid, with its workers/children) before the
    zone is removed.
    """
    factory = harness.ServerFactory(workdir, webroot)
    yield factory
    factory.stop_all()
