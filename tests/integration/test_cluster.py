"""Issue 13: one client's rate shared by the hosts of a fleet through Redis.

Two "hosts": two nginx (2 workers each, `listen ... reuseport`), one on
127.0.0.10 and one on 127.0.0.11, each under the library with a zone of its
own (a host's id is "<host>/<zone>", so they are two hosts on this one
machine; host a's <host> is the hostname, host b's TRAFFICRATE_CLUSTER_HOST
"host-b"), both with the same TRAFFICRATE_CLUSTER (one redis-server on
127.0.0.1 that this module starts, redis_server.py), _CLUSTER_SECRET and
_CLUSTER_NAME, TRAFFICRATE_CLUSTER_DECAY=1s, and rate 500k (512000 B/s) per
client IP. One client, 127.0.0.2, downloads big.bin from both.

Each host's budget for the key is its weighted max-min share of the rate,
weighted by sending connections: 2 + 2 downloads get half the rate on each
host, 3 + 1 get 3/4 and 1/4 (rate/4 for every connection). Redis away
(killed, or stopped for longer than the 200 ms an exchange may take): each
host falls back, its shares moving to the full local rate over the decay
(1 s), so the two hosts send twice the rate; Redis back: they share it again.
A host that dies leaves Redis 600 ms after its last exchange and the other
takes the whole rate. One process per zone holds the exchange (a lease in
the zone); when it dies another takes it over. `trafficrate check` refuses
bad cluster settings in one line naming the variable and never echoes the
password or the secret.

Rates are measured by the clients over 8 s windows, which start once both
hosts' `trafficrate stat` show the key split as planned (its "cluster":
"active" and "hosts") and at least 2 s after the downloads connected;
per-connection figures at rate/4 need the small_gso_packets fixture
(conftest.py, see test_dynamics.py): net.ipv4.tcp_tso_rtt_log = 0.

The servers (Redis and the two hosts) are shared by the module's tests; the
`fleet` fixture makes them whole again before each test (Redis started again
if a test killed it, a host whose nginx a test killed started afresh in its
zone) and waits until no connection of the client is left on either host.

NginxServer listens on harness.SERVER_HOST only, so HostNginx below puts its
listening sockets on another address. Run with -s to see the figures; they
are in every assertion message too.
"""

import json
import shutil
import signal
import socket
import time

import pytest

import harness
import redis_server

RATE = "500k"
TARGET = 512000  # B/s per client IP, for the whole fleet
CLIENT = "127.0.0.2"
OTHER_CLIENT = "127.0.0.3"  # requests that start another worker's watcher
HOST_ADDRS = ("127.0.0.10", "127.0.0.11")
SECRET = "trafficrate-it-fleet-secret-0123456789"
DECAY = "1s"
WARMUP_S = 2.0  # from all downloads connected
SETTLE_S = 1.0  # from both hosts' stat showing the planned split
SETTLE_TIMEOUT_S = 5.0
WINDOW_S = 8.0
POLL_S = 0.05  # stat polling interval
TOTAL_TOLERANCE = 0.05
CONNECTION_TOLERANCE = 0.05
SHARE_TOLERANCE = 0.10  # a host_share in stat vs its planned fraction
FALLBACK_WITHIN_S = 3.0  # Redis killed -> both hosts "fallback"
FULL_RATE_AFTER_S = 2.0  # Redis killed -> full local rate (decay 1 s + a tick)
RECONNECT_WITHIN_S = 2.0  # Redis back -> both "connected", shared again
DEAD_HOST_WITHIN_S = 1.0  # a host killed -> the other's share >= 0.95 x rate
TAKEOVER_WITHIN_S = 3.0  # the exchange's holder killed -> another holds it
# ... and exchanges before the host's entry in Redis expires: 600 ms after
# the last exchange, up to a tick (100 ms) before the kill. The next holder
# comes at the next watcher poll (every 250 ms), plus the stat polling here.
TAKEOVER_BEFORE_EXPIRY_S = 0.5

pytestmark = pytest.mark.usefixtures("small_gso_packets")


# -------------------------------------------------------------------- servers

class HostNginx(harness.NginxServer):
    """NginxServer whose listening sockets are on `host` (e.g. 127.0.0.10)
    instead of harness.SERVER_HOST; readiness is checked there too."""

    def __init__(self, workdir, webroot, host, port=None, **kw):
        super().__init__(workdir, webroot, port=port or harness.free_port(host),
                         **kw)
        self.host = host
        self.title += ", on %s" % host

    def conf_text(self):
        text = super().conf_text()
        old = "listen %s:%d" % (harness.SERVER_HOST, self.port)
        assert old in text, text
        return text.replace(old, "listen %s:%d" % (self.host, self.port))

    def ready(self):
        try:
            status, _, _ = harness.http_get(self.port, harness.SMALL_FILE,
                                            host=self.host, timeout=1.0)
            return status == 200
        except (OSError, ValueError, IndexError):
            return False


class Host:
    """One host of the fleet: its label, listening address, zone and nginx."""

    def __init__(self, label, addr, zone):
        self.label, self.addr, self.zone = label, addr, zone
        self.server = None

    @property
    def host_name(self):
        """TRAFFICRATE_CLUSTER_HOST: host a's is left to the hostname."""
        return None if self.label == "a" else "host-" + self.label

    @property
    def host_id(self):
        return "%s/%s" % (self.host_name or socket.gethostname(), self.zone)

    def stat(self):
        return harness.stat_json(self.zone)

    def processes(self):
        """Live pids of this host's nginx (master and workers)."""
        server = self.server
        alive = [server.pid] if server.proc.poll() is None else []
        return set(alive + server.family())


class Fleet:
    """Redis and two hosts sharing one cluster name and secret."""

    def __init__(self, workdir, webroot, redis):
        self.workdir, self.webroot, self.redis = workdir, webroot, redis
        self.name = harness.unique_zone("fleet")
        self.hosts = [Host(label, addr, harness.unique_zone("cluster-" + label))
                      for label, addr in zip("ab", HOST_ADDRS)]

    def env(self, host):
        return harness.preload_env(
            host.zone, RATE, CLUSTER=self.redis.url(), CLUSTER_SECRET=SECRET,
            CLUSTER_NAME=self.name, CLUSTER_DECAY=DECAY,
            CLUSTER_HOST=host.host_name)

    def start_host(self, host):
        harness.remove_zone(host.zone)
        host.server = HostNginx(self.workdir, self.webroot, host.addr,
                                env=self.env(host), workers=2, reuseport=True)
        host.server.start()
        complaints = [l for l in host.server.trafficrate_lines()
                      if "TRAFFICRATE_" in l]
        assert not complaints, host.server.describe()

    def start(self):
        for host in self.hosts:
            self.start_host(host)
        return self

    def healthy(self, host):
        server = host.server
        return (server is not None and server.proc.poll() is None
                and harness.wait_for(lambda: len(server.worker_pids()) == 2, 3.0))

    def ensure(self):
        """Redis running and answering, both hosts' nginx whole (else started
        afresh in their zones), no connection of CLIENT left on either."""
        if self.redis.running():
            self.redis.signal(signal.SIGCONT)  # in case a test left it stopped
        else:
            self.redis.start()
        assert harness.wait_for(self.redis.ping, 5.0), self.redis.describe()
        for host in self.hosts:
            if not self.healthy(host):
                if host.server is not None:
                    host.server.stop()
                self.start_host(host)
        for host in self.hosts:
            waited, entry = harness.wait_key_count(host.zone, CLIENT, 0, 5.0)
            assert waited is not None, "host %s: %s" % (host.label, entry)

    def stop(self):
        for host in self.hosts:
            if host.server is not None:
                host.server.stop()
            harness.remove_zone(host.zone)


@pytest.fixture(scope="module")
def fleet_servers(test_namespace, webroot):
    for path in (harness.library_path(), harness.cli_path()):
        if not path.is_file():
            pytest.fail("%s is missing: build first or set TRAFFICRATE_BUILD_DIR"
                        % path, pytrace=False)
    workdir = harness.make_workdir()
    redis = redis_server.RedisServer(workdir)
    fleet = Fleet(workdir, webroot, redis)
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


# -------------------------------------------------------------------- clients

class Traffic:
    """Downloads of big.bin from CLIENT, one per entry of `plan` (a Host
    each), all starting together and stopping after `duration` s at the
    latest; a context manager that stops and joins them (bounded) at exit."""

    def __init__(self, plan, duration):
        self.start_at = time.monotonic() + 0.05
        self.stop_at = self.start_at + duration
        self.plan = list(plan)
        counts = {}
        self.downloads = []
        for host in self.plan:
            counts[host.label] = counts.get(host.label, 0) + 1
            self.downloads.append(harness.Download(
                host.server.port, CLIENT, label="%s@%s#%d" % (
                    CLIENT, host.label, counts[host.label]),
                start_at=self.start_at, stop_at=self.stop_at, host=host.addr))

    def __enter__(self):
        for d in self.downloads:
            d.start()
        return self

    def __exit__(self, *exc):
        for d in self.downloads:
            d.stop()
        deadline = time.monotonic() + 10.0
        for d in self.downloads:
            d.join(max(0.0, deadline - time.monotonic()))
        return False

    def on(self, host):
        return [d for d, h in zip(self.downloads, self.plan) if h is host]

    def wait_started(self, timeout=10.0):
        def started():
            times = [d.connected_at for d in self.downloads]
            return None if None in times else max(times)
        return harness.wait_for(started, timeout)

    def errors(self, downloads=None):
        return ["%s: %s" % (d.label, d.error)
                for d in (self.downloads if downloads is None else downloads)
                if d.error]

    def measure(self, t0, t1, target=None, downloads=None):
        return harness.Measurement(self.downloads if downloads is None
                                   else downloads, t0, t1, target)


def total(measurement):
    return sum(r for _, r in measurement.per_download)


def sleep_until(t):
    time.sleep(max(0.0, t - time.monotonic()))


# ----------------------------------------------------------------------- stat

def key_entry(stat, key=CLIENT):
    return next((k for k in stat["keys"] if k["key"] == key), None)


def key_cluster(stat, key=CLIENT):
    """The key's "cluster" object ({active, hosts, host_share}) or None."""
    entry = key_entry(stat, key)
    return None if entry is None else entry.get("cluster")


def state(stat):
    cluster = stat.get("cluster")
    return None if cluster is None else cluster.get("state")


def host_share(stat):
    """The key's host_share, or None."""
    kc = key_cluster(stat)
    return None if kc is None else kc.get("host_share")


def split_is(stat, active, hosts):
    kc = key_cluster(stat)
    return (state(stat) == "connected" and kc is not None
            and kc.get("active") == active and kc.get("hosts") == hosts)


def describe(stats):
    lines = []
    for host, stat in stats.items():
        entry = key_entry(stat) or {}
        lines.append("  host %s (%s, zone %s): cluster %s\n    key %s: active %s "
                     "connections %s share %s cluster %s" % (
                         host.label, host.addr, host.zone,
                         json.dumps(stat.get("cluster"), sort_keys=True), CLIENT,
                         entry.get("active"), entry.get("connections"),
                         entry.get("share"),
                         json.dumps(entry.get("cluster"), sort_keys=True)))
    return "\n".join(lines)


def wait_stats(hosts, predicate, timeout, interval=POLL_S):
    """Poll every host's stat (every `interval` s, at most timeout/interval
    + 2 rounds) until predicate({host: stat}) holds. Returns (monotonic time
    of the round where it held, or None, and that round's stats)."""
    deadline = time.monotonic() + timeout
    stats = {}
    for _ in range(int(timeout / interval) + 2):
        stats = {host: host.stat() for host in hosts}
        now = time.monotonic()
        if predicate(stats):
            return now, stats
        if now >= deadline:
            break
        time.sleep(interval)
    return None, stats


def settle(traffic, hosts, active, n_hosts):
    """Wait until every download connected and every host's stat shows the
    key with `active` sending connections on `n_hosts` hosts, connected.
    Returns (start of the measuring window, the stats seen)."""
    started = traffic.wait_started(10.0)
    assert started, "downloads did not all connect: %s" % traffic.errors()
    seen, stats = wait_stats(
        hosts, lambda st: all(split_is(st[h], active, n_hosts) for h in hosts),
        SETTLE_TIMEOUT_S)
    assert seen, "after %.0f s the hosts do not show %d connections of %s on " \
        "%d hosts:\n%s\n%s" % (SETTLE_TIMEOUT_S, active, CLIENT, n_hosts,
                               describe(stats), "\n".join(traffic.errors()))
    return max(started + WARMUP_S, seen + SETTLE_S), stats


def kill_host(host):
    """SIGKILL the host's nginx master and every worker, by pid; returns
    the monotonic time the signals were sent."""
    server = host.server
    pids = [server.pid] + [p for p in server.family() if p != server.pid]
    for pid in pids:  # the master first: no worker is respawned
        harness.kill_pid(pid, signal.SIGKILL)
    killed = time.monotonic()
    gone = harness.wait_for(lambda: not any(harness.pid_alive(p) for p in pids),
                            2.0)
    assert gone, "host %s: still alive after SIGKILL: %s" % (
        host.label, [p for p in pids if harness.pid_alive(p)])
    return killed


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


def test_two_downloads_on_each_host_share_the_clients_rate(fleet):
    """2 + 2 downloads: the client's total is the rate; each host shows the
    cluster connected with one peer, the key's 4 connections on 2 hosts and
    half the rate as its share; Redis holds no client address in clear."""
    a, b = hosts = fleet.hosts
    with Traffic([a, a, b, b], WARMUP_S + SETTLE_TIMEOUT_S + WINDOW_S + 5) as traffic:
        t0, _ = settle(traffic, hosts, 4, 2)
        t1 = t0 + WINDOW_S
        sleep_until(t0 + WINDOW_S / 2)
        stats = {host: host.stat() for host in hosts}
        names = fleet.redis.command("KEYS", "*")
        sleep_until(t1 + 0.05)
    m = traffic.measure(t0, t1, TARGET)
    report = "2 + 2 downloads, rate %d B/s for the fleet\n%s\nhost stats " \
        "mid-window:\n%s\nRedis keys: %s" % (TARGET, m.report(), describe(stats),
                                             names)
    print("\n" + report)
    assert not traffic.errors(), report
    assert harness.within(total(m), TARGET, TOTAL_TOLERANCE), report
    for host in hosts:
        stat = stats[host]
        cluster = stat["cluster"]
        assert cluster is not None, report
        assert cluster["state"] == "connected", report
        assert cluster["url"] == "redis://127.0.0.1:%d/0" % fleet.redis.port, report
        assert cluster["name"] == fleet.name, report
        assert cluster["host"] == host.host_id, report
        assert cluster["pid"] in host.processes(), report
        assert cluster["peers"] == 1, report
        assert cluster["exchanges"] > 0, report
        assert cluster["last_exchange_ms_ago"] < 1000, report
        assert isinstance(cluster["last_rtt_ms"], (int, float)), report
        kc = key_cluster(stat)
        assert kc["active"] == 4 and kc["hosts"] == 2, report
        assert harness.within(kc["host_share"], TARGET / 2, SHARE_TOLERANCE), report
    assert names, report
    assert not [n for n in names if CLIENT.encode() in n], report
    assert [n for n in names if fleet.name.encode() in n], report


def test_three_and_one_downloads_get_a_quarter_of_the_rate_each(fleet):
    """3 downloads on one host, 1 on the other: every connection gets rate/4
    (the hosts' shares 3/4 and 1/4 of the rate)."""
    a, b = hosts = fleet.hosts
    with Traffic([a, a, a, b], WARMUP_S + SETTLE_TIMEOUT_S + WINDOW_S + 5) as traffic:
        t0, _ = settle(traffic, hosts, 4, 2)
        t1 = t0 + WINDOW_S
        sleep_until(t0 + WINDOW_S / 2)
        stats = {host: host.stat() for host in hosts}
        sleep_until(t1 + 0.05)
    m = traffic.measure(t0, t1, TARGET)
    report = "3 + 1 downloads, rate %d B/s for the fleet, %d B/s each\n%s\n" \
        "host stats mid-window:\n%s" % (TARGET, TARGET / 4, m.report(),
                                        describe(stats))
    print("\n" + report)
    assert not traffic.errors(), report
    assert harness.within(total(m), TARGET, TOTAL_TOLERANCE), report
    for _, rate in m.per_download:
        assert harness.within(rate, TARGET / 4, CONNECTION_TOLERANCE), report
    for host, fraction in ((a, 0.75), (b, 0.25)):
        kc = key_cluster(stats[host])
        assert kc is not None and kc["active"] == 4 and kc["hosts"] == 2, report
        assert harness.within(kc["host_share"], TARGET * fraction,
                              SHARE_TOLERANCE), report


def test_a_stalled_redis_means_fallback_and_connected_again_when_it_answers(fleet):
    """Redis stopped (SIGSTOP: connections open, no replies, so exchanges
    time out after 200 ms): both hosts fall back within 3 s, counting
    failures; resumed (SIGCONT): both connected again within 2 s."""
    a, b = hosts = fleet.hosts
    with Traffic([a, b], WARMUP_S + SETTLE_TIMEOUT_S + 8) as traffic:
        settle(traffic, hosts, 2, 2)
        before = {host: host.stat()["cluster"] for host in hosts}
        try:
            assert fleet.redis.signal(signal.SIGSTOP), fleet.redis.describe()
            stalled = time.monotonic()
            fell, stats = wait_stats(
                hosts, lambda st: all(state(st[h]) == "fallback" for h in hosts),
                FALLBACK_WITHIN_S)
        finally:
            fleet.redis.signal(signal.SIGCONT)
        resumed = time.monotonic()
        back, stats_back = wait_stats(
            hosts, lambda st: all(state(st[h]) == "connected" for h in hosts),
            RECONNECT_WITHIN_S)
    report = "Redis stopped, then resumed\nbefore: %s\nafter %s s stopped:\n%s\n" \
        "after %s s resumed:\n%s\n%s" % (
            json.dumps([before[h] for h in hosts], sort_keys=True),
            None if fell is None else "%.2f" % (fell - stalled), describe(stats),
            None if back is None else "%.2f" % (back - resumed),
            describe(stats_back), "\n".join(traffic.errors()))
    print("\n" + report)
    assert fell is not None, report
    for host in hosts:
        cluster = stats[host]["cluster"]
        assert cluster["failures"] > before[host]["failures"], report
        assert cluster["fallbacks"] > before[host]["fallbacks"], report
    assert back is not None, report
    assert not traffic.errors(), report


def test_another_process_takes_over_the_exchange_when_its_holder_dies(fleet):
    """SIGKILL the process that holds host a's exchange, once another worker
    of host a has served a request (a process takes part in its zone, and may
    take the exchange over, from its first connection on): that worker holds
    the exchange within 0.5 s, connected, exchanging again: before host a's
    figures in Redis expire (a dead holder's lease is free at the next
    watcher poll, not when it runs out), so host b counts host a as a peer
    all along, until 1 s after."""
    a, b = hosts = fleet.hosts
    with Traffic([a, b], WARMUP_S + SETTLE_TIMEOUT_S + TAKEOVER_WITHIN_S + 8) \
            as traffic:
        _, stats = settle(traffic, hosts, 2, 2)
        holder = stats[a]["cluster"]["pid"]
        family = a.processes()
        assert holder in family, describe(stats)

        def others(st):
            return [p["pid"] for p in st[a]["processes"]
                    if p["alive"] and p["pid"] != holder]
        for _ in range(40):  # requests spread over the workers (reuseport)
            if others({a: a.stat()}):
                break
            harness.http_get(a.server.port, source=OTHER_CLIENT, host=a.addr)
        stats = {a: a.stat()}
        assert others(stats), "no other process of host a registered:\n%s" % (
            describe(stats))
        assert harness.kill_pid(holder, signal.SIGKILL)
        killed = time.monotonic()
        seen_by_b = []  # (s after the kill, host b's peers)

        def watch_b(st):
            seen_by_b.append((round(time.monotonic() - killed, 2),
                              (st[b].get("cluster") or {}).get("peers")))
            return False

        def taken_over(st):
            watch_b(st)
            cluster = st[a].get("cluster")
            return (cluster is not None and cluster["pid"] != holder
                    and harness.pid_alive(cluster["pid"])
                    and cluster["state"] == "connected"
                    and cluster["last_exchange_ms_ago"] < 500)
        seen, after = wait_stats(hosts, taken_over, TAKEOVER_WITHIN_S)
        if seen is not None:
            wait_stats(hosts, watch_b, 1.0)
    gone = [v for v in seen_by_b if v[1] != 1]
    report = ("host a's exchange holder pid %d (of %s) killed; after %s s:\n%s\n"
              "host b's peers not 1 at (s after the kill, peers): %s of %d" % (
                  holder, sorted(family),
                  None if seen is None else "%.2f" % (seen - killed),
                  describe(after), gone, len(seen_by_b)))
    print("\n" + report)
    assert seen is not None, report
    new = after[a]["cluster"]["pid"]
    assert new in a.processes() | family, report
    assert seen - killed < TAKEOVER_BEFORE_EXPIRY_S, report
    assert not gone, report


def test_hosts_fall_back_to_the_full_rate_without_redis_and_share_again(fleet):
    """2 + 2 downloads, Redis killed: both hosts in fallback within 3 s, and
    once the decay (1 s) has run each host sends the full rate (the fleet
    twice the rate); Redis started again on its port: both connected within
    2 s with at most 0.6 x rate each, and the total is the rate again."""
    a, b = hosts = fleet.hosts
    duration = (WARMUP_S + SETTLE_TIMEOUT_S + FULL_RATE_AFTER_S + WINDOW_S
                + RECONNECT_WITHIN_S + SETTLE_S + WINDOW_S + 10)
    with Traffic([a, a, b, b], duration) as traffic:
        settle(traffic, hosts, 4, 2)
        assert fleet.redis.kill(), fleet.redis.describe()
        killed = time.monotonic()
        fell, stats_fell = wait_stats(
            hosts, lambda st: all(state(st[h]) == "fallback" and
                                  st[h]["cluster"]["fallbacks"] >= 1
                                  for h in hosts), FALLBACK_WITHIN_S)
        report = "2 + 2 downloads, Redis killed; after %s s:\n%s" % (
            None if fell is None else "%.2f" % (fell - killed),
            describe(stats_fell))
        assert fell is not None, report
        t0 = max(time.monotonic(), killed + FULL_RATE_AFTER_S)
        t1 = t0 + WINDOW_S
        sleep_until(t0)
        stats_full = {host: host.stat() for host in hosts}
        sleep_until(t1 + 0.05)
        fallback = traffic.measure(t0, t1, 2 * TARGET)
        report += "\nin fallback, from %.2f s after the kill:\n%s\n%s" % (
            t0 - killed, describe(stats_full), fallback.report())

        fleet.redis.start()
        restarted = time.monotonic()
        back, stats_back = wait_stats(
            hosts, lambda st: all(state(st[h]) == "connected" and
                                  host_share(st[h]) is not None and
                                  host_share(st[h]) <= 0.6 * TARGET
                                  for h in hosts), RECONNECT_WITHIN_S)
        report += "\nRedis started again (pid %d, port %d); after %s s:\n%s" % (
            fleet.redis.pid, fleet.redis.port,
            None if back is None else "%.2f" % (back - restarted),
            describe(stats_back))
        assert back is not None, report
        t2 = back + SETTLE_S
        t3 = t2 + WINDOW_S
        sleep_until(t3 + 0.05)
    shared = traffic.measure(t2, t3, TARGET)
    report += "\nshared again:\n%s\n%s" % (shared.report(),
                                           "\n".join(traffic.errors()))
    print("\n" + report)
    assert not traffic.errors(), report
    assert harness.within(total(fallback), 2 * TARGET, TOTAL_TOLERANCE), report
    for host in hosts:
        assert harness.within(total(traffic.measure(t0, t1, downloads=traffic.on(host))),
                              TARGET, TOTAL_TOLERANCE), report
        assert host_share(stats_full[host]) >= 0.95 * TARGET, report
    assert harness.within(total(shared), TARGET, TOTAL_TOLERANCE), report


def test_a_dead_hosts_share_goes_to_the_other_host_within_a_second(fleet):
    """2 + 2 downloads, host b's nginx SIGKILLed (master and workers): within
    1 s host a's share of the key is the whole rate (b's entry in Redis
    expired), and a's 2 downloads get the rate; a then sees no peer."""
    a, b = hosts = fleet.hosts
    duration = (WARMUP_S + SETTLE_TIMEOUT_S + DEAD_HOST_WITHIN_S + SETTLE_S
                + WINDOW_S + 5)
    with Traffic([a, a, b, b], duration) as traffic:
        settle(traffic, hosts, 4, 2)
        killed = kill_host(b)
        seen, stats = wait_stats(
            [a], lambda st: (host_share(st[a]) or 0) >= 0.95 * TARGET,
            DEAD_HOST_WITHIN_S)
        report = "2 + 2 downloads, host b killed; host a after %s s:\n%s" % (
            None if seen is None else "%.2f" % (seen - killed), describe(stats))
        assert seen is not None and seen - killed <= DEAD_HOST_WITHIN_S, report
        t0 = seen + SETTLE_S
        t1 = t0 + WINDOW_S
        sleep_until(t1 + 0.05)
        after = {a: a.stat()}
    m = traffic.measure(t0, t1, TARGET, downloads=traffic.on(a))
    report += "\nhost a's downloads:\n%s\nhost a after the window:\n%s" % (
        m.report(), describe(after))
    print("\n" + report)
    assert not traffic.errors(traffic.on(a)), report
    assert harness.within(total(m), TARGET, TOTAL_TOLERANCE), report
    cluster, kc = after[a]["cluster"], key_cluster(after[a])
    assert cluster["state"] == "connected" and cluster["peers"] == 0, report
    assert kc["active"] == 2 and kc["hosts"] == 1, report
