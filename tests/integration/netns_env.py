"""Environment of the trafficrate integration tests (part of harness.py).

What the tests and the demo need before any server runs:
  * paths and constants: REPO_ROOT, the build (build_dir(), library_path(),
    cli_path()), the nginx / Python binaries, the served files;
  * the network namespace: namespace_problems() (root, a private namespace,
    lo up at MTU 1500), interface_mtu(), interface_up(), sysctl();
  * zones: unique_zone(), zone_path(), remove_zone(), and the environments
    preload_env() (a server under the library) and server_environment();
  * files: make_workdir(), make_webroot() (big.bin, 256 MiB, and
    medium.bin, 384 KiB, of seeded pseudo-random bytes; small.txt), and
    free_port();
  * what the served files hold, to check every byte a client receives:
    BIG_CONTENT, MEDIUM_CONTENT, SMALL_CONTENT (RepeatingContent /
    BytesContent: sha256(n, offset) of any span, cached), content_for(path)
    (a served URL path -> its content, or None) and register_content() for
    a test's own files or URL paths.

Standard library only; import it through harness (`import harness`).
"""

import atexit
import fcntl
import hashlib
import os
import stat
import random
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NGINX = "/usr/sbin/nginx"
PYTHON = "/usr/bin/python3"
PYSERVER = Path(__file__).resolve().with_name("pyserver.py")
SERVER_HOST = "127.0.0.1"
BIG_FILE = "/big.bin"
MEDIUM_FILE = "/medium.bin"
SMALL_FILE = "/small.txt"
# 256 MiB: about 8 minutes at 500k, and more than any test downloads in one
# response at the rates they use (unpaced downloads that may reach the end
# use Download(repeat=True), or account for the EOF).
BIG_FILE_SIZE = 256 << 20
MEDIUM_FILE_SIZE = (384 << 10) + 3  # ~0.37 s at 1m: many on one connection
RUN_HINT = ("run the suite via scripts/test.sh, or: cd %s && unshare -n sh -c "
            "'ip link set lo up mtu 1500 && /usr/bin/python3 -m pytest "
            "tests/integration'" % REPO_ROOT)


# ---------------------------------------------------------------- environment

def build_dir():
    """$TRAFFICRATE_BUILD_DIR, or <repo>/build."""
    return Path(os.environ.get("TRAFFICRATE_BUILD_DIR") or REPO_ROOT / "build")


def library_path():
    return build_dir() / "libtrafficrate.so"


def cli_path():
    return build_dir() / "trafficrate"


def parse_rate(text):
    """'500k' -> 512000 (nginx units: k = 1024, m = 1024**2)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kKmM]?)\s*", str(text))
    if not m:
        raise ValueError("bad rate %r" % (text,))
    return int(m.group(1)) * {"": 1, "k": 1024, "m": 1 << 20}[m.group(2).lower()]


_SIOCGIFFLAGS = 0x8913
_SIOCGIFMTU = 0x8921
_IFF_UP = 0x1


def interface_mtu(name="lo"):
    """MTU of an interface in *this* network namespace.

    Asks the kernel through a socket (ioctl): /sys/class/net shows the
    namespace that mounted sysfs, not ours, so it is wrong after `unshare -n`.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16si12x", name.encode(), 0)
        return struct.unpack("16si12x", fcntl.ioctl(s.fileno(), _SIOCGIFMTU, req))[1]


def set_interface_mtu(mtu, name="lo"):
    """Sets an interface's MTU in this network namespace (ip link)."""
    subprocess.run(["ip", "link", "set", name, "mtu", str(mtu)], check=True,
                   timeout=10, capture_output=True)


def interface_up(name="lo"):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", name.encode(), 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, req))[1]
        return bool(flags & _IFF_UP)


def namespace_problems():
    """Why this process cannot run throughput tests; [] when it can."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not running as root (euid %d)" % os.geteuid())
    names = sorted(name for _, name in socket.if_nameindex())
    if names != ["lo"]:
        problems.append("not in a private network namespace (interfaces: %s)"
                        % ", ".join(names))
    try:
        if not interface_up("lo"):
            problems.append("lo is down")
        mtu = interface_mtu("lo")
        if mtu != 1500:
            problems.append("lo has MTU %d, need 1500 (the kernel's unpaced "
                            "first 10 segments would skew the rates)" % mtu)
    except OSError as e:
        problems.append("cannot query lo: %s" % e)
    return problems


def sysctl(name, value=None):
    """Read (and with value, set) a sysctl via /proc/sys; returns the old
    value. net.* settings belong to this network namespace only."""
    path = Path("/proc/sys") / name.replace(".", "/")
    old = path.read_text().strip()
    if value is not None:
        path.write_text("%s\n" % value)
    return old


# ---------------------------------------------------------------------- zones

_zone_counter = 0


def unique_zone(tag="test"):
    """A zone name no other test or run uses: it-<pid>-<tag>-<n>."""
    global _zone_counter
    _zone_counter += 1
    clean = re.sub(r"[^A-Za-z0-9_-]+", "-", tag).strip("-")[:48] or "zone"
    return "it-%d-%s-%d" % (os.getpid(), clean, _zone_counter)


def zone_dirs(uid=None):
    """The directories where a user's zones live, in the order the library
    looks at them (src/shm/zone_file.h): for root /run/trafficrate when /run is a
    tmpfs, then /dev/shm/trafficrate-UID, then the user's fallback
    directories /dev/shm/trafficrate-UID.XXXXXX (its own ones)."""
    uid = os.geteuid() if uid is None else uid
    dirs = []
    if uid == 0 and _on_tmpfs("/run"):
        dirs.append(Path("/run/trafficrate"))
    dirs.append(Path("/dev/shm/trafficrate-%d" % uid))
    prefix = "trafficrate-%d." % uid
    for entry in sorted(os.listdir("/dev/shm")):
        path = Path("/dev/shm") / entry
        if entry.startswith(prefix) and _own_dir(path, uid):
            dirs.append(path)
    return dirs


def _on_tmpfs(path):
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return False
    best = None
    real = os.path.realpath(path)
    for fields in mounts:
        point = fields[4]
        sep = fields.index("-")
        if (real == point or real.startswith(point.rstrip("/") + "/")) and \
                (best is None or len(point) >= len(best[0])):
            best = (point, fields[sep + 1])
    return best is not None and best[1] in ("tmpfs", "ramfs")


def _own_dir(path, uid):
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o022


def zone_path(zone, uid=None):
    """Where the zone file of that name is: the first of zone_dirs() that
    holds it, else where the library would make it."""
    dirs = zone_dirs(uid)
    for d in dirs:
        if _own_dir(d, os.geteuid() if uid is None else uid) and (d / zone).exists():
            return d / zone
    return dirs[0] / zone


def remove_zone(zone):
    try:
        zone_path(zone).unlink()
    except FileNotFoundError:
        pass


def preload_env(zone, rate=None, library=None, **variables):
    """The environment that puts a server under the library.

    `rate` None leaves TRAFFICRATE_RATE unset (library inactive). Extra keyword
    arguments are TRAFFICRATE_* names without the prefix, e.g. STRICT="1";
    a value of None leaves that variable out.
    """
    env = {"LD_PRELOAD": str(library or library_path()), "TRAFFICRATE_ZONE": zone}
    if rate is not None:
        env["TRAFFICRATE_RATE"] = str(rate)
    for name, value in variables.items():
        if value is not None:
            env["TRAFFICRATE_" + name.upper()] = str(value)
    return env


def server_environment(extra):
    """os.environ without any LD_PRELOAD / TRAFFICRATE_* leaking in, plus extra."""
    env = {k: v for k, v in os.environ.items()
           if k != "LD_PRELOAD" and not k.startswith("TRAFFICRATE_")}
    env.update(extra or {})
    return env


# ------------------------------------------------------------ served content

class RepeatingContent:
    """What a served file holds: one seeded pseudo-random block repeated
    (byte i is block[i % block_size]), `size` bytes in all. A block size
    that is no power of two (1 MiB + 13 for big.bin) keeps the repeats off
    page, buffer and TCP segment boundaries, so a misplaced or repeated
    chunk of the body shows in its digest.

    sha256(n, offset) is the hex SHA-256 of bytes [offset, offset + n);
    prefixes (offset 0, what the clients check) come from hash states kept
    at every block boundary, so one costs at most one block of hashing
    once those are built (one pass over the file, done once). Thread-safe.
    """

    def __init__(self, name, size, block_size, seed):
        self.name, self.size = name, size
        self.block_size, self.seed = block_size, seed
        self._block = None
        self._states = []  # _states[k]: hash of the first k blocks
        self._cache = {}
        self._lock = threading.Lock()

    @property
    def block(self):
        if self._block is None:
            self._block = random.Random(self.seed).randbytes(self.block_size)
        return self._block

    def pieces(self, offset, n):
        """memoryviews of the block covering bytes [offset, offset + n)."""
        block, size = memoryview(self.block), self.block_size
        while n > 0:
            start = offset % size
            k = min(n, size - start)
            yield block[start:start + k]
            offset += k
            n -= k

    def read(self, offset, n):
        return b"".join(self.pieces(offset, n))

    def sha256(self, n, offset=0):
        with self._lock:
            key = (offset, n)
            if key not in self._cache:
                self._cache[key] = self._digest(n, offset)
            return self._cache[key]

    def _digest(self, n, offset):
        if offset:
            h = hashlib.sha256()
            for piece in self.pieces(offset, n):
                h.update(piece)
            return h.hexdigest()
        blocks, rest = divmod(n, self.block_size)
        if not self._states:
            self._states.append(hashlib.sha256())
        while len(self._states) <= blocks:
            h = self._states[-1].copy()
            h.update(self.block)
            self._states.append(h)
        h = self._states[blocks].copy()
        h.update(memoryview(self.block)[:rest])
        return h.hexdigest()

    def write(self, path, size=None):
        """Write the first `size` (default: all) bytes to path."""
        size = self.size if size is None else size
        run = memoryview(self.block * max(1, (8 << 20) // self.block_size))
        with open(path, "wb") as f:
            done = 0
            while done < size:  # whole runs keep the block phase right
                k = min(size - done, len(run))
                f.write(run[:k])
                done += k


class BytesContent:
    """What a served file holds, given as bytes (a test's own random file,
    small.txt). Same interface as RepeatingContent."""

    def __init__(self, name, data):
        self.name, self.data, self.size = name, bytes(data), len(data)
        self._cache = {}

    def read(self, offset, n):
        return self.data[offset:offset + n]

    def sha256(self, n, offset=0):
        key = (offset, n)
        if key not in self._cache:
            self._cache[key] = hashlib.sha256(
                memoryview(self.data)[offset:offset + n]).hexdigest()
        return self._cache[key]

    def write(self, path, size=None):
        with open(path, "wb") as f:
            f.write(self.data if size is None else self.data[:size])


BIG_CONTENT = RepeatingContent("big.bin", BIG_FILE_SIZE, (1 << 20) + 13, seed=1)
MEDIUM_CONTENT = RepeatingContent("medium.bin", MEDIUM_FILE_SIZE,
                                  MEDIUM_FILE_SIZE, seed=2)
SMALL_CONTENT = BytesContent("small.txt", b"trafficrate small file\n" * 100)
_BUILT_IN = {BIG_FILE: BIG_CONTENT, MEDIUM_FILE: MEDIUM_CONTENT,
             SMALL_FILE: SMALL_CONTENT}
_registered = {}


def register_content(path, content):
    """From now on the URL path `path` serves `content` (bytes, or a
    RepeatingContent/BytesContent): for a test's own files (e.g.
    "/tls.bin"), or other URLs of a known file (an alias, a proxy's
    "/via/big.bin"). A later registration of the same path replaces it.
    Returns the content object."""
    if isinstance(content, (bytes, bytearray, memoryview)):
        content = BytesContent(path.rsplit("/", 1)[-1], content)
    _registered[path] = content
    return content


def content_for(path):
    """The content the URL path serves (query string ignored): registered
    ones first, then big.bin, medium.bin and small.txt of make_webroot();
    None if unknown."""
    path = path.split("?", 1)[0]
    return _registered.get(path) or _BUILT_IN.get(path)


# ---------------------------------------------------------------------- files

def make_workdir(prefix="trafficrate-it-"):
    """A fresh directory under /tmp that unprivileged nginx workers can read.

    pytest's tmp_path is 0700, which `nobody` cannot traverse.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    return path


_big_cache = {}  # size -> path of a big.bin this process wrote once


def _cached_big(size):
    """A big.bin of `size` bytes in a private directory, written once per
    process (removed at exit); webroots get hard links to it."""
    path = _big_cache.get(size)
    if path is None or not path.exists():
        cache = Path(tempfile.mkdtemp(prefix="trafficrate-content-", dir="/tmp"))
        cache.chmod(0o755)
        atexit.register(shutil.rmtree, cache, True)
        path = cache / "big.bin"
        BIG_CONTENT.write(path, size)
        path.chmod(0o644)
        _big_cache[size] = path
    return path


def make_webroot(parent, big_size=BIG_FILE_SIZE):
    """parent/www, world-readable, with big.bin (the first big_size bytes of
    BIG_CONTENT; the full size is written once per process and linked),
    medium.bin (MEDIUM_CONTENT) and small.txt (SMALL_CONTENT)."""
    www = Path(parent) / "www"
    www.mkdir(mode=0o755, exist_ok=True)
    www.chmod(0o755)
    big = www / "big.bin"
    if big.exists():
        big.unlink()
    if big_size >= (64 << 20):
        try:
            os.link(_cached_big(big_size), big)
        except OSError:  # another file system: copy it
            shutil.copyfile(_cached_big(big_size), big)
    else:
        BIG_CONTENT.write(big, big_size)
    MEDIUM_CONTENT.write(www / "medium.bin")
    SMALL_CONTENT.write(www / "small.txt")
    for name in ("big.bin", "medium.bin", "small.txt"):
        (www / name).chmod(0o644)
    return www


def free_port(host=SERVER_HOST):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
