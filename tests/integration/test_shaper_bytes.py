"""Issue 33: the packet shaper in the send path, every byte, every way.

A governed connection whose level is low (under ~40 x 64 KiB/s) hands its
bytes to the kernel as MSG_EOR pieces of about level/40 bytes, varied per
connection, so that no 64 KiB TSO packet (nor a 64 KiB-MTU segment) leaves
at once and the connections of a key stay out of phase; every connection's
first bytes go out as ~10 tiny pieces, so that the kernel's 10 unpaced
initial segments carry ~1 KB; sendfile goes through pread + send(MSG_EOR);
splice from a pipe passes through. TRAFFICRATE_SHAPE=1 (the default) | 0.
See docs/design.md, "Packet granularity".

The module runs at the kernel's default net.ipv4.tcp_tso_rtt_log = 9
(conftest.py's default_tso fixture sets it and restores it), as users
have it, in two phases, each a module fixture that runs its
scenarios at once and returns what the tests then check:

  * bytes (no rates measured, everything at once): send_paths_server.py
    sends each response through send, write, writev, sendmsg, sendmmsg,
    sendfile (with an offset, and with offset None), or splice from a pipe,
    on blocking sockets and (but sendmmsg) on non-blocking ones with a 4 KiB
    SO_SNDBUF; it checks every return value (a count > 0 and <= what was
    asked, all of it on a blocking socket, no error but EAGAIN, the file
    position after every sendfile) and reports each connection. Each way
    at 200k (shaped) and at 8m (not shaped beyond the first bytes), three
    and thirty 160 KiB responses on one keep-alive connection, and nginx
    (sendfile on) at both rates: every byte checked by the client. At 200k
    each way has its own server process and zone, and the shaper's counters
    in stat (shaped_calls, shaped_pieces) must show that it cut that way's
    sends (splice's are shown: it passes through).

  * counted: a long blocking sendfile (one call for the whole file) is
    counted in stat while it runs, at 2m (shaped) and at 4m (chunked).

Run with -s to see the figures; they are in every assertion message too.
(Shared helpers in shaper_common.py.)
"""

import json
import os
import random
import time
from pathlib import Path

import pytest

import harness
from shaper_common import Run, shaped, sleep_until

SEND_PATHS_SERVER = Path(__file__).resolve().with_name("send_paths_server.py")

pytestmark = pytest.mark.usefixtures("default_tso")


LOW_RATE, HIGH_RATE = "200k", "8m"  # shaped; unshaped (level > 2.6 MB/s)
SHAPE_FILE = "shape.bin"
SHAPE_SIZE = (160 << 10) + 5
SHAPE_CONTENT = harness.BytesContent(SHAPE_FILE, random.Random(33).randbytes(SHAPE_SIZE))
WAYS = ["send", "write", "writev", "sendmsg", "sendmmsg", "sendfile",
        "sendfile-pos", "splice"]
NB_WAYS = [w + "-nb" for w in WAYS if w != "sendmmsg"]
RESPONSES = {"low": 3, "high": 30}
BYTE_RATES = {"low": LOW_RATE, "high": HIGH_RATE}
NGINX_LOW_S = 3.0  # nginx, low rate: big.bin for this long (checked as far as it came)
NGINX_HIGH_RESPONSES = 10  # nginx, high rate: medium.bin this many times
BYTES_LIMIT_S = 20.0  # every byte client is done by then
# Non-blocking at the low rate: at least this many EAGAIN per connection.
MIN_EAGAIN = 5


class SendPathsServer(harness.Server):
    """send_paths_server.py (see its docstring) serving `root`."""

    name = "send-paths"

    def __init__(self, workdir, root, port=None, env=None, sndbuf=4096):
        super().__init__(workdir, port, env)
        self.title = "send_paths_server.py (python, a thread per connection)"
        self.argv = [harness.PYTHON, str(SEND_PATHS_SERVER), "--port", str(self.port),
                     "--bind", harness.SERVER_HOST, "--dir", str(root),
                     "--sndbuf", str(sndbuf)]

    def ready(self):
        return "send_paths_server: pid" in self.output()

    def conn_reports(self):
        """The server's per-connection JSON lines, by (client, client port)."""
        result = {}
        for line in self.output().splitlines():
            if line.startswith('{"shape_server"'):
                entry = json.loads(line)
                result[(entry["client"], entry["client_port"])] = entry
        return result


def byte_cases():
    """(case id, level, way or 'nginx', client address), every case its own
    client address: 127.0.1.x at the low rate, 127.0.2.x at the high one."""
    cases = []
    for row, level in ((1, "low"), (2, "high")):
        for i, way in enumerate(WAYS + NB_WAYS + ["nginx"]):
            cases.append(("%s-%s" % (level, way), level, way,
                          "127.0.%d.%d" % (row, 2 + i)))
    return cases


BYTE_CASES = byte_cases()


@pytest.fixture(scope="module")
def byte_runs(test_namespace, webroot):
    """Every byte case at once: at 200k one send_paths_server.py process
    per way (its own zone, so that the shaper's counters tell the ways
    apart) and nginx (sendfile on); at 8m one send_paths_server.py for every
    way and nginx. Returns {"cases": {case id: dict}, "shaper": {case id or
    "high-py": harness.shaper_counts() of its server}}."""
    run = Run(webroot, "bytes")
    root = run.workdir / "shape"
    root.mkdir(mode=0o755)
    SHAPE_CONTENT.write(root / SHAPE_FILE)
    (root / SHAPE_FILE).chmod(0o644)
    for way in WAYS + NB_WAYS:
        harness.register_content("/%s/%s" % (way, SHAPE_FILE), SHAPE_CONTENT)
    results, counts = {}, {}
    try:
        servers = {}
        for level, rate in BYTE_RATES.items():
            servers[level, "nginx"] = run.nginx(run.zone("nginx-" + level), rate,
                                                sendfile=True)
        for name in ["high-py"] + ["low-" + way for way in WAYS + NB_WAYS]:
            zone = run.zone(name)
            py = SendPathsServer(run.workdir, root, env=run.env(
                zone, BYTE_RATES[name.split("-", 1)[0]]))
            py.zone = zone
            run.factory.servers.append(py)  # stopped with the others
            servers[name] = py.start(wait_ready=False)
        for name, server in servers.items():
            if isinstance(server, SendPathsServer):
                server.wait_ready()
        start = time.monotonic() + 0.2
        stop = start + BYTES_LIMIT_S
        for case, level, way, client in BYTE_CASES:
            if way == "nginx" and level == "low":
                server = servers[level, "nginx"]
                d = harness.Download(server.port, client, harness.BIG_FILE,
                                     label=case, start_at=start,
                                     stop_at=start + NGINX_LOW_S)
            elif way == "nginx":
                server = servers[level, "nginx"]
                d = harness.KeepaliveDownload(server.port, client, harness.MEDIUM_FILE,
                                              max_requests=NGINX_HIGH_RESPONSES,
                                              label=case, start_at=start, stop_at=stop)
            else:
                server = servers.get(case) or servers["high-py"]
                d = harness.KeepaliveDownload(server.port, client,
                                              "/%s/%s" % (way, SHAPE_FILE),
                                              max_requests=RESPONSES[level],
                                              label=case, start_at=start, stop_at=stop)
            results[case] = dict(download=d, server=server, level=level, way=way,
                                 client=client)
        run.started(*[r["download"] for r in results.values()])
        deadline = stop + 1.0
        for r in results.values():
            r["download"].join(max(0.0, deadline - time.monotonic()))
        run.stop()
        # The server writes each connection's report once the client closed.
        py_cases = [r for r in results.values() if r["way"] != "nginx"]
        harness.wait_for(lambda: all(
            (r["client"], r["download"].local_port) in r["server"].conn_reports()
            for r in py_cases if r["download"].local_port), 5.0)
        for r in results.values():
            d = r["download"]
            r["found"], r["summary"] = harness.body_problems([d])
            r["conn"] = (r["server"].conn_reports().get((r["client"], d.local_port))
                         if r["way"] != "nginx" else None)
            r["output"] = r["server"].output()[-3000:]
        for key, server in servers.items():
            counts[key if isinstance(key, str) else "%s-%s" % key] = \
                harness.shaper_counts(server.zone)
    finally:
        run.close()
    return {"cases": results, "shaper": counts}


def byte_report(r):
    d = r["download"]
    return ("%s under the library at %s, client %s: %s, %d responses complete, "
            "%d B; %s\nserver's report of the connection: %s%s" % (
                r["server"].title, BYTE_RATES[r["level"]], r["client"], d.path,
                sum(1 for b in d.bodies if b.complete), d.total, r["summary"],
                r["conn"], "\nERROR %s" % d.error if d.error else ""))


def check_bytes(r):
    """The client got every byte and every response; the server saw only
    return values the kernel gives. Returns the report."""
    d, conn = r["download"], r["conn"]
    report = byte_report(r)
    print("\n" + report)
    assert not d.error, report + "\n" + r["output"]
    assert not r["found"], "\n".join(r["found"]) + "\n" + report
    if r["way"] == "nginx" and r["level"] == "low":
        assert d.total >= 0.5 * NGINX_LOW_S * 200 * 1024, report
        return report
    wanted = NGINX_HIGH_RESPONSES if r["way"] == "nginx" else RESPONSES[r["level"]]
    assert d.requests == wanted, report
    if r["way"] == "nginx":
        return report
    assert conn is not None, report + "\n" + r["output"]
    assert conn["problems"] == [], report
    assert conn["way"] == r["way"] and conn["responses"] == wanted, report
    assert conn["body_bytes"] == wanted * SHAPE_SIZE, report
    return report


def case_ids(select):
    return [c[0] for c in BYTE_CASES if select(c[2])]


@pytest.mark.parametrize("case", case_ids(
    lambda way: way in ("nginx", "sendfile", "sendfile-pos", "writev", "sendmsg",
                        "sendmmsg", "send", "write")))
def test_blocking_ways_and_nginx_sendfile_deliver_every_byte(byte_runs, case):
    """Blocking sockets: every call returns all it was asked (no signal is
    sent), sendfile keeps the file position (with an offset) or moves it by
    exactly what it returned (offset None); nginx, sendfile on."""
    r = byte_runs["cases"][case]
    report = check_bytes(r)
    if r["conn"] is not None:
        assert r["conn"]["partial"] == 0 and r["conn"]["eagain"] == 0, report


@pytest.mark.parametrize("case", case_ids(lambda way: way.endswith("-nb")
                                          and not way.startswith("splice")))
def test_non_blocking_partial_writes_and_eagain(byte_runs, case):
    """Non-blocking sockets with a 4 KiB SO_SNDBUF: partial counts and EAGAIN
    (nothing else, never a count <= 0), the rest sent after a selector wait;
    at the low rate EAGAIN many times on every connection."""
    r = byte_runs["cases"][case]
    report = check_bytes(r)
    if r["level"] == "low":
        assert r["conn"]["eagain"] >= MIN_EAGAIN, report
        assert r["conn"]["partial"] >= 1, report


@pytest.mark.parametrize("case", case_ids(lambda way: way.startswith("splice")))
def test_splice_from_a_pipe_into_a_full_socket(byte_runs, case):
    """splice from a pipe (a thread fills it with the file) into a socket that
    fills: no pipe byte may be consumed that the socket did not take."""
    r = byte_runs["cases"][case]
    report = check_bytes(r)
    print("shaper (splice passes through): %s" % byte_runs["shaper"].get(
        case, "see high-py: %s" % byte_runs["shaper"]["high-py"]))
    if r["level"] == "low" and r["way"].endswith("-nb"):
        assert r["conn"]["eagain"] >= MIN_EAGAIN, report


# At 200k a response of SHAPE_SIZE goes as pieces of ~5 KB; the server cut
# 3 of them into at least this many (the slices and buffers of under an MSS
# go whole).
MIN_LOW_PIECES = 20


@pytest.mark.parametrize("case", [c[0] for c in BYTE_CASES if c[1] == "low"
                                  and not c[2].startswith("splice")])
def test_the_low_rate_byte_cases_went_through_the_shaper(byte_runs, case):
    """At 200k the shaper cut each way's sends into pieces (its counters in
    stat, one server process and zone per way), so the cases above checked
    the shaped paths; the 8m servers' counters are shown."""
    counts = byte_runs["shaper"]
    report = "%s: shaper %s; at %s: python server %s, nginx %s" % (
        case, counts[case], HIGH_RATE, counts["high-py"], counts["high-nginx"])
    print("\n" + report)
    assert shaped(counts[case], MIN_LOW_PIECES), report


# --- counted while it runs ---------------------------------------------------
# A server that hands a whole file to one blocking sendfile (gunicorn's
# wsgi.file_wrapper, busybox httpd) sits in that call for the whole
# download. What `stat` shows must still follow the bytes as they go: at a
# rate in the shaper's range each batch of pieces is counted as it is sent
# (2m: pieces of 37-75 KB, the file copied through many buffers); above it
# the call is made in chunks of a quarter second at the level (4m).
COUNTED_CASES = {"shaped": ("2m", "127.0.3.2"), "chunked": ("4m", "127.0.3.3")}


@pytest.fixture(scope="module")
def counted_runs(test_namespace, webroot):
    run = Run(webroot, "counted")
    root = run.workdir / "long"
    root.mkdir(mode=0o755)
    os.symlink(Path(webroot) / "big.bin", root / "big.bin")
    harness.register_content("/sendfile/big.bin", harness.BIG_CONTENT)
    results = {}
    try:
        servers = {}
        for case, (rate, _) in COUNTED_CASES.items():
            zone = run.zone(case)
            server = SendPathsServer(run.workdir, root, env=run.env(zone, rate))
            server.zone = zone
            run.factory.servers.append(server)
            servers[case] = server.start(wait_ready=False)
        for server in servers.values():
            server.wait_ready()
        start = time.monotonic() + 0.2
        downloads = {}
        for case, (rate, client) in COUNTED_CASES.items():
            downloads[case] = harness.Download(servers[case].port, client,
                                               "/sendfile/big.bin", label=case,
                                               start_at=start, stop_at=start + 4.5)
        run.started(*downloads.values())
        samples = {case: [] for case in COUNTED_CASES}
        for at in (1.5, 3.5):
            sleep_until(start + at)
            for case, (_, client) in COUNTED_CASES.items():
                seen = harness.key_stat(servers[case].zone, client)["bytes"]
                samples[case].append((at, seen, downloads[case].bytes_at(start + at)))
        run.stop()
        for case, (rate, _) in COUNTED_CASES.items():
            results[case] = {"rate": harness.parse_rate(rate), "samples": samples[case],
                             "server": servers[case].describe()}
    finally:
        run.close()
    return results


@pytest.mark.parametrize("case", sorted(COUNTED_CASES))
def test_a_long_blocking_sendfile_is_counted_while_it_runs(counted_runs, case):
    r = counted_runs[case]
    report = "%s at %d B/s: (seconds, stat bytes, client bytes) %s\n%s" % (
        case, r["rate"], r["samples"], r["server"])
    print("\n" + report)
    # (The client hangs up mid-file, so the server's call ends short then:
    # its return values are checked by the byte cases above.)
    (t1, seen1, got1), (t2, seen2, got2) = r["samples"]
    # The client got the rate, and what stat counts grew with it: at most
    # a socket buffer, a batch or a chunk ahead of the client.
    assert got2 - got1 >= 0.8 * r["rate"] * (t2 - t1), report
    assert seen2 - seen1 >= 0.5 * r["rate"] * (t2 - t1), report
    for seen, got in ((seen1, got1), (seen2, got2)):
        assert got - 0.1 * r["rate"] <= seen <= got + 2 * r["rate"] + (4 << 20), report
