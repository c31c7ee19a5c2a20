"""The preload library exports exactly the functions it interposes: the
names lib/exports.map makes global, each defined as a function, each with
the real function resolved behind it (lib/real.cc), and nothing else (the
core, Abseil and hiredis stay hidden, so a host that links its own is not
disturbed; docs/design.md, "The preload library")."""

import re
import subprocess

import harness


def map_names():
    text = (harness.REPO_ROOT / "lib" / "exports.map").read_text()
    block = text.split("global:")[1].split("local:")[0]
    return sorted(n.strip() for n in block.split(";") if n.strip())


def resolved_names():
    text = (harness.REPO_ROOT / "lib" / "real.cc").read_text()
    return sorted(re.findall(r'Resolve\("(\w+)"', text))


def test_the_library_exports_exactly_its_interposers(preload):
    done = subprocess.run(["nm", "-D", "--defined-only", str(preload)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    symbols = dict((parts[2], parts[1]) for parts in
                   (line.split() for line in done.stdout.splitlines())
                   if len(parts) == 3)
    names = map_names()
    report = "exports.map: %s\nreal.cc: %s\nnm -D:\n%s" % (
        names, resolved_names(), done.stdout)
    assert "accept4" in names and "listen" in names, report
    assert sorted(symbols) == names, report
    assert all(symbols[n] == "T" for n in names), report
    assert resolved_names() == names, report
