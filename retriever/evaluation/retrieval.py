"""Retrieval evaluation in BEIR's layout and with BEIR's conventions, through the index's own search path.

A `RetrievalSet` is a corpus, queries and graded qrels. Sources:

- `load_beir(FOLDER)`: any BEIR folder (`corpus.jsonl[.gz]`, `queries.jsonl`, `qrels/<split>.tsv` with header
  `query-id  corpus-id  score`; graded relevance, 0 = not relevant);
- `qnli_retrieval(DATA)`: GLUE QNLI dev as retrieval: each question retrieves the sentence(s) that answer it
  (entailment) among all distinct dev sentences;
- `duplicate_retrieval("stsb" | "sickr", DATA)`: duplicate retrieval on the test split: the corpus is every
  distinct sentence; every sentence of a pair with gold >= 4 is a query whose relevant documents are its partners
  (the query itself, also in the corpus under the same id, is ignored as BEIR ignores identical ids).

Metrics follow trec_eval as BEIR runs it (`pytrec_eval`): nDCG@10 with linear gains, Recall@100, MRR@10; a hit
whose id equals the query id is dropped before cutting; ties in score are broken by document id, descending, as
trec_eval does; a query with no relevant document is not scored. `tests/test_retrieval_eval.py` checks every
metric against pytrec_eval on fixed runs.

`evaluate_through_index` builds a real index from the set's raw vectors (the calibrator fitted on the corpus by
`Index.build`, as for any user), calibrates the queries with the index's calibrator and searches it exactly as
`retriever search` and the server do.
"""

from __future__ import annotations

import gzip
import json
import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retriever.errors import RetrieverError

METRICS = ("ndcg@10", "recall@100", "mrr@10")
DUPLICATE_THRESHOLD = 4.0
Run = dict[str, dict[str, float]]  # query id -> {doc id: score}
Qrels = dict[str, dict[str, int]]  # query id -> {doc id: grade}


@dataclass(frozen=True)
class RetrievalSet:
    name: str
    corpus: dict[str, tuple[str | None, str]]  # doc id -> (title, text)
    queries: dict[str, str]  # query id -> text
    qrels: Qrels  # only queries with at least one relevant (grade > 0) document

    def describe(self) -> dict:
        return {"documents": len(self.corpus), "queries": len(self.queries),
                "relevant": sum(sum(1 for grade in found.values() if grade > 0) for found in self.qrels.values())}


# --- sources -------------------------------------------------------------------------------------------------


def load_beir(folder: str | Path, split: str = "test", name: str | None = None) -> RetrievalSet:
    folder = Path(folder)
    corpus_path = next((folder / f for f in ("corpus.jsonl", "corpus.jsonl.gz") if (folder / f).is_file()), None)
    qrels_path = folder / "qrels" / f"{split}.tsv"
    for path, what in ((corpus_path, "corpus.jsonl"), (folder / "queries.jsonl", "queries.jsonl"), (qrels_path, f"qrels/{split}.tsv")):
        if path is None or not path.is_file():
            raise RetrieverError(f"{folder} is not a BEIR folder: no {what}")
    corpus = {str(r["_id"]): (r.get("title") or None, r["text"]) for r in _jsonl(corpus_path)}
    queries = {str(r["_id"]): r["text"] for r in _jsonl(folder / "queries.jsonl")}
    qrels: Qrels = {}
    for number, line in enumerate(qrels_path.read_text(encoding="utf-8").splitlines(), start=1):
        fields = line.split("\t")
        if number == 1 and not fields[-1].strip().lstrip("-").isdigit():
            continue  # the header
        if len(fields) != 3:
            raise RetrieverError(f"{qrels_path} line {number}: expected query-id, corpus-id, score")
        query, doc, grade = fields[0], fields[1], int(fields[2])
        if grade > 0 and query in queries and doc in corpus:
            qrels.setdefault(query, {})[doc] = grade
    return RetrievalSet(name or folder.name, corpus, {q: queries[q] for q in qrels}, qrels)


def qnli_retrieval(data_dir: str | Path) -> RetrievalSet:
    from retriever.evaluation.tasks import get_task

    (subset,) = get_task("qnli").load(Path(data_dir))["dev"]
    sentences = list(dict.fromkeys(subset.sent2))
    doc_ids = {sentence: f"s{i}" for i, sentence in enumerate(sentences)}
    questions = list(dict.fromkeys(subset.sent1))
    query_ids = {question: f"q{i}" for i, question in enumerate(questions)}
    qrels: Qrels = {}
    for question, sentence, label in zip(subset.sent1, subset.sent2, subset.labels):
        if label == 1:
            qrels.setdefault(query_ids[question], {})[doc_ids[sentence]] = 1
    queries = {query_ids[q]: q for q in questions if query_ids[q] in qrels}
    return RetrievalSet("qnli-retrieval", {doc_ids[s]: (None, s) for s in sentences}, queries, qrels)


def duplicate_retrieval(task_name: str, data_dir: str | Path, threshold: float = DUPLICATE_THRESHOLD) -> RetrievalSet:
    from retriever.evaluation.tasks import get_task

    task = get_task(task_name)
    subsets = task.load(Path(data_dir))[task.eval_split]
    sentences = list(dict.fromkeys(s for subset in subsets for s in (*subset.sent1, *subset.sent2)))
    ids = {sentence: f"s{i}" for i, sentence in enumerate(sentences)}
    qrels: Qrels = {}
    for subset in subsets:
        for first, second, gold in zip(subset.sent1, subset.sent2, subset.labels):
            if gold >= threshold and first != second:
                qrels.setdefault(ids[first], {})[ids[second]] = 1
                qrels.setdefault(ids[second], {})[ids[first]] = 1
    queries = {ids[s]: s for s in sentences if ids[s] in qrels}
    return RetrievalSet(f"{task.name}-dup", {ids[s]: (None, s) for s in sentences}, queries, qrels)


@dataclass(frozen=True)
class RetrievalTask:
    """A retrieval benchmark, declared as data: a name, what it is, and how to load its set from the data
    folder. Scored with `METRICS`; the calibrators are fitted on the task's corpus, by the index build."""

    name: str
    description: str
    load: Callable[[Path], RetrievalSet]
    split: str = "test"
    main_metric: str = "ndcg@10"


RETRIEVAL_TASKS: dict[str, RetrievalTask] = {
    task.name: task for task in (
        RetrievalTask("qnli-retrieval", "QNLI dev: each question retrieves its answering sentence(s) among all "
                      "distinct dev sentences", qnli_retrieval, split="dev"),
        RetrievalTask("stsb-dup", "STS-B test as duplicate retrieval: pairs with gold >= 4, both ways",
                      lambda data: duplicate_retrieval("stsb", data)),
        RetrievalTask("sickr-dup", "SICK test as duplicate retrieval: pairs with gold >= 4, both ways",
                      lambda data: duplicate_retrieval("sickr", data)),
        *(RetrievalTask(f"{year}-dup", f"{year.upper()} as duplicate retrieval: pairs with gold >= 4, both ways",
                        lambda data, year=year: duplicate_retrieval(year, data))
          for year in ("sts12", "sts13", "sts14", "sts15", "sts16")),
        *(RetrievalTask(name, description, lambda data, name=name: _passage_task(name, data))
          for name, description in (
              ("bible-parallel", "a King James verse retrieves the same verse of the World English Bible (New "
                                 "Testament), from passages/"),
              ("wordnet-define", "a WordNet lemma retrieves the glosses of its synsets, from passages/"),
              ("debian-package", "a Debian package's synopsis retrieves its description's paragraphs, from "
                                 "passages/"),
              ("foldoc-term", "a FOLDOC headword retrieves the paragraphs defining it, from passages/"))),
    )
}


def _passage_task(name: str, data_dir: Path) -> RetrievalSet:
    from retriever.evaluation import passage_tasks

    return getattr(passage_tasks, name.replace("-", "_"))(Path(data_dir))


def beir_task(folder: str | Path, split: str = "test") -> RetrievalTask:
    """A task for any BEIR folder (`retriever bench beir PATH`), named after the folder."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise RetrieverError(f"beir: {folder} is not a folder")
    return RetrievalTask(folder.name, f"BEIR folder {folder}", lambda data: load_beir(folder, split), split=split)


# --- metrics -------------------------------------------------------------------------------------------------


def ranked(run_for_query: dict[str, float], query_id: str, ignore_identical: bool = True) -> list[str]:
    """Document ids best first: score descending, ties by id descending (trec_eval's order)."""
    items = [(doc, score) for doc, score in run_for_query.items() if not (ignore_identical and doc == query_id)]
    items.sort(key=lambda item: item[0], reverse=True)
    items.sort(key=lambda item: item[1], reverse=True)  # stable: equal scores keep the id order
    return [doc for doc, _ in items]


def evaluate_run(run: Run, qrels: Qrels, ignore_identical: bool = True) -> dict[str, float]:
    """Mean nDCG@10, Recall@100 and MRR@10 (x100) over the queries of QRELS with a relevant document."""
    totals = dict.fromkeys(METRICS, 0.0)
    scored = 0
    for query, relevant in qrels.items():
        relevant = {doc: grade for doc, grade in relevant.items() if grade > 0}
        if not relevant:
            continue
        scored += 1
        order = ranked(run.get(query, {}), query, ignore_identical)
        dcg = sum(relevant.get(doc, 0) / math.log2(rank + 2) for rank, doc in enumerate(order[:10]))
        ideal = sum(grade / math.log2(rank + 2) for rank, grade in enumerate(sorted(relevant.values(), reverse=True)[:10]))
        totals["ndcg@10"] += dcg / ideal
        totals["recall@100"] += len(set(order[:100]) & set(relevant)) / len(relevant)
        first = next((rank for rank, doc in enumerate(order[:10]) if doc in relevant), None)
        totals["mrr@10"] += 0.0 if first is None else 1.0 / (first + 1)
    if not scored:
        raise RetrieverError("no query has a relevant document: nothing to score")
    return {metric: 100.0 * total / scored for metric, total in totals.items()}


# --- through the index -----------------------------------------------------------------------------------


def evaluate_through_index(rset: RetrievalSet, embed: Callable[[Sequence[str]], np.ndarray], encoder,
                           calibrator: str, seed: int = 0, depth: int = 100,
                           fit_queries: bool = False,
                           on_fitted: Callable[[object], None] | None = None) -> dict[str, float]:
    """Build an index of RSET's corpus from its raw vectors (EMBED: ENCODER's output, possibly cached), fitting
    CALIBRATOR on the corpus as `retriever build` does (FIT_QUERIES: on the corpus plus the queries, unlabeled, as
    `retriever build --fit-queries` does); search every query through it; score. ON_FITTED, when given, is
    called with the index's fitted calibrator (the benchmark records what `auto` decided)."""
    from retriever.corpus import Document, document_text
    from retriever.index import Index

    doc_ids = list(rset.corpus)
    documents = [Document(doc, text, title, "corpus", number) for number, (doc, (title, text))
                 in enumerate(rset.corpus.items(), start=1)]
    raw_documents = np.asarray(embed([document_text(d) for d in documents]), dtype=np.float32)
    query_ids = list(rset.queries)
    raw_queries = np.asarray(embed([rset.queries[q] for q in query_ids]), dtype=np.float32)
    with tempfile.TemporaryDirectory(prefix="retriever-bench-") as folder:
        corpus = Path(folder) / "corpus.jsonl"
        with open(corpus, "w", encoding="utf-8") as file:
            for document in documents:
                file.write(json.dumps({"_id": document.doc_id, "title": document.title, "text": document.text},
                                      ensure_ascii=False) + "\n")
        np.save(Path(folder) / "vectors.npy", raw_documents)
        Index.build(corpus, "bench", Path(folder) / "indexes", vectors=Path(folder) / "vectors.npy", encoder=encoder,
                    calibrator=calibrator, calibrator_options={"seed": seed}, index_type="flat", device="cpu",
                    fit_queries=raw_queries if fit_queries else None)
        index = Index.open("bench", Path(folder) / "indexes", device="cpu")
        if on_fitted is not None:
            on_fitted(index.calibrator)
        run: Run = {}
        for start in range(0, len(query_ids), 256):
            batch = query_ids[start : start + 256]
            scores, rows = index.search_vectors(index.calibrate(raw_queries[start : start + 256]),
                                                min(depth + 1, len(doc_ids)))
            for query, hits in zip(batch, index.hits(scores, rows)):
                run[query] = {hit.doc_id: hit.score for hit in hits}
        for segment in index.segments:
            segment.close()
    return evaluate_run(run, rset.qrels)


def _jsonl(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as file:
        for number, line in enumerate(file, start=1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as error:
                    raise RetrieverError(f"{path} line {number}: not valid JSON ({error.msg})") from None
