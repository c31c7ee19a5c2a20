"""Checks of the documentation: README.md and docs/*.md.

Every relative link (Markdown links and images, `[text](path)` and
`[text](path#anchor)`) must resolve: the file exists, and an #anchor names a
heading of the target file by GitHub's rules (lower case, spaces to '-',
punctuation other than '-' and '_' removed, '-1', '-2' … for repeats).
External http(s) and mailto links are not fetched. README.md stays a front
page (at most 320 lines), and no document cites a DESIGN.md, which is not
in the repository: the design is docs/design.md.

Reads files only: no library, server or network namespace is needed, so
the namespace fixture of conftest.py is replaced here by one that checks
nothing. Run alone with
    /usr/bin/python3 -m pytest -p no:cacheprovider tests/integration/test_docs.py
"""

import functools
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
README_MAX_LINES = 320

# Documents whose links are checked.
LINKED = ["README.md", "bench/README.md"] + sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))


@functools.lru_cache(maxsize=None)
def tracked_lines():
    """The lines of the checkout's files that cite documents (sources,
    scripts and documents; not recorded benchmark results, nor this file),
    as (file, line number, line), read once for every check."""
    return tuple((relative, number, line)
                 for relative in tracked_sources()
                 for number, line in enumerate(
                     (ROOT / relative).read_text(errors="replace").splitlines(), 1))


def tracked_sources():
    """The checkout's files that cite documents: sources, scripts and
    documents (not recorded benchmark results, nor this file)."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True,
                            text=True, check=False)
    if listed.returncode != 0:  # not a git checkout: what the tree has
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]
    else:
        names = listed.stdout.split()
    keep = re.compile(r"\.(cc|h|py|sh|md|txt|in)$|^CMakeLists\.txt$")
    return sorted(n for n in names
                  if keep.search(n) and not n.startswith(("bench/results/", "build"))
                  and n != "tests/integration/test_docs.py" and (ROOT / n).is_file())


# A path of the documentation, as sources and documents cite it.
DOC_PATH = re.compile(r"\bdocs/[A-Za-z0-9_./-]+\.(?:md|png)\b")

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_CODE = re.compile(r"(`+).*?\1")
# [text](target) or ![alt](target), with an optional "title".
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto: …


@pytest.fixture(scope="session", autouse=True)
def test_namespace():
    """Overrides conftest.py's: these checks read files and run anywhere."""
    yield


def prose_lines(text):
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def github_anchor(heading):
    """The anchor GitHub gives a heading's text (before de-duplication)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links: their text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits and '_'
    return text.replace(" ", "-")


def anchors(path):
    """Every anchor of a Markdown file's headings, with GitHub's -1, -2 …"""
    seen, result = {}, set()
    for _, line in prose_lines(path.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        anchor = github_anchor(match.group(2))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        result.add(anchor if count == 0 else "%s-%d" % (anchor, count))
    return result


def links(path):
    """(line number, target) of every link outside code, in one file.

    A link may span lines (its text wrapped), so lines are joined per
    paragraph before matching.
    """
    found, paragraph, start = [], [], 0
    lines = list(prose_lines(path.read_text())) + [(None, "")]
    for number, line in lines:
        if line.strip() and number is not None:
            if not paragraph:
                start = number
            paragraph.append(line)
            continue
        text = INLINE_CODE.sub("", "\n".join(paragraph))
        for match in LINK.finditer(text):
            found.append((start + text.count("\n", 0, match.start()), match.group(1)))
        paragraph = []
    return found


def broken_links(relative):
    """Lines naming each link of ROOT/relative that does not resolve."""
    path = ROOT / relative
    problems = []
    for number, target in links(path):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = "%s:%d: %s" % (relative, number, target)
        if not dest.exists():
            problems.append("%s: no such file %s" % (where, dest))
        elif anchor:
            if dest.suffix != ".md":
                problems.append("%s: an anchor into a file that is not Markdown" % where)
            elif anchor not in anchors(dest):
                problems.append("%s: %s has no heading with anchor #%s"
                                % (where, dest.relative_to(ROOT), anchor))
    return problems


def test_anchor_rules_match_github():
    assert github_anchor("Programs that bypass libc") == "programs-that-bypass-libc"
    assert github_anchor("Fleet (several hosts through Redis)") == \
        "fleet-several-hosts-through-redis"
    assert github_anchor("The `trafficrate` command") == "the-trafficrate-command"
    assert github_anchor("Shared budget (`TRAFFICRATE_SHARE=budget`, the default)") == \
        "shared-budget-trafficrate_sharebudget-the-default"
    assert github_anchor("gc and rm") == "gc-and-rm"


def test_checker_sees_a_broken_link(tmp_path, monkeypatch):
    """The link check itself fails on a missing file and a missing anchor."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\n## Real heading\n\n```\n# not a heading\n```\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/a.md#real-heading) [gone](docs/b.md)\n"
        "[bad anchor](docs/a.md#not-a-heading) `[code](docs/c.md)`\n"
        "[web](https://example.com/x) [self](#nowhere)\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    problems = broken_links("README.md")
    assert len(problems) == 3, problems
    assert "docs/b.md: no such file" in problems[0]
    assert "#not-a-heading" in problems[1]
    assert "#nowhere" in problems[2]


@pytest.mark.parametrize("relative", LINKED)
def test_relative_links_resolve(relative):
    problems = broken_links(relative)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_docs_page_is_linked_from_the_readme():
    targets = {target.partition("#")[0] for _, target in links(ROOT / "README.md")}
    missing = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md"))
               if str(p.relative_to(ROOT)) not in targets]
    assert not missing, "docs pages the README does not link: %s" % ", ".join(missing)


def test_docs_pages_link_back_to_the_readme():
    for page in sorted((ROOT / "docs").glob("*.md")):
        targets = [target for _, target in links(page)]
        assert "../README.md" in targets, "%s has no link back to the README" % page.name


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, (
        "README.md has %d lines; keep it a front page of at most %d and move "
        "reference text to docs/" % (lines, README_MAX_LINES))


def test_no_citation_of_a_missing_design_file():
    hits = ["%s:%d: %s" % (relative, number, line.strip())
            for relative, number, line in tracked_lines() if "DESIGN.md" in line]
    assert not hits, "DESIGN.md is not in the repository; cite docs/design.md:\n" + "\n".join(hits)


def test_every_cited_docs_path_exists():
    """Comments, messages and scripts that name a docs/ page name one that
    is there (the bypass line a server logs names docs/how-it-works.md)."""
    missing = ["%s:%d: %s" % (relative, number, path)
               for relative, number, line in tracked_lines()
               for path in DOC_PATH.findall(line) if not (ROOT / path).is_file()]
    assert not missing, "no such document:\n" + "\n".join(missing)
