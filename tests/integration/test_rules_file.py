"""Issue 11, a rules file (TRAFFICRATE_CONFIG): several named rules in one
server, each with its own ports, clients, key and rate, applied at once.

Real nginx (2 workers, sendfile on) listening on two ports, one of them on
[::1] too, under the library with a rules file and no TRAFFICRATE_RATE, in
the private network namespace of conftest.py; each test has its own zone.
Rates are measured by the clients (harness.Download); run with -s to see
the figures, which are in every assertion message too.
"""

import subprocess
import time

import harness

TOLERANCE = 0.05
UNLIMITED_FACTOR = 20  # "unpaced" means at least this many times the rate
DOWNLOADS = 512000     # B/s per client on the downloads port (500k)
SERVICE = 1 << 20      # B/s for all clients of the service port together (1m)
A, B, C = "127.0.0.2", "127.0.0.3", "127.0.0.4"
INTERNAL_NET = "127.0.9.0/24"  # the internal network, never paced
INTERNAL = "127.0.9.7"
EXEMPT = "127.0.0.8"  # the downloads rule's exempt client
V6_HOST = "::1"

RULES = """\
# The internal network is never paced; it comes first, so it wins.
[internal]
clients = {internal}
rate    = unlimited

# Downloads: 500 KB/s per client, one client exempt.
[downloads]
listen  = {p1}
exempt  = {exempt}
rate    = 500k

# The whole service on the other port shares 1 MB/s, over IPv4 and IPv6.
[service]
listen  = {p2}, [::1]:{p2}   # a trailing comment
key     = all
rate    = 1m
"""


def two_port_nginx(servers, env, workdir):
    """nginx on 127.0.0.1:p1 and :p2 and [::1]:p2, with the rules file."""
    p1, p2 = harness.free_port(), harness.free_port()
    while p2 == p1:
        p2 = harness.free_port()
    rules = workdir / "rules.conf"
    rules.write_text(RULES.format(internal=INTERNAL_NET, exempt=EXEMPT, p1=p1,
                                  p2=p2))
    server = servers.nginx(
        env=dict(env, TRAFFICRATE_CONFIG=str(rules)), workers=2, port=p1,
        extra_ports=[p2], extra_server="    listen [::1]:%d;" % p2)
    server.p1, server.p2, server.rules = p1, p2, rules
    server.title += ", also [::1]:%d; rules file %s" % (p2, rules)
    return server


def test_two_rules_an_exempt_client_and_a_shared_cap_at_once(
        servers, lib_env, zone, workdir):
    server = two_port_nginx(servers, lib_env(), workdir)
    downloads = harness.DownloadSet(server.p1, [A, A, B], duration=12.0)
    service = harness.DownloadSet(server.p2, [A, C], duration=12.0)
    service6 = harness.DownloadSet(server.p2, [V6_HOST], host=V6_HOST,
                                   duration=12.0)
    internal = harness.DownloadSet(server.p1, [INTERNAL, EXEMPT],
                                   duration=12.0, repeat=True)
    sets = [downloads, service, service6, internal]
    for s in sets:
        s.start()
    try:
        started = [s.wait_started(10.0) for s in sets]
        assert all(started), [s.errors() for s in sets]
        t0 = max(started) + 2.0
        t1 = t0 + 8.0
        time.sleep(max(0.0, t0 + 1.0 - time.monotonic()))
        stat = harness.stat_json(zone)
        time.sleep(max(0.0, t1 + 0.1 - time.monotonic()))
        m = [s.measure(t0, t1) for s in sets]
    finally:
        for s in sets:
            s.stop()
        for s in sets:
            s.join(10.0)
    rate_a, rate_b = m[0].source_rate(A), m[0].source_rate(B)
    shared = m[1].source_rate(A) + m[1].source_rate(C) + m[2].source_rate(V6_HOST)
    free = m[3].source_rate(INTERNAL)
    exempt = m[3].source_rate(EXEMPT)
    keys = {(k["key"], k["rule"]): k["connections"] for k in stat["keys"]}
    report = "%s\ndownloads port:\n%s\nservice port:\n%s\n%s\ninternal:\n%s\n" \
        "downloads: %s %.4f x, %s %.4f x; service together %.4f x; internal " \
        "%.1f x; exempt %.1f x\nstat keys: %s\nrules: %s" % (
            server.title, m[0].report(), m[1].report(), m[2].report(),
            m[3].report(), A, rate_a / DOWNLOADS, B, rate_b / DOWNLOADS,
            shared / SERVICE, free / DOWNLOADS, exempt / DOWNLOADS, keys,
            stat["rules"])
    print("\n" + report)
    assert not any(s.errors() for s in sets), report
    # Each downloads client at its own 500k, the same client under the
    # service rule in the service's shared 1m: two rules, two budgets.
    assert harness.within(rate_a, DOWNLOADS, TOLERANCE), report
    assert harness.within(rate_b, DOWNLOADS, TOLERANCE), report
    assert harness.within(shared, SERVICE, TOLERANCE), report
    assert free > UNLIMITED_FACTOR * DOWNLOADS, report
    assert exempt > UNLIMITED_FACTOR * DOWNLOADS, report
    assert keys == {(A, "downloads"): 2, (B, "downloads"): 1,
                    ("all", "service"): 3}, report
    assert [(r["name"], r["rate"], r["key"]) for r in stat["rules"]] == [
        ("downloads", DOWNLOADS, "peer"), ("service", SERVICE, "all")], report
    assert server.trafficrate_lines() == [], server.describe()
    table = harness.run_cli("stat", "--zone", zone)
    assert "rule service: 1 MiB/s per client (key all)" in table.stdout, table.stdout


def test_set_rule_changes_one_rule_while_the_other_holds(
        servers, lib_env, zone, workdir):
    server = two_port_nginx(servers, lib_env(), workdir)
    sets = [harness.DownloadSet(server.p1, [A], duration=13.0),
            harness.DownloadSet(server.p2, [C], duration=13.0)]
    for s in sets:
        s.start()
    try:
        started = [s.wait_started(10.0) for s in sets]
        assert all(started), [s.errors() for s in sets]
        time.sleep(max(0.0, max(started) + 1.0 - time.monotonic()))
        # Without --rule, or with an unknown one: refused, naming the rules.
        bare = harness.run_cli("set", "--zone", zone, "2m")
        unknown = harness.run_cli("set", "--zone", zone, "--rule", "api", "2m")
        changed = harness.run_cli("set", "--zone", zone, "--rule", "service",
                                  "2m")
        t0 = time.monotonic() + 2.0
        t1 = t0 + 8.0
        time.sleep(max(0.0, t1 + 0.1 - time.monotonic()))
        m = [s.measure(t0, t1) for s in sets]
    finally:
        for s in sets:
            s.stop()
        for s in sets:
            s.join(10.0)
    report = "%s\nset 2m: rc %d %s\nset --rule api: rc %d %s\nset --rule " \
        "service: rc %d %s\ndownloads port:\n%s\nservice port:\n%s" % (
            server.title, bare.returncode, bare.stderr, unknown.returncode,
            unknown.stderr, changed.returncode, changed.stdout, m[0].report(),
            m[1].report())
    print("\n" + report)
    assert not any(s.errors() for s in sets), report
    assert bare.returncode == 2 and "name one with --rule" in bare.stderr, report
    assert unknown.returncode == 1 and "downloads, service" in unknown.stderr, \
        report
    assert changed.returncode == 0 and "rule service" in changed.stdout, report
    # The running service download rose to the new rate; downloads held.
    assert harness.within(m[0].source_rate(A), DOWNLOADS, TOLERANCE), report
    assert harness.within(m[1].source_rate(C), 2 * SERVICE, TOLERANCE), report


def test_check_and_run_refuse_a_rule_that_can_never_match(workdir, cli):
    rules = workdir / "shadowed.conf"
    rules.write_text("[all]\nrate = 1m\n\n[api]\nlisten = 8443\nrate = 2m\n")
    good = workdir / "good.conf"
    good.write_text("[api]\nlisten = 8443\nrate = 2m\n[all]\nrate = 1m\n")
    check = harness.run_cli("check", "--config", rules)
    run = harness.run_cli("run", "--config", rules, "--", "true")
    ok = harness.run_cli("check", "--config", good)
    report = "check: rc %d\n%s%s\nrun: rc %d %s\ngood: rc %d\n%s" % (
        check.returncode, check.stdout, check.stderr, run.returncode, run.stderr,
        ok.returncode, ok.stdout)
    print("\n" + report)
    want = 'rule "api" (line 4) can never match: rule "all" (line 1)'
    assert check.returncode == 1 and want in check.stderr, report
    assert run.returncode == 1 and want in run.stderr, report
    assert ok.returncode == 0, report
    assert "1. [api] (line 1)" in ok.stdout and "2. [all] (line 4)" in ok.stdout, \
        report


def test_reload_applies_the_changed_file_without_a_signal(
        servers, lib_env, zone, workdir):
    server = two_port_nginx(servers, lib_env(), workdir)
    before = harness.DownloadSet(server.p1, [A], duration=16.0)
    after = harness.DownloadSet(server.p1, [B], duration=12.0)
    one = harness.DownloadSet(server.p2, [C], duration=12.0)
    running = [before.start()]
    try:
        assert before.wait_started(10.0), before.errors()
        # A broken file: every process keeps its rules and says so.
        server.rules.write_text("[downloads]\nrate = 2x\n")
        broken = harness.run_cli("reload", "--zone", zone)
        # (Each process with a watcher running reads it: here the worker
        # serving the download; one that has served nothing yet reads the
        # file when it first accepts, before classifying that connection.)
        harness.wait_for(lambda: any("reload:" in line for line in
                                     server.trafficrate_lines()), 5.0)
        # The downloads rule at 1m now, and a new rule for one client of the
        # service port, ahead of the service's.
        server.rules.write_text(RULES.format(
            internal=INTERNAL_NET, exempt=EXEMPT, p1=server.p1,
            p2=server.p2).replace(
                "rate    = 500k", "rate    = 1m").replace(
                "# The whole service", "[one]\nlisten = %d\nclients = %s\n"
                "rate = 200k\n\n# The whole service" % (server.p2, C)))
        checked = harness.run_cli("reload", "--zone", zone, "--config",
                                  server.rules)
        harness.wait_for(lambda: any("reload: 4 rule(s)" in line for line in
                                     server.trafficrate_lines()), 5.0)
        for s in (after, one):
            running.append(s.start())
        started = [s.wait_started(10.0) for s in (after, one)]
        assert all(started), [s.errors() for s in (before, after, one)]
        t0 = max(started) + 2.0
        t1 = t0 + 8.0
        time.sleep(max(0.0, t1 + 0.1 - time.monotonic()))
        stat = harness.stat_json(zone)
        m = [s.measure(t0, t1) for s in (before, after, one)]
    finally:
        for s in running:
            s.stop()
        for s in running:
            s.join(10.0)
    lines = server.trafficrate_lines()
    report = "%s\nreload of a broken file: rc %d %s%s\nreload --config: rc %d " \
        "%s %s\nlog:\n%s\nexisting download:\n%s\nnew download:\n%s\nnew " \
        "rule:\n%s\nrules: %s\nkeys: %s" % (
            server.title, broken.returncode, broken.stdout, broken.stderr,
            checked.returncode,
            checked.stdout, checked.stderr, "\n".join(lines), m[0].report(),
            m[1].report(), m[2].report(), stat["rules"],
            [(k["key"], k["rule"]) for k in stat["keys"]])
    print("\n" + report)
    # reload waits for the processes' answers: the broken file is an error
    # naming what each did, the good one is read by all.
    assert broken.returncode == 1, report
    assert "invalid: it keeps the rules in force" in broken.stderr, report
    assert checked.returncode == 0, report
    assert " server process" in checked.stdout and \
        "read the rules file %s again" % server.rules in checked.stdout, report
    assert any("the rules in force stay" in line for line in lines), report
    # The existing connection kept its rule, whose rate is now 1m; the new
    # one from another client got it too; the new rule governs its client.
    assert harness.within(m[0].source_rate(A), 2 * DOWNLOADS, TOLERANCE), report
    assert harness.within(m[1].source_rate(B), 2 * DOWNLOADS, TOLERANCE), report
    assert harness.within(m[2].source_rate(C), 200 * 1024, TOLERANCE), report
    assert ("one", 200 * 1024) in [(r["name"], r["rate"]) for r in stat["rules"]], \
        report
    assert (C, "one") in [(k["key"], k["rule"]) for k in stat["keys"]], report


def test_reload_says_which_processes_cannot_read_the_file_and_fails(
        servers, lib_env, zone, workdir, cli):
    """A rules file only root can read: nginx's master read it at start-up,
    its workers (nobody) cannot read it again. reload waits for their
    answers, names them and their user, and exits 1; the rules in force
    stay. Without a live process, or without a rules file, it fails too."""
    server = two_port_nginx(servers, lib_env(), workdir)
    server.rules.chmod(0o600)
    # Each worker starts its watcher at its first governed connection.
    for _ in range(8):
        assert harness.http_get(server.p1, source=A)[0] == 200
    reload = harness.run_cli("reload", "--zone", zone, "--config", server.rules)
    plain_zone = harness.unique_zone("plain")
    plain = servers.nginx(env=lib_env("500k", ZONE=plain_zone), workers=1)
    harness.http_get(plain.port, source=A)
    no_file = harness.run_cli("reload", "--zone", plain_zone)
    plain.stop()
    nobody = harness.run_cli("reload", "--zone", plain_zone)
    harness.remove_zone(plain_zone)
    report = "no server: rc %d %s\nroot-only file: rc %d\n%s%s\nno file: " \
        "rc %d\n%s%s\nlog:\n%s" % (
            nobody.returncode, nobody.stderr, reload.returncode, reload.stdout,
            reload.stderr, no_file.returncode, no_file.stdout, no_file.stderr,
            "\n".join(server.trafficrate_lines()))
    print("\n" + report)
    assert nobody.returncode == 1 and "has no live server process" in \
        nobody.stderr, report
    assert reload.returncode == 1, report
    assert "cannot read the rules file %s (Permission denied)" % server.rules \
        in reload.stderr, report
    assert "(user 65534 (nobody))" in reload.stderr, report
    assert "make the file readable by user 65534 (nobody)" in reload.stderr, \
        report
    assert no_file.returncode == 1, report
    assert "has no rules file" in no_file.stderr, report


def test_a_bad_rules_file_leaves_the_server_unpaced_and_says_where(
        servers, lib_env, workdir):
    rules = workdir / "bad.conf"
    rules.write_text("[downloads]\nlisten = 80\nrate = 500k\nburst = 1\n")
    server = servers.nginx(env=dict(lib_env(), TRAFFICRATE_CONFIG=str(rules)),
                           workers=2)
    free = harness.run_downloads(server.port, [A], warmup=0.5, window=2.0,
                                 repeat=True)
    lines = server.trafficrate_lines()
    report = "%s\n%s\nlog: %s" % (server.title, free.report(), lines)
    print("\n" + report)
    assert free.source_rate(A) > UNLIMITED_FACTOR * DOWNLOADS, report
    assert any(line.startswith("trafficrate: TRAFFICRATE_CONFIG: %s:4:9: "
                               "burst: " % rules) and
               line.endswith("the server runs unpaced") for line in lines), report


def test_run_gives_the_library_the_rules_file_by_its_absolute_path(
        workdir, cli):
    (workdir / "good.conf").write_text("[all]\nrate = 1m\n")
    out = subprocess.run(
        [str(cli), "run", "--config", "good.conf", "--library",
         str(harness.library_path()),
         "--", "/bin/sh", "-c", 'echo "$TRAFFICRATE_CONFIG"'],
        cwd=workdir, capture_output=True, text=True, timeout=10,
        env=harness.server_environment({}))
    report = "rc %d\n%s%s" % (out.returncode, out.stdout, out.stderr)
    assert out.returncode == 0, report
    assert out.stdout.strip() == str(workdir / "good.conf"), report
