"""Issue 32: no other local user and no full disk may crash, stall, disable
or steer a server under trafficrate.

Zones live in a directory of their user's own (src/shm/zone_file.h): root's in
/run/trafficrate when /run is a tmpfs, else /dev/shm/trafficrate-0; user
UID's in /dev/shm/trafficrate-UID. /dev/shm is world-writable, so another
user can make those names first. Each test runs its servers in a private
mount namespace (mount_ns.py) with a fresh tmpfs on /dev/shm, and /run on
disk, so that root's zones too go to /dev/shm, where a squatter reaches.

The squatter is `nobody`. Before the servers start, it takes each server
user's usual place, one way per server:
  * a directory of its own holding a valid zone (copied from one it made
    with TRAFFICRATE_RATE=1) and the same zone at an earlier version's
    /dev/shm/trafficrate.NAME; for nginx run by root it truncates both
    files while the downloads run (what killed every worker with SIGBUS
    when the server had mapped them);
  * a zone of the wrong size in its directory;
  * an empty directory (mode 0777);
  * a symlink to a directory of its own holding its zone.
Every server then runs 4 downloads from its own client address, all in the
same window: each client must get the configured rate (+-5%), each server
must say once where its zone went instead, no server process may die, the
squatter's files must be as it left them, and root's CLI must find each
zone where it went.
"""

import json
import shutil
import time

import pytest

import harness
import mount_ns

SQUATTER = 65534  # nobody
RATE = "500k"
TARGET = 512000
WARMUP_S = 2.0
WINDOW_S = 6.0
TOLERANCE = 0.05
DOWNLOADS = 4

# (case, server user, client address)
CASES = [
    ("valid-zone-truncated", 0, "127.0.0.2"),
    ("valid-zone", 2001, "127.0.0.3"),
    ("wrong-size", 2002, "127.0.0.4"),
    ("directory", 2003, "127.0.0.5"),
    ("symlink", 2004, "127.0.0.6"),
]


def squat_script(case, uid, zone, bait):
    """Shell run as the squatter: takes /dev/shm/trafficrate-UID (and the
    earlier version's name of the zone) its way."""
    usual = "/dev/shm/trafficrate-%d" % uid
    legacy = "/dev/shm/trafficrate.%s" % zone
    own_zone = "/dev/shm/trafficrate-%d/%s" % (SQUATTER, bait)
    if case in ("valid-zone-truncated", "valid-zone"):
        return ("mkdir -m 0777 {u} && cp {z} {u}/{n} && chmod 0666 {u}/{n} && "
                "cp {z} {l} && chmod 0666 {l}").format(u=usual, z=own_zone,
                                                        n=zone, l=legacy)
    if case == "wrong-size":
        return ("mkdir -m 0777 {u} && cp {z} {u}/{n} && truncate -s 512k {u}/{n} "
                "&& chmod 0666 {u}/{n}").format(u=usual, z=own_zone, n=zone)
    if case == "directory":
        return "mkdir -m 0777 {u} {l}".format(u=usual, l=legacy)
    if case == "symlink":
        target = "/dev/shm/squat-%d" % uid
        return ("mkdir -m 0777 {t} && cp {z} {t}/{n} && ln -s {t} {u} && "
                "ln -s {t}/{n} {l}").format(t=target, z=own_zone, n=zone,
                                            u=usual, l=legacy)
    raise ValueError(case)


def squatter_files(ns):
    """sha256 of every file the squatter owns under /dev/shm (its own zone
    directory aside), by path."""
    cp = ns.run(["sh", "-c", "find /dev/shm -user %d -type f ! -path "
                 "'/dev/shm/trafficrate-%d/*' -print0 | xargs -0 -r sha256sum"
                 % (SQUATTER, SQUATTER)])
    return dict(reversed(line.split(None, 1)) for line in cp.stdout.splitlines())


@pytest.fixture(scope="module")
def squatted(webroot):
    """Runs every case at once; returns {case: result dict} for the tests."""
    preload, cli = harness.library_path(), harness.cli_path()
    workdir = harness.make_workdir()
    factory = harness.ServerFactory(workdir, webroot)
    ns = mount_ns.MountNamespace()
    base = harness.unique_zone("squat")
    zones = {case: "%s-%d" % (base, i) for i, (case, _, _) in enumerate(CASES)}
    results = {case: {} for case, _, _ in CASES}
    sets = []
    try:
        ns.tmpfs("/dev/shm", "256m")
        ns.run_on_disk("/run")
        bait = base + "-bait"
        # The squatter's own valid zone, at 1 B/s, to copy around.
        ns.run(["/bin/true"], user=SQUATTER,
               env=harness.preload_env(bait, "1", library=preload))
        for case, uid, _ in CASES:
            ns.run(["sh", "-c", squat_script(case, uid, zones[case], bait)],
                   user=SQUATTER)
        before = squatter_files(ns)
        servers = {}
        for case, uid, _ in CASES:
            env = harness.preload_env(zones[case], RATE, library=preload)
            if uid == 0:
                server = factory.nginx(env={}, workers=2, start=False,
                                       user="www-data www-data")
            else:
                server = factory.python(env={}, mode="thread", start=False)
            server.argv = ns.command(server.argv, user=uid or None, env=env)
            servers[case] = server.start()
        workers_before = servers["valid-zone-truncated"].worker_pids()
        for case, _, client in CASES:
            dset = harness.DownloadSet(servers[case].port, [client] * DOWNLOADS,
                                       duration=WARMUP_S + WINDOW_S + 2.0)
            sets.append((case, client, dset.start()))
        started = [dset.wait_started(10.0) for _, _, dset in sets]
        assert all(started), [dset.errors() for _, _, dset in sets]
        t0 = max(started) + WARMUP_S
        t1 = t0 + WINDOW_S
        time.sleep(max(0.0, t0 - time.monotonic()))
        # Mid-window: the squatter truncates its files that stand where root's
        # zone would have been.
        zone0 = zones["valid-zone-truncated"]
        ns.run(["truncate", "-s", "0", "/dev/shm/trafficrate-0/%s" % zone0,
                "/dev/shm/trafficrate.%s" % zone0], user=SQUATTER)
        truncated = squatter_files(ns)
        time.sleep(max(0.0, t1 + 0.1 - time.monotonic()))
        for case, client, dset in sets:
            m = dset.measure(t0, t1, TARGET)
            results[case].update(rate=m.source_rate(client), report=m.report(),
                                 errors=dset.errors())
        for case, uid, _ in CASES:
            server = servers[case]
            stat = ns.run([cli, "stat", "--zone", zones[case], "--json"],
                          check=False)
            results[case].update(
                alive=not server.exited(), lines=server.trafficrate_lines(),
                output=server.describe(), stat_rc=stat.returncode,
                stat=json.loads(stat.stdout) if stat.returncode == 0 else None,
                stat_err=stat.stderr, uid=uid)
        results["valid-zone-truncated"].update(
            workers_before=workers_before,
            workers_after=servers["valid-zone-truncated"].worker_pids())
        after = squatter_files(ns)
        for case, _, _ in CASES:
            results[case].update(squatter_before=before,
                                 squatter_truncated=truncated,
                                 squatter_after=after)
    finally:
        for _, _, dset in sets:
            dset.stop()
            dset.join(5.0)
        factory.stop_all()
        ns.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return results


@pytest.mark.parametrize("case", [c for c, _, _ in CASES])
def test_a_squatted_zone_place_is_never_used_and_the_rate_holds(squatted, case):
    r = squatted[case]
    report = "%s\n%s\n%s" % (case, r["report"], r["output"])
    print("\n" + report)
    assert r["alive"], report
    assert not r["errors"], report
    assert harness.within(r["rate"], TARGET, TOLERANCE), report
    usual = "/dev/shm/trafficrate-%d" % r["uid"]
    moved = [line for line in r["lines"] if "never used" in line]
    assert len(moved) == 1, report
    assert usual in moved[0] and "instead" in moved[0], report
    assert "/dev/shm/trafficrate-%d." % r["uid"] in moved[0], report
    assert r["stat_rc"] == 0, r["stat_err"]
    path = r["stat"]["path"]
    assert path.startswith("/dev/shm/trafficrate-%d." % r["uid"]), path
    assert path.endswith("/" + r["stat"]["zone"]), path
    assert r["stat"]["rate"] == TARGET, r["stat"]


def test_the_squatters_files_are_never_written(squatted):
    r = squatted["valid-zone"]
    assert r["squatter_before"], "the squatter made no files"
    # Everything but the two files it truncated itself stays as it was.
    assert r["squatter_after"] == r["squatter_truncated"], (
        r["squatter_before"], r["squatter_after"])
    changed = {p for p in r["squatter_before"]
               if r["squatter_before"][p] != r["squatter_truncated"].get(p)}
    assert len(changed) == 2, changed


def test_truncating_a_file_where_roots_zone_was_crashes_nothing(squatted):
    r = squatted["valid-zone-truncated"]
    assert len(r["workers_before"]) == 2, r["output"]
    assert r["workers_after"] == r["workers_before"], r["output"]
    assert "signal" not in r["output"], r["output"]


def start_in(factory, ns, env, **kw):
    """nginx (2 workers, as root, workers www-data) in the namespace."""
    server = factory.nginx(env={}, workers=2, start=False,
                           user="www-data www-data", **kw)
    server.argv = ns.command(server.argv, env=env)
    return server.start()


def test_a_full_dev_shm_leaves_nginx_serving_with_one_line_and_no_half_zone(
        servers, preload, cli, zone):
    """A 128 MiB zone on a 64 MiB /dev/shm (Docker's default): nginx starts,
    serves (unpaced), says so in one line, leaves nothing behind, and the
    next start does the same. Then /run as a small tmpfs: root's zone goes
    to /run/trafficrate when it fits, else to /dev/shm/trafficrate-0."""
    ns = mount_ns.MountNamespace()
    try:
        ns.tmpfs("/dev/shm", "64m")
        ns.run_on_disk("/run")
        env = harness.preload_env(zone, RATE, library=preload, ZONE_SIZE="128m")
        for attempt in (1, 2):
            server = start_in(servers, ns, env)
            lines = server.trafficrate_lines()
            status, _, body = harness.http_get(server.port, harness.MEDIUM_FILE,
                                               source="127.0.0.2")
            workers = server.worker_pids()
            left = ns.run(["find", "/dev/shm", "-mindepth", "1"]).stdout.split()
            server.stop()
            report = "attempt %d\n%s\nleft in /dev/shm: %s" % (
                attempt, server.describe(), left)
            assert status == 200 and len(body) == harness.MEDIUM_FILE_SIZE, report
            assert len(workers) == 2, report
            assert len(lines) == 1, report
            assert ("zone %s needs 128.0 MiB (TRAFFICRATE_ZONE_SIZE=128m) but "
                    "/dev/shm/trafficrate-0 has 64.0 MiB free of 64.0 MiB"
                    % zone) in lines[0], report
            assert "runs unpaced" in lines[0], report
            assert [p for p in left if zone in p] == [], report
        # /run as a 4 MiB tmpfs: a 1 MiB zone fits there, a 32 MiB one goes
        # on to /dev/shm/trafficrate-0.
        ns.tmpfs("/run", "4m", mode="0755")
        for size, where in (("1m", "/run/trafficrate/"),
                            ("32m", "/dev/shm/trafficrate-0/")):
            name = "%s-%s" % (zone, size)
            env = harness.preload_env(name, RATE, library=preload, ZONE_SIZE=size)
            server = start_in(servers, ns, env)
            check = ns.run(["env", "TRAFFICRATE_RATE=500k", "TRAFFICRATE_ZONE=" + name,
                            "TRAFFICRATE_ZONE_SIZE=" + size, cli, "check"])
            stat = json.loads(ns.run([cli, "stat", "--zone", name, "--json"]).stdout)
            server.stop()
            assert server.trafficrate_lines() == [], server.describe()
            assert stat["path"] == where + name, stat
            assert "%s%s, owned by user 0 (root), mode 0600" % (where, name) in \
                check.stdout, check.stdout
    finally:
        ns.close()


CGI_SCRIPT = """#!/bin/sh
printf 'Content-Type: application/octet-stream\\r\\n\\r\\n'
exec cat %s
"""


def cgi_server(factory, webroot, workdir, env):
    """Python's http.server --cgi run by root: for each request it forks a
    child that switches to nobody and execs the script with the client's
    socket as stdout, so the body is sent by a process that cannot reach
    root's zone."""
    root = workdir / ("cgi-%d" % len(factory.servers))
    (root / "cgi-bin").mkdir(parents=True)
    script = root / "cgi-bin" / "big.sh"
    script.write_text(CGI_SCRIPT % (webroot / harness.BIG_FILE.lstrip("/")))
    script.chmod(0o755)
    (root / harness.SMALL_FILE.lstrip("/")).write_bytes(
        (webroot / harness.SMALL_FILE.lstrip("/")).read_bytes())
    for path in (workdir, root, root / "cgi-bin"):
        path.chmod(0o755)
    server = harness.Server(workdir, env=env)
    server.name = server.title = "python http.server --cgi"
    server.argv = [harness.PYTHON, "-m", "http.server", "--cgi", "--bind",
                   harness.SERVER_HOST, "--directory", str(root), str(server.port)]
    factory.servers.append(server)
    return server.start()


# (share mode, client address): both at once, each its own server and zone.
CGI_CASES = [("equal", "127.0.0.2"), ("budget", "127.0.0.3")]


@pytest.fixture(scope="module")
def cgi_runs(webroot):
    """3 CGI downloads of one client per share mode, both measured in one
    window; {share: (server, measurement, errors)}."""
    workdir = harness.make_workdir()
    factory = harness.ServerFactory(workdir, webroot)
    # The body is cat's output: no Content-Length, it ends with the child.
    harness.register_content("/cgi-bin/big.sh", harness.BIG_CONTENT)
    zones, runs, sets = [], {}, []
    try:
        for share, client in CGI_CASES:
            zone = harness.unique_zone("cgi-" + share)
            zones.append(zone)
            server = cgi_server(factory, webroot, workdir, harness.preload_env(
                zone, RATE, SHARE=share))
            dset = harness.DownloadSet(server.port, [client] * 3,
                                       path="/cgi-bin/big.sh",
                                       duration=WARMUP_S + WINDOW_S + 2.0)
            sets.append((share, client, server, dset))
        for _, _, _, dset in sets:
            dset.start()
        started = [dset.wait_started(10.0) for _, _, _, dset in sets]
        assert all(started), [dset.errors() for _, _, _, dset in sets]
        t0 = max(started) + WARMUP_S
        time.sleep(max(0.0, t0 + WINDOW_S + 0.1 - time.monotonic()))
        for share, client, server, dset in sets:
            runs[share] = (server, client, dset.measure(t0, t0 + WINDOW_S,
                                                        TARGET), dset)
        yield runs
    finally:
        for _, _, _, dset in sets:
            dset.stop()
            dset.join(5.0)
        factory.stop_all()
        for zone in zones:
            harness.remove_zone(zone)
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("share", [s for s, _ in CGI_CASES])
def test_cgi_children_that_cannot_reach_the_zone_hold_the_clients_rate(
        cgi_runs, share):
    """3 CGI downloads of one client, each body sent by a child running as
    nobody (which cannot open root's zone): the client's total stays within
    5% of the rate. The parent owns each connection's registration; its
    socket's queue (equal) and what left it by the kernel's count (budget),
    not the parent's own sends, say it is still sending and how much."""
    server, client, m, dset = cgi_runs[share]
    report = "%s (share %s)\n%s\n%s" % (server.title, share, m.report(),
                                        server.describe())
    print("\n" + report)
    assert not dset.errors(), report
    assert m.source_rate(client) <= 1.05 * TARGET, report
    assert m.source_rate(client) >= 0.85 * TARGET, report
