#!/usr/bin/python3
"""Integration harness for trafficrate: servers under LD_PRELOAD and clients.

Standard library only, so it serves both the pytest suite (conftest.py wraps
it in fixtures) and scripts/demo.sh (`harness.py demo ...`).

This module is the one the tests import (`import harness`, then harness.X);
the code lives in sibling modules and is re-exported here:
  * netns_env.py, environment: build_dir(), library_path(), cli_path(),
    namespace_problems(), sysctl(), set_interface_mtu(); zones:
    unique_zone(), zone_path(), remove_zone(), preload_env(); files:
    make_workdir(), make_webroot() (big.bin: 256 MiB, medium.bin: 384 KiB,
    both seeded pseudo-random bytes; small.txt), free_port(); what they
    hold: BIG_CONTENT, MEDIUM_CONTENT, SMALL_CONTENT (sha256(n) of any
    prefix, cached), content_for(path), register_content() for a test's
    own files.
  * procs.py, processes by pid: wait_for(), pid_alive(), proc_starttime(),
    children(), descendants(), kill_pid().
  * servers.py: NginxServer (real Debian nginx, master + N workers, daemon
    off, so we own the master's pid), PythonServer (pyserver.py, thread or
    fork mode), ServerFactory; supervised_servers.py: ApacheServer (apache2,
    prefork or event MPM), LighttpdServer, NodeServer (a Node.js cluster);
    server_base.py: Server, PidProcess. All stopped by pid, with every
    descendant, and bounded waits.
  * clients.py: Download (one HTTP GET from a chosen source address, e.g.
    127.0.0.2, recording cumulative body bytes against time.monotonic()),
    DownloadSet / run_downloads() to run many in parallel, KeepaliveDownload
    (many GETs on one keep-alive connection), PausingDownload (stops reading
    for a while).
  * http_client.py: http_get() (one small complete GET), open_keepalive()
    and keepalive_get() for idle keep-alive connections.
  * measurement.py: Measurement for rates over a window, bucket_rates(),
    within(); the PauseWatch (pauses_in(), on_time(), require_on_time()).
  * who_serves.py: socket_owners() (which pid holds which TCP connection,
    via ss) and ports_by_worker().
  * budget_clients.py: the shared-budget scenarios' clients (PacedDownload,
    a slow reader; RangeFetches; KeepaliveRequests).
  * bodies.py: every client hands each response body to a Body, which
    undoes chunked framing and gzip and hashes the content; LEDGER holds
    their verdicts, and conftest.py fails a test any of whose bodies is not
    the served file's bytes (SHA-256 of what arrived vs the file's bytes at
    the same place). check_bodies(downloads) / body_problems() judge
    chosen ones now.
  * cli_tools.py: run_cli(), stat_json(), key_stat(), shaper_counts(),
    wait_key_count(), placed_ports().
  * demo.py: the live demo and this file's command line (main()).

Throughput runs must happen in a private network namespace whose loopback has
MTU 1500 (see docs/design.md, "Loopback MTU"):
    unshare -n sh -c 'ip link set lo up mtu 1500 && /usr/bin/python3 -m pytest tests/integration'
"""

import signal
import sys

from bodies import LEDGER, Body
from bodies import check as check_bodies
from bodies import problems as body_problems
from cli_tools import (key_stat, placed_ports, run_cli, shaper_counts,
                       stat_json, wait_key_count)
from budget_clients import PacedDownload
from clients import (Download, DownloadSet, KeepaliveDownload, PausingDownload,
                     run_downloads)
from demo import main
from http_client import http_get, keepalive_get, open_keepalive
# A private name, but tests connect from chosen source ports with it.
from http_client import _connect
from measurement import (Measurement, bucket_rates, bucket_text, jain, on_time,
                         paused_seconds, pauses_in, ratio_text,
                         require_on_time, sleep_until, window_of, within)
from netns_env import (BIG_CONTENT, BIG_FILE, BIG_FILE_SIZE, MEDIUM_CONTENT,
                       MEDIUM_FILE, MEDIUM_FILE_SIZE, NGINX, PYSERVER, PYTHON,
                       REPO_ROOT, RUN_HINT, SERVER_HOST, SMALL_CONTENT,
                       SMALL_FILE, BytesContent, RepeatingContent, build_dir,
                       cli_path, content_for, free_port, interface_mtu,
                       interface_up, library_path, make_webroot, make_workdir,
                       namespace_problems, parse_rate, preload_env,
                       register_content, remove_zone, server_environment,
                       set_interface_mtu, sysctl, unique_zone, zone_path)
from procs import (children, descendants, kill_pid, pid_alive, proc_cmdline,
                   proc_starttime, wait_for)
from server_base import PidProcess, Server
from servers import NginxServer, PythonServer, ServerFactory
from supervised_servers import ApacheServer, LighttpdServer, NodeServer
from who_serves import (PROBE_PORT_FIRST, PROBE_PORT_LAST, established,
                        ports_by_worker, probe_owner, socket_owners)


def _interrupt_on_sigterm(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    # Clean up on Ctrl-C even if started with SIGINT ignored (background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt_on_sigterm)
    sys.exit(main())
