"""A leaner `BaseHTTPRequestHandler` for the JSON servers (the extender; the tests' API stand-in).

Why (issue 12 item 4: keep a hand-written piece only where a benchmark shows the library cannot meet the
extender's targets): per request the stdlib handler parses headers with the email package
(http.client.parse_headers, ~30 µs for five headers), formats the Date header with email.utils, and writes
status line, headers and body in separate calls. `benchmarks/bench_http.py` puts that at 63-79 µs of CPU
per filter request against 23-30 µs here; in the extender itself (bench_extender.py with and without
benchmarks/stdlib_http/ on PYTHONPATH, three interleaved pairs, 2-core machine, 2026-11-23) the stdlib
handler took the CPU per pod from 1.47 to 2.04 ms (medians), i.e. 490 pods per CPU-second: below the
extender's 500 pods/s target even on a whole core. So this stays (benchmarks/README.md, "HTTP pieces").
The framing checks below would be needed with either (the stdlib takes the first of several Content-Length
fields). This class keeps the stdlib server (threads, keep-alive, TLS wrapping, error pages) and changes
only these things:
- `parse_request`: a fast path for the usual request (`METHOD /path HTTP/1.1` and plain headers);
  anything else (other versions, odd request lines) takes the stdlib path unchanged. Limits are the
  stdlib's: at most 100 header lines of at most 64 KiB (431 beyond); folded lines get 400.
- request framing is unambiguous or refused (400, connection closed), on both paths: more than one
  Content-Length field (equal or not), or Transfer-Encoding together with Content-Length (RFC 9112 §6.3:
  a proxy in front may frame the body otherwise than this server; the stdlib takes the first field).
- `send_all`: status line, headers and body in one write (one syscall, one TCP segment when small).
- the Date header is formatted once per second.
"""

from __future__ import annotations

import email.utils
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler

MAX_HEADERS = 100  # as http.client
MAX_HEADER_LINE = 65536
PHRASES = {int(s): s.phrase for s in HTTPStatus}
_date_cache: tuple[int, str] = (0, "")


def http_date() -> str:
    """The Date header for now, formatted once per second."""
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, email.utils.formatdate(now, usegmt=True))
    return _date_cache[1]


class Headers:
    """Request headers as handlers read them: case-insensitive get(); the first of repeated fields."""

    def __init__(self, fields: list[tuple[str, str]]) -> None:
        self._fields = fields
        self._first: dict[str, str] = {}
        self.lengths = 0  # Content-Length fields (framing_error's count, taken in the same pass)
        for name, value in fields:
            lower = name.lower()
            if lower == "content-length":
                self.lengths += 1
            self._first.setdefault(lower, value)

    def framing_error(self) -> str | None:
        """framing_error() of these fields."""
        if self.lengths > 1:
            return f"{self.lengths} Content-Length header fields; send exactly one"
        if self.lengths and "transfer-encoding" in self._first:
            return "both Transfer-Encoding and Content-Length; send a Content-Length only"
        return None

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._first.get(name.lower(), default)

    def __getitem__(self, name: str) -> str | None:
        return self._first.get(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._first

    def items(self) -> list[tuple[str, str]]:
        return list(self._fields)


def framing_error(fields: list[tuple[str, str]]) -> str | None:
    """Why these request headers frame the body ambiguously, or None when they do not."""
    lengths = sum(1 for name, _ in fields if name.lower() == "content-length")
    if lengths > 1:
        return f"{lengths} Content-Length header fields; send exactly one"
    if lengths and any(name.lower() == "transfer-encoding" for name, _ in fields):
        return "both Transfer-Encoding and Content-Length; send a Content-Length only"
    return None


class LeanRequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    raw_requestline: bytes  # set by the stdlib handler before parse_request (not declared in its stubs)

    def parse_request(self) -> bool:
        """The stdlib's parse_request with a fast path for the usual request (see the module)."""
        line = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = line.split()
        if len(words) != 3 or words[2] != "HTTP/1.1" or words[1].startswith("//"):
            return super().parse_request() and self._framing_ok(framing_error(list(self.headers.items())))
        self.requestline = line
        self.command, self.path, self.request_version = words
        self.close_connection = False
        fields: list[tuple[str, str]] = []
        while True:
            raw = self.rfile.readline(MAX_HEADER_LINE + 1)
            if len(raw) > MAX_HEADER_LINE:
                self.close_connection = True
                self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long")
                return False
            if raw in (b"\r\n", b"\n", b""):
                break
            if len(fields) >= MAX_HEADERS or raw[:1] in (b" ", b"\t"):  # too many, or obsolete folding
                self.close_connection = True
                self.send_error(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE if len(fields) >= MAX_HEADERS
                                else HTTPStatus.BAD_REQUEST, "Too many headers" if len(fields) >= MAX_HEADERS
                                else "Folded header lines are not accepted")
                return False
            name, _, value = str(raw, "iso-8859-1").partition(":")
            fields.append((name.strip(), value.strip()))
        headers = Headers(fields)
        if not self._framing_ok(headers.framing_error()):
            return False
        self.headers = headers  # type: ignore[assignment]
        if (self.headers.get("Connection") or "").lower() == "close":
            self.close_connection = True
        if (self.headers.get("Expect") or "").lower() == "100-continue":
            return self.handle_expect_100()
        return True

    def _framing_ok(self, error: str | None) -> bool:
        """False (400 sent, connection to be closed) when the headers frame the body ambiguously (`error`)."""
        if error is None:
            return True
        self.close_connection = True
        self.send_error(HTTPStatus.BAD_REQUEST, error)
        return False

    def send_all(self, code: int, body: bytes, content_type: str) -> None:
        """Status line, headers and body in one write."""
        self.log_request(code)
        close = "Connection: close\r\n" if self.close_connection else ""
        head = (f"{self.protocol_version} {code} {PHRASES.get(code, '')}\r\nServer: {self.server_version}\r\n"
                f"Date: {http_date()}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                f"{close}\r\n")
        self.wfile.write(head.encode("latin-1") + body)
