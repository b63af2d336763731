"""The MCP tools as an agent host uses them: the SDK's own client over stdio (`retriever mcp`, a subprocess) and over
streamable HTTP (`retriever serve`'s /mcp, behind its keys), each tool called and its answer checked, and what the
HTTP API refuses refused here too."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from retriever.index import Index
from retriever.serve.access import AccessPolicy
from retriever.serve.app import create_app
from retriever.serve.protocol import HTTP_MAX_K, MAX_QUERY_CHARS
from retriever.serve.run import serving_in_thread
from tests.helpers import one_line_error

REPO = Path(__file__).resolve().parent.parent
WRITE_KEY = "write-key-0123456789abcdef"
READ_KEY = "read-key-0123456789abcdef"
# A long page (cut into passages) among short notes: a hit must carry where it matched, not the whole page.
SECTIONS = ["The lighthouse keeper trims the lamp wick each evening and logs passing ships.",
            "Sourdough starter needs flour and water every day to stay active and sour.",
            "Glaciers carve U-shaped valleys as they slowly grind over bedrock."]
LONG_PAGE = " ".join(f"{section} " * 12 + f"Section {number} ends here." for number, section in enumerate(SECTIONS))
DOCUMENTS = [
    {"_id": "cats", "title": "Cats", "text": "Cats are small domesticated carnivores that purr when content.",
     "metadata": {"kind": "animal", "year": 2021}},
    {"_id": "rust", "title": "Rust", "text": "Rust is a systems programming language focused on memory safety.",
     "metadata": {"kind": "code", "year": 2015}},
    {"_id": "bread", "title": "Bread", "text": "Bread is baked from a dough of flour, water and yeast.",
     "metadata": {"kind": "food", "year": 2020}},
    {"_id": "handbook", "title": "Field handbook", "text": LONG_PAGE, "metadata": {"kind": "manual", "year": 2019}},
]
TOOLS = {"search", "get_document", "list_indexes"}


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory) -> Path:
    """One index of DOCUMENTS with the embedded model, as `retriever build` makes it (the long page cut)."""
    folder = tmp_path_factory.mktemp("mcp")
    corpus = folder / "notes.jsonl"
    corpus.write_text("\n".join(json.dumps(document) for document in DOCUMENTS), encoding="utf-8")
    Index.build(corpus, "notes", folder / "indexes", calibrator="none", device="cpu", max_length=64)
    return folder / "indexes"


async def _exercise(client: Client) -> dict:
    """Every tool called as an agent would, with the answers and errors an agent reads."""
    listed = await client.list_tools()
    found = {"tools": {tool.name: tool for tool in listed.tools}}
    calls = {
        "pet": ("search", {"query": "which animal purrs?", "k": 2}),
        "glacier": ("search", {"query": "how do glaciers shape valleys", "k": 1, "mode": "dense"}),
        "filtered": ("search", {"query": "memory safety", "filter": {"year": {"$gte": 2020}}, "mode": "keyword"}),
        "with_text": ("search", {"query": "memory safety", "k": 1, "include_text": True}),
        "misspelt_field": ("search", {"query": "x", "filter": {"yaer": 2020}}),
        "bad_filter": ("search", {"query": "x", "filter": {"year": {"$bogus": 1}}}),
        "missing_index": ("search", {"query": "x", "index": "notse"}),
        "too_many": ("search", {"query": "x", "k": HTTP_MAX_K + 1}),
        "no_query": ("search", {"k": 3}),
        "number_query": ("search", {"query": 5}),
        "too_long": ("search", {"query": "word " * (MAX_QUERY_CHARS // 5 + 1)}),
        "document": ("get_document", {"id": "rust"}),
        "missing_document": ("get_document", {"id": "nothing", "index": "notes"}),
        "filter_as_where": ("search", {"query": "x", "where": {"year": 1900}}),  # the library's name for it
        "list_filter": ("search", {"query": "x", "filter": [1, 2]}),
        "empty_index": ("search", {"query": "x", "index": ""}),  # answered from the default index before
        # taken as k=1 and k=5 before (a QA run), where the HTTP API and the library refuse both
        "k_true": ("search", {"query": "x", "k": True}),
        "k_text": ("search", {"query": "x", "k": "5"}),
        "text_flag": ("search", {"query": "x", "include_text": "yes"}),
        "indexes": ("list_indexes", {}),
    }
    for name, (tool, arguments) in calls.items():
        found[name] = await client.call_tool(tool, arguments)
    glacier = found["glacier"].structured_content["hits"][0]
    found["window"] = await client.call_tool("get_document", {"id": glacier["id"], "start": glacier["span"][0],
                                                               "end": glacier["span"][1], "context": 20})
    found["past_end"] = await client.call_tool("get_document", {"id": "rust", "start": 10_000})
    first = await client.call_tool("get_document", {"id": glacier["id"], "max_chars": 100})
    found["paged"] = [first, await client.call_tool("get_document", {"id": glacier["id"], "max_chars": 100,
                                                                      "start": first.structured_content["end"]})]
    return found


def _check_answers(found: dict) -> None:
    assert set(found["tools"]) == TOOLS
    search = found["tools"]["search"]
    assert {"query", "index", "k", "mode", "filter", "include_text"} <= set(search.input_schema["properties"])
    assert search.input_schema["required"] == ["query"] and search.input_schema["additionalProperties"] is False
    assert search.output_schema is not None and "hits" in search.output_schema["properties"]
    assert all(tool.annotations.read_only_hint for tool in found["tools"].values())

    pet = found["pet"]
    assert not pet.is_error
    hits = pet.structured_content["hits"]
    assert hits[0]["id"] == "cats" and hits[0]["metadata"] == {"kind": "animal", "year": 2021}
    assert hits[0]["text"] is None and hits[0]["passage"].startswith("Cats are small")
    assert pet.structured_content["index"] == "notes" and pet.structured_content["version"] == 1

    glacier = found["glacier"].structured_content["hits"][0]  # the long page, by its passage on glaciers
    assert glacier["id"] == "handbook" and "Glaciers carve" in glacier["passage"]
    assert len(glacier["passage"]) < len(LONG_PAGE) / 2 and glacier["text"] is None
    start, end = glacier["span"]
    assert LONG_PAGE[start:end] == glacier["passage"]
    window = found["window"].structured_content
    assert window["start"] == start - 20 and window["end"] == min(end + 20, len(LONG_PAGE))
    assert window["text"] == LONG_PAGE[window["start"]:window["end"]] and window["length"] == len(LONG_PAGE)
    # read on from an answer's end: what follows it, no text already read
    assert [(part.structured_content["start"], part.structured_content["end"]) for part in found["paged"]] == [
        (0, 100), (100, 200)]
    assert "".join(part.structured_content["text"] for part in found["paged"]) == LONG_PAGE[:200]

    assert [hit["id"] for hit in found["filtered"].structured_content["hits"]] == []  # rust is from 2015
    assert found["with_text"].structured_content["hits"][0]["text"] == DOCUMENTS[1]["text"]
    assert "did you mean 'year'?" in found["misspelt_field"].structured_content["warnings"][0]
    assert "source" not in found["misspelt_field"].structured_content["warnings"][0]  # not filtered on here

    document = found["document"].structured_content
    assert (document["id"], document["text"], document["start"], document["end"]) == (
        "rust", DOCUMENTS[1]["text"], 0, len(DOCUMENTS[1]["text"]))
    listed = found["indexes"].structured_content["indexes"]
    assert [(index["name"], index["default"], index["documents"]) for index in listed] == [("notes", True, 4)]
    assert listed[0]["passages"] > 4 and listed[0]["fields"] == ["kind", "year"]
    assert "folder" not in listed[0]

    errors = {name: found[name] for name in ("bad_filter", "missing_index", "too_many", "no_query", "number_query",
                                             "too_long", "missing_document", "past_end", "filter_as_where",
                                             "list_filter", "empty_index", "k_true", "k_text", "text_flag")}
    assert all(result.is_error for result in errors.values())
    text = {name: result.content[0].text for name, result in errors.items()}
    assert all("\n" not in line for line in text.values())
    assert "unknown operator '$bogus'" in text["bad_filter"]
    assert "no index named 'notse'" in text["missing_index"] and "did you mean 'notes'?" in text["missing_index"]
    assert "<index home>" in text["missing_index"]  # no server path
    assert str(HTTP_MAX_K) in text["too_many"] and "k: " in text["too_many"]
    # the argument at fault named, `query` too (the HTTP API's own locations, "query" among them, are left out)
    assert text["no_query"].endswith("query: Field required") and "query: " in text["number_query"]
    assert f"at most {MAX_QUERY_CHARS:,}" in text["too_long"]
    assert "no document 'nothing' in index 'notes'" in text["missing_document"]
    assert "past the document's end" in text["past_end"]
    assert "where: Extra inputs are not permitted (did you mean 'filter'?); search takes query, index, k" in \
        text["filter_as_where"]  # answered unfiltered before
    assert "invalid index name ''" in text["empty_index"]
    assert text["list_filter"].endswith('filter: must be a JSON object such as {"lang": "en"}, got a list')
    assert all("k: Input should be a valid integer" in text[name] for name in ("k_true", "k_text"))
    assert "include_text: Input should be a valid boolean" in text["text_flag"]


def _over_http(url: str, key: str | None, host: str | None = None) -> dict:
    headers = {**({"Authorization": f"Bearer {key}"} if key else {}), **({"Host": host} if host else {})}

    async def session():
        transport = streamable_http_client(f"{url}/mcp", http_client=httpx2.AsyncClient(headers=headers, timeout=120))
        async with Client(transport) as client:
            return await _exercise(client)

    return asyncio.run(session())


def test_over_http_behind_keys_a_read_only_key_calls_every_tool_and_no_key_is_refused(index_dir):
    access = AccessPolicy.create(api_key=WRITE_KEY, read_only_api_key=READ_KEY)
    with serving_in_thread(create_app(index_dir, device="cpu", access=access)) as url:
        _check_answers(_over_http(url, READ_KEY))  # none of the tools writes
        found = _over_http(url, WRITE_KEY)
        assert found["pet"].structured_content == _over_http(url, READ_KEY)["pet"].structured_content
        # Refused before MCP reads a byte, as every other path: no key, a wrong key, a Host not served.
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        for headers, status in (({}, 401), ({"Authorization": "Bearer not-the-key-0123456789"}, 401),
                                ({"Authorization": f"Bearer {READ_KEY}", "Host": "attacker.example"}, 421)):
            answer = httpx.post(f"{url}/mcp", json=initialize, headers=headers, timeout=30)
            assert answer.status_code == status and answer.json()["status"] == status
        with pytest.raises(Exception) as refused:  # the SDK's client gets no answer without a key
            _over_http(url, None)
        assert any(isinstance(leaf, MCPError) for leaf in _leaves(refused.value))


def _leaves(error: BaseException) -> list[BaseException]:
    """ERROR, or the errors an exception group (anyio's task groups) holds, however deep."""
    nested = getattr(error, "exceptions", None)
    return [leaf for inner in nested for leaf in _leaves(inner)] if nested else [error]


def test_over_stdio_an_agent_host_lists_the_tools_and_each_answers(index_dir):
    """`retriever mcp` as a host launches it: a subprocess speaking MCP on stdin and stdout."""
    # The test's environment whole (the SDK passes a host's few safe variables only): the session's ONNX cache, never
    # the user's.
    server = StdioServerParameters(command=sys.executable, args=["-m", "cli.main", "mcp", "--index-dir",
                                                                 str(index_dir), "--device", "cpu"], cwd=str(REPO),
                                   env=dict(os.environ))

    async def session():
        async with Client(server, read_timeout_seconds=120) as client:
            return await _exercise(client)

    _check_answers(asyncio.run(session()))


def test_answers_over_http_and_mcp_name_no_server_folder(tmp_path, tiny_bert):
    """An index built from a folder records the folder it read (absolute, for `sync`): a search's hits and a fetched
    document show the file's path within it, never the server's folder."""
    folder = tmp_path / "private-notes"
    (folder / "garden").mkdir(parents=True)
    (folder / "garden" / "tomatoes.md").write_text("# Tomatoes\n\nThe tomatoes ripen late in a cold August.\n")
    (folder / "ships.txt").write_text("The lighthouse keeper logs every passing ship.\n")
    Index.build(folder, "notes", tmp_path / "indexes", model=str(tiny_bert), calibrator="none", device="cpu")
    access = AccessPolicy.create(api_key=WRITE_KEY)
    headers = {"Authorization": f"Bearer {WRITE_KEY}"}
    with serving_in_thread(create_app(tmp_path / "indexes", device="cpu", access=access)) as url:
        answers = [httpx.get(f"{url}/search", params={"q": "tomatoes", "include": "text,metadata"}, headers=headers,
                             timeout=60).text,
                   httpx.get(f"{url}/indexes/notes/documents/garden/tomatoes.md", headers=headers, timeout=60).text,
                   httpx.get(f"{url}/indexes/notes", headers=headers, timeout=60).text]
        # a filter could read the folder out a character at a time; a sync's error and notes would name it
        probes = [httpx.get(f"{url}/search", params={"q": "tomatoes", "where": json.dumps(where)}, headers=headers,
                            timeout=60) for where in ({"folder": {"$gte": str(tmp_path)}},
                                                      {"$not": {"source": {"$lt": "/u"}}})]
        assert [one_line_error(probe, 400) for probe in probes] == [
            f"{field}: the server does not filter on it (its values are paths on the server)"
            for field in ("folder", "source")]
        os.symlink(tmp_path / "gone" / "note.md", folder / "broken.md")
        synced = httpx.post(f"{url}/indexes/notes/sync", headers=headers, timeout=60)
        assert synced.json()["notes"] == ["skipped broken.md: a broken symbolic link (to a path on the server, which "
                                          "does not exist)"]
        folder.rename(tmp_path / "moved")
        moved = httpx.post(f"{url}/indexes/notes/sync", headers=headers, timeout=60)
        assert one_line_error(moved, 400) == "index 'notes' was built from private-notes, which is no longer a folder"
        answers += [synced.text, moved.text]

        async def session():
            transport = streamable_http_client(f"{url}/mcp", http_client=httpx2.AsyncClient(headers=headers,
                                                                                             timeout=60))
            async with Client(transport) as client:
                found = await client.call_tool("search", {"query": "tomatoes", "k": 2})
                document = await client.call_tool("get_document", {"id": "garden/tomatoes.md"})
                listed = await client.call_tool("list_indexes", {})
                return found, document, listed

        found, document, listed = asyncio.run(session())
    # `folder` is no field to offer an agent: its values (the server's folder) are shown nowhere
    assert "folder" not in listed.structured_content["indexes"][0]["fields"]
    assert "path" in listed.structured_content["indexes"][0]["fields"]
    hit = found.structured_content["hits"][0]
    assert hit["path"] == "garden/tomatoes.md" and "folder" not in hit["metadata"]
    assert "folder" not in document.structured_content["metadata"]
    shown = answers + [json.dumps(found.structured_content), json.dumps(document.structured_content)]
    assert all(str(tmp_path) not in text for text in shown), shown
    fetched = json.loads(answers[1])["document"]
    assert fetched["metadata"]["path"] == "garden/tomatoes.md" and fetched["source"] == "private-notes"  # its name


def test_over_stdio_a_line_that_does_not_parse_is_answered_and_the_server_goes_on(index_dir):
    """The SDK's stdio transport dropped such a line: a host that sent a lone surrogate waited for ever."""
    import select
    import subprocess

    server = subprocess.Popen([sys.executable, "-m", "cli.main", "mcp", "--index-dir", str(index_dir), "--device",
                               "cpu"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              cwd=REPO)

    def ask(line: str) -> dict:
        server.stdin.write(line.encode() + b"\n")
        server.stdin.flush()
        ready, _, _ = select.select([server.stdout], [], [], 60)
        assert ready, f"no answer to {line[:60]!r}"
        return json.loads(server.stdout.readline())

    try:
        started = ask(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}}))
        assert started["id"] == 1 and "result" in started
        server.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode() + b"\n")
        surrogate = ask('{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "search", '
                        '"arguments": {"query": "ab\\ud800cd"}}}')
        assert surrogate["id"] == 3 and surrogate["error"]["code"] == -32700
        assert ask("this is not json") == {"jsonrpc": "2.0", "id": None, "error": {
            "code": -32700, "message": "Parse error: Invalid JSON: expected ident at line 1 column 2"}}
        server.stdin.write(b"\n" + b'{"jsonrpc": "2.0", "id": 8, "error": {"code": 1}}\n')  # answered: neither
        assert ask('{"no": "message"}')["error"]["code"] == -32600
        found = ask(json.dumps({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
            "name": "search", "arguments": {"query": "which animal purrs?", "k": 1}}}))
        assert found["id"] == 4 and found["result"]["structuredContent"]["hits"][0]["id"] == "cats"
    finally:
        server.stdin.close()
        server.wait(timeout=60)


def test_over_stdio_requests_piped_in_are_all_answered_when_stdin_closes(index_dir):
    """From a CLI QA run: five requests piped in, then end of input, got two answers (the SDK cancels what is still
    running when its input ends)."""
    import subprocess

    lines = [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"}]
    lines += [{"jsonrpc": "2.0", "id": 10 + number, "method": "tools/call", "params": {
        "name": "search", "arguments": {"query": query, "k": 1}}}
        for number, query in enumerate(["which animal purrs?", "a dog", "the sea", "music", "a kitchen knife"])]
    piped = subprocess.run([sys.executable, "-m", "cli.main", "mcp", "--index-dir", str(index_dir), "--device", "cpu"],
                           input="".join(json.dumps(line) + "\n" for line in lines), capture_output=True, text=True,
                           timeout=120, cwd=REPO)
    answers = [json.loads(line) for line in piped.stdout.splitlines() if line.strip()]
    assert sorted(answer["id"] for answer in answers) == [1, 10, 11, 12, 13, 14]
    assert all("result" in answer for answer in answers)
    # a request the host cancelled gets no answer: the session does not wait a minute for one (from the review)
    cancelled = lines[:3] + [{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 10}}]
    subprocess.run([sys.executable, "-m", "cli.main", "mcp", "--index-dir", str(index_dir), "--device", "cpu"],
                   input="".join(json.dumps(line) + "\n" for line in cancelled), capture_output=True, text=True,
                   timeout=45, cwd=REPO)


def test_a_broken_link_s_target_is_no_path_in_a_server_s_answer():
    from retriever.serve.public import without_folder

    for target in ("/home/alice/Backups (2019)/old.md", "../../home/alice/private/old.md", "/srv/notes-archive/x.md"):
        note = f"skipped old.md: a broken symbolic link (to {target}, which does not exist)"
        assert without_folder(note, "/srv/notes") == ("skipped old.md: a broken symbolic link (to a path on the "
                                                      "server, which does not exist)")
    assert without_folder("index 'n' was built from /srv/notes, which is no longer a folder", "/srv/notes") == \
        "index 'n' was built from notes, which is no longer a folder"
