"""Retrieval evaluation in BEIR's layout and with BEIR's conventions, through the index's own search path.

A `RetrievalSet` is a corpus, queries and graded qrels; `load_beir(FOLDER)` reads any BEIR folder
(`corpus.jsonl[.gz]`, `queries.jsonl`, `qrels/<split>.tsv` with header `query-id  corpus-id  score`; graded
relevance, 0 = not relevant). The tasks built from the pair data (QNLI as question -> answer, STS-B, SICK-R and
STS12-16 as duplicate retrieval, where the query itself, also in the corpus under the same id, is ignored as BEIR
ignores identical ids) and from the passages are declared in `retriever.evaluation.retrieval_tasks`.

Metrics follow trec_eval as BEIR runs it (`pytrec_eval`): nDCG@10 with linear gains, Recall@100, MRR@10; a hit
that is the query itself (a document under the query's id holding the query's text: the duplicate tasks, BEIR's
Quora) is dropped before cutting, but a document that only shares its number with a query is not (the classic
collections number both from 1, and Cranfield's document 225 answers its query 225); ties in score are broken by
document id, descending, as trec_eval does; a query with no relevant document is not scored. `tests/test_retrieval_eval.py` checks every
metric against pytrec_eval on fixed runs.

`evaluate_searches` builds a real index from the set's raw vectors (the calibrator fitted on the corpus by
`Index.build`, as for any user, with its keyword index), calibrates the queries with the index's calibrator and
searches it in each asked mode exactly as `retriever search` and the server do (`evaluate_through_index`: the
dense search alone).
"""

from __future__ import annotations

import gzip
import json
import math
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retriever.errors import RetrieverError

METRICS = ("ndcg@10", "recall@100", "mrr@10")
Run = dict[str, dict[str, float]]  # query id -> {doc id: score}
Qrels = dict[str, dict[str, int]]  # query id -> {doc id: grade}


@dataclass(frozen=True)
class RetrievalSet:
    name: str
    corpus: dict[str, tuple[str | None, str]]  # doc id -> (title, text)
    queries: dict[str, str]  # query id -> text
    qrels: Qrels  # only queries with at least one relevant (grade > 0) document
    # The queries whose hit under their own id is the query itself, dropped before scoring (`per_query`): True for
    # every query, or the ids of those that are.
    ignore_identical: bool | frozenset[str] = True
    skipped: int = 0  # corpus documents left out: no text to index (a relevant one then counts as never found)

    def describe(self) -> dict:
        described = {"documents": len(self.corpus), "queries": len(self.queries),
                     "relevant": sum(sum(1 for grade in found.values() if grade > 0) for found in self.qrels.values())}
        return {**described, "documents_without_text": self.skipped} if self.skipped else described


# --- sources -------------------------------------------------------------------------------------------------


def load_beir(folder: str | Path, split: str = "test", name: str | None = None) -> RetrievalSet:
    """A BEIR folder's set. Documents without text are left out (an index holds none; `skipped` counts them, and
    their judgments stay: a relevant one is never found, as in the collection), and a hit is dropped as the query
    itself only where the document under the query's id holds the query's text."""
    folder = Path(folder)
    corpus_path = next((folder / f for f in ("corpus.jsonl", "corpus.jsonl.gz") if (folder / f).is_file()), None)
    qrels_path = folder / "qrels" / f"{split}.tsv"
    for path, what in ((corpus_path, "corpus.jsonl"), (folder / "queries.jsonl", "queries.jsonl"), (qrels_path, f"qrels/{split}.tsv")):
        if path is None or not path.is_file():
            raise RetrieverError(f"{folder} is not a BEIR folder: no {what}")
    corpus, empty = {}, set()
    for record in _jsonl(corpus_path):
        if str(record.get("text") or "").strip():
            corpus[str(record["_id"])] = (record.get("title") or None, record["text"])
        else:
            empty.add(str(record["_id"]))
    queries = {str(r["_id"]): r["text"] for r in _jsonl(folder / "queries.jsonl")}
    qrels: Qrels = {}
    for number, line in enumerate(qrels_path.read_text(encoding="utf-8").splitlines(), start=1):
        fields = line.split("\t")
        if number == 1 and not fields[-1].strip().lstrip("-").isdigit():
            continue  # the header
        if len(fields) != 3:
            raise RetrieverError(f"{qrels_path} line {number}: expected query-id, corpus-id, score")
        query, doc, grade = fields[0], fields[1], fields[2].strip()
        if not re.fullmatch(r"-?[0-9]{1,9}", grade):  # a relevance grade is a whole number, as trec_eval reads it
            raise RetrieverError(f"{qrels_path} line {number}: the score must be a whole number (got {grade!r})")
        grade = int(grade)
        if grade > 0 and query in queries and (doc in corpus or doc in empty):
            qrels.setdefault(query, {})[doc] = grade
    themselves = frozenset(query for query in qrels if query in corpus and _same_text(corpus[query][1], queries[query]))
    return RetrievalSet(name or folder.name, corpus, {q: queries[q] for q in qrels}, qrels, themselves, len(empty))


def _same_text(first: str, second: str) -> bool:
    return " ".join(first.split()) == " ".join(second.split())


@dataclass(frozen=True)
class RetrievalTask:
    """A retrieval benchmark, declared as data: a name, what it is, and how to load its set from the data
    folder. Scored with `METRICS`; the calibrators are fitted on the task's corpus, by the index build."""

    name: str
    description: str
    load: Callable[[Path], RetrievalSet]
    split: str = "test"
    main_metric: str = "ndcg@10"




# --- metrics -------------------------------------------------------------------------------------------------


def ranked(run_for_query: dict[str, float], query_id: str, ignore_identical: bool | frozenset[str] = True) -> list[str]:
    """Document ids best first: score descending, ties by id descending (trec_eval's order). IGNORE_IDENTICAL: drop
    the hit under the query's own id (True), or only for the query ids it holds."""
    drop = query_id in ignore_identical if isinstance(ignore_identical, frozenset) else ignore_identical
    items = [(doc, score) for doc, score in run_for_query.items() if not (drop and doc == query_id)]
    items.sort(key=lambda item: item[0], reverse=True)
    items.sort(key=lambda item: item[1], reverse=True)  # stable: equal scores keep the id order
    return [doc for doc, _ in items]


def evaluate_run(run: Run, qrels: Qrels, ignore_identical: bool | frozenset[str] = True) -> dict[str, float]:
    """Mean nDCG@10, Recall@100 and MRR@10 (x100) over the queries of QRELS with a relevant document."""
    return {metric: float(values.mean()) for metric, values in per_query(run, qrels, ignore_identical).items()}


def per_query(run: Run, qrels: Qrels, ignore_identical: bool | frozenset[str] = True) -> dict[str, np.ndarray]:
    """Each of METRICS (x100) per query of QRELS with a relevant document, in QRELS' order: what a paired test
    of two runs on the same queries compares."""
    values: dict[str, list[float]] = {metric: [] for metric in METRICS}
    for query, relevant in qrels.items():
        relevant = {doc: grade for doc, grade in relevant.items() if grade > 0}
        if not relevant:
            continue
        order = ranked(run.get(query, {}), query, ignore_identical)
        dcg = sum(relevant.get(doc, 0) / math.log2(rank + 2) for rank, doc in enumerate(order[:10]))
        ideal = sum(grade / math.log2(rank + 2) for rank, grade in enumerate(sorted(relevant.values(), reverse=True)[:10]))
        values["ndcg@10"].append(dcg / ideal)
        values["recall@100"].append(len(set(order[:100]) & set(relevant)) / len(relevant))
        first = next((rank for rank, doc in enumerate(order[:10]) if doc in relevant), None)
        values["mrr@10"].append(0.0 if first is None else 1.0 / (first + 1))
    if not values["ndcg@10"]:
        raise RetrieverError("no query has a relevant document: nothing to score")
    return {metric: 100.0 * np.asarray(scores) for metric, scores in values.items()}


# --- through the index -----------------------------------------------------------------------------------


def evaluate_through_index(rset: RetrievalSet, embed: Callable[[Sequence[str]], np.ndarray], encoder,
                           calibrator: str, seed: int = 0, depth: int = 100,
                           fit_queries: bool = False,
                           on_fitted: Callable[[object], None] | None = None) -> dict[str, float]:
    """The dense search's metrics (`evaluate_searches` with that one search)."""
    return evaluate_searches(rset, embed, encoder, calibrator, {"dense": {"mode": "dense"}}, seed, depth,
                             fit_queries, on_fitted)["dense"]


def evaluate_searches(rset: RetrievalSet, embed: Callable[[Sequence[str]], np.ndarray], encoder, calibrator: str,
                      searches: dict[str, dict], seed: int = 0, depth: int = 100, fit_queries: bool = False,
                      on_fitted: Callable[[object], None] | None = None,
                      passages=None) -> dict[str, dict[str, float]]:
    """Build an index of RSET's corpus as `retriever build` does, long documents cut into passages as PASSAGES
    say (None: the default), each text encoded by EMBED (ENCODER's output, possibly cached), fitting
    CALIBRATOR on the corpus as `retriever build` does (FIT_QUERIES: on the corpus plus the queries, unlabeled, as
    `retriever build --fit-queries` does); search every query through it once per entry of SEARCHES (label ->
    `SearchOptions` settings: mode, fusion, weight), exactly as `retriever search` and the server do;
    score each. Returns label -> metrics. ON_FITTED, when given, is called with the index's fitted calibrator
    (the benchmark records what `auto` decided)."""
    return {label: evaluate_run(run, rset.qrels, rset.ignore_identical) for label, run in
            search_runs(rset, embed, encoder, calibrator, searches, seed, depth, fit_queries, on_fitted,
                        passages).items()}


class EmbeddingEncoder:
    """ENCODER whose texts are encoded by EMBED (a cache of its vectors, say): what a benchmark's build encodes
    through, so that it cuts and encodes documents exactly as `retriever build` does, at the cache's speed."""

    def __init__(self, embed: Callable[[Sequence[str]], np.ndarray], encoder):
        self.embed, self.encoder = embed, encoder

    def __getattr__(self, name: str):
        if name == "encoder":
            raise AttributeError(name)
        return getattr(self.encoder, name)

    def encode(self, texts: Sequence[str], progress: bool = False, description: str = "Encoding") -> np.ndarray:
        return np.asarray(self.embed(list(texts)), dtype=np.float32)

    def encode_chunks(self, chunks, on_batch=None):
        for chunk in chunks:
            vectors = self.encode(chunk)
            if on_batch is not None:
                on_batch(len(vectors))
            yield vectors, 0


def search_runs(rset: RetrievalSet, embed: Callable[[Sequence[str]], np.ndarray], encoder, calibrator: str,
                searches: dict[str, dict], seed: int = 0, depth: int = 100, fit_queries: bool = False,
                on_fitted: Callable[[object], None] | None = None, passages=None,
                on_snapshot: Callable[[object], None] | None = None,
                embed_queries: Callable[[Sequence[str]], np.ndarray] | None = None) -> dict[str, Run]:
    """`evaluate_searches`' runs (label -> query id -> {doc id: score}), before scoring. The set's documents are
    built as `retriever build` builds them, cut into passages as PASSAGES say (a `PassageSettings`; None: the
    default), each text encoded by EMBED (the queries by EMBED_QUERIES, where given). ON_FITTED(calibrator) and
    ON_SNAPSHOT(snapshot) see the built version."""
    from retriever.corpus import Document
    from retriever.encode.passages import PassageSettings
    from retriever.index import Index
    from retriever.search.options import SearchOptions
    from retriever.search.searcher import Searcher
    from retriever.versions.snapshot import Snapshot

    doc_ids = list(rset.corpus)
    documents = [Document(doc, text, title, "corpus", number) for number, (doc, (title, text))
                 in enumerate(rset.corpus.items(), start=1)]
    query_ids = list(rset.queries)
    texts = [rset.queries[q] for q in query_ids]
    raw_queries = np.asarray((embed_queries or embed)(texts), dtype=np.float32)
    runs: dict[str, Run] = {}
    with tempfile.TemporaryDirectory(prefix="retriever-bench-") as folder:
        Index.build(documents, "bench", Path(folder) / "indexes", encoder=EmbeddingEncoder(embed, encoder),
                    calibrator=calibrator, calibrator_options={"seed": seed}, index_type="flat", device="cpu",
                    fit_queries=raw_queries if fit_queries else None, passages=passages or PassageSettings())
        with Snapshot.open("bench", Path(folder) / "indexes", device="cpu") as snapshot:
            if on_fitted is not None:
                on_fitted(snapshot.calibrator)
            if on_snapshot is not None:  # what the build decided (its manifest), before anything is searched
                on_snapshot(snapshot)
            searcher = Searcher(snapshot)  # the search path of `Index.search` and the server's batches
            vectors = snapshot.calibrate(raw_queries)
            for label, settings in searches.items():
                options = SearchOptions(k=min(depth + 1, len(doc_ids)), **settings)
                run: Run = {}
                for start in range(0, len(query_ids), 256):
                    batch = slice(start, start + 256)
                    found = searcher.search(texts[batch], vectors[batch], options)
                    for query, hits in zip(query_ids[batch], found):
                        run[query] = {hit.doc_id: hit.score for hit in hits}
                runs[label] = run
    return runs


def _jsonl(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as error:
                    raise RetrieverError(f"{path} line {number}: not valid JSON ({error.msg})") from None
