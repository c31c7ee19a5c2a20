"""Environment of the trafficrate integration tests (part of harness.py).

What the tests and the demo need before any server runs:
  * paths and constants: REPO_ROOT, the build (build_dir(), library_path(),
    cli_path()), the nginx / Python binaries, the served files;
  * the network namespace: namespace_problems() (root, a private namespace,
    lo up at MTU 1500), interface_mtu(), interface_up(), sysctl();
  * zones: unique_zone(), zone_path(), remove_zone(), and the environments
    preload_env() (a server under the library) and server_environment();
  * files: make_workdir(), make_webroot() (big.bin is a sparse 1 GiB file),
    free_port().

Standard library only; import it through harness (`import harness`).
"""

import fcntl
import os
import re
import socket
import struct
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
NGINX = "/usr/sbin/nginx"
PYTHON = "/usr/bin/python3"
PYSERVER = Path(__file__).resolve().with_name("pyserver.py")
SERVER_HOST = "127.0.0.1"
BIG_FILE = "/big.bin"
SMALL_FILE = "/small.txt"
BIG_FILE_SIZE = 1 << 30
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


def zone_path(zone):
    return Path("/dev/shm/trafficrate.%s" % zone)


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


# ---------------------------------------------------------------------- files

def make_workdir(prefix="trafficrate-it-"):
    """A fresh directory under /tmp that unprivileged nginx workers can read.

    pytest's tmp_path is 0700, which `nobody` cannot traverse.
    """
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    return path


def make_webroot(parent, big_size=BIG_FILE_SIZE):
    """parent/www with big.bin (sparse) and small.txt, world-readable."""
    www = Path(parent) / "www"
    www.mkdir(mode=0o755, exist_ok=True)
    www.chmod(0o755)
    with open(www / "big.bin", "wb") as f:
        f.truncate(big_size)
    (www / "small.txt").write_text("trafficrate small file\n" * 100)
    for name in ("big.bin", "small.txt"):
        (www / name).chmod(0o644)
    return www


def free_port(host=SERVER_HOST):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
