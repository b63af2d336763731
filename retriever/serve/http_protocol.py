"""uvicorn's HTTP protocol with two limits of our own: JSON for the errors it answers itself, and a bound on the
request line and headers.

uvicorn answers a request it cannot parse with a plain-text 400 before the application sees it, and httptools
reads headers of any size (a 64 MiB header was accepted). Clients of this API parse JSON errors, and a server
that holds whatever headers a client sends can be made to hold a lot, so this subclass counts the bytes of the
request line and headers as they arrive and answers 431 (JSON) past MAX_HEADER_BYTES, and words its own 400 in
JSON too. A request line in absolute form (GET http://name/path) names a host that uvicorn drops: it is recorded
for the Host guard (`retriever.serve.access`). Everything else is uvicorn's.
"""

from __future__ import annotations

import json
import re

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from retriever.serve.access import TARGET_AUTHORITY

MAX_HEADER_BYTES = 64 * 2**10
ABSOLUTE_FORM = re.compile(rb"[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)")


class HeadersTooLarge(Exception):
    pass


class BoundedHttpProtocol(HttpToolsProtocol):
    max_header_bytes = MAX_HEADER_BYTES

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_bytes = 0
        self._too_large = False

    def _count(self, size: int) -> None:
        self._header_bytes += size
        if self._header_bytes > self.max_header_bytes:
            self._too_large = True
            raise HeadersTooLarge  # httptools turns it into a parser error: data_received answers and closes

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if not self.url.startswith(b"/") and self.url != b"*":  # not origin form: the guard checks what it names
            found = ABSOLUTE_FORM.match(self.url)
            self.scope[TARGET_AUTHORITY] = found.group(1).decode("latin-1") if found else ""
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        if getattr(self, "_too_large", False):
            status, detail = 431, f"request line and headers over {self.max_header_bytes // 2**10} KiB"
        else:
            status, detail = 400, "not a valid HTTP request"
        body = json.dumps({"detail": detail, "status": status}).encode()
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend([b"content-type: application/json\r\n", b"content-length: " + str(len(body)).encode() + b"\r\n",
                        b"connection: close\r\n", b"\r\n", body])
        self.transport.write(b"".join(content))
        self.transport.close()
