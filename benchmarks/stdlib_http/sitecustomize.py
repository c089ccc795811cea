"""For the A/B run in benchmarks/README.md ("HTTP pieces"): with this directory on PYTHONPATH, every memslice
server (the extender, the API stand-in) answers through the stdlib BaseHTTPRequestHandler's own code instead
of memslice.lean_http's fast paths: http.client's email-based header parsing, and send_response /
send_header / end_headers plus a separate body write. The framing checks (one Content-Length, not with
Transfer-Encoding) are kept, as they would be with the stdlib handler in production.

    PYTHONPATH=benchmarks/stdlib_http .venv/bin/python benchmarks/bench_extender.py ...
"""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler

import memslice.lean_http as lean


def parse_request(self: lean.LeanRequestHandler) -> bool:
    return (BaseHTTPRequestHandler.parse_request(self)
            and self._framing_ok(lean.framing_error(list(self.headers.items()))))


def send_all(self: lean.LeanRequestHandler, code: int, body: bytes, content_type: str) -> None:
    self.send_response(code)
    self.send_header("Content-Type", content_type)
    self.send_header("Content-Length", str(len(body)))
    if self.close_connection:
        self.send_header("Connection", "close")
    self.end_headers()
    self.wfile.write(body)


lean.LeanRequestHandler.parse_request = parse_request  # type: ignore[method-assign]
lean.LeanRequestHandler.send_all = send_all  # type: ignore[method-assign]
