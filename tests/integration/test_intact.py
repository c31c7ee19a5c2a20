"""Every byte checked, whatever nginx does to send it: one nginx (2 workers)
under the library at 1m (1048576 B/s per client IP) serves six clients at
once, each its own way, and each client gets the rate (within 5% over 8 s)
and the served file's bytes, every one of them (SHA-256 of what arrived vs
the file's bytes at the same place, see bodies.py):

  * sendfile on (127.0.0.2) and sendfile off (127.0.0.3) of big.bin;
  * gzip (127.0.0.4): `gzip on` for application/octet-stream, the client
    sends Accept-Encoding: gzip; the body comes chunked and compressed, the
    rate is that of the bytes on the wire, the check is on the decoded
    bytes (big.bin is pseudo-random: it does not shrink);
  * chunked (127.0.0.5): a sub_filter that never matches makes nginx send
    big.bin chunked, without a length;
  * keep-alive (127.0.0.6): medium.bin (384 KiB) again and again on one
    keep-alive connection, 20 and more requests in the window;
  * a reader that stops (127.0.0.7): it reads 2 s, stops reading for 3 s
    and goes on; the rate is measured over 8 s from when it had read what
    the kernel queued in its receive buffer during the pause.

TLS is test_tls.py's (its bytes are checked the same way). The six run in
one ~14 s span (a module fixture); each test checks one of them. Run with -s
to see the figures.
"""

import shutil
import time

import pytest

import harness

RATE = "1m"
TARGET = 1 << 20
TOLERANCE = 0.05
WARMUP, WINDOW = 2.0, 8.0
PAUSE_AT, PAUSE_S = 2.0, 3.0  # s after the start; how long the reader stops
DURATION = PAUSE_AT + PAUSE_S + 0.7 + WINDOW  # the pause's window ends last
STAT_AT = 6.0
NEVER = "trafficrate-never-in-random-bytes-4f1c"  # sub_filter's pattern

# name -> (client address, URL prefix of big.bin / medium.bin, kind)
SCENARIOS = {
    "sendfile-on": ("127.0.0.2", "", "plain"),
    "sendfile-off": ("127.0.0.3", "/nosendfile", "plain"),
    "gzip": ("127.0.0.4", "/gzip", "gzip"),
    "chunked": ("127.0.0.5", "/chunked", "plain"),
    "keepalive": ("127.0.0.6", "", "keepalive"),
    "pause": ("127.0.0.7", "", "pause"),
}


def locations(webroot):
    """nginx locations serving the webroot under other URLs, each its way."""
    return "\n".join([
        "    location /nosendfile/ {",
        "      alias %s/;" % webroot,
        "      sendfile off;",
        "    }",
        "    location /gzip/ {",
        "      alias %s/;" % webroot,
        "      gzip on;",
        "      gzip_types application/octet-stream;",
        "      gzip_min_length 0;",
        "      gzip_comp_level 1;",
        "    }",
        "    location /chunked/ {",
        "      alias %s/;" % webroot,
        "      sub_filter '%s' '%s';" % (NEVER, NEVER),
        "      sub_filter_types *;",
        "    }",
    ])


class Span:
    """The server, the downloads and what was seen, for the tests."""

    def __init__(self):
        self.server = None
        self.downloads = {}
        self.start_at = None
        self.keys = {}
        self.error = None


@pytest.fixture(scope="module")
def span(test_namespace, webroot):
    lib = harness.library_path()
    if not lib.is_file():
        pytest.fail("%s is missing: build the library first or set "
                    "TRAFFICRATE_BUILD_DIR" % lib, pytrace=False)
    for prefix in ("/nosendfile", "/gzip", "/chunked"):
        for name in (harness.BIG_FILE, harness.MEDIUM_FILE, harness.SMALL_FILE):
            harness.register_content(prefix + name, harness.content_for(name))
    workdir = harness.make_workdir()
    zone = harness.unique_zone("intact")
    harness.remove_zone(zone)
    factory = harness.ServerFactory(workdir, webroot)
    result = Span()
    try:
        result.server = factory.nginx(
            env=harness.preload_env(zone, RATE, library=lib), workers=2,
            extra_server=locations(webroot))
        start = result.start_at = time.monotonic() + 0.1
        common = dict(start_at=start, stop_at=start + DURATION)
        for name, (source, prefix, kind) in SCENARIOS.items():
            label = "%s %s" % (name, source)
            if kind == "keepalive":
                d = harness.KeepaliveDownload(
                    result.server.port, source, prefix + harness.MEDIUM_FILE,
                    label=label, **common)
            elif kind == "pause":
                d = harness.PausingDownload(
                    result.server.port, source, path=prefix + harness.BIG_FILE,
                    pause_at=start + PAUSE_AT, pause_s=PAUSE_S, label=label,
                    **common)
            else:
                d = harness.Download(
                    result.server.port, source, prefix + harness.BIG_FILE,
                    label=label, headers={"Accept-Encoding": "gzip"}
                    if kind == "gzip" else None, **common)
            result.downloads[name] = d
        for d in result.downloads.values():
            d.start()
        time.sleep(max(0.0, start + STAT_AT - time.monotonic()))
        result.keys = {k["key"]: k for k in harness.stat_json(zone)["keys"]}
        time.sleep(max(0.0, start + DURATION + 0.1 - time.monotonic()))
        for d in result.downloads.values():
            d.stop()
        for d in result.downloads.values():
            d.join(5.0)
        yield result
    finally:
        for d in result.downloads.values():
            d.stop()
        factory.stop_all()
        harness.remove_zone(zone)
        shutil.rmtree(workdir, ignore_errors=True)


def window_of(span, name):
    """(t0, t1) over which the scenario's rate is measured."""
    d = span.downloads[name]
    if name == "pause":
        t0 = d.drained_at()
        assert t0 is not None, "the pausing reader never drained its queue"
    elif name == "keepalive":
        t0 = d.first_byte_at + WARMUP
    else:
        t0 = d.connected_at + WARMUP
    return t0, t0 + WINDOW


def check(span, name, extra=""):
    """The scenario's rate within 5% over its 8 s window, no error, every
    byte intact; returns (download, report)."""
    d = span.downloads[name]
    source = SCENARIOS[name][0]
    assert d.connected_at is not None and d.first_byte_at is not None, (
        "%s: %s" % (d.label, d.error))
    t0, t1 = window_of(span, name)
    assert t1 <= d.times[-1] + 0.3, "%s: window past the download's end" % d.label
    rate = d.rate(t0, t1)
    found, summary = harness.body_problems([d])
    key = span.keys.get(source, {})
    report = ("%s: %s\n  %s over [%.2f, %.2f] s: %.0f B/s = %.4f x rate %d B/s"
              "\n  %d B on the wire in %d response(s); %s; stat at %.0f s: %s"
              "%s%s" % (
                  span.server.title, d.label, harness.MEDIUM_FILE
                  if name == "keepalive" else d.path, t0 - span.start_at,
                  t1 - span.start_at, rate, rate / TARGET, TARGET, d.total,
                  len(d.bodies), summary, STAT_AT,
                  {f: key.get(f) for f in ("connections", "active", "share")},
                  extra, "\n  ERROR %s" % d.error if d.error else ""))
    print("\n" + report)
    assert not d.error, report
    assert not found, "%s\n%s" % ("\n".join(found), report)
    assert harness.within(rate, TARGET, TOLERANCE), report
    assert key.get("connections") == 1, report
    return d, report


def test_sendfile_on(span):
    d, report = check(span, "sendfile-on")
    assert d.bodies[0].length == harness.BIG_FILE_SIZE, report


def test_sendfile_off(span):
    d, report = check(span, "sendfile-off")
    assert d.bodies[0].length == harness.BIG_FILE_SIZE, report


def test_gzip(span):
    d = span.downloads["gzip"]
    body = d.bodies[0] if d.bodies else None
    extra = "" if body is None else (
        "\n  response: Content-Encoding %s, Transfer-Encoding %s; %d B decoded "
        "from %d B on the wire (%.4f)" % (
            d.response_headers.get("content-encoding"),
            d.response_headers.get("transfer-encoding"), body.size, body.wire,
            body.size / max(1, body.wire)))
    d, report = check(span, "gzip", extra)
    assert body.encoding == "gzip" and body.chunked, report
    assert body.size > 0.95 * body.wire, report  # the bytes did not shrink


def test_chunked(span):
    d = span.downloads["chunked"]
    body = d.bodies[0] if d.bodies else None
    extra = "" if body is None else (
        "\n  response: Transfer-Encoding %s, no length %s; %d B of content in "
        "%d B on the wire" % (d.response_headers.get("transfer-encoding"),
                               "content-length" not in d.response_headers,
                               body.size, body.wire))
    d, report = check(span, "chunked", extra)
    assert body.chunked and body.encoding is None, report
    assert "content-length" not in d.response_headers, report


def test_many_requests_on_one_keepalive_connection(span):
    d = span.downloads["keepalive"]
    done = [b for b in d.bodies if b.complete]
    extra = ("\n  %d responses complete, one after the other, on one "
             "connection (local port %s)" % (len(done), d.local_port))
    d, report = check(span, "keepalive", extra)
    assert d.requests == len(done) >= 20, report
    assert all(b.size == harness.MEDIUM_FILE_SIZE for b in done), report
    # KeepaliveDownload connects once; the server never closed it, and the
    # zone saw one connection of this client (check()).
    assert not d.eof, report


def test_a_reader_that_stops_for_3_s_then_goes_on(span):
    d = span.downloads["pause"]
    extra = ""
    if d.resumed_at is not None:
        extra = ("\n  stopped reading %.2f..%.2f s with %d B read; the kernel "
                 "had queued %d B for it by then, read by %.2f s" % (
                     d.paused_at - span.start_at, d.resumed_at - span.start_at,
                     d.at_pause, d.queued_at_resume,
                     (d.drained_at() or 0) - span.start_at))
    d, report = check(span, "pause", extra)
    assert d.resumed_at - d.paused_at >= PAUSE_S - 0.05, report
    assert d.at_resume == d.at_pause and d.queued_at_resume > 0, report
    # Nothing came between the stop and the resume; the window starts after.
    assert window_of(span, "pause")[0] >= d.resumed_at, report
