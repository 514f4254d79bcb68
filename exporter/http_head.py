"""The head of an HTTP/1.x request, its request line and header fields, parsed the
same way for both of the daemon's servers (the API on the Unix socket, /metrics).

Ours rather than ``http.server``'s: that one imports ``http.client``, and with it the
``email`` package and ``ssl`` (libssl and libcrypto mapped): ~7 MiB of the daemon's
RSS for a parser of a few lines. Ours rather than h11's (sans-IO, well
kept): for the API's requests h11 took 3.7 times the CPU (25 us a request against
6.7 us) and twice the memory (784 KiB imported against 372 KiB), measured side by
side by benchmarks/http_parser.py; the requests that parser is trusted with are few
and small, and tests/test_api_http.py holds it to what http.server answered and to
the framing rules below.

Stricter than ``http.server`` where it let a request mean two things: a header line
without a colon, with a space before its colon, or folded onto the next line is
refused (400), where the stdlib silently dropped it and every header after it, so a
``Content-Length`` below such a line went unseen and its body was read as the next
request (RFC 9112 5.1, 5.2). A field sent twice is kept as one, its values joined
by ", " (RFC 9110 5.3): a ``Content-Length`` sent twice is then no number.
"""

from __future__ import annotations

from dataclasses import dataclass

# A field name is a token (RFC 9110 5.6.2): no space, no separator.
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
# ASCII digits only: str.isdigit() takes "²" (latin-1 0xB2), which int() refuses.
_DIGITS = frozenset("0123456789")
# A Content-Length of more digits is no body the daemon would take (and int() refuses
# over 4,300 digits): refused as too large before it is read as a number.
MAX_LENGTH_DIGITS = 19


def _number(text: str, most_digits: int) -> int | None:
    """``text`` as a number of 1 to ``most_digits`` ASCII digits (RFC 9110's
    1*DIGIT), else None."""
    if not 0 < len(text) <= most_digits or not _DIGITS.issuperset(text):
        return None
    return int(text)


class BadHead(Exception):
    """A head that is not an HTTP/1.x request: ``status`` and ``error`` say why."""

    def __init__(self, status: int, error: str, detail: str = "") -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.detail = detail


@dataclass(frozen=True)
class Head:
    method: str
    target: str  # as sent: the path and its query
    version: tuple[int, int]  # (0, 9) for a request line without one
    headers: dict[str, str]  # names in lower case

    def keeps_alive(self) -> bool:
        """Whether the connection stays open after the answer: by default from
        HTTP/1.1 on, unless the client says otherwise."""
        connection = self.headers.get("connection", "").lower()
        if connection == "close":
            return False
        return self.version >= (1, 1) or connection == "keep-alive"

    def content_length(self) -> int | None:
        """The body's length as sent (None: no Content-Length); a value that is not
        number is a BadHead (400), as are two values (RFC 9112 6.3); one of over
        MAX_LENGTH_DIGITS digits is too large (413)."""
        raw = self.headers.get("content-length")
        if raw is None:
            return None
        if not raw or not _DIGITS.issuperset(raw):
            raise BadHead(400, "invalid Content-Length", repr(raw[:40]))
        digits = raw.lstrip("0") or "0"
        if len(digits) > MAX_LENGTH_DIGITS:
            raise BadHead(413, "body too large", f"a Content-Length of {len(digits)} digits")
        return int(digits)


def parse_request_line(line: str) -> tuple[str, str, tuple[int, int]]:
    """(method, target, version) of a request line (its line end removed)."""
    words = line.split()
    version = (0, 9)
    if len(words) >= 3:
        version = _version(words[-1])
        if version >= (2, 0):
            raise BadHead(505, f"Invalid HTTP version ({version[0]}.{version[1]})")
    if not 2 <= len(words) <= 3:
        raise BadHead(400, f"Bad request syntax ({line!r})")
    if len(words) == 2 and words[0] != "GET":
        raise BadHead(400, f"Bad HTTP/0.9 request type ({words[0]!r})")
    return words[0], words[1], version


def _version(word: str) -> tuple[int, int]:
    numbers = [_number(n, 10) for n in word[5:].split(".")] if word.startswith("HTTP/") else []
    if len(numbers) != 2 or None in numbers:
        raise BadHead(400, f"Bad request version ({word[:40]!r})")
    return numbers[0], numbers[1]  # type: ignore[return-value]


def parse_fields(lines: list[str]) -> dict[str, str]:
    """Header fields by lower-case name, from their lines (line ends removed)."""
    fields: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not name or not _TOKEN.issuperset(name):
            folded = line[:1] in (" ", "\t")
            why = "a folded header line" if folded else "not a header field (name: value)"
            raise BadHead(400, "invalid header", f"{line[:80]!r} is {why}")
        name = name.lower()
        value = value.strip(" \t")
        fields[name] = f"{fields[name]}, {value}" if name in fields else value
    return fields


def parse_head(head: bytes) -> Head:
    """A whole head, without the empty line that ends it."""
    lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
    method, target, version = parse_request_line(lines[0])
    return Head(method, target, version, parse_fields(lines[1:]))
