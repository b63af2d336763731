"""The LangChain adapter (`retriever.integrations.langchain`): LangChain's own standard suite for vector stores,
unmodified, then what the suite does not ask: filters, hybrid and dense search, relevance scores, the retriever,
the index's own encoder (embedding=None), and one end-to-end check against `retriever search`."""

from __future__ import annotations

import pytest

pytest.importorskip("langchain_core")
from langchain_core.documents import Document  # noqa: E402
from langchain_tests.integration_tests import VectorStoreIntegrationTests  # noqa: E402

from retriever.errors import RetrieverError  # noqa: E402
from retriever.integrations.langchain import RetrieverVectorStore, langchain_filter  # noqa: E402


class TestRetrieverVectorStore(VectorStoreIntegrationTests):
    @pytest.fixture()
    def vectorstore(self, tmp_path):
        store = RetrieverVectorStore(embedding=self.get_embeddings(), name="lc", index_dir=tmp_path)
        yield store


def fake_embeddings():
    return TestRetrieverVectorStore.get_embeddings()


@pytest.fixture()
def notes(tmp_path):
    store = RetrieverVectorStore(embedding=fake_embeddings(), name="notes", index_dir=tmp_path)
    store.add_documents([
        Document(page_content="tea grows on hills", metadata={"lang": "en", "year": 2019, "source": "a.txt"}, id="t"),
        Document(page_content="rain falls on the hills", metadata={"lang": "en", "year": 2023, "tags": ["w"]},
                 id="r"),
        Document(page_content="der Regen fällt", metadata={"lang": "de", "year": 2021, "source": "b.txt"}, id="d"),
    ])
    return store


def test_filters_in_langchain_form_reach_the_metadata(notes):
    found = lambda where: sorted(d.id for d in notes.similarity_search("hills", k=3, filter=where))  # noqa: E731
    assert found({"lang": "en"}) == ["r", "t"]
    assert found({"year": {"$gte": 2021}}) == ["d", "r"]
    assert found({"year": {"$between": [2019, 2021]}}) == ["d", "t"]
    assert found({"$or": [{"lang": "de"}, {"tags": "w"}]}) == ["d", "r"]
    assert found({"$not": {"lang": "en"}}) == ["d"]
    assert found({"source": "a.txt"}) == ["t"]  # a metadata key named like a document field is the metadata's
    assert langchain_filter({"source": {"$in": ["a"]}}) == {"metadata.source": {"$in": ["a"]}}
    with pytest.raises(RetrieverError, match="unknown operator '\\$like'"):
        notes.similarity_search("hills", filter={"lang": {"$like": "e%"}})


def test_modes_scores_and_the_retriever(notes):
    hybrid = notes.similarity_search_with_score("rain hills", k=3)
    keyword = notes.similarity_search_with_score("rain hills", k=3, mode="keyword")
    dense = notes.similarity_search_with_score("rain falls on the hills", k=1, mode="dense")
    assert {d.id for d, _ in hybrid} == {"r", "t", "d"} and keyword[0][0].id == "r"
    assert dense[0][0].id == "r" and dense[0][1] == pytest.approx(1.0, abs=1e-5)  # its own vector: cosine 1
    relevance = notes.similarity_search_with_relevance_scores("rain falls on the hills", k=3)
    assert relevance[0][0].id == "r" and all(0.0 <= score <= 1.0 for _, score in relevance)
    assert relevance[0][1] == pytest.approx(1.0, abs=1e-5)
    with pytest.raises(RetrieverError, match="no relevance scores"):
        notes.similarity_search_with_relevance_scores("rain", k=1, mode="keyword")
    by_vector = notes.similarity_search_by_vector(fake_embeddings().embed_query("der Regen fällt"), k=1)
    assert [d.id for d in by_vector] == ["d"]
    retriever = notes.as_retriever(search_kwargs={"k": 2, "filter": {"lang": "en"}, "mode": "keyword"})
    assert [d.id for d in retriever.invoke("tea")] == ["t"]
    thresholded = notes.as_retriever(search_type="similarity_score_threshold",
                                     search_kwargs={"k": 3, "score_threshold": 0.99})
    assert [d.id for d in thresholded.invoke("tea grows on hills")] == ["t"]


def test_a_store_reopens_its_index_and_refuses_a_mismatch(notes, tmp_path):
    again = RetrieverVectorStore(embedding=fake_embeddings(), name="notes", index_dir=tmp_path)
    assert [d.id for d in again.get_by_ids(["d", "nope", "t"])] == ["d", "t"]
    assert notes.index.snapshot.manifest.encoder["model"] == "external:DeterministicFakeEmbedding"
    with pytest.raises(RetrieverError, match="open it with that embedding="):
        RetrieverVectorStore(embedding=None, name="notes", index_dir=tmp_path)
    from langchain_core.embeddings import DeterministicFakeEmbedding

    wider = RetrieverVectorStore(embedding=DeterministicFakeEmbedding(size=8), name="notes", index_dir=tmp_path)
    with pytest.raises(RetrieverError, match="8-dimensional"):
        wider.add_texts(["too wide"])
    again.delete()  # None: every document
    assert again.similarity_search("tea", k=3) == [] and len(again.index) == 0


def test_importing_without_langchain_names_the_extra(monkeypatch):
    import subprocess
    import sys

    code = ("import sys; sys.modules['langchain_core'] = None\n"
            "import retriever.integrations.langchain")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "ImportError: retriever.integrations.langchain needs langchain-core: pip install 'retriever[langchain]'")


# --- end to end: the index's own encoder (embedding=None) on a small real corpus ------------------------------

@pytest.fixture(scope="module")
def sick_store(tmp_path_factory):
    import os
    from pathlib import Path

    from tests.helpers import sick_sentences

    data = Path(os.environ.get("RETRIEVER_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    sentences = sick_sentences(data, 150)
    index_dir = tmp_path_factory.mktemp("lc-sick")
    # whitening-32: a real calibrator both paths must apply alike, fitted in milliseconds (auto's candidates take
    # seconds here, and what auto decides is tests/test_auto_calibrator.py's)
    store = RetrieverVectorStore(embedding=None, name="sick", index_dir=index_dir, calibrator="whitening-32")
    store.add_texts(sentences, ids=[f"s{i}" for i in range(len(sentences))])
    return store, index_dir


@pytest.mark.filterwarnings("ignore:whitening fitted on")  # fewer sentences than dimensions: shrunk, and said
@pytest.mark.parametrize("mode", ["hybrid", "dense"])
def test_the_retriever_gives_retriever_search_s_top_5(sick_store, cli, mode):
    import json

    store, index_dir = sick_store
    query = "a man is playing a guitar"
    found = store.as_retriever(search_kwargs={"k": 5, "mode": mode}).invoke(query)
    done = cli("search", query, "--name", "sick", "-k", "5", "--mode", mode, "--json", "--index-dir", index_dir)
    assert done.returncode == 0, done.stderr
    assert [d.id for d in found] == [hit["doc_id"] for hit in json.loads(done.stdout)["results"]]
    assert len(found) == 5
