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
    # A metadata key that begins with "$" is a key like any other: once refused, its advice then finding nothing.
    notes.add_texts(["dollar hills"], metadatas=[{"$k": 1}], ids=["dollar"])
    assert found({"$k": 1}) == ["dollar"]
    with pytest.raises(RetrieverError, match=r"\$between takes \[low, high\], got \[2019\]"):
        found({"year": {"$between": [2019]}})  # once an "unknown operator"


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


def test_another_embeddings_class_of_the_same_width_is_refused(notes, tmp_path):
    from langchain_core.embeddings import DeterministicFakeEmbedding

    class OtherEmbedding(DeterministicFakeEmbedding):
        pass

    width = len(fake_embeddings().embed_query("x"))
    with pytest.raises(RetrieverError, match="made by DeterministicFakeEmbedding, not by OtherEmbedding"):
        RetrieverVectorStore(embedding=OtherEmbedding(size=width), name="notes", index_dir=tmp_path)
    assert len(notes.index) == 3


def test_ids_are_any_value_but_none_made_strings(tmp_path):
    store = RetrieverVectorStore(embedding=fake_embeddings(), name="ids", index_dir=tmp_path)
    assert store.add_texts(["zero", "one"], ids=[0, 1]) == ["0", "1"]  # 0 is an id, not "no id"
    assert [d.page_content for d in store.get_by_ids(["0"])] == ["zero"]
    made = store.add_texts(["new"], ids=[None])
    assert len(made[0]) == 36 and store.get_by_ids(made)[0].page_content == "new"  # None: a uuid4
    with pytest.raises(ValueError, match=r"ids\[1\] is empty"):
        store.add_texts(["a", "b"], ids=["a", ""])
    assert len(store.index) == 3
    # one id string is one id: "01" fetched and deleted the documents 0 and 1
    store.add_texts(["both"], ids=["01"])
    assert [d.page_content for d in store.get_by_ids("01")] == ["both"]
    store.delete("01")
    assert sorted(d.page_content for d in store.get_by_ids(["0", "1", "01"])) == ["one", "zero"]


def test_ids_and_texts_keep_their_outer_whitespace(tmp_path):
    """`dup ` is not `dup`: the second add once overwrote the first, and the id it returned could not be read."""
    store = RetrieverVectorStore(embedding=fake_embeddings(), name="spaces", index_dir=tmp_path)
    store.add_texts(["first"], ids=["dup"])
    assert store.add_texts(["  second\n"], ids=["dup "]) == ["dup "]
    assert [d.page_content for d in store.get_by_ids(["dup"])] == ["first"]
    assert [(d.id, d.page_content) for d in store.get_by_ids(["dup "])] == [("dup ", "  second\n")]
    with pytest.raises(ValueError, match="whitespace"):
        store.add_texts(["blank"], ids=["  "])
    assert len(store.index) == 2


def test_search_by_vector_is_dense_and_takes_langchain_s_options(notes):
    vector = fake_embeddings().embed_query("der Regen fällt")
    assert [d.id for d in notes.similarity_search_by_vector(vector, k=1, mode="dense")] == ["d"]
    assert [d.id for d in notes.similarity_search_by_vector(vector, k=1, score_threshold=0.5)] == ["d"]
    with pytest.raises(RetrieverError, match="search by vector is dense search .* no mode='keyword'"):
        notes.similarity_search_by_vector(vector, mode="keyword")


def test_max_marginal_relevance_trades_relevance_for_novelty(notes, tmp_path):
    notes.add_texts(["tea grows on hills"], [{"lang": "en"}], ids=["t2"])  # a duplicate of "t": the same vector
    query = "tea grows on hills"
    dense = [d.id for d in notes.similarity_search(query, k=4, mode="dense")]
    assert set(dense[:2]) == {"t", "t2"}
    # All relevance: dense search's order. Mostly novelty: the duplicate waits behind the other documents.
    assert [d.id for d in notes.max_marginal_relevance_search(query, k=4, lambda_mult=1.0)] == dense
    novel = [d.id for d in notes.max_marginal_relevance_search(query, k=2, fetch_k=4, lambda_mult=0.25)]
    assert novel[0] == dense[0] and novel[1] not in ("t", "t2")
    retriever = notes.as_retriever(search_type="mmr", search_kwargs={"k": 2, "fetch_k": 4, "lambda_mult": 0.25})
    assert [d.id for d in retriever.invoke(query)] == novel
    by_vector = notes.max_marginal_relevance_search_by_vector(fake_embeddings().embed_query(query), k=2, fetch_k=4,
                                                              lambda_mult=0.25)
    assert [d.id for d in by_vector] == novel
    import asyncio

    assert [d.id for d in asyncio.run(notes.amax_marginal_relevance_search(query, k=2, fetch_k=4,
                                                                           lambda_mult=0.25))] == novel
    filtered = notes.as_retriever(search_type="mmr", search_kwargs={"k": 3, "filter": {"lang": "en"}})
    assert sorted(d.id for d in filtered.invoke(query)) == ["r", "t", "t2"]
    assert len(notes.max_marginal_relevance_search(query, k=5, fetch_k=2)) == 4  # k above fetch_k: still k
    with pytest.raises(RetrieverError, match="max-marginal-relevance search is dense search .* no mode='hybrid'"):
        notes.max_marginal_relevance_search(query, mode="hybrid")
    with pytest.raises(RetrieverError, match="no space='raw'"):
        notes.max_marginal_relevance_search(query, space="raw")
    keyword_store = RetrieverVectorStore(embedding=fake_embeddings(), name="notes", index_dir=tmp_path,
                                         mode="keyword")  # the store's mode is for similarity search
    assert [d.id for d in keyword_store.max_marginal_relevance_search(query, k=2, lambda_mult=0.25)] == novel
    empty = RetrieverVectorStore(embedding=fake_embeddings(), name="empty", index_dir=tmp_path)
    assert empty.max_marginal_relevance_search(query) == []


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


@pytest.mark.filterwarnings("ignore:whitening fitted on")
def test_max_marginal_relevance_with_the_index_s_own_encoder(sick_store):
    store, _ = sick_store
    query = "a man is playing a guitar"
    dense = [d.id for d in store.similarity_search(query, k=5, mode="dense")]
    assert [d.id for d in store.max_marginal_relevance_search(query, k=5, lambda_mult=1.0)] == dense
    novel = store.as_retriever(search_type="mmr", search_kwargs={"k": 5, "lambda_mult": 0.3}).invoke(query)
    assert len({d.id for d in novel}) == 5 and novel[0].id == dense[0]


def test_max_marginal_relevance_reads_a_long_document_by_its_matching_passage(tmp_path):
    from tests.helpers import DOCS, sentences

    # Past the 256 tokens MiniLM reads, a document is cut into passages; this one's last holds the guitar
    # sentence. Dense search scores it from its first passage and that one, and max-marginal-relevance search's
    # relevance must be that score, not the matching passage's cosine alone.
    long_text = " ".join(sentences(40).values()) + " " + DOCS["guitar"]
    store = RetrieverVectorStore(embedding=None, name="long", index_dir=tmp_path, calibrator="none")
    store.add_texts([long_text, *DOCS.values()], ids=["long", *DOCS])
    assert store.index.snapshot.manifest.live_vectors > len(DOCS) + 1  # the long one: cut, two passages or more
    query = "a man is playing a guitar"
    dense = [d.id for d in store.similarity_search(query, k=6, mode="dense")]
    assert dense[0] == "guitar" and "long" in dense
    assert [d.id for d in store.max_marginal_relevance_search(query, k=6, lambda_mult=1.0)] == dense
    diverse = [d.id for d in store.max_marginal_relevance_search(query, k=2, lambda_mult=0.3)]
    assert diverse[0] == "guitar" and diverse[1] != "long"  # the long one matched by the guitar sentence itself


def test_stores_on_one_index_see_each_others_writes_and_concurrent_first_adds_all_land(tmp_path):
    import asyncio

    early = RetrieverVectorStore(embedding=fake_embeddings(), name="shared", index_dir=tmp_path)  # before any index
    writer = RetrieverVectorStore(embedding=fake_embeddings(), name="shared", index_dir=tmp_path)

    async def four_batches():
        await asyncio.gather(*[writer.aadd_texts([f"batch {i} text"], ids=[f"b{i}"]) for i in range(4)])
    asyncio.run(four_batches())
    assert sorted(d.id for d in early.get_by_ids([f"b{i}" for i in range(4)])) == ["b0", "b1", "b2", "b3"]
    early.add_texts(["from the early store"], ids=["e"])
    writer.delete(["b0"])
    assert sorted(d.id for d in early.get_by_ids(["b0", "b1", "e"])) == ["b1", "e"]
    assert [d.id for d in writer.similarity_search("from the early store", k=1)] == ["e"]


_FIRST_ADDS = """
import sys
sys.path.insert(0, sys.argv[3])
from tests.test_integrations_langchain import fake_embeddings
from retriever.integrations.langchain import RetrieverVectorStore
store = RetrieverVectorStore(embedding=fake_embeddings(), name="fresh", index_dir=sys.argv[1])
for batch in range(20):
    store.add_texts([f"{sys.argv[2]} batch {batch}"], ids=[f"{sys.argv[2]}{batch}"])
"""


def test_two_processes_first_adds_to_a_new_store_wait_for_each_other_and_all_land(tmp_path):
    """The second process's first adds once raised ConflictError for as long as the other built the index."""
    import subprocess
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parent.parent)
    writers = [subprocess.Popen([sys.executable, "-c", _FIRST_ADDS, str(tmp_path), name, root],
                                stderr=subprocess.PIPE, text=True) for name in ("a", "b")]
    for writer in writers:
        assert writer.wait(timeout=300) == 0, writer.stderr.read()
    store = RetrieverVectorStore(embedding=fake_embeddings(), name="fresh", index_dir=tmp_path)
    assert len(store.get_by_ids([f"{name}{n}" for name in "ab" for n in range(20)])) == 40
