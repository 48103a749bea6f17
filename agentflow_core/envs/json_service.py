"""The request side shared by the loopback JSON services a channel drives (the machine service, a process's own
service such as refund's): a refusal as a 4xx status with a reason, a body read as one JSON object with its
size bounded before it is read, a reply with its length, no log line per request."""

from __future__ import annotations

import json
from collections.abc import Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any


class Refusal(Exception):
    """A request the service refuses with a 4xx status and a JSON reason."""

    def __init__(self, status: HTTPStatus, reason: str) -> None:
        self.status, self.reason = status, reason
        super().__init__(reason)


class JsonRequestHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 keep-alive handler reading and writing JSON objects; ``max_body_bytes`` bounds a body."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms delayed-ACK stall
    max_body_bytes = 64 * 1024

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Nothing: a service under training load would otherwise write one line per request."""

    def _body(self) -> dict[str, Any]:
        """The request's JSON object ({} without a body); a malformed or oversized one is a :class:`Refusal`."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise Refusal(HTTPStatus.BAD_REQUEST, "Content-Length: expected an integer") from None
        if length < 0:
            raise Refusal(HTTPStatus.BAD_REQUEST, "Content-Length: expected a non-negative integer")
        if length > self.max_body_bytes:
            self.close_connection = True  # the body is never read
            raise Refusal(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body larger than {self.max_body_bytes} bytes")
        if length == 0:
            return {}
        try:
            body = json.loads(self.rfile.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise Refusal(HTTPStatus.BAD_REQUEST, "body: expected JSON") from None
        if not isinstance(body, dict):
            raise Refusal(HTTPStatus.BAD_REQUEST, "body: expected a JSON object")
        return body

    def _reply(self, status: int, body: Mapping[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:  # e.g. a refused body left unread: the client must not reuse the connection
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
