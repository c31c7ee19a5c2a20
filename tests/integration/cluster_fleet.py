"""The fleet of the issue 13 tests (one client's rate shared by the hosts of
a fleet through Redis): test_cluster_sharing.py, test_cluster_failover.py
and test_cluster_check.py.

Two "hosts": two nginx (2 workers each, `listen ... reuseport`), one on
127.0.0.10 and one on 127.0.0.11, each under the library with a zone of its
own (a host's id is "<host>/<zone>", so they are two hosts on this one
machine; host a's <host> is the hostname, host b's TRAFFICRATE_CLUSTER_HOST
"host-b"), both with the same TRAFFICRATE_CLUSTER (one redis-server on
127.0.0.1, redis_server.py), _CLUSTER_SECRET and _CLUSTER_NAME,
TRAFFICRATE_CLUSTER_DECAY=1s, and rate 500k (512000 B/s) per client IP. One
client, 127.0.0.2, downloads big.bin from both (Traffic).

Rates are measured by the clients over 8 s windows, which start once both
hosts' `trafficrate stat` show the key split as planned (its "cluster":
"active" and "hosts") and at least 2 s after the downloads connected
(settle()).

The servers (Redis and the two hosts) are shared by a module's tests: the
fleet_servers fixture of conftest.py starts them (module scope), and its
`fleet` fixture makes them whole again before each test (Fleet.ensure:
Redis started again if a test killed it, a host whose nginx a test killed
started afresh in its zone) and waits until no connection of the client is
left on either host.

NginxServer listens on harness.SERVER_HOST only, so HostNginx below puts its
listening sockets on another address.
"""

import json
import signal
import socket
import time

import harness
from harness import sleep_until  # noqa: F401 (for the cluster tests)

RATE = "500k"
TARGET = 512000  # B/s per client IP, for the whole fleet
CLIENT = "127.0.0.2"
HOST_ADDRS = ("127.0.0.10", "127.0.0.11")
SECRET = "trafficrate-it-fleet-secret-0123456789"
DECAY = "1s"
WARMUP_S = 2.0  # from all downloads connected
SETTLE_S = 1.0  # from both hosts' stat showing the planned split
SETTLE_TIMEOUT_S = 5.0
WINDOW_S = 8.0
POLL_S = 0.05  # stat polling interval
TOTAL_TOLERANCE = 0.05


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
