"""What a hostile client must not be able to do to the server or to the other clients: poison their batches,
reach it through DNS rebinding, use it without a key, read server paths, take it down with one damaged index,
make it build unbounded answers, or crash it with bad text, bad HTTP or concurrent writes."""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from retriever.serve.access import AccessPolicy, check_exposure, host_name, resolve_key, serving_hosts
from retriever.errors import RetrieverError
from retriever.versions.folder import writer_lock
from retriever.versions.writer import IndexWriter
from retriever.index import Index
from retriever.serve.protocol import MAX_HITS
from retriever.serve.app import create_app
from retriever.serve.run import serving_in_thread
from tests.helpers import assert_one_line_error, build_notes, one_line_error


WRITE_KEY = "write-key-0123456789abcdef"
READ_KEY = "read-key-0123456789abcdef"
LOCAL = "http://127.0.0.1"


@pytest.fixture()
def index_dir(tmp_path, tiny_bert) -> Path:
    return build_notes(tmp_path / "indexes", tiny_bert, 60)


@pytest.fixture()
def client(index_dir):
    with TestClient(create_app(index_dir, device="cpu"), base_url=LOCAL) as test_client:
        yield test_client


# ---- 1. one client's bad query never fails another's -------------------------------------------------------

def test_a_malformed_query_among_concurrent_clients_fails_only_its_own_request(client):
    poison = '{"queries": ["a \\ud800 b"], "k": 3}'  # a lone surrogate, as JSON escapes it
    barrier = threading.Barrier(24)

    def innocent(number: int) -> int:
        barrier.wait()
        return client.post("/search", json={"queries": [f"a dog on day {number}", "the budget"], "k": 3}).status_code

    def malicious(_: int) -> int:
        barrier.wait()
        return client.post("/search", content=poison, headers={"content-type": "application/json"}).status_code

    with ThreadPoolExecutor(24) as pool:
        innocents = [pool.submit(innocent, n) for n in range(16)]
        attacks = [pool.submit(malicious, n) for n in range(8)]
        assert [f.result() for f in innocents] == [200] * 16
        assert [f.result() for f in attacks] == [400] * 8
    detail = one_line_error(client.post("/search", content=poison, headers={"content-type": "application/json"}),
                            400)
    assert "invalid character" in detail


def test_a_batch_that_fails_anyway_is_retried_query_by_query(index_dir, monkeypatch):
    """A query that passes every check yet breaks the encoder (as a tokenizer might) fails its own request only."""
    with TestClient(create_app(index_dir, device="cpu"), base_url=LOCAL, raise_server_exceptions=False) as client:
        _retried_alone(client, monkeypatch)


def _retried_alone(client, monkeypatch) -> None:
    encoder = client.app.state.indexes.get("notes").encoder
    original, batches = encoder.encode, []

    def fragile(texts, *args, **kwargs):
        batches.append(len(texts))
        if any("explode" in text for text in texts):
            raise ValueError("cannot tokenize")
        return original(texts, *args, **kwargs)

    monkeypatch.setattr(encoder, "encode", fragile)
    barrier = threading.Barrier(12)

    def ask(text: str) -> int:
        barrier.wait()
        return client.post("/search", json={"queries": [text], "k": 3}).status_code

    with ThreadPoolExecutor(12) as pool:
        statuses = list(pool.map(ask, ["explode now"] + [f"a dog on day {n}" for n in range(11)]))
    assert statuses[0] == 500 and statuses[1:] == [200] * 11
    assert max(batches) > 1  # the queries were batched together, so the retry is what saved the others


# ---- 2. Host header and API keys ---------------------------------------------------------------------------

ENDPOINTS = [  # (method, path, JSON body, is a write)
    ("GET", "/indexes", None, False),
    ("GET", "/indexes/notes", None, False),
    ("GET", "/search?q=dog&k=2", None, False),
    ("POST", "/search", {"queries": ["dog"], "k": 2}, False),
    ("GET", "/indexes/notes/documents/d1", None, False),
    ("GET", "/metrics", None, False),
    ("POST", "/indexes/notes/documents", {"documents": [{"_id": "new", "text": "a new note"}]}, True),
    ("DELETE", "/indexes/notes/documents/d2", None, True),
    ("POST", "/indexes", {"name": "made", "documents": [{"_id": "a", "text": "a note"}], "calibrator": "none"}, True),
]
OPEN = [("GET", "/health"), ("GET", "/"), ("GET", "/openapi.json"), ("GET", "/docs"),
        ("GET", "/docs-assets/swagger-ui-bundle.js")]


@pytest.mark.parametrize("key,expected_read,expected_write", [
    (None, 401, 401),
    ("not-the-key-0123456789", 401, 401),
    (READ_KEY, 200, 403),
    (WRITE_KEY, 200, (200, 201)),
])
def test_keys_on_every_endpoint(index_dir, key, expected_read, expected_write):
    policy = AccessPolicy.create(api_key=WRITE_KEY, read_only_api_key=READ_KEY)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with TestClient(create_app(index_dir, device="cpu", access=policy), base_url=LOCAL) as client:
        for method, path, body, write in ENDPOINTS:
            response = client.request(method, path, json=body, headers=headers)
            expected = expected_write if write else expected_read
            assert response.status_code in (expected if isinstance(expected, tuple) else (expected,)), \
                (method, path, response.text)
            if response.status_code >= 400:
                one_line_error(response, response.status_code)
            if response.status_code == 401:
                assert response.headers["www-authenticate"].startswith("Bearer")
        for method, path in OPEN:
            assert client.request(method, path).status_code == 200, path


@pytest.mark.parametrize("host", ["rebind.attacker.example", "rebind.attacker.example:8000", "127.0.0.1.evil.example",
                                  "localhost.", "[::2]:80", "127.0.0.1:80:80"])
def test_a_foreign_host_header_is_refused_on_every_endpoint_even_with_a_key(index_dir, host):
    policy = AccessPolicy.create(api_key=WRITE_KEY)
    with TestClient(create_app(index_dir, device="cpu", access=policy), base_url=LOCAL) as client:
        for method, path, body, _ in ENDPOINTS + [(m, p, None, False) for m, p in OPEN]:
            response = client.request(method, path, json=body,
                                      headers={"Host": host, "Authorization": f"Bearer {WRITE_KEY}"})
            assert "rebinding" in one_line_error(response, 421), (method, path)
        assert client.get("/indexes/notes/documents/d2", headers={"Authorization": f"Bearer {WRITE_KEY}"}).status_code \
            == 200  # nothing was deleted


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:8000", "localhost:8000", "LOCALHOST", "[::1]:8000"])
def test_loopback_names_are_served(client, host):
    assert client.get("/indexes", headers={"Host": host}).status_code == 200


def test_host_names_served_follow_the_bind_address():
    assert host_name("[::1]:8000") == "::1" and host_name("Example.org:80") == "example.org"
    assert host_name("a:b") is None and host_name("[::1]x") is None and host_name("") is None
    assert "*" in serving_hosts("0.0.0.0") and "*" not in serving_hosts("0.0.0.0", ["search.example.org"])
    assert "10.1.2.3" in serving_hosts("10.1.2.3") and "*" not in serving_hosts("127.0.0.1")
    policy = AccessPolicy.create(["*.example.org"])
    assert policy.host_allowed("a.example.org:443") and policy.host_allowed("example.org")
    assert not policy.host_allowed("evilexample.org")


@pytest.mark.parametrize("host", ["localhost:99999", "localhost:65536", "localhost:0", "localhost:abc", "localhost:",
                                  "localhost:\u00b2", "[::1]:99999", "[::1]:", "127.0.0.1:+80"])
def test_a_host_header_with_an_impossible_port_is_refused(tmp_path, host):
    assert host_name(host) is None
    with TestClient(create_app(tmp_path, device="cpu"), base_url=LOCAL) as client:
        assert client.get("/indexes", headers={"Host": "localhost:8000"}).status_code == 200
        assert "rebinding" in one_line_error(client.get("/indexes", headers={"Host": host.encode("latin-1")}), 421)


def test_a_non_ascii_or_unprintable_key_is_refused_at_start_up(tmp_path, monkeypatch, cli):
    """HTTP headers are latin-1 and clients send UTF-8: a non-ASCII key could never match, so it never starts."""
    import retriever.serve.run as run

    monkeypatch.setattr(run, "_run", lambda *args, **kwargs: pytest.fail("the server started"))
    for bad in ("clé-0123456789abcdef", "key-0123456789abcdef\u00a0x", "key-0123456789abcdef\x7f"):
        with pytest.raises(RetrieverError, match="ASCII"):
            resolve_key(bad, None, "RETRIEVER_API_KEY", "--api-key")
        with pytest.raises(RetrieverError, match="ASCII"):
            AccessPolicy.create(read_only_api_key=bad)
    (tmp_path / "key").write_text("ключ-0123456789abcdef\n", encoding="utf-8")
    assert_one_line_error(cli("serve", "--api-key-file", tmp_path / "key", "--index-dir", tmp_path), "--api-key",
                          "ASCII")
    monkeypatch.setenv("RETRIEVER_READ_ONLY_API_KEY", "clé-0123456789abcdef")
    assert_one_line_error(cli("serve", "--index-dir", tmp_path), "$RETRIEVER_READ_ONLY_API_KEY", "ASCII")


def test_serving_beyond_loopback_needs_a_key_or_an_explicit_flag(caplog):
    with pytest.raises(RetrieverError, match="set one with api_key .* allow_without_key=True"):
        check_exposure("0.0.0.0", AccessPolicy.create(serving_hosts("0.0.0.0")), allow_without_key=False)
    check_exposure("0.0.0.0", AccessPolicy.create(api_key=WRITE_KEY), allow_without_key=False)
    check_exposure("127.0.0.1", AccessPolicy.create(), allow_without_key=False)
    with caplog.at_level(logging.WARNING, logger="retriever.serve.app"):
        check_exposure("0.0.0.0", AccessPolicy.create(), allow_without_key=True)
    assert "WITHOUT AN API KEY" in caplog.text


def test_serve_on_all_addresses_without_a_key_is_one_cli_line(cli, index_dir):
    result = cli("serve", "--host", "0.0.0.0", "--index-dir", index_dir)
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and "--api-key" in result.stderr


def test_keys_come_from_the_option_a_file_or_the_environment(tmp_path, monkeypatch, cli):
    key_file = tmp_path / "key"
    key_file.write_text(WRITE_KEY + "\n")
    assert resolve_key(None, key_file, "RETRIEVER_API_KEY", "--api-key") == WRITE_KEY
    monkeypatch.setenv("RETRIEVER_API_KEY", READ_KEY)
    assert resolve_key(None, None, "RETRIEVER_API_KEY", "--api-key") == READ_KEY
    assert resolve_key(WRITE_KEY, None, "RETRIEVER_API_KEY", "--api-key") == WRITE_KEY
    for bad in ("short", "has a space in it 0123456789"):
        with pytest.raises(RetrieverError):
            resolve_key(bad, None, "RETRIEVER_API_KEY", "--api-key")
    with pytest.raises(RetrieverError, match="empty"):
        (tmp_path / "empty").write_text("")
        resolve_key(None, tmp_path / "empty", "RETRIEVER_API_KEY", "--api-key")
    result = cli("serve", "--api-key", "short")
    assert result.returncode == 1 and "at least 16" in result.stderr
    monkeypatch.setenv("RETRIEVER_API_KEY", "schlüssel-0123456789abcdef")  # named where it came from
    with pytest.raises(RetrieverError, match=r"^\$RETRIEVER_API_KEY holds .* beyond ASCII"):
        resolve_key(None, None, "RETRIEVER_API_KEY", "--api-key")


# ---- no server paths, damage, storage errors ---------------------------------------------------------------

def test_no_answer_holds_a_server_path(client, index_dir):
    answers = [client.get(path) for path in ("/health", "/indexes", "/indexes/notes", "/indexes/none",
                                              "/search?q=dog", "/indexes/notes/documents/nope")]
    answers.append(client.post("/indexes/none/documents", json={"documents": [{"_id": "x", "text": "y"}]}))
    for answer in answers:
        assert str(index_dir) not in answer.text and str(Path.home()) not in answer.text, answer.text
        assert os.path.realpath(index_dir) not in answer.text


def _flip_byte(path: Path, offset: int = 5) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_calibrator_is_that_index_s_503_and_the_others_serve(index_dir, tiny_bert):
    build_notes(index_dir, tiny_bert, 30, name="other", prefix="o")
    _flip_byte((index_dir / "notes").resolve() / "calibrator" / "calibrator.json")
    with TestClient(create_app(index_dir, device="cpu", preload=True), base_url=LOCAL) as client:  # starts
        for path in ("/search?q=dog&index=notes", "/indexes/notes", "/indexes/notes/documents/d1"):
            assert "damaged" in one_line_error(client.get(path), 503), path
        assert client.get("/search?q=dog&index=other").status_code == 200
        listed = {entry["name"]: entry for entry in client.get("/indexes").json()["indexes"]}
        assert listed["other"].get("problem") is None


def test_a_storage_error_during_a_write_is_a_503_and_the_index_is_unchanged(client, monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(Index, "add", read_only)
    detail = one_line_error(client.post("/indexes/notes/documents", json={"documents": [{"_id": "n", "text": "x"}]}),
                            503)
    assert "read-only" in detail and client.get("/indexes/notes").json()["documents"] == 60


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"),
                                     OSError(errno.EROFS, "Read-only file system"),
                                     sqlite3.OperationalError("database or disk is full")])
def test_a_full_or_read_only_disk_fails_every_write_to_an_index_with_a_503(client, monkeypatch, failure):
    """Raised inside the write (where the library words a full disk itself): a 503 a client retries, not a 400."""
    def fail(*args, **kwargs):
        raise failure

    monkeypatch.setattr(IndexWriter, "commit", fail)
    for method, path, body in (("POST", "/indexes/notes/documents", {"documents": [{"_id": "n", "text": "x"}]}),
                               ("POST", "/indexes/notes/documents", {"documents": [{"_id": "d1", "text": "x"}],
                                                                     "upsert": True}),
                               ("DELETE", "/indexes/notes/documents/d1", None)):
        response = client.request(method, path, json=body)
        detail = one_line_error(response, 503)
        assert response.json()["code"] == "unavailable", (method, path)
        assert ("read-only" if getattr(failure, "errno", None) == errno.EROFS else "disk is full") in detail
    assert client.get("/indexes/notes").json()["documents"] == 60
    assert client.get("/indexes/notes/documents/d1").status_code == 200


# ---- 6. bounded answers, built off the event loop ----------------------------------------------------------

def test_results_per_request_are_bounded(client):
    queries = [f"query {n}" for n in range(MAX_HITS // 1000 + 1)]
    detail = one_line_error(client.post("/search", json={"queries": queries, "k": 1000}), 422)
    assert f"{MAX_HITS:,}" in detail


def test_the_text_in_one_answer_is_bounded(client, monkeypatch):
    import retriever.serve.protocol as protocol

    monkeypatch.setattr(protocol, "MAX_ANSWER_CHARS", 2_000)
    detail = one_line_error(client.post("/search", json={"queries": ["dog"] * 20, "k": 10}), 413)
    assert "lower k" in detail
    assert client.get("/search?q=dog&k=2").status_code == 200


def test_answers_are_rendered_off_the_event_loop(client, monkeypatch):
    import retriever.serve.app as server

    threads = []
    original = server.render_answer

    def recording(*args):
        threads.append(threading.current_thread().name)
        return original(*args)

    monkeypatch.setattr(server, "render_answer", recording)
    assert client.get("/search?q=dog").status_code == 200
    loop_thread = client.portal.call(lambda: threading.current_thread().name)
    assert threads and threads[0] != loop_thread


# ---- 7. invalid text, 11. odd values -----------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    '{"queries": ["\\udc80"]}',
    '{"queries": [{"id": "\\ud800", "text": "dog"}]}',
    '{"queries": ["dog"], "index": "\\ud800"}',
    '{"documents": [{"_id": "\\ud800", "text": "x"}]}',
    '{"documents": [{"_id": "ok", "text": "bad \\udfff text"}]}',
    '{"documents": [{"_id": "ok", "title": "\\ud83d", "text": "x"}]}',
])
def test_lone_surrogates_in_requests_are_400_not_500(client, body):
    path = "/indexes/notes/documents" if "documents" in body else "/search"
    response = client.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code in (400, 404, 422), response.text
    one_line_error(response, response.status_code)


@pytest.mark.parametrize("path", ["/indexes/notes/documents/%ED%A0%80", "/search?q=%ED%A0%80%FF",
                                  "/indexes/%FF/documents/x", "/search?q=a&index=%ED%A0%80"])
def test_invalid_utf8_in_urls_is_answered_without_a_500(client, path):
    response = client.get(path)
    assert response.status_code < 500, response.text
    assert response.headers["content-type"].startswith("application/json")


@pytest.mark.parametrize("sent, stored", [("%FF", "\ufffd"), ("x%C3", "x\ufffd")])
def test_invalid_utf8_in_a_path_is_a_400_and_deletes_nothing(client, sent, stored):
    """The path's bad bytes once read as U+FFFD: the delete removed the document whose id is that character."""
    assert client.post("/indexes/notes/documents", json={"documents": [{"_id": stored, "text": "x"}]}).status_code == 201
    assert "not valid UTF-8" in one_line_error(client.delete(f"/indexes/notes/documents/{sent}"), 400)
    quoted = "".join(f"%{byte:02X}" for byte in stored.encode("utf-8"))
    assert client.get(f"/indexes/notes/documents/{quoted}").json()["document"]["doc_id"] == stored


@pytest.mark.parametrize("query, parameter", [("q=%FF%FE", "q"), ("q=a+%ED%A0%80+b", "q"),
                                              ("q=dog&mode=hybr%C3", "mode"), ("q=dog&index=%FFx", "index")])
def test_invalid_utf8_in_a_query_string_is_a_400_naming_the_parameter(client, query, parameter):
    """As POST refuses the same bytes: never searched as U+FFFD."""
    response = client.get(f"/search?{query}")
    assert f"'{parameter}'" in one_line_error(response, 400) and response.json()["parameter"] == parameter


@pytest.mark.parametrize("method, path, body, field", [
    ("post", "/search", {"queries": ["dog"], "wehre": {"lang": "en"}}, "wehre"),
    ("post", "/search", {"queries": [{"text": "dog", "idd": "q1"}]}, "idd"),
    ("post", "/indexes/notes/documents", {"documents": [{"_id": "n", "text": "x"}], "upsrt": True}, "upsrt"),
    ("post", "/indexes", {"name": "other", "documents": [{"_id": "n", "text": "x"}], "calibrater": "none"},
     "calibrater"),
    ("get", "/search?q=dog&wehre=lang%3Den", None, "wehre"),
])
def test_a_field_the_api_does_not_know_is_a_422_naming_it(client, method, path, body, field):
    """A misspelt filter once answered 200, unfiltered."""
    response = client.post(path, json=body) if method == "post" else client.get(path)
    assert field in one_line_error(response, 422)


@pytest.mark.parametrize("body", ['{"documents": [{"_id": "n", "text": "x", "metadata": {"a": 1, "a": 2}}]}',
                                  '{"documents": [{"_id": "n", "_id": "m", "text": "x"}]}'])
def test_a_key_given_twice_in_a_json_object_is_refused_not_collapsed(client, body):
    response = client.post("/indexes/notes/documents", content=body, headers={"content-type": "application/json"})
    assert "given twice" in one_line_error(response, 400)
    assert client.get("/indexes/notes/documents/n").status_code == 404


def test_a_query_parameter_given_twice_is_a_422_naming_it(client):
    response = client.get("/search?q=dog&k=1&k=50")
    assert "'k'" in one_line_error(response, 422) and response.json()["parameter"] == "k"


@pytest.mark.parametrize("body", ['{"queries": ["dog"], "k": true}', '{"queries": ["dog"], "k": "3"}',
                                  '{"queries": ["dog"], "k": 2.5}', '{"queries": [7]}', '{"queries": "dog"}'])
def test_values_of_the_wrong_type_are_422_not_coerced(client, body):
    one_line_error(client.post("/search", content=body, headers={"content-type": "application/json"}), 422)


# ---- 9. concurrent writes; 11. descriptors of replaced versions ---------------------------------------------

def _open_version_files(index_dir: Path) -> set[str]:
    versions = os.path.realpath(index_dir)
    found = set()
    for descriptor in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{descriptor}")
        except OSError:
            continue
        if target.startswith(versions):
            found.add(target)
    return found


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors through /proc")
def test_concurrent_writes_all_succeed_and_replaced_versions_are_closed(client, index_dir):
    def write(number: int) -> tuple[int, int]:
        added = client.post("/indexes/notes/documents",
                            json={"documents": [{"_id": f"w{number}", "text": f"note number {number}"}]})
        searched = client.get(f"/search?q=note+{number}")
        deleted = client.delete(f"/indexes/notes/documents/d{number}")
        return added.status_code, searched.status_code, deleted.status_code

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(write, range(24)))
    assert all(status == (201, 200, 200) for status in statuses), statuses
    assert client.get("/indexes/notes").json()["documents"] == 60
    current = os.path.realpath(index_dir / "notes")
    assert client.get("/search?q=note").status_code == 200
    stale = {path for path in _open_version_files(index_dir) if not path.startswith(current + os.sep)}
    assert not stale, sorted(stale)[:5]


def test_concurrent_creates_of_one_name_are_one_201_and_409s_that_name_no_other_process(client, index_dir):
    """The refusals are conflicts (409, as an existing name is), and never blame another process for this one."""
    barrier = threading.Barrier(6)

    def create(_: int):
        barrier.wait()
        return client.post("/indexes", json={"name": "made", "documents": [{"_id": "a", "text": "a note"}],
                                             "calibrator": "none"})

    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(create, range(6)))
    assert sorted(answer.status_code for answer in answers) == [201] + [409] * 5, [a.text for a in answers]
    with writer_lock(index_dir, "held"):  # held by this process, as another request's write holds it
        answers += [client.post("/indexes", json={"name": "held", "documents": [{"_id": "a", "text": "a note"}]})]
    for answer in answers:
        if answer.status_code == 409:
            detail = one_line_error(answer, 409)
            assert answer.json()["code"] == "conflict" and ("being" in detail or "exists" in detail), detail
            assert "process" not in detail.replace("this process", "") and str(os.getpid()) not in detail, detail


# ---- 11. HTTP the application never sees --------------------------------------------------------------------

def _raw_request(url: str, payload: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as connection:
        connection.sendall(payload)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def test_protocol_errors_and_huge_headers_get_json_answers(index_dir):
    with serving_in_thread(create_app(index_dir, device="cpu")) as url:
        garbage = _raw_request(url, b"\x16\x03\x01 not http at all\r\n\r\n")
        head, _, body = garbage.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400") and json.loads(body)["status"] == 400
        huge = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (256 * 1024) + b"\r\n\r\n"
        head, _, body = _raw_request(url, huge).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 431") and json.loads(body)["status"] == 431
        fine = _raw_request(url, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert fine.startswith(b"HTTP/1.1 200")


def test_every_host_the_request_names_is_checked(tmp_path):
    """The authority of an absolute-form request line, every Host header (more than one is a 400), the port."""
    def status(head: bytes) -> int:
        answer = _raw_request(url, head + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        code = int(answer.partition(b"\r\n")[0].split()[1])
        assert code < 400 or json.loads(answer.partition(b"\r\n\r\n")[2])["status"] == code, answer
        return code

    with serving_in_thread(create_app(tmp_path, device="cpu")) as url:
        port = url.rpartition(":")[2].encode()
        assert status(b"GET /indexes HTTP/1.1\r\nHost: 127.0.0.1:" + port) == 200
        assert status(b"GET http://127.0.0.1:" + port + b"/indexes HTTP/1.1\r\nHost: 127.0.0.1:" + port) == 200
        assert status(b"GET http://evil.example/indexes HTTP/1.1\r\nHost: 127.0.0.1") == 421
        assert status(b"POST http://evil.example/indexes/notes/documents HTTP/1.1\r\nHost: 127.0.0.1") == 421
        assert status(b"GET http://127.0.0.1@evil.example/indexes HTTP/1.1\r\nHost: 127.0.0.1") == 421
        assert status(b"GET http://127.0.0.1/indexes HTTP/1.1\r\nHost: evil.example") == 421
        assert status(b"GET /indexes HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example") == 400
        assert status(b"GET /indexes HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: 127.0.0.1") == 400
        for host in (b"localhost:99999", b"localhost:abc", b"localhost:"):
            assert status(b"GET /indexes HTTP/1.1\r\nHost: " + host) == 421, host
        # No Host (HTTP/1.0 lets a client leave it out), or a blank one: a 400 that says so, not a name refused
        for request in (b"GET /indexes HTTP/1.0", b"GET /indexes HTTP/1.1", b"GET /indexes HTTP/1.1\r\nHost: "):
            answer = _raw_request(url, request + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            assert status(request) == 400
            assert json.loads(answer.partition(b"\r\n\r\n")[2])["detail"].startswith("the request names no host")


def test_a_port_in_use_or_a_missing_gpu_is_one_line_before_any_index_opens(tmp_path, monkeypatch):
    """From a CLI QA run: `serve --port` on a port in use opened every index, then printed uvicorn's bind error;
    `serve --device cuda` on a machine without CUDA started, each index refused in a warning of its own."""
    import socket

    import torch

    import retriever.serve.run as run
    from retriever.errors import RetrieverError

    def no_index_opens(*args, **kwargs):
        raise AssertionError("the indexes were opened")

    monkeypatch.setattr(run, "create_app", no_index_opens)
    first = run.listening_socket("127.0.0.1", 0)  # a server still opening its indexes holds its port already
    with pytest.raises(RetrieverError, match="is in use"):
        run.listening_socket("127.0.0.1", first.getsockname()[1])
    first.close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RetrieverError, match=rf"^port {port} on 127.0.0.1 is in use \(another server\?\): "
                                                 r"choose another with port$"):
            run.serve(tmp_path, port=port, device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RetrieverError, match="CUDA is not available on this machine"):
            run.serve(tmp_path, port=port, device="cuda")


def test_ctrl_c_stops_the_server_quietly(tmp_path, monkeypatch):
    """From the review: with the server on a socket of its own, uvicorn's clean shutdown on Ctrl-C raised the
    KeyboardInterrupt again (uvicorn.run swallowed it), and `retriever serve` ended 130, "interrupted"."""
    import uvicorn

    import retriever.serve.run as run

    def interrupted(self, sockets=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(uvicorn.Server, "run", interrupted)
    run.serve(tmp_path, port=0, device="cpu")  # returns: stopped as asked
