"""Shared code of the shared-budget benchmark (bench/budget.py): servers.

  * Bench: one benchmark run's working directory, web root and nginx servers
    under a share mode ("none": no library, "equal", "budget"), started and
    stopped by pid with their zones removed (server()); place() picks client
    source ports that land on each nginx reuseport worker.
  * Comparators (issue 10): Bench.server() also starts nginx the way
    operators limit it without the library, TOOLS: "limit_rate" (nginx's
    per-connection limit_rate), "limit_conn" (limit_conn per IP plus
    limit_rate), "trickle" / "trickle-nosendfile" (nginx run under
    `trickle -s -u KB`); trickle_evidence() says why trickle cannot see
    nginx's sockets.
  * What a server did: shaper_cost() (its shaper's counters and the packets
    sent), worker_split() (which worker serves which connection).

The rest of the benchmark's shared code:
  * bench_client.py: Conn / Reader, a single-threaded epoll HTTP client, and
    drive() / drive_parallel(), which run client connections against
    servers and measure them;
  * bench_figures.py: total_rate(), windows() (1 s buckets), jain(),
    spread(), median(), percentile();
  * bench_cpu.py: thread_cpu() / process_cpu() / watcher_tids() for CPU
    time from /proc, and InterruptTrace for the part spent in interrupts;
  * bench_table.py: row() builds one line of the final table (values of
    every share mode, the target interval, PASS/FAIL of the budget column).

Standard library only (Debian's /usr/bin/python3). It imports the
integration harness from tests/integration (harness.NginxServer,
ports_by_worker(), preload_env(), ...) without modifying it.
"""

import re
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
sys.path.insert(0, str(REPO_ROOT / "tests" / "integration"))

import harness  # noqa: E402  (needs the sys.path entry above)

SERVER_HOST = harness.SERVER_HOST  # 127.0.0.1
BIG_FILE = harness.BIG_FILE        # /big.bin, 256 MiB of pseudo-random bytes
SMALL_FILE_4K = "/4k.bin"
LIB_MODES = ("equal", "budget")    # the table's columns
# A library mode with this suffix runs with the packet shaper off
# (TRAFFICRATE_SHAPE=0) whatever the run's --shape: keepalive measures the
# shaper on against off in the same seconds.
NO_SHAPE = "-noshape"
# What operators use instead of the library (bench/README.md, "Comparators"),
# measured in the accuracy scenario next to LIB_MODES. Every one runs nginx
# without the library.
LIMIT_CONN = 1  # connections per client IP under the limit_conn tool
TOOLS = ("limit_rate", "limit_conn", "trickle", "trickle-nosendfile")
TOOL_TEXT = {
    "equal": "trafficrate, TRAFFICRATE_SHARE=equal",
    "budget": "trafficrate, TRAFFICRATE_SHARE=budget",
    "limit_rate": "nginx limit_rate {rate} (per connection), no library",
    "limit_conn": "nginx limit_conn_zone $binary_remote_addr; limit_conn addr %d;"
                  " limit_rate {rate}; no library" % LIMIT_CONN,
    "trickle": "trickle -s -u {rate_kb} nginx (sendfile on), no library",
    "idle-thread": "nginx with a preload that only starts one idle thread, no library",
    "trickle-nosendfile": "trickle -s -u {rate_kb} nginx with sendfile off, no library",
}
# The overhead scenario's floor: nginx with a preload that only starts one
# idle thread (tests/bench/idle_thread_preload.cc), no library.
IDLE_THREAD = "idle-thread"
IDLE_THREAD_LIB = "idle_thread_preload.so"
TRICKLE = "/usr/bin/trickle"
TRICKLE_LIB = "trickle-overload.so"


def log(text):
    print(text, flush=True)


# -------------------------------------------------------------------- servers

class BenchNginx(harness.NginxServer):
    """harness.NginxServer with room for many connections: worker_connections,
    worker_rlimit_nofile and a listen backlog (servers.py hard-codes 1024
    connections and nginx's default backlog of 511)."""

    def __init__(self, *args, connections=1024, **kw):
        super().__init__(*args, **kw)
        self.connections = connections

    def conf_text(self):
        text = super().conf_text()
        if self.connections <= 1024:
            return text
        old_events = "events { worker_connections 1024; }"
        assert old_events in text, "servers.py's nginx.conf changed:\n" + text
        # multi_accept: thousands of connections arrive at once, and a
        # worker accepts all that wait at each turn of its event loop, not
        # one. Without it, once thousands of paced connections made each
        # turn long (512 events, up to a second on 2 cores), the last
        # hundreds of 10 000 waited in the accept queue for a minute.
        text = text.replace(old_events, "worker_rlimit_nofile %d;\nevents { "
                            "worker_connections %d; multi_accept on; }" % (
                                min(20000, 2 * self.connections + 100),
                                self.connections + 100))
        if self.connections > 10000:
            # One open file shared by a worker's downloads, not one each:
            # 12 500 sockets and as many files would pass 20 000 fds.
            text = text.replace("http {\n", "http {\n  open_file_cache max=64 "
                                "inactive=600s;\n", 1)
            assert "open_file_cache" in text, "servers.py's nginx.conf changed"
        # A deep accept queue: thousands of connections arrive at once.
        return text.replace(" reuseport;", " reuseport backlog=4096;")


class Bench:
    """One benchmark run: work directory, web root, library, quick flag."""

    def __init__(self, quick=False):
        self.quick = quick
        self.workdir = harness.make_workdir("trafficrate-bench-")
        self.webroot = harness.make_webroot(self.workdir)
        small = self.webroot / SMALL_FILE_4K.lstrip("/")
        small.write_bytes(b"x" * 4096)
        small.chmod(0o644)
        self.library = harness.library_path()
        self.cli = harness.cli_path()
        self.warnings = []
        self.tools = TOOLS     # comparators the accuracy scenario measures
        self.tool_results = {}  # tool -> case -> figures (accuracy fills it)
        # scenario -> tool -> client total / rate, 1 s windows (short,
        # slowreader, spread24 fill it)
        self.adversarial = {}
        self.serial = False  # --serial: tools one after the other, not side by side
        self.cases = []  # --cases: (workers, rate, N) of the accuracy scenario

    def close(self):
        shutil.rmtree(self.workdir, ignore_errors=True)

    def idle_thread_lib(self):
        """The idle-thread preload beside the library, or None if not built."""
        path = Path(self.library).parent / IDLE_THREAD_LIB
        return str(path) if path.is_file() else None

    def env_for(self, mode, rate, zone, **variables):
        if mode == IDLE_THREAD:
            return {"LD_PRELOAD": self.idle_thread_lib()}
        share = lib_mode(mode)
        if share is None:
            return {}
        if mode != share:
            variables["SHAPE"] = "0"
        variables.setdefault("SHAPE", getattr(self, "shape", None))
        return harness.preload_env(zone, rate, library=self.library,
                                   SHARE=share, **variables)

    @contextmanager
    def server(self, mode, rate, workers=2, connections=1024, **variables):
        """nginx (reuseport, sendfile on) under share `mode` at `rate`;
        TRAFFICRATE_<NAME> variables as keywords (e.g. ZONE_SIZE="32m").
        mode may also be "none" (no library, no limit) or one of TOOLS (no
        library, nginx limited by that tool at `rate`).
        Yields the server; stops it (by pid) and removes its zone after."""
        zone = harness.unique_zone("bench-%s" % mode)
        harness.remove_zone(zone)
        lib = lib_mode(mode) is not None
        nginx_kw = {}
        if mode in ("limit_rate", "limit_conn"):
            nginx_kw["limit_rate"] = rate
        if mode == "limit_conn":
            nginx_kw["extra_http"] = (
                "  limit_conn_zone $binary_remote_addr zone=addr:10m;")
            nginx_kw["extra_server"] = ("    limit_conn addr %d;\n"
                                        "    limit_conn_status 503;" % LIMIT_CONN)
        if mode == "trickle-nosendfile":
            nginx_kw["sendfile"] = False
        srv = BenchNginx(self.workdir, self.webroot, workers=workers,
                         reuseport=True, connections=connections,
                         env=self.env_for(mode, rate, zone, **variables),
                         **nginx_kw)
        if mode.startswith("trickle"):
            # trickle sets LD_PRELOAD=trickle-overload.so and execs nginx:
            # the pid we start is nginx's master. -u is in KB/s (1024 B).
            srv.argv = [TRICKLE, "-s", "-u", str(max(1, harness.parse_rate(rate)
                                                   // 1024))] + srv.argv
        srv.zone = zone if lib else None
        srv.mode = mode
        try:
            srv.start(timeout=15.0)
            for pid in srv.worker_pids():
                if _maps_library(pid) != lib:
                    raise RuntimeError("nginx worker %d (mode %s): libtrafficrate.so"
                                       " is%s mapped" % (pid, mode, "" if not lib
                                                         else " not"))
            if mode == IDLE_THREAD and not all(
                    _maps_library(pid, IDLE_THREAD_LIB) for pid in srv.worker_pids()):
                raise RuntimeError("nginx (%s): %s is not mapped" % (mode, IDLE_THREAD_LIB))
            if mode.startswith("trickle"):
                srv.trickle_mapped = {str(pid): _maps_library(pid, TRICKLE_LIB)
                                      for pid in srv.worker_pids()}
            for line in srv.trafficrate_lines():
                self.warn("nginx (%s): %s" % (mode, line))
            yield srv
        finally:
            srv.stop()
            harness.remove_zone(zone)

    def warn(self, text):
        if text not in self.warnings:
            self.warnings.append(text)
            log("  WARNING " + text)

    def place(self, srv, source, n):
        """n source ports for `source`, taking the workers in turn (first
        port on worker 0, second on worker 1, ...): nginx listens with
        reuseport, so the kernel picks the worker by a hash of the 4-tuple
        (harness.ports_by_worker probes it)."""
        workers = srv.worker_pids()
        if n < 2 or len(workers) < 2:
            return [0] * n
        workers = workers[:n]
        k = len(workers)
        want = {w: (n - i + k - 1) // k for i, w in enumerate(workers)}
        found = harness.ports_by_worker(srv.port, source, want,
                                        max_probes=max(200, 8 * n * k))
        ports = []
        for i in range(n):
            ports.append(found[workers[i % k]][i // k])
        # The probes registered with the zone (never sent); wait until the
        # workers have seen their resets.
        if srv.zone and self.cli.is_file():
            harness.wait_for(lambda: harness.key_stat(srv.zone, source)
                             ["connections"] == 0, 5.0, 0.05)
        else:
            time.sleep(0.2)
        return ports

    def stat(self, srv, key=None):
        """The zone's stat entry for key (or the used counts), {} if none."""
        if not srv.zone or not self.cli.is_file():
            return {}
        try:
            # The used counts need no key: one is read, not thousands.
            st = harness.stat_json(srv.zone, top=1 if key is None else None)
        except (RuntimeError, ValueError, OSError) as e:
            return {"error": str(e)}
        if key is None:
            return st.get("used", {})
        for entry in st["keys"]:
            if entry["key"] == key:
                return entry
        return {}


def _maps_library(pid, name="libtrafficrate.so"):
    try:
        with open("/proc/%d/maps" % pid) as f:
            return name in f.read()
    except OSError:
        return False


def _dynsyms(path, defined):
    """Dynamic symbol names of an ELF file (nm -D), defined or undefined
    ones; None if nm is missing or fails."""
    argv = ["nm", "-D", "--defined-only" if defined else "--undefined-only", path]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return {line.split()[-1].split("@")[0] for line in out.stdout.splitlines()
            if line.split()}


# The socket calls a shaper must intercept to see and pace nginx's sending.
_SOCKET_CALLS = ("accept", "accept4", "socket", "send", "sendto", "sendmsg",
                 "write", "writev", "sendfile", "sendfile64", "select", "poll",
                 "epoll_wait")


def trickle_evidence():
    """Which of the socket calls nginx imports trickle-overload.so hooks and
    which it does not (from nm -D), or why that could not be read."""
    lib = Path("/usr/lib/x86_64-linux-gnu/trickle") / TRICKLE_LIB
    hooked = _dynsyms(str(lib), True) if lib.is_file() else None
    used = _dynsyms(harness.NGINX, False)
    if hooked is None or used is None:
        return {"error": "nm -D of %s / %s failed" % (lib, harness.NGINX)}
    calls = [c for c in _SOCKET_CALLS if c in used]
    return {"library": str(lib), "nginx": harness.NGINX,
            "nginx_calls_hooked": [c for c in calls if c in hooked],
            "nginx_calls_not_hooked": [c for c in calls if c not in hooked]}


def shaper_cost(srv):
    """What the packet shaper cost srv so far: its processes' shaper counters
    (stat --json) and the packets the kernel sent on srv's open client
    connections (ss: segs_out, since each connection began). {} if unknown
    (no zone, no stat)."""
    if not srv.zone:
        return {}
    try:
        cost = harness.shaper_counts(srv.zone)
    except (RuntimeError, ValueError, OSError, KeyError):
        return {}
    out = subprocess.run(["ss", "-tinH", "state", "established",
                          "( sport = :%d )" % srv.port],
                         capture_output=True, text=True, timeout=20).stdout
    cost["segs_out"] = sum(int(m) for m in re.findall(r"\bsegs_out:(\d+)", out))
    cost["connections"] = len(re.findall(r"\bsegs_out:", out))
    return cost


def worker_split(srv, conns):
    """{worker pid: number of conns it serves} via ss, while conns are open."""
    by_peer = {o["peer"]: o["pids"] for o in harness.socket_owners(srv.port)}
    split = {}
    for c in conns:
        pids = by_peer.get((c.source, c.local_port))
        if pids:
            split[pids[0]] = split.get(pids[0], 0) + 1
    return {str(k): v for k, v in sorted(split.items())}


def lib_mode(mode):
    """The share mode of a library mode (LIB_MODES, or one of them with
    NO_SHAPE), or None if mode runs no library."""
    base = mode[:-len(NO_SHAPE)] if mode.endswith(NO_SHAPE) else mode
    return base if base in LIB_MODES else None
