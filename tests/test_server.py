"""`retriever serve`'s HTTP API through FastAPI's test client: the contract, micro-batching, versions, errors."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from retriever.errors import RetrieverError
from retriever.index import Index
from retriever.serve.protocol import MAX_BODY_BYTES, MAX_DOCUMENTS, HTTP_MAX_K as MAX_K, MAX_QUERIES
from retriever.serve.app import create_app
from tests.helpers import build_notes, documents, one_line_error, write_corpus


@pytest.fixture()
def index_dir(tmp_path, tiny_bert) -> Path:
    return build_notes(tmp_path / "indexes", tiny_bert, 120)


@pytest.fixture()
def client(index_dir):
    with TestClient(create_app(index_dir, device="cpu"), base_url="http://127.0.0.1") as test_client:
        yield test_client


def test_health_and_index_listing(client, index_dir):
    assert client.get("/health").json() == {"status": "ok"}  # open to anyone: nothing about the indexes
    listed = client.get("/indexes").json()["indexes"]
    assert [entry["name"] for entry in listed] == ["notes"]
    info = client.get("/indexes/notes").json()
    assert info["documents"] == 120 and info["calibrator"] == "sn" and info["version"] == listed[0]["version"]
    assert info["segments"] and "search_settings" in info
    assert info["calibrator"] == listed[0]["calibrator"]  # one label for the calibrator (auto's: what it chose)
    assert client.get("/docs").status_code == 200 and client.get("/openapi.json").json()["paths"]["/search"]


def test_the_api_docs_load_nothing_from_outside(client):
    """/docs works offline: Swagger UI's script and styles come from this server, not a CDN."""
    import re

    page = client.get("/docs")
    assert page.status_code == 200
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page.text), page.text  # no external script or style
    for asset in re.findall(r"""/docs-assets/[\w.-]+""", page.text):
        fetched = client.get(asset)
        assert fetched.status_code == 200 and len(fetched.content) > 100, asset
    assert "swagger-ui-bundle.js" in page.text and "swagger-ui.css" in page.text


def test_get_search_answers_in_the_cli_schema_with_the_version(client, index_dir):
    text = documents(120)[7]["text"]
    answer = client.get("/search", params={"q": text, "k": 3, "index": "notes"}).json()
    index = Index.open("notes", index_dir, device="cpu")
    assert answer["index"] == "notes" and answer["version"] == index.snapshot.manifest.version and answer["k"] == 3
    [record] = answer["queries"]
    assert record["query_id"] is None and record["query"] == text
    assert [hit["rank"] for hit in record["results"]] == [1, 2, 3]
    assert answer["mode"] == record["mode"] == "hybrid"  # the default, with a keyword index
    first = record["results"][0]
    # A hit carries where it matched and its metadata; its whole text only when asked (include=text).
    assert first == {"rank": 1, "doc_id": "d7", "score": first["score"], "dense_score": first["dense_score"],
                     "keyword_score": first["keyword_score"], "dense_rank": 1, "keyword_rank": 1, "title": "note 7",
                     "metadata": None, "passage": text, "span": [0, len(text)], "page": None, "length": len(text)}
    asked = client.get("/search", params={"q": text, "k": 3, "index": "notes", "include": "text"}).json()
    assert asked["queries"][0]["results"][0] == {**{key: value for key, value in first.items() if key != "metadata"},
                                                 "text": text}
    bare = client.post("/search", json={"queries": [text], "k": 3, "include": []}).json()["queries"][0]["results"][0]
    assert "text" not in bare and "metadata" not in bare and bare["passage"] == text
    for refused in (client.get("/search", params={"q": text, "include": "txt"}),
                    client.post("/search", json={"queries": [text], "include": ["txt"]})):
        assert refused.status_code == 422 and "include" in refused.json()["detail"]
    expected = index.search(text, 3)
    assert [hit["doc_id"] for hit in record["results"]] == [hit.doc_id for hit in expected]
    # The server encodes on ONNX Runtime, the library here on PyTorch: the same numbers to float precision.
    assert [hit["score"] for hit in record["results"]] == pytest.approx([hit.score for hit in expected], abs=1e-4)
    # The only index is the default; the same query gives the same answer.
    assert client.get("/search", params={"q": text, "k": 3}).json()["queries"] == answer["queries"]


def test_post_search_takes_texts_and_ids_and_matches_single_queries(client):
    texts = [record["text"] for record in documents(120)[:5]]
    queries = [texts[0], {"id": "q-two", "text": texts[1]}, *texts[2:]]
    answer = client.post("/search", json={"queries": queries, "k": 4, "index": "notes"}).json()
    assert [record["query_id"] for record in answer["queries"]] == [None, "q-two", None, None, None]
    assert [record["results"][0]["doc_id"] for record in answer["queries"]] == ["d0", "d1", "d2", "d3", "d4"]
    for text, record in zip(texts, answer["queries"]):
        single = client.get("/search", params={"q": text, "k": 4}).json()["queries"][0]["results"]
        assert [hit["doc_id"] for hit in single] == [hit["doc_id"] for hit in record["results"]]


def test_concurrent_queries_are_micro_batched_and_answered_as_if_alone(client):
    texts = [record["text"] for record in documents(120)[:48]]
    alone = {text: client.get("/search", params={"q": text, "k": 5}).json()["queries"][0]["results"]
             for text in texts}
    batcher = client.app.state.server_state["batcher"]
    batches_before, queries_before = batcher.batches, batcher.queries
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda text: client.get("/search", params={"q": text, "k": 5}).json(), texts))
    for text, answer in zip(texts, answers):
        assert [h["doc_id"] for h in answer["queries"][0]["results"]] == [h["doc_id"] for h in alone[text]]
        # Padded beside longer queries a vector moves in its last float digits only.
        assert [h["score"] for h in answer["queries"][0]["results"]] == pytest.approx(
            [h["score"] for h in alone[text]], abs=1e-4)
    assert batcher.queries - queries_before == len(texts)
    assert batcher.batches - batches_before < len(texts)  # some requests shared an encoder call


def test_a_version_committed_by_another_writer_is_served_by_the_next_request(client, index_dir, tmp_path):
    before = client.get("/search", params={"q": "a violin", "k": 3}).json()["version"]
    extra = write_corpus(tmp_path / "extra.jsonl", [{"_id": "zebra", "text": "Zebras graze on the open savanna."}])
    Index.open("notes", index_dir, device="cpu").add(extra)  # what `retriever add` does, outside the server
    answer = client.get("/search", params={"q": "Zebras graze on the open savanna.", "k": 1}).json()
    assert answer["version"] != before and answer["version"] == Index.open("notes", index_dir).snapshot.manifest.version
    assert answer["queries"][0]["results"][0]["doc_id"] == "zebra"


def test_add_show_and_delete_documents(client):
    version = client.get("/indexes/notes").json()["version"]
    added = client.post("/indexes/notes/documents",
                        json={"documents": [{"_id": "new/1", "title": "Kites", "text": "Kites fly over the dunes."}]})
    assert added.status_code == 201, added.text
    assert added.json()["added"] == 1 and added.json()["documents"] == 121 and added.json()["version"] != version
    found = client.get("/search", params={"q": "Kites fly over the dunes.", "k": 1}).json()
    assert found["version"] == added.json()["version"] and found["queries"][0]["results"][0]["doc_id"] == "new/1"
    shown = client.get("/indexes/notes/documents/new/1").json()["document"]
    assert shown["doc_id"] == "new/1" and shown["title"] == "Kites" and shown["text"] == "Kites fly over the dunes."

    deleted = client.delete("/indexes/notes/documents/new/1")
    assert deleted.status_code == 200 and deleted.json()["deleted"] == 1 and deleted.json()["documents"] == 120
    after = client.get("/search", params={"q": "Kites fly over the dunes.", "k": 5}).json()
    assert "new/1" not in [hit["doc_id"] for hit in after["queries"][0]["results"]]
    assert "new/1" in one_line_error(client.get("/indexes/notes/documents/new/1"), 404)
    assert "not in the index" in one_line_error(client.delete("/indexes/notes/documents/new/1"), 404)
    # an id holding a line break is reached as any other (a final one was cut: `tail%0A` deleted `tail`)
    added = client.post("/indexes/notes/documents", json={"documents": [{"_id": "line1\nline2", "text": "one"},
                                                                         {"_id": "tail\n", "text": "two"},
                                                                         {"_id": "tail", "text": "three"}]})
    assert added.status_code == 201
    assert client.get("/indexes/notes/documents/line1%0Aline2").json()["document"]["text"] == "one"
    assert client.delete("/indexes/notes/documents/tail%0A").json()["deleted"] == 1
    assert client.get("/indexes/notes/documents/tail").json()["document"]["text"] == "three"


def test_every_response_comes_from_exactly_one_version_while_a_writer_commits(client):
    """Documents added in version V appear only in answers from V or later; no request fails meanwhile."""
    added_in: dict[str, str] = {}
    failures: list[str] = []
    answers: list[dict] = []
    stop = threading.Event()

    def writer():
        for number in range(4):
            record = {"_id": f"w{number}", "text": f"Walruses number {number} rest on the icy shore."}
            response = client.post("/indexes/notes/documents", json={"documents": [record]})
            if response.status_code != 201:
                failures.append(response.text)
            added_in[record["_id"]] = response.json()["version"]
        stop.set()

    def reader():
        while not stop.is_set():
            response = client.get("/search", params={"q": "Walruses rest on the icy shore.", "k": 10})
            if response.status_code != 200:
                failures.append(response.text)
            else:
                answers.append(response.json())

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures
    assert len({answer["version"] for answer in answers}) >= 2
    for answer in answers:
        for hit in answer["queries"][0]["results"]:
            if hit["doc_id"] in added_in:
                assert answer["version"] >= added_in[hit["doc_id"]]  # version names sort by commit time


def test_raw_space_ranks_by_uncalibrated_cosine(tmp_path, tiny_bert):
    folder = tmp_path / "plain"
    Index.build(write_corpus(tmp_path / "plain.jsonl", documents(120)), "plain", folder, model=str(tiny_bert),
                calibrator="none", device="cpu")
    with TestClient(create_app(folder, device="cpu"), base_url="http://127.0.0.1") as client:
        text = documents(120)[11]["text"]
        calibrated = client.get("/search", params={"q": text, "k": 8, "mode": "dense"}).json()
        raw = client.get("/search", params={"q": text, "k": 8, "space": "raw"}).json()
    assert raw["space"] == "raw" and calibrated["space"] == "calibrated"
    # With no calibrator the two spaces are the same, so an exact raw ranking equals the index's.
    assert [h["doc_id"] for h in raw["queries"][0]["results"]] == [h["doc_id"] for h in calibrated["queries"][0]["results"]]
    assert [h["score"] for h in raw["queries"][0]["results"]] == pytest.approx(
        [h["score"] for h in calibrated["queries"][0]["results"]], abs=1e-3)


def test_raw_space_differs_from_calibrated_where_calibration_changes_the_space(client):
    text = documents(120)[3]["text"]
    raw = client.get("/search", params={"q": text, "k": 10, "space": "raw"}).json()["queries"][0]["results"]
    calibrated = client.get("/search", params={"q": text, "k": 10}).json()["queries"][0]["results"]
    assert raw[0]["doc_id"] == calibrated[0]["doc_id"] == "d3"
    assert [h["score"] for h in raw] != pytest.approx([h["score"] for h in calibrated], abs=1e-3)


def test_bad_search_requests_get_json_errors_with_the_right_status(client, index_dir, tmp_path, tiny_bert):
    assert "k" in one_line_error(client.get("/search", params={"q": "x", "k": 0}), 422)
    assert "k" in one_line_error(client.get("/search", params={"q": "x", "k": MAX_K + 1}), 422)
    assert "q" in one_line_error(client.get("/search"), 422)
    assert "empty query" in one_line_error(client.get("/search", params={"q": "   "}), 400)
    assert "empty query" in one_line_error(client.post("/search", json={"queries": ["ok", ""]}), 400)
    # the field at fault named (from a QA run: null), and a query of NUL or a zero-width space is blank too
    assert client.get("/search", params={"q": "\x00"}).json()["parameter"] == "q"
    assert client.post("/search", json={"queries": ["ok", "\u200b"]}).json()["parameter"] == "queries"
    assert "no query" in one_line_error(client.post("/search", json={"queries": []}), 400)
    assert "no index named 'nope'" in one_line_error(client.get("/search", params={"q": "x", "index": "nope"}), 404)
    assert "invalid index name" in one_line_error(client.get("/search", params={"q": "x", "index": "my index"}), 400)
    assert "space" in one_line_error(client.get("/search", params={"q": "x", "space": "sideways"}), 422)
    assert "queries" in one_line_error(client.post("/search", json={"queries": ["x"] * (MAX_QUERIES + 1)}), 413)
    assert "characters" in one_line_error(client.get("/search", params={"q": "x" * 10_001}), 413)
    assert "not valid JSON" in one_line_error(
        client.post("/search", content=b'{"queries": ["x",]}', headers={"content-type": "application/json"}), 400)
    assert "queries" in one_line_error(client.post("/search", json={"k": 3}), 422)
    # JSON sent as a form (curl -d without the header) is told what the API reads
    assert "content-type: application/json" in one_line_error(
        client.post("/search", content=b'{"queries": ["x"]}',
                    headers={"content-type": "application/x-www-form-urlencoded"}), 400)
    one_line_error(client.get("/indexes/nope"), 404)
    # With two indexes, one not named is the most recently written, as in the CLI; the answer names it.
    Index.build(write_corpus(tmp_path / "other.jsonl", documents(80)), "other", index_dir, model=str(tiny_bert),
                calibrator="none", device="cpu")
    assert client.get("/search", params={"q": "x"}).json()["index"] == "other"
    assert client.get("/search", params={"q": "x", "index": "notes"}).json()["index"] == "notes"
    for body in (b'{"queries": ["gz\xffip"]}', b"[" * 100_000 + b"]" * 100_000, b'{"queries": ["x"], "k": 1' + b"0" * 5000
                 + b"}"):  # FastAPI said "There was an error parsing the body", with no code
        refused = client.post("/search", content=body, headers={"content-type": "application/json"})
        assert one_line_error(refused, 400).startswith("the request body is not valid JSON: not UTF-8 text")
        assert refused.json()["code"] == "bad_input"


def test_an_empty_index_name_a_repeated_filter_key_and_a_query_parameter_a_path_does_not_take_are_refused(client):
    """Each answered as if it were not there (the default index, the last key's value, no index named)."""
    assert "invalid index name ''" in one_line_error(client.get("/search", params={"q": "guitar", "index": ""}), 400)
    assert "invalid index name ''" in one_line_error(client.post("/search", json={"queries": ["guitar"],
                                                                                   "index": ""}), 400)
    repeated = client.get("/search", params={"q": "guitar", "where": '{"year": 2001, "year": 2002}'})
    assert one_line_error(repeated, 422) == 'where: the key "year" is given twice in one object'
    assert one_line_error(client.post("/search?index=notes", json={"queries": ["guitar"]}), 422).startswith(
        "index: Extra inputs are not permitted (POST /search takes no query parameters)")
    unknown_part = client.get("/search", params={"q": "guitar", "include": "bogus"})
    assert "unknown part 'bogus'" in one_line_error(unknown_part, 422)
    assert (unknown_part.json()["code"], unknown_part.json()["parameter"]) == ("bad_input", "include")
    assert client.get("/?q=guitar").status_code == 200  # the page: a browser may add what it likes


def test_bad_writes_get_json_errors_with_the_right_status(client):
    post = lambda body: client.post("/indexes/notes/documents", json=body)  # noqa: E731
    assert "already in the index" in one_line_error(post({"documents": [{"_id": "d1", "text": "again"}]}), 409)
    replaced = post({"documents": [{"_id": "d1", "text": "again, replaced"}], "upsert": True})
    assert replaced.status_code == 201 and replaced.json()["added"] == 1
    assert client.get("/indexes/notes/documents/d1").json()["document"]["text"] == "again, replaced"
    assert 'missing "text"' in one_line_error(post({"documents": [{"_id": "x"}]}), 400)
    assert "empty text" in one_line_error(post({"documents": [{"_id": "x", "text": "  "}]}), 400)
    assert "duplicate ids" in one_line_error(post({"documents": [{"_id": "x", "text": "a"}, {"_id": "x", "text": "b"}]}), 400)
    assert "no documents" in one_line_error(post({"documents": []}), 400)
    assert "documents" in one_line_error(post({"docs": []}), 422)
    too_many = [{"_id": f"n{i}", "text": "t"} for i in range(MAX_DOCUMENTS + 1)]
    assert "at most" in one_line_error(post({"documents": too_many}), 413)
    assert "MiB" in one_line_error(client.post("/indexes/notes/documents", content=b"x" * (MAX_BODY_BYTES + 1),
                                               headers={"content-type": "application/json"}), 413)
    assert "no index named" in one_line_error(client.post("/indexes/nope/documents",
                                                          json={"documents": [{"_id": "x", "text": "a"}]}), 404)
    # From a QA run: what was ignored or dropped is refused, naming it
    assert "'metdata' is not read" in one_line_error(post({"documents": [{"_id": "x", "text": "a",
                                                                         "metdata": {"year": 1999}}]}), 400)
    assert "'id' is not read" in one_line_error(post({"documents": [{"_id": "x", "id": "y", "text": "a"}]}), 400)
    assert "upsert: Input should be a valid boolean" in one_line_error(post({"documents": [{"_id": "d1", "text": "b"}],
                                                                             "upsert": "yes"}), 422)
    dry_run = client.delete("/indexes/notes/documents/d2?dry_run=true")  # it deleted
    assert one_line_error(dry_run, 422).startswith("dry_run: Extra inputs are not permitted (DELETE "
                                                   "/indexes/{name}/documents/{doc_id} takes no query parameters)")
    assert dry_run.json()["parameter"] == "dry_run"
    created = client.post("/indexes", json={"name": "pq", "documents": [{"_id": "a", "text": "x"}],
                                            "index_type": "ivfpq"})
    assert "from at least 256 vectors; this build has 1" in one_line_error(created, 400)  # a 500 before
    assert created.json()["parameter"] == "index_type"
    # Nothing above changed the index.
    assert client.get("/indexes/notes").json()["documents"] == 120


def test_a_body_without_a_declared_length_is_bounded_too(client):
    def chunks():
        for _ in range(MAX_BODY_BYTES // 2**16 + 2):
            yield b" " * 2**16

    response = client.post("/search", content=chunks(), headers={"content-type": "application/json"})
    one_line_error(response, 413)


def test_the_search_page_is_served(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'id="view"' in page.text and 'id="results"' in page.text and 'value="modes"' in page.text


def test_an_index_removed_while_served_answers_404_and_others_go_on(client, index_dir, tmp_path, tiny_bert):
    from retriever.versions.folder import remove_index

    Index.build(write_corpus(tmp_path / "other.jsonl", documents(80)), "other", index_dir, model=str(tiny_bert),
                calibrator="none", device="cpu")
    assert client.get("/search", params={"q": "a violin", "index": "other"}).status_code == 200
    remove_index(index_dir, "other")  # what `retriever remove other --yes` does
    assert "no index named 'other'" in one_line_error(client.get("/search", params={"q": "x", "index": "other"}), 404)
    assert client.get("/search", params={"q": "a violin", "index": "notes"}).status_code == 200
    assert [entry["name"] for entry in client.get("/indexes").json()["indexes"]] == ["notes"]


def test_an_index_whose_model_is_gone_answers_503_and_others_still_serve(client, index_dir, tmp_path, tiny_bert):
    import shutil

    model = tmp_path / "model-copy"
    shutil.copytree(tiny_bert, model)
    Index.build(write_corpus(tmp_path / "orphan.jsonl", documents(40)), "orphan", index_dir, model=str(model),
                calibrator="none", device="cpu")
    shutil.rmtree(model)
    assert "cannot encode text" in one_line_error(client.get("/search", params={"q": "x", "index": "orphan"}), 503)
    assert client.get("/search", params={"q": "a violin", "index": "notes"}).status_code == 200


def test_search_modes_answer_with_each_side_s_scores_and_ranks(client, index_dir):
    text = documents(120)[7]["text"]
    index = Index.open("notes", index_dir, device="cpu")
    for mode in ("dense", "keyword", "hybrid"):
        answer = client.get("/search", params={"q": text, "k": 5, "mode": mode}).json()
        assert answer["mode"] == answer["queries"][0]["mode"] == mode
        # What a score is, said with it: a fused score orders one answer, and reads nothing like a cosine.
        assert answer["scores"].startswith({"dense": "cosine", "keyword": "BM25", "hybrid": "fused"}[mode])
        hits = answer["queries"][0]["results"]
        expected = index.search(text, 5, mode=mode)
        assert [hit["doc_id"] for hit in hits] == [hit.doc_id for hit in expected]
        assert hits[0]["doc_id"] == "d7"
        assert (hits[0]["dense_score"] is None) == (mode == "keyword")
        assert (hits[0]["keyword_score"] is None) == (mode == "dense")
    posted = client.post("/search", json={"queries": [text], "k": 5, "mode": "hybrid", "fusion": "rrf",
                                          "weight": 0.7}).json()
    assert posted["scores"].startswith("reciprocal-rank fusion, 0.70 / (60 + dense rank)")
    posted = posted["queries"][0]["results"]
    assert [hit["doc_id"] for hit in posted] == [hit.doc_id for hit in index.search(text, 5, mode="hybrid",
                                                                                     fusion="rrf", weight=0.7)]
    assert "mode" in one_line_error(client.get("/search", params={"q": text, "mode": "fuzzy"}), 422)
    assert "weight" in one_line_error(client.post("/search", json={"queries": [text], "weight": 1.5}), 422)
    # not a number at all: said so, not that it is above 1
    assert "finite number" in one_line_error(client.get("/search", params={"q": text, "weight": "nan"}), 422)
    assert '"mode": "dense" only' in one_line_error(client.get("/search", params={"q": text, "space": "raw",
                                                                             "mode": "keyword"}), 400)


def test_an_index_without_a_keyword_index_searches_dense_and_refuses_keyword_mode(tmp_path, tiny_bert, monkeypatch):
    import retriever.store.segment as segment_module

    monkeypatch.setattr(segment_module, "STRUCTURES", [])  # segments as a release before keyword search wrote them
    folder = build_notes(tmp_path / "old", tiny_bert, 30)
    with TestClient(create_app(folder, device="cpu"), base_url="http://127.0.0.1") as client:
        detail = one_line_error(client.get("/search", params={"q": "day 7", "mode": "keyword"}), 400)
        assert "has no keyword index" in detail and "compacting it adds one" in detail
        answer = client.get("/search", params={"q": documents(30)[7]["text"], "k": 3}).json()
        assert answer["mode"] == "dense" and answer["queries"][0]["results"][0]["doc_id"] == "d7"


def test_a_hybrid_answer_never_depends_on_what_was_batched_with_it(index_dir):
    """A k=5 hybrid query batched with a k=500 one is searched with its own candidate lists: hybrid fusion reads
    each side's whole top list, so a longer list would change its scores."""
    from retriever.index import load_encoder
    from retriever.search.options import SearchOptions
    from retriever.search.searcher import Searcher
    from retriever.serve.batcher import SearchBatcher
    from retriever.serve.open_indexes import Served

    index = Index.open("notes", index_dir, device="cpu")
    texts = [record["text"] for record in documents(120)[:3]]
    options = SearchOptions(k=5, mode="hybrid")
    alone = index.search(texts[1], options)
    encoder = load_encoder(index.snapshot)
    encode, holding, release = encoder.encode, threading.Event(), threading.Event()

    def held_encode(batch, *args, **kwargs):
        holding.set()
        release.wait(10)  # the first batch waits here while the next two requests queue up together
        return encode(batch, *args, **kwargs)

    encoder.encode = held_encode
    served = Served(index, Searcher(index.snapshot), encoder)
    batcher = SearchBatcher()
    try:
        first = batcher.submit(served, [texts[0]], options)
        assert holding.wait(10)
        short = batcher.submit(served, [texts[1]], options)
        long = batcher.submit(served, [texts[2]], SearchOptions(k=500, mode="hybrid"))
        release.set()
        first.result(30)
        found = short.result(30)[0]
        long.result(30)
        assert batcher.batches == 2  # the two later requests did share a batch
    finally:
        batcher.close()
    assert [hit.doc_id for hit in found] == [hit.doc_id for hit in alone]
    assert [hit.score for hit in found] == pytest.approx([hit.score for hit in alone], abs=1e-5)


def test_min_score_leaves_out_weak_hits_and_an_empty_answer_means_no_good_match(client, index_dir):
    """A user asks for a floor on the cosine: every hit left meets it, in every mode that has a dense side; the
    library, the CLI's path and the server agree; keyword search, which has no cosine, refuses it."""
    text = documents(120)[7]["text"]
    index = Index.open("notes", index_dir, device="cpu")
    for mode in ("dense", "hybrid"):
        everything = index.search(text, 10, mode=mode)
        scores = sorted(hit.dense_score for hit in everything)
        floor = (scores[4] + scores[5]) / 2  # half the hits below, none near it (the server's encoder may differ
        # from this one in the last digits)
        kept = index.search(text, 10, mode=mode, min_score=floor)
        # the k best that reach the floor: of the dense list, or in the fused order of the hybrid candidates (each
        # side's top 100, the lists k=10 reads too). From a QA run: a hybrid list held to it after its top k were
        # taken came back with fewer than k where more reach it.
        passing = [hit.doc_id for hit in index.search(text, 100, mode=mode) if hit.dense_score >= floor]
        assert [hit.doc_id for hit in kept] == passing[:10] and len(kept) == min(10, len(passing))
        assert [hit.rank for hit in kept] == list(range(1, len(kept) + 1))
        served = client.get("/search", params={"q": text, "k": 10, "mode": mode, "min_score": floor}).json()
        assert [hit["doc_id"] for hit in served["queries"][0]["results"]] == [hit.doc_id for hit in kept]
    # a floor that 10 of the hybrid candidates reach, not all of the fused top 10: still 10 hits
    candidates = index.search(text, 100, mode="hybrid")
    floor = sorted((hit.dense_score for hit in candidates), reverse=True)[9]
    assert any(hit.dense_score < floor for hit in index.search(text, 10, mode="hybrid"))
    assert len(index.search(text, 10, mode="hybrid", min_score=floor)) == 10
    raw = index.search(text, 10, space="raw", min_score=0.5)
    assert all(hit.dense_score >= 0.5 for hit in raw)
    nothing = client.post("/search", json={"queries": ["zzz qqq"], "k": 5, "mode": "dense", "min_score": 1.0})
    assert nothing.json()["queries"][0]["results"] == []
    assert "min_score" in one_line_error(client.get("/search", params={"q": text, "min_score": 2}), 422)
    assert "keyword search has none" in one_line_error(
        client.get("/search", params={"q": text, "mode": "keyword", "min_score": 0.3}), 400)
    with pytest.raises(RetrieverError, match="between -1 and 1"):
        index.search(text, 5, min_score=-3)


def test_an_index_is_created_over_http_and_served_at_once(client, index_dir):
    """POST /indexes builds an index from the request's documents (default model), as `retriever build` does:
    searchable by the next request; an existing name is a 409 unless replace, which keeps the old version."""
    records = [{"_id": d["_id"], "title": d["title"], "text": d["text"]} for d in documents(30, prefix="h")]
    made = client.post("/indexes", json={"name": "fresh", "documents": records, "calibrator": "none"})
    assert made.status_code == 201, made.text
    assert made.json()["index"] == "fresh" and made.json()["documents"] == 30
    found = client.get("/search", params={"q": records[4]["text"], "index": "fresh", "k": 3}).json()
    assert found["index"] == "fresh" and found["queries"][0]["results"][0]["doc_id"] == "h4"
    assert "fresh" in [entry["name"] for entry in client.get("/indexes").json()["indexes"]]

    again = client.post("/indexes", json={"name": "fresh", "documents": records[:5], "calibrator": "none"})
    assert 'exists (30 documents' in (refused := one_line_error(again, 409)) and 'pass "replace": true' in refused
    replaced = client.post("/indexes", json={"name": "fresh", "documents": records[:5], "calibrator": "none",
                                             "replace": True})
    assert replaced.status_code == 201 and replaced.json()["documents"] == 5
    assert client.get("/indexes/fresh").json()["documents"] == 5
    assert len(Index.versions("fresh", index_dir)) == 2  # the replaced version is kept for a rollback

    assert "name" in one_line_error(client.post("/indexes", json={"name": "../out", "documents": records}), 400)
    assert "calibrator" in one_line_error(client.post("/indexes", json={"name": "x", "documents": records,
                                                                         "calibrator": "magic"}), 400)
    assert "record 1" in one_line_error(client.post("/indexes", json={"name": "x", "documents": [{"_id": "a"}]}), 400)
    too_many = [{"_id": str(i), "text": "t"} for i in range(MAX_DOCUMENTS + 1)]
    assert "at most" in one_line_error(client.post("/indexes", json={"name": "x", "documents": too_many}), 413)
    assert not (index_dir / "x").exists() and not (index_dir.parent / "out").exists()


def test_filters_over_http_get_and_post_and_bad_ones_are_422(tmp_path, tiny_bert):
    """`where` on GET (JSON in the query string) and POST (an object or a JSON text); every hit keeps to it and
    carries its metadata; a filter that cannot be compiled, or a hostile one, is a one-line 422 and changes nothing."""
    records = [{**record, "metadata": {"number": number, "lang": ["en", "de"][number % 2]}}
               for number, record in enumerate(documents(60))]
    corpus = write_corpus(tmp_path / "meta.jsonl", records)
    index_dir = tmp_path / "indexes"
    Index.build(corpus, "meta", index_dir, model=str(tiny_bert), calibrator="sn", device="cpu")
    with TestClient(create_app(index_dir, device="cpu"), base_url="http://127.0.0.1") as client:
        text = records[8]["text"]
        got = client.get("/search", params={"q": text, "k": 5, "where": '{"lang": "de", "number": {"$lt": 30}}'})
        hits = got.json()["queries"][0]["results"]
        assert len(hits) == 5 and all(h["metadata"]["lang"] == "de" and h["metadata"]["number"] < 30 for h in hits)
        for where in ({"number": {"$in": [3, 5, 7]}}, '{"number": {"$in": [3, 5, 7]}}'):
            posted = client.post("/search", json={"queries": [text], "k": 10, "mode": "dense", "where": where})
            assert sorted(h["doc_id"] for h in posted.json()["queries"][0]["results"]) == ["d3", "d5", "d7"]
        assert client.get("/indexes/meta/documents/d4").json()["document"]["metadata"] == {"number": 4, "lang": "en"}
        assert "unknown operator '$where'" in one_line_error(
            client.get("/search", params={"q": text, "where": '{"lang": {"$where": "1"}}'}), 422)
        assert "not valid JSON" in one_line_error(client.get("/search", params={"q": text, "where": "{lang"}), 422)
        assert "not a field name" in one_line_error(client.post("/search", json={
            "queries": [text], "where": {"metadata.": "en"}}), 422)
        hostile = client.post("/search", json={  # a key is any text, bound as data: it names no field here
            "queries": [text], "where": {"lang') OR 1=1; DROP TABLE documents; --": "en"}}).json()
        assert hostile["queries"][0]["results"] == [] and "no document has the field" in hostile["warnings"][0]
        # the fields it offers are those the server filters on: not source, a server path
        assert hostile["warnings"][0].endswith("(and the document's own: doc_id, text, title)")
        wide = client.post("/search", json={"queries": [text], "where": json.dumps({"lang": "日本語" * 3000},
                                                                                  ensure_ascii=False)})
        assert wide.status_code == 200 and wide.json()["queries"][0]["results"] == []  # 9,000 characters, not 54,000
        sneaky = client.post("/search", json={"queries": [text], "k": 60, "mode": "dense",
                                               "where": {"lang": "en' OR '1'='1"}})
        assert sneaky.status_code == 200 and sneaky.json()["queries"][0]["results"] == []
        # a number written as text matches nothing, and the answer says why and how to write it
        quoted = client.get("/search", params={"q": text, "where": '{"number": "8"}'}).json()
        assert quoted["queries"][0]["results"] == [] and "'number' holds numbers" in quoted["warnings"][0]
        assert quoted["warnings"][0].endswith("write 8")
        assert "warnings" not in client.get("/search", params={"q": text, "where": '{"number": 8}'}).json()
        added = client.post("/indexes/meta/documents", json={"documents": [
            {"_id": "new", "text": "a new note", "metadata": {"lang": "fr", "number": 99}}]})
        assert added.status_code == 201
        french = client.get("/search", params={"q": "note", "k": 5, "where": '{"lang": "fr"}'}).json()
        assert [h["doc_id"] for h in french["queries"][0]["results"]] == ["new"]
        assert client.get("/indexes/meta").json()["documents"] == 61


def test_answering_never_deletes_a_file_and_the_server_tidies_as_it_starts(index_dir):
    """What killed writers leave (a temporary link never swapped in) is tidied by writes and at start-up; listing
    the indexes, or any other read, leaves every file where it is."""
    stray = index_dir / ".notes.0123456789ab.link"
    stray.symlink_to(".versions/notes/0123456789ab")
    with TestClient(create_app(index_dir, device="cpu"), base_url="http://127.0.0.1") as client:
        assert not stray.is_symlink()  # the server's start tidied it
        stray.symlink_to(".versions/notes/0123456789ab")
        assert client.get("/indexes").status_code == 200 and client.get("/indexes/notes").status_code == 200
        assert stray.is_symlink()
