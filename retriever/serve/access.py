"""Who may talk to the server: the Host header it answers to, and API keys (read-write or read-only).

Two attacks shape this module. DNS rebinding: a web page the user visits points its own host name at 127.0.0.1,
and the browser then sends the page's requests to the local server with `Host: attacker.example`; checking Host
against the names the server is bound to stops it, with or without keys. And anyone else on the network, once
the server listens beyond loopback: `serve` refuses that without a key unless told otherwise, loudly.

Keys travel as `Authorization: Bearer KEY`. A read-write key may do everything; a read-only key may search and
read (a write answers 403). Keys are compared as SHA-256 digests with `hmac.compare_digest`, each against every
stored key, so the time taken says nothing about how much of a guess was right. The search page, `/health` and
the API docs need no key: none of them holds anything private.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from starlette.responses import JSONResponse

from retriever.errors import RetrieverError, param

log = logging.getLogger("retriever.serve.app")

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
WILDCARD_BINDS = ("0.0.0.0", "::", "")
API_KEY_ENV = "RETRIEVER_API_KEY"
READ_ONLY_API_KEY_ENV = "RETRIEVER_READ_ONLY_API_KEY"
MIN_KEY_CHARS = 16
OPEN_PATHS = frozenset({"/", "/health", "/docs", "/openapi.json"})
OPEN_PREFIXES = ("/docs-assets/",)  # the API docs' own scripts and styles
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
MCP_PATH = "/mcp"  # the MCP tools for agents (`retriever.serve.mcp_tools`): none of them writes
# Where every method only reads: POST /search (many queries at once) and MCP (its tools, POSTed as JSON-RPC).
READ_ONLY_PATHS = frozenset({"/search", MCP_PATH})
# Where `retriever.serve.http_protocol` records the host an absolute-form request line names
# (GET http://name/path): uvicorn keeps only the path, and the Host guard must see the name too.
TARGET_AUTHORITY = "retriever.target_authority"
PORT = re.compile(r"[0-9]{1,5}")  # ASCII digits only: str.isdigit also takes "²"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True)
class AccessPolicy:
    """The Host names answered (`*` any, `*.example.org` a domain and its subdomains) and the keys' digests."""

    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS
    write_keys: tuple[bytes, ...] = ()
    read_keys: tuple[bytes, ...] = ()

    @classmethod
    def create(cls, allowed_hosts: tuple[str, ...] | list[str] = LOOPBACK_HOSTS, api_key: str | None = None,
               read_only_api_key: str | None = None) -> AccessPolicy:
        for key, what in ((api_key, "the API key"), (read_only_api_key, "the read-only API key")):
            if key is not None:
                check_key(key, what)
        if api_key is not None and api_key == read_only_api_key:
            raise RetrieverError("the API key and the read-only API key are the same; give them different values")
        hosts = tuple(dict.fromkeys(host.strip().lower() for host in allowed_hosts if host.strip()))
        return cls(hosts or LOOPBACK_HOSTS, (_digest(api_key),) if api_key else (),
                   (_digest(read_only_api_key),) if read_only_api_key else ())

    @property
    def needs_key(self) -> bool:
        return bool(self.write_keys or self.read_keys)

    def host_allowed(self, host_header: str | None) -> bool:
        host = host_name(host_header)
        if host is None:
            return False
        for allowed in self.allowed_hosts:
            if allowed == "*" or host == allowed:
                return True
            if allowed.startswith("*.") and (host == allowed[2:] or host.endswith(allowed[1:])):
                return True
        return False

    def role(self, authorization: str | None) -> str | None:
        """"write", "read", or None (no valid key) for an Authorization header's value."""
        if not authorization:
            return None
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            return None
        digest = _digest(key.strip())
        write = any([hmac.compare_digest(digest, known) for known in self.write_keys])  # no early exit: a list
        read = any([hmac.compare_digest(digest, known) for known in self.read_keys])
        return "write" if write else "read" if read else None


def host_name(host_header: str | None) -> str | None:
    """The name in a Host header, without the port, lower case ("[::1]:8000" -> "::1"); None when malformed."""
    if not host_header:
        return None
    host = host_header.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        rest = host[end + 1 :]
        if end <= 1 or not (rest == "" or (rest.startswith(":") and _port(rest[1:]))):
            return None
        return host[1:end]
    name, colon, port = host.partition(":")
    if (colon and not _port(port)) or not name:
        return None
    return name


def _port(port: str) -> bool:
    """A port a client can have connected to: 1 to 65535 (an empty one, as in "localhost:", is not)."""
    return PORT.fullmatch(port) is not None and 0 < int(port) < 65536


def check_key(key: str, what: str = "the API key") -> str:
    if len(key) < MIN_KEY_CHARS:
        raise RetrieverError(f"{what} has {len(key)} characters; use at least {MIN_KEY_CHARS} (e.g. from: "
                             "python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    # Headers travel as latin-1 and clients send UTF-8: a key beyond ASCII could never be sent so as to match.
    if any(character.isspace() for character in key) or not (key.isascii() and key.isprintable()):
        raise RetrieverError(f"{what} holds spaces, control characters or characters beyond ASCII; use printable "
                             "ASCII characters only")
    return key


def resolve_key(value: str | None, file: str | Path | None, env_name: str, what: str) -> str | None:
    """A key from the option's VALUE, else from FILE (its first line), else from the environment variable."""
    if value is not None and file is not None:
        raise RetrieverError(f"{what}: give the key or a file that holds it, not both")
    source = what  # an error names where the key came from
    if file is not None:
        source = f"{what}-file {file}"
        try:
            lines = Path(file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            raise RetrieverError(f"{what}: cannot read {file} ({getattr(error, 'strerror', None) or error})") from None
        if not lines or not lines[0].strip():
            raise RetrieverError(f"{what}: {file} is empty; put the key on its first line")
        value = lines[0].strip()
    elif value is None:
        value, source = os.environ.get(env_name) or None, f"${env_name}"
    return check_key(value, source) if value is not None else None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serving_hosts(bind: str, extra: tuple[str, ...] | list[str] = ()) -> tuple[str, ...]:
    """The Host names a server bound to BIND answers: loopback names, the bound address itself, and EXTRA; bound
    to every address (0.0.0.0, ::) with no EXTRA, any name (a key is then required, see `check_exposure`)."""
    hosts = list(LOOPBACK_HOSTS) + [host.strip().lower() for host in extra]
    if bind in WILDCARD_BINDS:
        if not extra:
            hosts.append("*")
    elif not is_loopback(bind):
        hosts.append(bind.strip("[]").lower())
    return tuple(dict.fromkeys(hosts))


def check_exposure(bind: str, policy: AccessPolicy, allow_without_key: bool) -> None:
    """Refuse to listen beyond this machine without a key, unless the user said so explicitly (then warn)."""
    if is_loopback(bind) or policy.needs_key:
        return
    if not allow_without_key:
        raise RetrieverError(
            f"serving on {bind or 'every address'} without an API key would let anyone who reaches this machine "
            f"read and change its indexes; set one with {param('api_key')} or ${API_KEY_ENV} (or pass "
            f"{param('allow_without_key', True)} to serve without one at your own risk)")
    log.warning("SERVING ON %s WITHOUT AN API KEY: anyone who can reach this address can read, add and delete "
                "documents", bind or "every address")


class AccessGuard:
    """ASGI middleware: the Host check on every request, then the key check on all but the open paths."""

    def __init__(self, app, policy: AccessPolicy):
        self.app, self.policy = app, policy

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers, hosts = {}, []
        for name, value in scope.get("headers") or ():
            headers.setdefault(name, value)
            if name == b"host":
                hosts.append(value.decode("latin-1"))
        refusal = self._refusal(hosts, scope.get(TARGET_AUTHORITY), headers, scope.get("path", ""),
                                scope.get("method", "GET"))
        if refusal is not None:
            return await refusal(scope, receive, send)
        return await self.app(scope, receive, send)

    def _refusal(self, hosts: list[str], authority: str | None, headers: dict, path: str,
                 method: str) -> JSONResponse | None:
        """The answer refusing this request, or None to let it through. HOSTS: its Host headers; AUTHORITY: the
        host its request line names (absolute form), if it does. Every one must be a name served."""
        if len(hosts) > 1:  # which one a proxy or a framework reads varies: none is trusted (RFC 9112 says 400)
            return _refusal(400, "more than one Host header; send one")
        if not hosts or not hosts[0].strip():  # left out (HTTP/1.0 allows it) or blank
            return _refusal(400, "the request names no host: send a Host header with the address the server was "
                            "started on")
        if not all(self.policy.host_allowed(host) for host in hosts + [authority] if host is not None):
            return _refusal(421, "this server does not answer to that Host name (a "
                            "guard against DNS rebinding); use the address it was started on, or add the name to "
                            "its allowed hosts")
        if not self.policy.needs_key or path in OPEN_PATHS or (path.startswith(OPEN_PREFIXES) and ".." not in path):
            return None
        role = self.policy.role(headers.get(b"authorization", b"").decode("latin-1"))
        if role is None:
            said = b"authorization" in headers
            return _refusal(401, "the API key is not valid" if said else
                            "this server needs an API key: send Authorization: Bearer KEY",
                            {"WWW-Authenticate": 'Bearer realm="retriever"'})
        if role == "read" and method not in READ_METHODS and path not in READ_ONLY_PATHS:
            return _refusal(403, "this key may only read; writes need the read-write API key")
        return None


def _refusal(status: int, detail: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail, "status": status}, status_code=status, headers=headers)
