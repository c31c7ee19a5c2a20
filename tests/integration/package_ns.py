"""Installs the trafficrate .deb in a throwaway root and uses it there; run by
test_package.py, which judges what it writes to OUT (one JSON document).

    unshare --mount --propagation private /usr/bin/python3 package_ns.py DEB SCRATCH OUT

In its private mount namespace it lays overlays on /usr, /etc and /var (their
changes go to a tmpfs at SCRATCH and vanish with the namespace) and fresh
tmpfs on /run and /dev/shm, installs the package with dpkg, and then, as an
operator would:

* runs the installed trafficrate --version, check, and man on both pages;
* runs `trafficrate run --rate 256k` (no --library) with a real nginx and
  measures two downloads;
* installs the example systemd drop-in for Debian's nginx.service, has
  systemd-analyze verify the unit with it, and starts nginx with exactly the
  drop-in's Environment= and the unit's ExecStartPre/ExecStart command lines,
  serving /var/www/html on port 80, and measures two downloads;
* reinstalls the package over a zone of another layout version (what an
  upgrade meets) and removes one with trafficrate rm;
* removes the package.

Every step is bounded in time; every process it starts is stopped by pid.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bodies  # noqa: E402
from clients import run_downloads  # noqa: E402
from netns_env import BIG_FILE, make_webroot  # noqa: E402
from procs import children, wait_for  # noqa: E402
from server_base import PidProcess, Server  # noqa: E402
from servers import NginxServer  # noqa: E402

UNIT = Path("/lib/systemd/system/nginx.service")
DROPIN_DIR = Path("/etc/systemd/system/nginx.service.d")
EXAMPLE = Path("/usr/share/doc/trafficrate/examples/trafficrate.conf")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def run(argv, timeout=60, env=None, **kwargs):
    """argv's exit status, stdout and stderr, as a dict."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=env, **kwargs)
        return {"rc": done.returncode, "out": done.stdout, "err": done.stderr}
    except subprocess.TimeoutExpired:
        return {"rc": None, "out": "", "err": "timed out after %s s" % timeout}


def mount(*args):
    subprocess.run(["mount"] + list(args), check=True, timeout=10)


def throwaway_root(scratch):
    scratch.mkdir(parents=True, exist_ok=True)
    mount("-t", "tmpfs", "-o", "size=2g", "tmpfs", str(scratch))
    for top in ("usr", "etc", "var"):
        upper, work = scratch / top / "upper", scratch / top / "work"
        upper.mkdir(parents=True)
        work.mkdir(parents=True)
        mount("-t", "overlay", "overlay", "-o",
              "lowerdir=/%s,upperdir=%s,workdir=%s" % (top, upper, work), "/" + top)
    for path in ("/run", "/dev/shm"):
        mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", path)


def measure(port, sources, target):
    m = run_downloads(port, sources, warmup=2.0, window=8.0, target=target)
    problems, summary = bodies.problems(m.downloads)
    return {"rate": sum(m.per_source.values()), "target": target,
            "report": m.report(), "bytes_problems": problems,
            "bytes_summary": summary,
            "errors": [d.error for d in m.downloads if d.error]}


def preloaded(pid):
    """The trafficrate libraries mapped into pid (nginx rewrites its
    environment block for its process title, so /proc/PID/environ cannot
    tell)."""
    try:
        maps = Path("/proc/%d/maps" % pid).read_text()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in maps.splitlines()
                   if "libtrafficrate" in line})


def run_with_trafficrate_run(scratch, webroot, result):
    zone = "pkgrun"
    server = NginxServer(scratch / "run", webroot, workers=2)
    server.argv = ["/usr/bin/trafficrate", "run", "--rate", "256k", "--zone", zone,
                   "--"] + server.argv
    server.start()
    try:
        result["run_preloaded"] = {str(p): preloaded(p) for p in [server.pid]
                                   + children(server.pid)}
        result["run_measure"] = measure(server.port, ["127.0.0.2"] * 2, 256 * 1024)
        result["run_stat"] = run(["trafficrate", "stat", "--zone", zone, "--json"])
    finally:
        server.stop()
        result["run_output"] = server.output()[-4000:]


def unit_commands(unit_text, key):
    """The unit's command lines for key (ExecStartPre, ExecStart), as argv
    lists, without systemd's prefixes (-, @, +, !)."""
    commands = []
    for line in unit_text.splitlines():
        if line.startswith(key + "="):
            argv = shlex.split(line[len(key) + 1:])
            argv[0] = argv[0].lstrip("-@+!:")
            commands.append(argv)
    return commands


def dropin_environment(text):
    """Environment= assignments of a unit file (systemd's quoting is the
    shell's for these lines)."""
    env = {}
    for line in text.splitlines():
        if line.startswith("Environment="):
            for assignment in shlex.split(line[len("Environment="):]):
                name, _, value = assignment.partition("=")
                env[name] = value
    return env


def nginx_under_systemd_dropin(webroot, result):
    DROPIN_DIR.mkdir(parents=True, exist_ok=True)
    dropin = DROPIN_DIR / "trafficrate.conf"
    shutil.copyfile(EXAMPLE, dropin)
    # A drop-in with a broken line first: proof that verify reads it.
    dropin.write_text(EXAMPLE.read_text().replace("Environment=TRAFFICRATE_RATE=500k",
                                                  "Environment=\"TRAFFICRATE_RATE"))
    result["verify_broken"] = run(["systemd-analyze", "verify", str(UNIT)], timeout=60)
    shutil.copyfile(EXAMPLE, dropin)
    result["verify"] = run(["systemd-analyze", "verify", str(UNIT)], timeout=60)
    env = dropin_environment(dropin.read_text())
    result["dropin_environment"] = env
    unit = UNIT.read_text()
    html = Path("/var/www/html")
    html.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(webroot / "big.bin", html / "big.bin")
    (html / "big.bin").chmod(0o644)
    service_env = dict(env, PATH=SYSTEM_PATH, LANG="C.UTF-8")
    steps = []
    for argv in unit_commands(unit, "ExecStartPre") + unit_commands(unit, "ExecStart"):
        steps.append({"argv": argv, **run(argv, timeout=20, env=service_env)})
    result["unit_steps"] = steps
    pid_file = Path("/run/nginx.pid")
    if not wait_for(pid_file.exists, 10.0):
        result["unit_error"] = "nginx wrote no /run/nginx.pid"
        return
    master = int(pid_file.read_text().split()[0])
    # The daemonized master, stopped (with its workers) by pid like the
    # servers the suite starts itself.
    service = Server(webroot.parent / "unit")
    service.proc = PidProcess(master)
    service.remember([master])
    try:
        result["unit_measure"] = measure(80, ["127.0.0.3"] * 2, 500 * 1024)
        # After the downloads: the workers are up by then.
        result["unit_preloaded"] = {str(p): preloaded(p) for p in [master]
                                    + children(master)}
        result["unit_stat"] = run(["trafficrate", "stat", "--zone", env.get(
            "TRAFFICRATE_ZONE", "default"), "--json"])
    finally:
        service.stop()


def upgrade_over_other_layout(deb, result):
    """A zone of layout version 1 where earlier versions kept zones (what an
    earlier version left), then the package installed over itself: its
    postinst names the zone."""
    template = Path("/run/trafficrate/nginx")
    old = Path("/dev/shm/trafficrate.older")
    if not template.exists():
        result["upgrade_error"] = "no zone nginx to copy"
        return
    data = bytearray(template.read_bytes())
    data[8:12] = (1).to_bytes(4, "little")  # ZoneHeaderShm.layout_version
    old.write_bytes(bytes(data))
    result["reinstall"] = run(["dpkg", "-i", deb], timeout=120)
    result["rm_old"] = run(["trafficrate", "rm", "--zone", "older"])
    result["rm_old_force"] = run(["trafficrate", "rm", "--zone", "older", "--force"])
    result["old_left"] = old.exists()


def main():
    deb, scratch, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    result = {}
    throwaway_root(scratch)
    os.environ["DEBIAN_FRONTEND"] = "noninteractive"
    result["install"] = run(["dpkg", "-i", deb], timeout=120)
    result["files"] = run(["dpkg", "-L", "trafficrate"])["out"].split()
    result["which"] = shutil.which("trafficrate")
    result["version"] = run(["trafficrate", "--version"])
    result["check"] = run(["trafficrate", "check", "--rate", "500k"])
    man_env = dict(os.environ, MANWIDTH="80", MANPAGER="cat", LC_ALL="C.UTF-8")
    result["man1"] = run(["man", "--warnings", "1", "trafficrate"], env=man_env)
    result["man7"] = run(["man", "--warnings", "7", "trafficrate"], env=man_env)
    webroot = make_webroot(scratch, big_size=64 << 20)
    try:
        run_with_trafficrate_run(scratch, webroot, result)
    except Exception as e:  # reported, judged by the test
        result["run_error"] = repr(e)
    try:
        nginx_under_systemd_dropin(webroot, result)
    except Exception as e:
        result["unit_error"] = repr(e)
    upgrade_over_other_layout(deb, result)
    result["remove"] = run(["dpkg", "-r", "trafficrate"], timeout=120)
    result["left_after_remove"] = [p for p in (
        "/usr/bin/trafficrate", "/usr/share/man/man1/trafficrate.1.gz")
        if Path(p).exists()] + [str(p) for p in Path("/usr/lib").glob(
            "*/libtrafficrate.so")]
    result["big_file"] = BIG_FILE
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    assert len(sys.argv) == 4 and re.match(r".*\.deb$", sys.argv[1]), \
        "usage: package_ns.py DEB SCRATCH OUT"
    sys.exit(main())
