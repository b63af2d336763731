"""The Haystack adapter (`retriever.integrations.haystack`): Haystack's own standard suite for document stores,
unmodified, then what the suite does not ask: the retriever components (embedding, BM25, hybrid), documents
without embeddings, the dimension check, serialisation, and one end-to-end check against `retriever search`."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("haystack")
from haystack import Document  # noqa: E402
from haystack.document_stores.errors import DuplicateDocumentError  # noqa: E402
from haystack.errors import FilterError  # noqa: E402
from haystack.testing.document_store import DocumentStoreBaseTests  # noqa: E402

from retriever.errors import RetrieverError  # noqa: E402
from retriever.integrations.haystack import (  # noqa: E402
    RetrieverBM25Retriever,
    RetrieverDocumentEmbedder,
    RetrieverDocumentStore,
    RetrieverEmbeddingRetriever,
    RetrieverHybridRetriever,
    RetrieverTextEmbedder,
    haystack_filter,
)


class TestRetrieverDocumentStore(DocumentStoreBaseTests):
    @pytest.fixture()
    def document_store(self, tmp_path):
        return RetrieverDocumentStore(name="hs", index_dir=tmp_path)

    def test_write_documents(self, document_store):
        """The default policy (NONE) is FAIL, as Haystack's InMemoryDocumentStore has it."""
        doc = Document(content="test doc")
        assert document_store.write_documents([doc]) == 1
        with pytest.raises(DuplicateDocumentError):
            document_store.write_documents([doc])
        self.assert_documents_are_equal(document_store.filter_documents(), [doc])


def unit(*values: float, dim: int = 4) -> list[float]:
    vector = [float(v) for v in values] + [0.0] * (dim - len(values))
    return vector


@pytest.fixture()
def store(tmp_path):
    store = RetrieverDocumentStore(name="hs", index_dir=tmp_path)
    store.write_documents([
        Document(id="tea", content="tea grows on the hills", meta={"lang": "en"}, embedding=unit(1, 0.1)),
        Document(id="rain", content="rain falls on the hills", meta={"lang": "en"}, embedding=unit(0.1, 1)),
        Document(id="plain", content="hills without an embedding", meta={"lang": "de"}),
    ])
    return store


@pytest.mark.filterwarnings("error::retriever.filters.FilterWarning")  # of the store's own keys too: none
def test_the_three_retrievers_and_documents_without_embeddings(store):
    dense = RetrieverEmbeddingRetriever(document_store=store, top_k=3).run(query_embedding=unit(1, 0))["documents"]
    assert [d.id for d in dense] == ["tea", "rain"]  # the document without an embedding is not dense-searchable
    assert dense[0].score == pytest.approx(1 / (1 + 0.01) ** 0.5, abs=1e-5) and dense[0].embedding == unit(1, 0.1)
    bm25 = RetrieverBM25Retriever(document_store=store, top_k=3).run(query="embedding hills")["documents"]
    assert bm25[0].id == "plain" and bm25[0].embedding is None and bm25[0].score > 0
    hybrid = RetrieverHybridRetriever(document_store=store, top_k=3)
    assert [d.id for d in hybrid.run(query="rain", query_embedding=unit(0, 1))["documents"]][0] == "rain"
    filtered = RetrieverBM25Retriever(document_store=store, filters={"field": "meta.lang", "operator": "==",
                                                                   "value": "en"}).run(query="hills")["documents"]
    assert sorted(d.id for d in filtered) == ["rain", "tea"]
    again = RetrieverHybridRetriever.from_dict(hybrid.to_dict())
    assert again.document_store.count_documents() == 3 and again.top_k == 3
    # Haystack's `== None` on a field no document has selects every document, with no warning that it selects
    # nothing; top_k=0 is no default (it asked for the retriever's 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(store.filter_documents({"field": "meta.absent", "operator": "==", "value": None})) == 3
    with pytest.raises(RetrieverError, match="k must be"):
        RetrieverBM25Retriever(document_store=store, top_k=3).run(query="hills", top_k=0)
    store.delete_documents("tea")  # one id string: one id
    assert store.count_documents() == 2


def test_ids_and_contents_keep_their_outer_whitespace(tmp_path):
    """Id ' w ' once came back 'w', content '  padded  ' as 'padded', and deleting 'pad' deleted 'pad '."""
    store = RetrieverDocumentStore(name="spaces", index_dir=tmp_path)
    written = [Document(id=" w ", content="  padded  "), Document(id="pad ", content="a line\n"),
               Document(id="pad", content="another")]
    assert store.write_documents(written) == 3
    store.delete_documents(["pad"])
    found = {document.id: document.content for document in store.filter_documents()}
    assert found == {" w ": "  padded  ", "pad ": "a line\n"}


def test_the_first_embedding_fixes_the_dimension(tmp_path, store):
    with pytest.raises(RetrieverError, match="5 dimensions; store 'hs' holds 4-dimensional"):
        store.write_documents([Document(content="too wide", embedding=[1.0] * 5)])
    late = RetrieverDocumentStore(name="late", index_dir=tmp_path)
    late.write_documents([Document(id="a", content="no embedding yet")])
    late.write_documents([Document(id="b", content="the first embedding", embedding=unit(0, 0, 1, dim=3))])
    assert late.index.snapshot.manifest.encoder["dim"] == 3 and late.count_documents() == 2
    found = late.embedding_retrieval(unit(0, 0, 1, dim=3), top_k=5)
    assert [d.id for d in found] == ["b"]
    assert [d.id for d in late.filter_documents({"field": "content", "operator": "==",
                                                 "value": "no embedding yet"})] == ["a"]


def test_haystack_filters_translate_to_the_one_engine():
    assert haystack_filter({"field": "meta.x", "operator": "==", "value": None}) == {
        "$or": [{"metadata.x": None}, {"metadata.x": {"$exists": False}}]}
    assert haystack_filter({"operator": "NOT", "conditions": [{"field": "id", "operator": "in", "value": ["a"]}]}) \
        == {"$not": {"$and": [{"doc_id": {"$in": ["a"]}}]}}
    from haystack.errors import FilterError

    with pytest.raises(FilterError, match="filters name meta.<key>, id or content"):
        haystack_filter({"field": "embedding", "operator": "==", "value": 1})


# --- end to end: MiniLM's vectors, brought as Haystack documents' embeddings ----------------------------------

@pytest.fixture(scope="module")
def sick(tmp_path_factory):
    """The same small real corpus in a Haystack store (embeddings from the default model, given as documents
    bring them) and in an index `retriever build` made with that model, both uncalibrated."""
    import json
    import os
    from pathlib import Path

    from retriever.encode.encoder import Encoder
    from retriever.index import Index
    from tests.helpers import sick_sentences

    data = Path(os.environ.get("RETRIEVER_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    sentences = sick_sentences(data, 150)
    index_dir = tmp_path_factory.mktemp("hs-sick")
    corpus = index_dir / "sick.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"s{i}", "text": t}) + "\n" for i, t in enumerate(sentences)))
    encoder = Encoder(device="cpu")
    Index.build(corpus, "built", index_dir, calibrator="none", encoder=encoder, device="cpu")
    store = RetrieverDocumentStore(name="hs", index_dir=index_dir)
    vectors = encoder.encode(sentences)
    store.write_documents([Document(id=f"s{i}", content=t, embedding=v.tolist())
                           for i, (t, v) in enumerate(zip(sentences, vectors))])
    return store, encoder, index_dir


@pytest.mark.parametrize("mode", ["hybrid", "keyword", "dense"])
def test_the_retrievers_give_retriever_search_s_top_5(sick, cli, mode):
    import json

    store, encoder, index_dir = sick
    query = "a man is playing a guitar"
    embedding = encoder.encode([query])[0].tolist()
    found = {"hybrid": lambda: RetrieverHybridRetriever(store, top_k=5).run(query=query, query_embedding=embedding),
             "keyword": lambda: RetrieverBM25Retriever(store, top_k=5).run(query=query),
             "dense": lambda: RetrieverEmbeddingRetriever(store, top_k=5).run(query_embedding=embedding)}[mode]()
    done = cli("search", query, "--name", "built", "-k", "5", "--mode", mode, "--json", "--index-dir", index_dir)
    assert done.returncode == 0, done.stderr
    assert [d.id for d in found["documents"]] == [hit["doc_id"] for hit in json.loads(done.stdout)["results"]]
    assert len(found["documents"]) == 5


def test_two_stores_on_one_index_see_each_others_writes_and_lose_nothing(tmp_path):
    """An indexing pipeline and a query pipeline hold a store each (or one is restored by from_dict): each reads
    the other's writes, and the first embedding's rebuild keeps what either wrote."""
    first = RetrieverDocumentStore(name="kb", index_dir=tmp_path)
    second = RetrieverDocumentStore(name="kb", index_dir=tmp_path)  # made before the index exists
    first.write_documents([Document(id="1", content="one without an embedding")])
    assert second.count_documents() == 1
    second.write_documents([Document(id="2", content="two", embedding=unit(1, 0))])  # the rebuild, done by second
    first.write_documents([Document(id="3", content="three", embedding=unit(0, 1))])
    reopened = RetrieverDocumentStore.from_dict(first.to_dict())
    assert sorted(d.id for d in reopened.filter_documents()) == ["1", "2", "3"]
    assert [d.id for d in second.embedding_retrieval(unit(0, 1), top_k=1)] == ["3"]
    first.delete_documents(["2"])
    assert sorted(d.id for d in second.filter_documents()) == ["1", "3"]


def test_a_filter_as_deep_as_filter_documents_takes_works_in_every_retrieval(store):
    """The store's own condition (documents with an embedding) once wrapped the filter one level deeper."""
    def nested(levels: int) -> dict:
        clause = {"field": "meta.lang", "operator": "==", "value": "en"}
        for _ in range(levels):
            clause = {"operator": "AND", "conditions": [clause]}
        return clause

    deepest = 0
    while True:
        try:
            store.filter_documents(nested(deepest + 1))
        except FilterError:
            break
        deepest += 1
    assert deepest >= 2
    where = nested(deepest)
    assert [d.id for d in store.embedding_retrieval(unit(1, 0), filters=where, top_k=3)] == ["tea", "rain"]
    hybrid = RetrieverHybridRetriever(document_store=store, filters=where, top_k=3)
    assert {d.id for d in hybrid.run(query="rain", query_embedding=unit(0, 1))["documents"]} == {"tea", "rain"}


def test_in_and_not_in_read_a_missing_field_as_none_and_offset_dates_are_refused(tmp_path):
    store = RetrieverDocumentStore(name="hs", index_dir=tmp_path)
    store.write_documents([Document(id="a", content="a"), Document(id="b", content="b", meta={"f": "s.txt"}),
                           Document(id="c", content="c", meta={"f": None}), Document(id="d", content="d",
                                                                                   meta={"f": "t.txt"})])

    def ids(operator, value):
        return sorted(d.id for d in store.filter_documents({"field": "meta.f", "operator": operator, "value": value}))

    assert ids("in", [None, "s.txt"]) == ["a", "b", "c"] and ids("in", [None]) == ["a", "c"]
    assert ids("not in", [None]) == ["b", "d"] and ids("not in", [None, "s.txt"]) == ["d"]
    assert ids("in", ["s.txt"]) == ["b"] and ids("not in", ["s.txt"]) == ["a", "c", "d"]
    for offset in ("2021-05-01T08:30:00+00:00", "20210501", "2021-W17"):
        with pytest.raises(FilterError, match="without a UTC offset"):
            store.filter_documents({"field": "meta.date", "operator": ">", "value": offset})


def test_a_named_calibrator_waits_for_the_first_embeddings(tmp_path):
    store = RetrieverDocumentStore(name="hs", index_dir=tmp_path, calibrator="whitening")
    store.write_documents([Document(id=str(i), content=f"text {i}") for i in range(5)])  # nothing to whiten yet
    assert store.index.snapshot.manifest.calibrator["name"] == "none"
    rng = __import__("numpy").random.default_rng(0)
    store.write_documents([Document(id=f"e{i}", content=f"embedded {i}", embedding=rng.standard_normal(8).tolist())
                           for i in range(40)])
    assert store.index.snapshot.manifest.calibrator["name"] == "whitening" and store.count_documents() == 45


_PLAIN_WRITER = """
import sys
from haystack import Document
from retriever.integrations.haystack import RetrieverDocumentStore
store = RetrieverDocumentStore(name="race", index_dir=sys.argv[1])
for batch in range(int(sys.argv[2])):
    store.write_documents([Document(id=f"p{batch}-{n}", content=f"plain {batch} {n}") for n in range(3)])
    print(batch, flush=True)  # acknowledged
"""
_EMBEDDING_WRITER = """
import sys
from haystack import Document
from retriever.integrations.haystack import RetrieverDocumentStore
store = RetrieverDocumentStore(name="race", index_dir=sys.argv[1])
vector = [1.0] + [0.0] * 15
store.write_documents([Document(id=f"e{n}", content=f"embedded {n}", embedding=vector) for n in range(3)])
print("done", flush=True)
"""


@pytest.mark.parametrize("trial", range(2))
def test_the_first_embeddings_written_by_another_process_lose_no_acknowledged_write(tmp_path, trial):
    """One process writes batches without embeddings while another gives the store its first embeddings, which
    rebuilds the index: once, the rebuild read the store before a batch the first had been told was written, and
    another batch failed on the embeddings' width."""
    import subprocess
    import sys

    RetrieverDocumentStore(name="race", index_dir=tmp_path).write_documents([Document(id="seed", content="seed")])
    plain = subprocess.Popen([sys.executable, "-c", _PLAIN_WRITER, str(tmp_path), "12"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    embedded = subprocess.Popen([sys.executable, "-c", _EMBEDDING_WRITER, str(tmp_path)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    (plain_out, plain_err), (embedded_out, embedded_err) = plain.communicate(timeout=300), embedded.communicate(300)
    assert plain.returncode == 0 and embedded.returncode == 0, plain_err + embedded_err
    acknowledged = {f"p{line}-{n}" for line in plain_out.split() for n in range(3)}
    found = {d.id for d in RetrieverDocumentStore(name="race", index_dir=tmp_path).filter_documents()}
    assert len(acknowledged) == 36 and acknowledged | {"seed", "e0", "e1", "e2"} == found


_SAME_IDS_WRITER = """
import sys
from haystack import Document
from haystack.document_stores.errors import DuplicateDocumentError
from haystack.document_stores.types import DuplicatePolicy
from retriever.integrations.haystack import RetrieverDocumentStore
store = RetrieverDocumentStore(name="same", index_dir=sys.argv[1])
policy = DuplicatePolicy[sys.argv[2]]
for batch in range(5):
    try:
        written = store.write_documents([Document(id=f"d{batch}-{n}", content=f"doc {batch} {n}") for n in range(2)],
                                        policy=policy)
        print("wrote", written, flush=True)
    except DuplicateDocumentError:
        print("duplicate", flush=True)
"""


@pytest.mark.parametrize("policy", ["FAIL", "SKIP"])
def test_two_processes_writing_the_same_ids_get_haystack_s_answers(tmp_path, policy):
    """Once: ConflictError (another retriever process writing) under FAIL, and even under SKIP."""
    import subprocess
    import sys

    writers = [subprocess.Popen([sys.executable, "-c", _SAME_IDS_WRITER, str(tmp_path), policy],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [writer.communicate(timeout=300) for writer in writers]
    assert all(writer.returncode == 0 for writer in writers), [err for _, err in outputs]
    lines = [line for out, _ in outputs for line in out.splitlines()]
    written = sum(int(line.split()[1]) for line in lines if line.startswith("wrote"))
    assert written == 10 and len(lines) == 10  # each batch written once: by one process, refused or skipped by the other
    assert policy == "FAIL" or not any(line == "duplicate" for line in lines)
    assert RetrieverDocumentStore(name="same", index_dir=tmp_path).count_documents() == 10


# ---- with retriever's own encoder: no download (issue 58, everyday 2 and 3) ------------------------------------

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_s_haystack_example_runs_offline_as_written(capsys, monkeypatch):
    """The example, cut from the README and run as it stands (index home: the test's own), embeds with the embedded
    model and prints the document that answers the question."""
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    example = next(block for block in blocks if "RetrieverTextEmbedder" in block)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    exec(compile(example, "README.md", "exec"), {})
    assert capsys.readouterr().out.strip().splitlines()[-1] == "open() reads a file"


def test_the_embedders_give_the_vectors_retriever_s_encoder_gives(minilm_encoder):
    documents = [Document(id="a", content="open() reads a file"), Document(id="b", content="the sky is blue")]
    embedded = RetrieverDocumentEmbedder(device="cpu").run(documents)["documents"]
    assert [d.id for d in embedded] == ["a", "b"] and documents[0].embedding is None  # the inputs are left as given
    expected = minilm_encoder.encode(["open() reads a file", "the sky is blue"])
    assert np.allclose([d.embedding for d in embedded], expected, atol=1e-5)
    query = RetrieverTextEmbedder(device="cpu").run(text="open() reads a file")["embedding"]
    assert np.allclose(query, expected[0], atol=1e-4)
    again = RetrieverTextEmbedder.from_dict(RetrieverTextEmbedder(max_length=64).to_dict())
    assert again.max_length == 64
    with pytest.raises(TypeError, match="RetrieverDocumentEmbedder"):
        RetrieverTextEmbedder().run(text=["a list"])


def test_a_haystack_store_is_not_the_cli_s_default_index_and_hides_its_own_fields(tmp_path, cli):
    """A plain `retriever search` searches the index that encodes text, not the store written after it; `list`
    shows neither store's internal fields."""
    home = tmp_path / "home"
    corpus = tmp_path / "notes.jsonl"
    corpus.write_text('{"_id": "n1", "text": "open() reads a file", "metadata": {"lang": "en"}}\n', encoding="utf-8")
    assert cli("build", corpus, "--calibrator", "none", "--index-dir", home).returncode == 0
    store = RetrieverDocumentStore(name="hs", index_dir=home)
    store.write_documents([Document(id="t", content="tea grows on the hills", meta={"lang": "en"},
                                    embedding=unit(1, 0.1))])
    found = cli("search", "reading files", "--json", "--index-dir", home)
    assert found.returncode == 0, found.stderr
    assert "using index 'notes'" in found.stderr and json.loads(found.stdout)["results"][0]["doc_id"] == "n1"
    listed = {record["name"]: record
              for record in json.loads(cli("list", "--json", "--index-dir", home).stdout)["indexes"]}
    assert listed["hs"]["fields"] == ["lang"] and listed["notes"]["fields"] == ["lang"]
    shown = cli("list", "--index-dir", home).stdout  # (the test's own folder is named with "haystack" in it)
    assert "lang" in shown and "_haystack.dense" not in shown and "_haystack.embedding" not in shown
