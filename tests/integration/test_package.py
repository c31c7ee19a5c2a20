"""The Debian package as an operator meets it: installed with dpkg into a
throwaway root (package_ns.py: overlays in a private mount namespace), its
trafficrate --version, check, man pages and `trafficrate run` with a real
nginx; Debian's nginx.service started with exactly the example drop-in's
environment; a reinstall over a zone of another layout; removal.

The .deb comes from $TRAFFICRATE_DEB, else the one build-pkg/ holds
(scripts/package.sh, which scripts/test.sh runs first); the test fails if
there is none.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import harness
from measurement import within

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LIBRARY = "/usr/lib/x86_64-linux-gnu/libtrafficrate.so"


def package_path():
    if os.environ.get("TRAFFICRATE_DEB"):
        return Path(os.environ["TRAFFICRATE_DEB"])
    debs = sorted((ROOT / "build-pkg").glob("trafficrate_*.deb"))
    return debs[-1] if len(debs) == 1 else None


@pytest.fixture(scope="module")
def deb():
    path = package_path()
    if path is None or not path.is_file():
        pytest.fail("no trafficrate .deb: run scripts/package.sh (or set TRAFFICRATE_DEB)",
                    pytrace=False)
    return path


@pytest.fixture(scope="module")
def installed(deb):
    """What package_ns.py saw, as a dict."""
    work = harness.make_workdir()
    out = work / "result.json"
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable,
         str(HERE / "package_ns.py"), str(deb), str(work / "scratch"), str(out)],
        capture_output=True, text=True, timeout=400, cwd=HERE)
    assert done.returncode == 0 and out.exists(), (
        "package_ns.py failed (rc %s):\n%s\n%s" % (done.returncode, done.stdout[-3000:],
                                                    done.stderr[-3000:]))
    return json.loads(out.read_text())


def test_control_fields_name_the_version_and_shlibdeps_dependencies(deb):
    fields = subprocess.run(["dpkg-deb", "--field", str(deb)], capture_output=True,
                            text=True, timeout=30, check=True).stdout
    version = harness.run_cli("--version").stdout.split("\n")[0].split()[1]
    assert "Package: trafficrate\n" in fields
    # The version is the project's, with the commit after it in a checkout.
    assert deb.name.startswith("trafficrate_0.") and deb.name.endswith("_amd64.deb")
    assert "Version: %s\n" % deb.name.split("_")[1] in fields
    assert deb.name.split("_")[1].split("+")[0] == version.split("+")[0]
    depends = next(line for line in fields.splitlines() if line.startswith("Depends:"))
    # Read off the binaries by dpkg-shlibdeps: Abseil's shared libraries,
    # libc, libstdc++.
    for package in ("libabsl20220623", "libc6", "libstdc++6"):
        assert package in depends, depends


def test_installs_into_the_multiarch_libdir_with_man_pages_and_examples(installed):
    assert installed["install"]["rc"] == 0, installed["install"]
    files = set(installed["files"])
    for path in ("/usr/bin/trafficrate", LIBRARY,
                 "/usr/share/man/man1/trafficrate.1.gz",
                 "/usr/share/man/man7/trafficrate.7.gz",
                 "/usr/share/doc/trafficrate/copyright",
                 "/usr/share/doc/trafficrate/examples/trafficrate.conf"):
        assert path in files, sorted(files)
    # Nothing of the build or test tree (tests, benchmarks, headers).
    assert not [f for f in files if "test" in f or "bench" in f or f.endswith(".h")]
    assert installed["which"] == "/usr/bin/trafficrate"


def test_installed_version_and_check(installed):
    version = installed["version"]
    assert version["rc"] == 0
    assert version["out"].startswith("trafficrate 0.")
    layout = re.search(r"kZoneLayoutVersion = (\d+);", (
        harness.REPO_ROOT / "src" / "shm" / "zone_layout.h").read_text()).group(1)
    assert "zone layout %s " % layout in version["out"], version
    assert "features:" in version["out"], version
    check = installed["check"]
    assert check["rc"] == 0, check
    assert "500 KiB/s (512000 B/s) per client key" in check["out"]


def test_installed_man_pages_render_without_warnings(installed):
    for section, heading in (("man1", "TRAFFICRATE(1)"), ("man7", "TRAFFICRATE(7)")):
        page = installed[section]
        assert page["rc"] == 0 and page["err"] == "", page["err"]
        assert page["out"].startswith(heading)
    assert "EXIT STATUS" in installed["man1"]["out"]
    assert "TRAFFICRATE_RATE" in installed["man7"]["out"]


def test_trafficrate_run_finds_the_installed_library(installed):
    assert "run_error" not in installed, installed.get("run_error")
    # master and both workers: the installed library, no --library given.
    assert len(installed["run_preloaded"]) == 3, installed["run_preloaded"]
    for pid, libraries in installed["run_preloaded"].items():
        assert libraries == [LIBRARY], (pid, libraries)
    m = installed["run_measure"]
    assert not m["errors"] and not m["bytes_problems"], m
    assert within(m["rate"], m["target"], 0.05), m["report"]


def test_systemd_dropin_verifies_and_paces_debian_nginx(installed):
    # systemd-analyze reads the drop-in (a broken copy is reported) and finds
    # nothing wrong with the example.
    assert "trafficrate.conf" in installed["verify_broken"]["err"]
    assert installed["verify"]["rc"] == 0
    assert installed["verify"]["err"] == "" and installed["verify"]["out"] == ""
    assert installed["dropin_environment"] == {
        "LD_PRELOAD": LIBRARY, "TRAFFICRATE_RATE": "500k",
        "TRAFFICRATE_ZONE": "nginx", "TRAFFICRATE_LOG": "syslog"}
    assert "unit_error" not in installed, installed.get("unit_error")
    for step in installed["unit_steps"]:
        assert step["rc"] == 0, step
    # The master and its workers (worker_processes auto: one per CPU).
    assert len(installed["unit_preloaded"]) >= 2, installed["unit_preloaded"]
    for pid, libraries in installed["unit_preloaded"].items():
        assert libraries == [LIBRARY], (pid, libraries)
    m = installed["unit_measure"]
    assert not m["errors"] and not m["bytes_problems"], m
    assert within(m["rate"], m["target"], 0.05), m["report"]
    stat = json.loads(installed["unit_stat"]["out"])
    assert stat["zone"] == "nginx" and stat["rate"] == 512000


def test_upgrade_names_a_zone_of_another_layout_and_rm_force_removes_it(installed):
    assert installed["reinstall"]["rc"] == 0, installed["reinstall"]
    assert "zone /dev/shm/trafficrate.older was made by an earlier version" in \
        installed["reinstall"]["err"]
    assert installed["rm_old"]["rc"] == 1
    assert "layout version 1" in installed["rm_old"]["err"]
    assert "trafficrate rm --force --zone /dev/shm/trafficrate.older" in \
        installed["rm_old"]["err"]
    assert installed["rm_old_force"]["rc"] == 0, installed["rm_old_force"]
    assert installed["old_left"] is False


def test_remove_leaves_nothing_and_names_the_dropin_left(installed):
    assert installed["remove"]["rc"] == 0, installed["remove"]
    assert installed["left_after_remove"] == []
    assert ("nginx.service.d/trafficrate.conf still preloads"
            in installed["remove"]["err"])
