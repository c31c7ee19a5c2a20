"""Response bodies as the clients receive them, and the check that every
byte is the served file's (part of harness.py).

  * Body: one HTTP response's body as it arrives: framing undone
    (Content-Length, or Transfer-Encoding: chunked), Content-Encoding gzip
    decoded, and the content hashed (SHA-256) as it comes, with the URL
    path it was asked for and the content that path serves
    (netns_env.content_for(), captured when the response starts). Every
    client in clients.py makes one per response;
  * the verdict on a body: the SHA-256 of the `size` content bytes
    received must equal that of the served content's bytes at the same
    place (a partial body is checked as far as it came), a complete body
    must have its declared length, and its framing and gzip stream must be
    sound. A body whose content is unknown is a problem too, unless made
    with verify=False (then it is counted as skipped);
  * LEDGER: the verdicts on every Body made while it is enabled (conftest.py
    enables it for the test session): a body is judged when it completes
    (and then forgets its state, so that 100 000 small responses cost
    little) or, if it never does, when the ledger is collected; conftest.py
    collects after each test, so every body a test made is judged;
  * check(bodies or downloads): judge these now, as an assertion (a test
    that wants its own bodies' verdict in its own report); the ledger then
    leaves them out.

Standard library only; import it through harness (`import harness`).
"""

import hashlib
import re
import threading
import zlib

from netns_env import content_for


class FramingError(Exception):
    """A body whose chunked framing or gzip stream is broken."""


class _Dechunker:
    """Transfer-Encoding: chunked, undone as the bytes come."""

    def __init__(self):
        self.state = "size"  # size, data, crlf, trailer, done
        self.line = bytearray()
        self.left = 0

    def feed(self, buf, start, end, out):
        """Consumes buf[start:end] up to the end of the body; calls out()
        with memoryviews of the chunks' data. Returns the bytes consumed."""
        pos = start
        view = memoryview(buf)
        while pos < end and self.state != "done":
            if self.state == "data":
                k = min(self.left, end - pos)
                out(view[pos:pos + k])
                pos += k
                self.left -= k
                if not self.left:
                    self.state = "crlf"
                continue
            nl = buf.find(b"\n", pos, end)
            stop = end if nl < 0 else nl + 1
            self.line += view[pos:stop]
            pos = stop
            if len(self.line) > 4096:
                raise FramingError("chunk line longer than 4096 bytes")
            if nl < 0:
                continue
            line = bytes(self.line).rstrip(b"\r\n")
            self.line.clear()
            self._line(line)
        return pos - start

    def _line(self, line):
        if self.state == "size":
            m = re.fullmatch(rb"\s*([0-9a-fA-F]+)\s*(;.*)?", line)
            if not m:
                raise FramingError("bad chunk size line %r" % line[:40])
            self.left = int(m.group(1), 16)
            self.state = "data" if self.left else "trailer"
        elif self.state == "crlf":
            if line:
                raise FramingError("chunk data not followed by CRLF")
            self.state = "size"
        elif not line:  # trailer: an empty line ends it
            self.state = "done"


class Body:
    """One response's body (status 200 or 206) as a client receives it.

    feed(buf, start, end) takes raw bytes after the response head and
    returns how many belong to this body (fewer only once it is complete,
    which `complete` then says); `wire` counts them (framing included),
    `size` the content bytes (de-chunked, decoded). The content's SHA-256
    is computed as it comes. Thread-safe: the ledger may judge a body that
    another thread still feeds (as far as it came).
    """

    def __init__(self, path, headers, status=200, label=None, url=None,
                 verify=True):
        self.path, self.label, self.status = path, label, status
        self.url = url or path
        self.verify = verify
        self.content = content_for(path)
        self.offset = 0
        m = re.match(r"bytes\s+(\d+)-", headers.get("content-range", ""))
        if m:
            self.offset = int(m.group(1))
        te = headers.get("transfer-encoding", "").lower()
        self.chunked = "chunked" in te
        self.length = None if self.chunked else (
            int(headers["content-length"]) if "content-length" in headers
            else None)
        self.encoding = headers.get("content-encoding", "").lower() or None
        if self.encoding == "identity":
            self.encoding = None
        self._gunzip = (zlib.decompressobj(16 + zlib.MAX_WBITS)
                        if self.encoding == "gzip" else None)
        self._dechunk = _Dechunker() if self.chunked else None
        self._digest = hashlib.sha256()
        self._lock = threading.Lock()
        self.wire = 0
        self.size = 0
        self.complete = False
        self.error = None
        if self.encoding not in (None, "gzip"):
            self.error = "content-encoding %r: not decoded" % self.encoding
        self.verdict = None  # (problem or None, size, skipped) once judged
        self.index = LEDGER.add(self)
        if self.length == 0:
            self._finish()

    def _content(self, view):
        if self._gunzip is not None:
            view = self._gunzip.decompress(view)
        self._digest.update(view)
        self.size += len(view)

    def feed(self, buf, start=0, end=None):
        end = len(buf) if end is None else end
        with self._lock:
            if self.complete or self.error or self.verdict:
                return 0 if self.complete else end - start
            try:
                if self._dechunk is not None:
                    n = self._dechunk.feed(buf, start, end, self._content)
                    complete = self._dechunk.state == "done"
                else:
                    n = end - start
                    if self.length is not None:
                        n = min(n, self.length - self.wire)
                    self._content(memoryview(buf)[start:start + n])
                    complete = self.length is not None and (
                        self.wire + n >= self.length)
                self.wire += n
                if complete:
                    self._finish()
            except (FramingError, zlib.error) as e:
                self.error = "%s: %s" % (type(e).__name__, e)
                return end - start
        if self.complete:
            LEDGER.judged(self)
        return n

    def _finish(self):
        """The body is complete. REQUIRES: self._lock held (or no other
        thread has the body yet)."""
        if self._gunzip is not None:
            if not self._gunzip.eof:
                raise FramingError("gzip stream ends early")
            if self._gunzip.unused_data:
                raise FramingError("%d bytes after the gzip stream"
                                   % len(self._gunzip.unused_data))
        self.complete = True
        if LEDGER.enabled:
            self._judge()

    def end(self):
        """The connection ended (EOF): a body without a declared length is
        complete now."""
        with self._lock:
            if self.verdict or self.error:
                return
            if self.length is None and not self.chunked:
                try:
                    self._finish()
                except (FramingError, zlib.error) as e:
                    self.error = "%s: %s" % (type(e).__name__, e)
        if self.complete:
            LEDGER.judged(self)

    def judge(self):
        """The verdict (problem or None, content bytes, skipped), judged
        now as far as the body came if not judged yet."""
        with self._lock:
            if self.verdict is None:
                self._judge()
            return self.verdict

    def _judge(self):
        """REQUIRES: self._lock held."""
        self.verdict = (_problem(self), self.size, not self.verify)
        self._digest = self._gunzip = self._dechunk = None  # no longer needed

    def describe(self):
        return "%s%s (%s%s%s)" % (
            self.url, " from %s" % self.label if self.label else "",
            "bytes from %d, " % self.offset if self.offset else "",
            "chunked" if self.chunked else "length %s" % self.length,
            ", %s" % self.encoding if self.encoding else "")


def _problem(body):
    """What is wrong with body as far as it came, or None. REQUIRES: its
    lock held."""
    if not body.verify:
        return None
    size = body.size
    if body.error or body.content is None:
        where = body.describe()
    if body.error:
        return "%s: %s after %d content bytes" % (where, body.error, size)
    if body.content is None:
        return ("%s: %d bytes of unknown content (register what the path "
                "serves with harness.register_content, or make the client "
                "with verify=False)" % (where, size))
    end = body.offset + size
    if end > body.content.size:
        return "%s: %d bytes, past the end of %s (%d bytes)" % (
            body.describe(), size, body.content.name, body.content.size)
    got = body._digest.hexdigest()
    expected = body.content.sha256(size, body.offset)
    if got != expected:
        return ("%s: bytes differ: SHA-256 of the %d bytes received %s, of "
                "%s's bytes %d..%d %s" % (body.describe(), size, got,
                                          body.content.name, body.offset, end,
                                          expected))
    if (body.complete and body.length is not None and body.encoding is None
            and size != body.length):
        return "%s: complete with %d bytes, declared %d" % (
            body.describe(), size, body.length)
    return None


class Ledger:
    """The verdicts on every Body made while enabled, by the order they
    were made in (mark() is a position in it), until collected."""

    def __init__(self):
        self.enabled = False
        self._lock = threading.Lock()
        self._count = 0
        self._open = {}     # index -> Body not judged yet
        self._verdicts = []  # (index, verdict) of judged bodies
        self._taken = set()  # indices check() reported itself

    def add(self, body):
        """Registers a new body; returns its index (None: not enabled)."""
        if not self.enabled:
            return None
        with self._lock:
            index = self._count
            self._count += 1
            self._open[index] = body
            return index

    def judged(self, body):
        """body has its verdict: keep only that."""
        if body.index is None:
            return
        with self._lock:
            if self._open.pop(body.index, None) is not None:
                self._verdicts.append((body.index, body.verdict))

    def mark(self):
        with self._lock:
            return self._count

    def collect(self, since=0):
        """Verdicts on every body made at or after mark `since` (those not
        judged yet are judged now, as far as they came), less those check()
        reported; they leave the ledger. Returns (problems, summary line)."""
        with self._lock:
            bodies = [(i, b) for i, b in self._open.items() if i >= since]
            for i, _ in bodies:
                del self._open[i]
            verdicts = [(i, v) for i, v in self._verdicts if i >= since]
            self._verdicts = [(i, v) for i, v in self._verdicts if i < since]
        verdicts += [(i, b.judge()) for i, b in bodies]
        with self._lock:
            verdicts = [v for i, v in verdicts if i not in self._taken]
            self._taken = {i for i in self._taken if i < since}
        return summarize(verdicts)

    def take(self, body):
        """check() reports body's verdict itself: collect() leaves it out."""
        if body.index is not None:
            with self._lock:
                self._taken.add(body.index)


LEDGER = Ledger()


def summarize(verdicts):
    """(problem lines, one summary line) of verdicts."""
    found = [p for p, _, _ in verdicts if p]
    judged = [v for v in verdicts if not v[2]]
    return found, "%d response bodies checked (%d content bytes), %d skipped" % (
        len(judged), sum(size for _, size, _ in judged),
        len(verdicts) - len(judged))


def bodies_of(things):
    """The Body objects of downloads (their .bodies), fetch sets (their
    fetches' bodies) and bodies."""
    result = []
    for thing in things:
        if isinstance(thing, Body):
            result.append(thing)
        elif hasattr(thing, "bodies"):
            result += thing.bodies
        elif hasattr(thing, "fetches"):
            result += [f.body for f in thing.fetches if f.body is not None]
        else:
            raise TypeError("no bodies in %r" % (thing,))
    return result


def problems(things):
    """Judges the bodies of `things` (see bodies_of) now; the ledger leaves
    them out. Returns (problem lines, summary line)."""
    bodies = bodies_of(things)
    for body in bodies:
        LEDGER.take(body)
    return summarize([body.judge() for body in bodies])


def check(things):
    """problems(things) as an assertion: raises AssertionError listing the
    problems (at most 20); returns the summary line."""
    found, summary = problems(things)
    if found:
        raise AssertionError("%d response bodies not intact (%s):\n%s" % (
            len(found), summary, "\n".join(found[:20])))
    return summary
