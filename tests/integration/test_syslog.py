"""TRAFFICRATE_LOG=syslog (issue 12): the library's lines reach /dev/log as
"<PRI>trafficrate[PID]: text", from the process that logs (an nginx worker,
not only the master), at their priority (facility daemon: <27> error, <28>
warning, <29> notice), and at most Logger::kBurstLines at once per process,
the dropped ones counted in the next line that goes out.

This host has no /dev/log (and the test must not touch a real one): each
server runs through devlog_ns.py in a private mount namespace whose /dev is
a tmpfs with the real /dev's entries bind-mounted (so /dev/shm is the real
one) and, at /dev/log, a datagram socket this test bound and reads.
"""

import os
import re
import socket
import time

import harness

DEVLOG_NS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                         "devlog_ns.py")
ERR, WARNING, NOTICE = 27, 28, 29  # LOG_DAEMON (3 << 3) | severity
BURST = 10                          # Logger::kBurstLines
REFILL_S = 1.0                      # Logger::kRefillNs
LINE = re.compile(r"<(\d+)>([^\[\]: ]+)\[(\d+)\]: (.*)", re.S)
SHADOWED = ('rule "never" (line 4) can never match: rule "all" (line 1) comes '
            'first and matches every connection it would')


class Message:
    def __init__(self, raw, t):
        self.raw, self.t = raw, t
        m = LINE.fullmatch(raw)
        self.pri, self.ident, self.pid, self.text = (
            (int(m.group(1)), m.group(2), int(m.group(3)), m.group(4)) if m
            else (None, None, None, raw))

    def __repr__(self):
        return "%.2f %r" % (self.t, self.raw)


class DevLog:
    """The test's syslog daemon: an AF_UNIX datagram socket in workdir."""

    def __init__(self, workdir):
        self.path = str(workdir / "devlog.sock")
        self.scratch = workdir / "devlog-ns"
        self.scratch.mkdir()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        os.chmod(self.path, 0o666)  # nginx workers run as nobody
        self.messages = []

    def close(self):
        self.sock.close()

    def wrap(self, server, with_socket=True):
        """Make the (not yet started) server run under devlog_ns.py."""
        server.argv = (["unshare", "--mount", "--propagation", "private", "--",
                        harness.PYTHON, DEVLOG_NS, "--scratch", str(self.scratch)]
                       + (["--socket", self.path] if with_socket else [])
                       + ["--"] + server.argv)
        server.env["DEVLOG_NS_LD_PRELOAD"] = server.env.pop("LD_PRELOAD")
        return server

    def receive(self, timeout):
        """Collect datagrams for up to `timeout` seconds (bounded)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.sock.settimeout(min(left, 0.1))
            try:
                raw = self.sock.recv(4096)
            except socket.timeout:
                continue
            self.messages.append(Message(raw.decode(errors="replace"),
                                         time.monotonic()))

    def wait(self, predicate, timeout):
        """Collect until predicate(messages) holds or timeout; the result."""
        deadline = time.monotonic() + timeout
        while not predicate(self.messages) and time.monotonic() < deadline:
            self.receive(min(0.1, max(0.0, deadline - time.monotonic())))
        return predicate(self.messages)


def report(server, log):
    return "%s\nmessages:\n%s" % (server.describe(),
                                  "\n".join(map(repr, log.messages)))


def shadowing_rules(path, shadowed):
    """[all] then `shadowed` rules that can never match (unlimited: they take
    no zone rule slot)."""
    text = "[all]\nrate = 1m\n"
    for i in range(shadowed):
        text += "\n[never%s]\nrate = unlimited\n" % ("" if i == 0 else i)
    path.write_text(text)


def test_nginx_lines_reach_dev_log_from_the_process_that_logs(
        servers, lib_env, zone, workdir, cli):
    log = DevLog(workdir)
    rules = workdir / "rules.conf"
    shadowing_rules(rules, 1)
    try:
        server = log.wrap(servers.nginx(
            env=lib_env(CONFIG=rules, LOG="syslog"), workers=2, start=False))
        server.start()
        master = server.pid
        # The constructor runs in the master, before it forks the workers.
        log.wait(lambda ms: len(ms) >= 1, 5.0)
        first = list(log.messages)
        # A governed connection starts its worker's watcher, which reads the
        # rules file again on `trafficrate reload`.
        status, _, _ = harness.http_get(server.port)
        workers = server.worker_pids()
        rules.write_text("[all]\nrate = 2m\n")
        good = harness.run_cli("reload", "--zone", zone)
        log.wait(lambda ms: any(m.text.startswith("reload: 1 rule(s)")
                                for m in ms), 5.0)
        rules.write_text("[all]\nrate = 2x\n")
        bad = harness.run_cli("reload", "--zone", zone)
        log.wait(lambda ms: any("the rules in force stay" in m.text
                                for m in ms), 5.0)
        log.receive(0.5)
        text = "%s\nmaster %d workers %s; reload rc %d %d\n%s" % (
            report(server, log), master, workers, good.returncode,
            bad.returncode, good.stderr + bad.stderr)
        print("\n" + text)
        assert status == 200, text
        assert [(m.pri, m.ident, m.pid, m.text) for m in first] == [
            (WARNING, "trafficrate", master, "%s: %s" % (rules, SHADOWED))], text
        applied = [m for m in log.messages
                   if m.text.startswith("reload: 1 rule(s) from %s" % rules)]
        refused = [m for m in log.messages
                   if m.text.startswith("reload: ") and
                   m.text.endswith("; the rules in force stay")]
        # Said by each worker with a watcher (both, here), each with its own
        # pid, once; not by the master, which serves nothing.
        said = sorted(m.pid for m in applied)
        assert said and set(said) <= set(workers), text
        assert len(set(said)) == len(said) and master not in said, text
        assert all((m.pri, m.ident) == (NOTICE, "trafficrate")
                   for m in applied), text
        assert sorted(m.pid for m in refused) == said, text
        assert all(m.pri == ERR for m in refused), text
        assert "rate" in refused[0].text and str(rules) in refused[0].text, text
        assert all(m.pri is not None for m in log.messages), text
        # Nothing fell back to stderr (or nginx's error log).
        assert server.trafficrate_lines() == [], text
    finally:
        log.close()


def test_a_refused_configuration_is_an_error(servers, lib_env, zone, workdir):
    log = DevLog(workdir)
    try:
        # The zone exists with the default size; another size is refused.
        first = servers.python(env=lib_env("1m"))
        first.stop()
        assert os.path.exists(harness.zone_path(zone)), first.describe()
        server = log.wrap(servers.python(
            env=lib_env("1m", LOG="syslog", ZONE_SIZE="2m"), start=False))
        server.start()
        log.wait(lambda ms: len(ms) >= 1, 5.0)
        log.receive(0.3)
        text = report(server, log)
        print("\n" + text)
        assert len(log.messages) == 1, text
        m = log.messages[0]
        assert (m.pri, m.ident, m.pid) == (ERR, "trafficrate", server.pid), text
        assert "TRAFFICRATE_ZONE_SIZE" in m.text, text
        assert m.text.endswith("; the server runs unpaced"), text
        assert server.trafficrate_lines() == [], text
    finally:
        log.close()


def test_a_flood_of_lines_is_limited_and_the_dropped_ones_counted(
        servers, lib_env, zone, workdir, cli):
    log = DevLog(workdir)
    rules = workdir / "rules.conf"
    shadowed = 15  # the most a file allows (16 rules)
    shadowing_rules(rules, shadowed)
    try:
        server = log.wrap(servers.python(
            env=lib_env(CONFIG=rules, LOG="syslog"), start=False))
        server.start()
        log.wait(lambda ms: len(ms) >= BURST, 5.0)
        log.receive(1.0)  # any more would come now
        at_start = list(log.messages)
        t0 = at_start[0].t if at_start else time.monotonic()
        status, _, _ = harness.http_get(server.port)  # starts the watcher
        # A few refills later: 15 shadowed lines and the reload line again.
        time.sleep(max(0.0, t0 + 3.5 - time.monotonic()))
        t_reload = time.monotonic()
        reload = harness.run_cli("reload", "--zone", zone)
        log.wait(lambda ms: len(ms) > len(at_start), 5.0)
        log.receive(1.5)
        t_end = time.monotonic()
        after = log.messages[len(at_start):]
        text = "%s\nreload rc %d %s" % (report(server, log), reload.returncode,
                                        reload.stderr)
        print("\n" + text)
        assert status == 200 and reload.returncode == 0, text
        assert all((m.ident, m.pid) == ("trafficrate", server.pid)
                   for m in log.messages), text
        # At start: exactly a burst of the 15 lines, in order.
        assert [m.text for m in at_start] == [
            '%s: rule "never%s" (line %d) can never match: rule "all" (line 1) '
            'comes first and matches every connection it would'
            % (rules, "" if i == 0 else i, 4 + 3 * i) for i in range(BURST)], text
        assert all(m.pri == WARNING for m in at_start), text
        # After the reload: first the count of the 5 dropped, then as many
        # lines as refilled since (about 3.5 s: 3 or 4), never a burst.
        assert after and after[0].pri == WARNING, text
        assert after[0].text == ("%d message(s) suppressed (at most %d lines "
                                 "per %d s)" % (shadowed - BURST, BURST,
                                                BURST * REFILL_S)), text
        lines = after[1:]
        refilled = (t_end - t0) / REFILL_S
        assert 1 <= len(lines) <= int(refilled) + 1, text
        assert len(lines) <= int(t_end - t_reload + (t_reload - t0)) + 1, text
        assert not any("suppressed" in m.text for m in lines), text
        assert server.trafficrate_lines() == [], text
    finally:
        log.close()


def test_without_dev_log_the_lines_go_to_stderr(servers, lib_env, workdir):
    log = DevLog(workdir)
    rules = workdir / "rules.conf"
    shadowing_rules(rules, 1)
    try:
        server = log.wrap(servers.python(
            env=lib_env(CONFIG=rules, LOG="syslog"), start=False),
            with_socket=False)
        server.start()
        log.receive(0.3)
        text = report(server, log)
        print("\n" + text)
        assert log.messages == [], text
        assert server.trafficrate_lines() == [
            "trafficrate: %s: %s" % (rules, SHADOWED)], text
    finally:
        log.close()
