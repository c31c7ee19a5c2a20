"""Issue 32, every new process recognised, and process slots: a threaded
server (spawning_server.py) that starts helper processes while it serves.

  * Python's subprocess starts each child with vfork; the child closes every
    fd above 2 (close_range) and dup2s its pipes through libc, so the
    interposers run in it, on its parent's memory. One client's 4 downloads
    served by the parent's threads meanwhile keep their registrations and
    the rate (before: the child's close_range released them, and its unlock
    of the zone lock made the zone look corrupt: the server went unpaced);
  * CGI style: the body of each response comes from `sh -c 'cat FILE;
    exit $?'` with the client's socket as its stdout. The shell never
    writes to it: it takes no process slot (before: every shell and every
    cat took one, and 30 clients ran a 64k zone's 57 slots out, passing
    connections through unpaced), and cat takes over the registration the
    server made (before: counted twice). Every byte is checked.
"""

import threading
import time

import harness
from server_base import Server

RATE = "500k"
TARGET = 512000
CLIENT = "127.0.0.2"  # 4 downloads
SPAWNER = "127.0.0.3"  # GET /spawn, one after another
CGI_CLIENTS = ["127.0.1.%d" % (i + 1) for i in range(30)]
CGI_RATE = "100k"
SPAWNING_SERVER = harness.REPO_ROOT / "tests" / "integration" / \
    "spawning_server.py"


class SpawningServer(Server):
    name = "spawning-server"

    def __init__(self, workdir, webroot, env_for_port):
        super().__init__(workdir)
        self.env = dict(env_for_port(self.port))
        self.title = "threaded server starting helper processes"
        self.argv = [harness.PYTHON, str(SPAWNING_SERVER), "--port",
                     str(self.port), "--bind", harness.SERVER_HOST, "--dir",
                     str(webroot)]


def fetch_loop(port, path, source, stop, results, limit=10000):
    """GETs `path` from `source` one after another until `stop` is set;
    appends (status, body length) to results, or the error."""
    for _ in range(limit):
        if stop.is_set():
            return
        try:
            status, _, body = harness.http_get(port, path, source=source,
                                               timeout=10.0, max_body=1 << 20)
            results.append((status, len(body)))
        except (OSError, ValueError, RuntimeError) as e:
            results.append(("error", "%s: %s" % (type(e).__name__, e)))


def wait_zone_empty(zone, timeout):
    t0 = time.monotonic()
    while True:
        snap = harness.stat_json(zone)
        if snap["used"]["connections"] == 0:
            return time.monotonic() - t0, snap
        if time.monotonic() - t0 >= timeout:
            return None, snap
        time.sleep(0.05)


def log_text(path):
    return path.read_text(errors="replace") if path.exists() else ""


def test_subprocess_children_leave_the_servers_connections_alone(
        servers, lib_env, zone, workdir, webroot):
    log = workdir / "trafficrate.log"
    server = SpawningServer(workdir, webroot,
                            lambda port: lib_env(RATE, LOG=str(log)))
    servers.servers.append(server)
    server.start()
    harness.register_content("/spawn", b"ok\n")
    stop = threading.Event()
    spawns = []
    spawner = threading.Thread(target=fetch_loop, args=(
        server.port, "/spawn", SPAWNER, stop, spawns), daemon=True)
    dset = harness.DownloadSet(server.port, [CLIENT] * 4, duration=10.0)
    dset.start()
    try:
        started = dset.wait_started(10.0)
        assert started, dset.errors()
        spawner.start()
        time.sleep(max(0.0, started + 5.0 - time.monotonic()))
        during = harness.key_stat(zone, CLIENT)
        time.sleep(max(0.0, started + 9.7 - time.monotonic()))
        m = dset.measure(started + 2.0, started + 9.5, TARGET)
    finally:
        stop.set()
        dset.stop()
        dset.join(5.0)
        spawner.join(15.0)
    waited, after = wait_zone_empty(zone, 3.0)
    errors = [r for r in spawns if r[0] != 200]
    report = "%s\n%s\nduring: %s\n%d children spawned (%d failed: %s)\n" \
        "zone empty after %s s\nlog:\n%s" % (
            server.title, m.report(), during, len(spawns), len(errors),
            errors[:3], "%.2f" % waited if waited is not None else "> 3",
            log_text(log)[-2000:])
    print("\n" + report)
    assert not dset.errors(), report
    assert not errors and len(spawns) >= 20, report
    print(harness.check_bodies(dset.downloads))
    assert (during["connections"], during["active"]) == (4, 4), report
    assert harness.within(m.source_rate(CLIENT), TARGET, 0.05), report
    assert "corrupt" not in log_text(log), report
    assert waited is not None, report


def test_exec_helpers_take_no_slot_they_do_not_use(
        servers, lib_env, zone, workdir, webroot):
    log = workdir / "trafficrate.log"
    # The smallest zone: 57 process slots. The helpers' client sockets are
    # theirs only on the server's port (TRAFFICRATE_PORTS; this port is
    # in the ephemeral range).
    # 100k: each response takes about 4 s, so that all 30 are in flight at
    # once.
    server = SpawningServer(workdir, webroot, lambda port: lib_env(
        CGI_RATE, LOG=str(log), ZONE_SIZE="64k", PORTS=str(port)))
    servers.servers.append(server)
    server.start()
    harness.register_content("/cgi/medium.bin", harness.MEDIUM_CONTENT)
    stop = threading.Event()
    results = {source: [] for source in CGI_CLIENTS}
    threads = [threading.Thread(target=fetch_loop, args=(
        server.port, "/cgi/medium.bin", source, stop, results[source]),
        daemon=True) for source in CGI_CLIENTS]
    for t in threads:
        t.start()
    peak = {"processes": 0, "connections": 0, "per client": 0}
    capacity = None
    try:
        deadline = time.monotonic() + 8.0
        while time.monotonic() < deadline:
            snap = harness.stat_json(zone)
            capacity = snap["capacity"]["processes"]
            for name in ("processes", "connections"):
                peak[name] = max(peak[name], snap["used"][name])
            peak["per client"] = max([peak["per client"]] + [
                k["connections"] for k in snap["keys"]])
            time.sleep(0.2)
    finally:
        stop.set()
        for t in threads:
            t.join(15.0)
    waited, after = wait_zone_empty(zone, 3.0)
    done = [r for rs in results.values() for r in rs]
    bad = [r for r in done if r != (200, harness.MEDIUM_FILE_SIZE)]
    slot_lines = [line for line in log_text(log).splitlines()
                  if "no free process slot" in line]
    report = "%s\n%d responses from %d clients (%d bad: %s)\npeak %s of " \
        "%s process slots; counters %s\nzone empty after %s s\n" \
        "'no free process slot' lines: %d\n%s" % (
            server.title, len(done), len(CGI_CLIENTS), len(bad), bad[:3],
            peak, capacity, after["counters"],
            "%.2f" % waited if waited is not None else "> 3",
            len(slot_lines), "\n".join(slot_lines[:3]))
    print("\n" + report)
    assert not bad and len(done) >= len(CGI_CLIENTS), report
    assert not slot_lines, report
    assert after["counters"]["table_full"] == 0, report
    # The server, and one cat per response being sent (the shells take
    # none), with room for the exited ones not yet reaped.
    assert peak["processes"] <= 1 + len(CGI_CLIENTS) + 5, report
    # Each client's one connection is counted once: cat takes over the
    # registration the server made when it accepted it.
    assert peak["per client"] == 1, report
    assert waited is not None, report
