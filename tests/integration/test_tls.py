"""Issue 9, TLS: nginx with `ssl` (a certificate this test makes with openssl)
is governed like plain HTTP: one client's 4 downloads share the rate,
another client gets its own, and every byte that arrives is the file's.

nginx writes TLS records with write(2) (not sendfile), so this covers the
library's write path under a real TLS stack.
"""

import os
import ssl
import subprocess
import time

import harness

RATE = "500k"
TARGET = 512000
CLIENT_A = "127.0.0.2"  # 4 downloads
CLIENT_B = "127.0.0.3"  # 1 download
FILE_NAME = "tls.bin"
FILE_SIZE = 16 << 20  # more than 12 s at the rate


class TlsDownload(harness.Download):
    """A Download over TLS (the test's self-signed certificate is not
    verified); like every Download it hashes the body it receives."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self._context = ssl.create_default_context()
        self._context.check_hostname = False
        self._context.verify_mode = ssl.CERT_NONE

    def _connect(self):
        return self._context.wrap_socket(super()._connect(),
                                         server_hostname="localhost")


def make_certificate(workdir):
    cert, key = workdir / "tls-cert.pem", workdir / "tls-key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1",
                    "-subj", "/CN=localhost"], check=True, capture_output=True)
    return cert, key


def test_tls_downloads_are_governed_and_intact(servers, lib_env, zone, workdir,
                                               webroot):
    path = webroot / FILE_NAME
    if not path.exists():
        path.write_bytes(os.urandom(FILE_SIZE))
    harness.register_content("/" + FILE_NAME, path.read_bytes())
    cert, key = make_certificate(workdir)
    tls_port = harness.free_port()
    server = servers.nginx(
        env=lib_env(RATE), workers=2,
        extra_server=("    listen %s:%d ssl;\n    ssl_certificate %s;\n"
                      "    ssl_certificate_key %s;" % (
                          harness.SERVER_HOST, tls_port, cert, key)))
    server.title += ", TLS on port %d" % tls_port
    dset = harness.DownloadSet(tls_port, [], duration=12.0)
    for n, source in enumerate([CLIENT_A] * 4 + [CLIENT_B]):
        dset.downloads.append(TlsDownload(
            tls_port, source, "/" + FILE_NAME, label="%s#%d" % (source, n + 1),
            start_at=dset.start_at, stop_at=dset.stop_at))
    dset.start()
    try:
        started = dset.wait_started(10.0)
        assert started, dset.errors()
        time.sleep(max(0.0, started + 6.0 - time.monotonic()))
        stat_a = harness.key_stat(zone, CLIENT_A)
        time.sleep(max(0.0, started + 10.2 - time.monotonic()))
        m = dset.measure(started + 2.0, started + 10.0, TARGET)
    finally:
        dset.stop()
        dset.join(5.0)
    report = "%s\n%s\nstat %s" % (server.title, m.report(), stat_a)
    print("\n" + report)
    assert not dset.errors(), report
    assert harness.within(m.source_rate(CLIENT_A), TARGET, 0.05), report
    assert harness.within(m.source_rate(CLIENT_B), TARGET, 0.05), report
    assert (stat_a["connections"], stat_a["active"]) == (4, 4), report
    # Every byte received is the file's, in order.
    assert all(d.total > 0 for d in dset.downloads), report
    print(harness.check_bodies(dset.downloads))
