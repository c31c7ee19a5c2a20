"""Programs the library cannot pace are said so, in one line (issue 32,
part 6): `trafficrate run` and `check` of a static program and of a Go one
(Debian's caddy, dynamically linked: the library loads into it and says it
itself), and the library's line for a process that holds connections on its
listening port that no accept() returned (accepted with a raw system call,
as io_uring servers do). Servers that accept through libc, nginx's workers
included, get no such line."""

import os
import re
import shutil
import socket
import time
from pathlib import Path

import pytest

import harness

RATE = "100k"
CADDY = "/usr/bin/caddy"
RAW_SERVER = Path(__file__).resolve().with_name("raw_accept_server.py")
HELP = ('see "Programs that bypass libc" in docs/how-it-works.md, or '
        "`trafficrate help limits`")
GO_REASON = "is a Go program: it makes its system calls itself"
STATIC_REASON = "is statically linked: the library cannot be loaded into it"
# How long the library waits before its first look at a listening port.
FIRST_LOOK = 5.0


def not_paced(path, reason):
    return ("trafficrate: %s %s, so trafficrate cannot pace its connections "
            "(%s)" % (path, reason, HELP))


def static_program():
    path = harness.build_dir() / "static_hello"
    if not path.is_file():
        pytest.fail("%s is missing: the build makes it when libc.a is there "
                    "(libc6-dev)" % path, pytrace=False)
    return str(path)


def caddy():
    if not os.access(CADDY, os.X_OK):
        pytest.fail("%s is missing: scripts/setup.sh installs caddy (a Go "
                    "server)" % CADDY, pytrace=False)
    return CADDY


def test_run_says_a_static_program_is_not_paced_and_runs_it(cli, zone):
    program = static_program()
    cp = harness.run_cli("run", "--rate", RATE, "--zone", zone, "--", program,
                         "word")
    report = "rc %d\nstdout: %s\nstderr: %s" % (cp.returncode, cp.stdout, cp.stderr)
    print("\n" + report)
    assert cp.returncode == 3, report  # the program's own
    assert cp.stdout == "static_hello ran word\n", report
    assert cp.stderr.splitlines() == [not_paced(program, STATIC_REASON)], report
    # Nothing of the library ran: no zone.
    assert not harness.zone_path(zone).exists(), report


def test_run_says_a_go_program_is_not_paced_and_runs_it(cli, zone):
    """caddy is dynamically linked (cgo): the library loads into it and its
    start-up line (with the pid) is the one; `run` says it itself only when
    the library logs elsewhere."""
    program = caddy()
    cp = harness.run_cli("run", "--rate", RATE, "--zone", zone, "--", "caddy",
                         "version")
    report = "rc %d\nstdout: %s\nstderr: %s" % (cp.returncode, cp.stdout, cp.stderr)
    print("\n" + report)
    assert cp.returncode == 0, report
    assert re.match(r"v?2\.\d+", cp.stdout), report
    lines = cp.stderr.splitlines()
    assert len(lines) == 1, report
    assert re.fullmatch(r"trafficrate: process \d+ \(%s\) %s, so trafficrate "
                        r"cannot pace its connections \(%s\)"
                        % (re.escape(program), re.escape(GO_REASON), re.escape(HELP)),
                        lines[0]), report

    cp = harness.run_cli("run", "--rate", RATE, "--zone", zone, "--log", "off",
                         "--", "caddy", "version")
    report = "rc %d\nstdout: %s\nstderr: %s" % (cp.returncode, cp.stdout, cp.stderr)
    print(report)
    assert cp.returncode == 0, report
    assert cp.stderr.splitlines() == [not_paced(program, GO_REASON)], report


def test_check_fails_for_a_program_that_cannot_be_paced(cli, zone):
    cases = [
        (["caddy", "run"], 1, not_paced(caddy(), GO_REASON),
         "  program %s %s: NOT PACED" % (CADDY, GO_REASON)),
        ([static_program()], 1, not_paced(static_program(), STATIC_REASON),
         "  program %s %s: NOT PACED" % (static_program(), STATIC_REASON)),
        (["nginx", "-g", "daemon off;"], 0, None,
         "  program %s: dynamically linked (/lib64/ld-linux-x86-64.so.2): the "
         "library is loaded into it" % shutil.which("nginx")),
        (["no-such-program-here"], 1,
         "trafficrate: check: cannot find no-such-program-here in PATH",
         "  program no-such-program-here: not found"),
    ]
    for command, rc, err, program_line in cases:
        cp = harness.run_cli("check", "--rate", RATE, "--zone", zone, "--", *command)
        report = "%s: rc %d\nstdout: %s\nstderr: %s" % (command, cp.returncode,
                                                      cp.stdout, cp.stderr)
        print("\n" + report)
        assert cp.returncode == rc, report
        assert cp.stderr.splitlines() == ([err] if err else []), report
        assert program_line in cp.stdout.splitlines(), report
    # Without a program: as before.
    cp = harness.run_cli("check", "--rate", RATE, "--zone", zone)
    assert cp.returncode == 0 and "\n  program " not in cp.stdout, cp


class CaddyServer(harness.Server):
    """Debian's caddy serving the webroot (a Go server), under `run`."""

    name = "caddy"

    def __init__(self, workdir, webroot, env=None):
        super().__init__(workdir, env=env)
        self.env.update({"HOME": str(self.workdir), "XDG_DATA_HOME": str(self.workdir),
                         "XDG_CONFIG_HOME": str(self.workdir)})
        self.argv = [str(harness.cli_path()), "run", "--rate", RATE, "--",
                     CADDY, "file-server", "--root", str(webroot), "--listen",
                     "%s:%d" % (harness.SERVER_HOST, self.port)]


def test_a_go_server_is_said_once_and_never_paced(servers, zone, workdir, webroot):
    caddy()
    server = servers._add(CaddyServer(workdir, webroot,
                                      env={"TRAFFICRATE_ZONE": zone}),
                          True, True, 10.0)
    download = harness.Download(server.port, "127.0.0.2", start_at=time.monotonic(),
                                stop_at=time.monotonic() + 3.0)
    download.start()
    time.sleep(2.0)
    stat = harness.stat_json(zone)  # while it downloads
    download.join(10.0)
    lines = server.trafficrate_lines()
    report = "%s\nstat: %s\ndownload: %d bytes, error %s" % (
        server.describe(), stat, download.total, download.error)
    print("\n" + report)
    assert len(lines) == 1 and GO_REASON in lines[0], report
    # What the line says: the zone never saw a connection, and the download
    # went far faster than the rate.
    assert stat["connections"] == [] and stat["processes"] == [], report
    assert download.error is None, report
    assert download.total > 10 * harness.parse_rate(RATE), report


def watch_threads(pid):
    """How many of pid's threads are the library's listen watch."""
    count = 0
    for task in Path("/proc/%d/task" % pid).glob("*/comm"):
        try:
            count += task.read_text().strip() == "trafficrate-l"
        except OSError:
            pass
    return count


class RawAcceptServer(harness.Server):
    """raw_accept_server.py: accepts with a raw accept4 system call, or
    through libc (libc=True)."""

    def __init__(self, workdir, env=None, libc=False):
        self.name = "rawaccept-libc" if libc else "rawaccept"
        super().__init__(workdir, env=env)
        self.argv = [harness.PYTHON, str(RAW_SERVER), "--port", str(self.port),
                     "--bind", harness.SERVER_HOST] + (["--libc"] if libc else [])

    def ready(self):
        try:
            with socket.create_connection((harness.SERVER_HOST, self.port), 1.0) as s:
                s.sendall(b"?")
                return s.recv(16) == b"ok\n"
        except OSError:
            return False


def hold_connection(port, source):
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(5.0)
    sock.connect((harness.SERVER_HOST, port))
    sock.sendall(b"?")
    assert sock.recv(16) == b"ok\n"
    return sock


@pytest.fixture(scope="module")
def watched(webroot):
    """One process that accepts around libc, one that accepts through it,
    nginx (its master listens, its workers accept) and the real servers of
    test_servers.py (listening in one process, accepting in the same or in
    forked workers), all at once, each holding a connection, past their
    first look: their lines and how many watch threads each still has."""
    workdir = harness.make_workdir()
    factory = harness.ServerFactory(workdir, webroot)
    zone = harness.unique_zone("bypass-watch")
    env = harness.preload_env(zone, RATE)
    held = []
    try:
        raw = factory._add(RawAcceptServer(workdir, env=env), True, True, 10.0)
        libc = factory._add(RawAcceptServer(workdir, env=env, libc=True), True,
                            True, 10.0)
        nginx = factory.nginx(env=env)
        zoo = [factory.apache(env=env, mpm="prefork"),
               factory.apache(env=env, mpm="event"), factory.lighttpd(env=env),
               factory.node(env=env, sched="rr"),
               factory.python(env=env, mode="fork"),
               factory.python(env=env, mode="thread")]
        all_listening = time.monotonic()
        held = [hold_connection(raw.port, "127.0.0.2"),
                hold_connection(libc.port, "127.0.0.3"),
                harness.open_keepalive(nginx.port, source="127.0.0.4")]
        held += [harness.open_keepalive(s.port, source="127.0.0.%d" % (5 + i))
                 for i, s in enumerate(zoo)]
        found = harness.wait_for(lambda: raw.trafficrate_lines(),
                                 FIRST_LOOK + 5.0)
        # Past every server's first look, and no second line comes.
        time.sleep(max(1.0, all_listening + FIRST_LOOK + 1.5 - time.monotonic()))
        everyone = [raw, libc, nginx] + zoo
        yield dict(raw=raw, libc=libc, nginx=nginx, zoo=zoo, found=found,
                   lines={s.title: s.trafficrate_lines() for s in everyone},
                   threads={s.title: watch_threads(s.pid) for s in everyone},
                   report="\n".join(s.describe() for s in everyone))
    finally:
        for sock in held:
            sock.close()
        factory.stop_all()
        harness.remove_zone(zone)
        shutil.rmtree(workdir, ignore_errors=True)


def test_connections_no_accept_returned_are_said(watched):
    """Only the process that accepts around libc is said, once; each watch
    ended at its first look (at the line, at an accept(), at connections
    only the workers hold)."""
    raw, libc, nginx = watched["raw"], watched["libc"], watched["nginx"]
    report = "%s\nwatch threads: %s" % (watched["report"], watched["threads"])
    print("\n" + report)
    assert watched["found"], report
    assert watched["lines"][raw.title] == [
        "trafficrate: process %d holds connections on port %d that no accept() "
        "or accept4() call returned (accepted through io_uring or a raw system "
        "call?): trafficrate cannot pace them (%s)" % (raw.pid, raw.port, HELP)], report
    assert watched["lines"][libc.title] == [], report
    assert watched["lines"][nginx.title] == [], report
    assert [watched["threads"][s.title] for s in (raw, libc, nginx)] == [0, 0, 0], \
        report


def test_servers_that_accept_through_libc_are_not_said(watched):
    """Past their first look, with a connection held: no line from any of
    the real servers of test_servers.py, and no watch thread left."""
    zoo = watched["zoo"]
    lines = {s.title: watched["lines"][s.title] for s in zoo}
    threads = {s.title: watched["threads"][s.title] for s in zoo}
    report = "lines: %s\nwatch threads: %s\n%s" % (lines, threads,
                                                    watched["report"])
    print("\n" + report)
    assert all(not found for found in lines.values()), report
    assert all(n == 0 for n in threads.values()), report
