"""The man pages the build renders (build/man/trafficrate.1 and .7, from
tools/manual.cc) read with man -l as a user reads them: no groff warnings,
and the same text as the --help of every command and `trafficrate help
TOPIC`, since both come from one source. No library or namespace needed."""

import re
import subprocess

import pytest

import harness

pytestmark = pytest.mark.harness


def rendered(section):
    page = harness.library_path().parent / "man" / ("trafficrate.%d" % section)
    assert page.is_file(), "%s is missing: build first" % page
    done = subprocess.run(["man", "--warnings", "-l", str(page)], capture_output=True,
                          text=True, timeout=30,
                          env={"LC_ALL": "C", "MANWIDTH": "200", "MANPAGER": "cat",
                               "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout


def words(text):
    """Text with its layout gone: single blanks, no backticks (--help keeps
    `code`, the man page sets it in bold, which man -l drops)."""
    return " ".join(text.replace("`", "").split())


def cli(*args):
    done = harness.run_cli(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def commands():
    overview = cli("--help")
    block = overview.split("commands:\n")[1].split("\n\n")[0]
    return [line.split()[0] for line in block.splitlines()]


def test_man_pages_render_without_warnings_and_are_indexed():
    for section in (1, 7):
        text = rendered(section)
        assert text.startswith("TRAFFICRATE(%d)" % section)
        page = harness.library_path().parent / "man" / ("trafficrate.%d" % section)
        whatis = subprocess.run(["lexgrog", str(page)], capture_output=True, text=True,
                                timeout=10)
        assert whatis.returncode == 0 and "trafficrate - " in whatis.stdout, whatis


def test_every_command_help_is_in_trafficrate_1():
    man = words(rendered(1))
    names = commands()
    assert {"run", "check", "stat", "top", "set", "reload", "gc", "rm"} <= set(names)
    for name in names:
        help_text = cli(name, "--help")
        usage = help_text.split("\n\n")[0]
        assert words(usage.replace("usage: ", "", 1)) in man, name
        options = re.findall(r"^  (--[a-z-]+)(?: ([A-Z]+))?\s+(.*(?:\n {18}.*)*)",
                             help_text, re.M)
        for flag, arg, text in options:
            assert words("%s %s %s" % (flag, arg, text) if arg else "%s %s" % (flag, text)) \
                in man, (name, flag)
        for paragraph in help_text.split("\n\n")[1:]:
            if paragraph.startswith(("  --", "example")):
                continue
            assert words(paragraph) in man, (name, paragraph[:60])


def test_every_topic_is_in_trafficrate_7():
    man = words(rendered(7))
    for variable in re.findall(r"^(TRAFFICRATE_[A-Z_]+)$", cli("help", "environment"), re.M):
        assert variable in man
    for topic in ("environment", "rules", "zone", "logging", "guarantees", "limits"):
        text = cli("help", topic)
        title, _, body = text.partition("\n")
        assert title in man, topic
        for paragraph in body.strip().split("\n\n"):
            if paragraph.startswith("    ") or re.match(r"^TRAFFICRATE_", paragraph):
                continue  # verbatim blocks and the variable list: laid out
            assert words(re.sub(r"^\* |^  ", "", paragraph, flags=re.M)) in man, \
                (topic, paragraph[:60])


def test_help_names_the_topics_when_given_an_unknown_one():
    done = harness.run_cli("help", "nonsense")
    assert done.returncode == 2
    assert done.stderr.startswith('trafficrate: help: no command or topic "nonsense"')
    assert "environment, rules, zone, logging, guarantees, limits" in done.stderr
