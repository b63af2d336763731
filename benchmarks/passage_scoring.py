"""Issue 54's study: how a cut document should be scored from its passages, on real questions and on the
long-document yardstick. Each task is built once as `retriever build` builds it (passages, calibrator `auto`, the
keyword index); then every query is scored against every document in NumPy from what the index stores (its
calibrated passage vectors, spans and texts), under each rule below, and each hybrid fused by the product's fusion
(`zscore-union`) over each side's top 100 at the weight the index decided. nDCG@10 x100 (recall@10 on the long
sets); the index's own rules are `cover` and `cover`, and a `--no-passages` build's are `first` and `whole`.

Dense, a document's score from its passages' cosines:
- `first`: its first passage's (what the encoder reads of it: a build without passages);
- `max`: its best passage's (MaxP, Dai and Callan, SIGIR 2019; the rule before issue 54);
- `cover`: the first weighed by the share of the text it spans, the best by the rest (`passages.document_scores`);
- `near`: `cover` for a document at most twice what the encoder reads (its first passage spans at least half of
  it), `max` for one far longer, whose first passage is one part among many (the issue's "passage scoring only for
  documents far longer than the length normalisation handles", on the dense side).
Keyword, BM25 over title and text (k1 1.2, b 0.75, the query's every word, as the index scores):
- `whole`: the document whole, with the documents' statistics;
- `passage`: its best passage, with the passages' statistics (the rule before issue 54);
- `sum`: whole + passage (Callan, SIGIR 1994);
- `cover`: whole weighed by the share of the text the first passage spans, the rest by the better of whole and its
  best passage scored with the documents' statistics (the index's rule, `search.keyword`);
- `near`: `whole` for a document at most twice what the encoder reads (its first passage spans at least half of
  it), `cover` for one far longer (the issue's "passage scoring only for documents far longer than the length
  normalisation handles", on the keyword side).

    python benchmarks/passage_scoring.py run --tasks ir-classic --max-lengths 256,128,64 \\
        --out benchmarks/results/passage_scoring/ir_classic_minilm.json
    python benchmarks/passage_scoring.py run --tasks long --out benchmarks/results/passage_scoring/long_minilm.json
    python benchmarks/passage_scoring.py report benchmarks/results/passage_scoring/*.json \\
        --out benchmarks/results/passage_scoring.md
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.hybrid import model_path  # noqa: E402
from benchmarks.passages_real import GROUPS, LONG, load_task, recall_at, split_of  # noqa: E402
from benchmarks.study_cli import generated_from, study_main  # noqa: E402

DENSE = ("first", "max", "cover", "near")
KEYWORD = ("whole", "passage", "sum", "cover", "near")
CANDIDATES = 100


def bm25(texts: list[str], queries: list[str], statistics: tuple[np.ndarray, float, int] | None = None):
    """BM25 of each query over TEXTS (queries x texts), and the texts' statistics (each term's document frequency
    as a dict, the average length, their number); STATISTICS: score with those instead (another set's)."""
    from retriever.store.keywords import B, K1, Tokenizer, text_postings

    postings, lengths = text_postings(texts)
    frequency = {term: len(at) for term, (at, _) in postings.items()}
    own = (frequency, float(lengths.mean()) if len(lengths) else 1.0, len(texts))
    frequency, average, count = statistics or own
    norms = (K1 * (1 - B + B * lengths / max(average, 1e-9))).astype(np.float32)
    tokenize = Tokenizer.get()
    scores = np.zeros((len(queries), len(texts)), np.float32)
    for row, query in enumerate(queries):
        for term, many in tokenize(query).items():
            if term in postings and frequency.get(term):
                at, tf = postings[term]
                idf = np.log1p((count - frequency[term] + 0.5) / (frequency[term] + 0.5))
                tf = tf.astype(np.float32)
                scores[row, at] += many * idf * tf * (K1 + 1) / (tf + norms[at])
    return scores, own


def scored(rset, encoder, seed: int = 0) -> tuple[dict, dict, float, list[str], list[str]]:
    """RSET built with passages as `retriever build` builds it; each rule's scores (queries x documents) and the
    weight the index decided, with the documents' and queries' ids."""
    from retriever.corpus import Document
    from retriever.evaluation.retrieval import EmbeddingEncoder
    from retriever.index import Index
    from retriever.numeric import l2_normalize
    from retriever.store.passages import PASSAGE_BITS, coverages, document_of
    from retriever.versions.snapshot import Snapshot

    documents = [Document(doc, text, title, "corpus", number)
                 for number, (doc, (title, text)) in enumerate(rset.corpus.items(), start=1)]
    query_ids = list(rset.queries)
    texts = [rset.queries[query] for query in query_ids]
    with tempfile.TemporaryDirectory(prefix="retriever-scoring-") as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Index.build(documents, "scoring", Path(folder), encoder=EmbeddingEncoder(encoder.encode, encoder),
                    calibrator_options={"seed": seed}, index_type="flat", device="cpu")
        with Snapshot.open("scoring", Path(folder), device="cpu") as snapshot:
            (segment,) = snapshot.segments
            split = segment.split
            keys = np.asarray(segment.keys).copy() if split else np.asarray(segment.rowids) << PASSAGE_BITS
            owners = document_of(keys) - 1  # row ids 1.. in corpus order
            passages = l2_normalize(snapshot.calibrate(np.asarray(segment.raw, np.float32)))
            queries = l2_normalize(snapshot.calibrate(np.asarray(encoder.encode(texts), np.float32)))
            spans = np.asarray(segment.spans).copy() if split else np.column_stack(
                [np.zeros(len(keys), np.int64), [len(document.text) for document in documents]])
            weight = float(snapshot.manifest.hybrid["weight"])
    coverage = coverages(keys, spans)
    starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
    similarity = queries @ passages.T
    first, best = similarity[:, starts], np.maximum.reduceat(similarity, starts, axis=1)
    share = coverage[starts]
    cover = share * first + (1 - share) * best
    dense = {"first": first, "max": best, "cover": cover, "near": np.where(share >= 0.5, cover, best)}
    whole_texts = [f"{d.title} {d.text}" if d.title else d.text for d in documents]
    passage_texts = [(f"{documents[o].title} " if documents[o].title else "") + documents[o].text[a:b]
                     for o, (a, b) in zip(owners.tolist(), spans.tolist())]
    whole, statistics = bm25(whole_texts, texts)
    by_passages = np.maximum.reduceat(bm25(passage_texts, texts)[0], starts, axis=1)
    as_documents = np.maximum.reduceat(bm25(passage_texts, texts, statistics)[0], starts, axis=1)
    keyword_cover = share * whole + (1 - share) * np.maximum(whole, as_documents)
    keyword = {"whole": whole, "passage": by_passages, "sum": whole + by_passages, "cover": keyword_cover,
               "near": np.where(share >= 0.5, whole, keyword_cover)}
    return dense, keyword, weight, [document.doc_id for document in documents], query_ids


def fused(dense: np.ndarray, keyword: np.ndarray, weight: float) -> np.ndarray:
    """The product's default fusion of each query's two score rows, over each side's top CANDIDATES."""
    from retriever.defaults import DEFAULT_FUSION
    from retriever.search.fusion import make_fusion, scored_candidates

    fusion = make_fusion(DEFAULT_FUSION)
    out = np.full(dense.shape, -np.inf, np.float32)
    for row, (one, other) in enumerate(zip(dense, keyword)):
        candidates = scored_candidates(one, other, CANDIDATES)
        out[row, candidates.rowids] = fusion.scores(candidates, weight)
    return out


def metric(scores: np.ndarray, doc_ids: list[str], query_ids: list[str], rset, long: bool) -> float:
    from retriever.evaluation.retrieval import evaluate_run

    run = {}
    for query, row in zip(query_ids, scores):
        top = np.argsort(-row, kind="stable")[:100]
        run[query] = {doc_ids[i]: float(row[i]) for i in top if np.isfinite(row[i])}
    return round(recall_at(run, rset) / 100, 4) if long else round(
        evaluate_run(run, rset.qrels, rset.ignore_identical)["ndcg@10"], 2)


def run(model: str, tasks: list[str], max_lengths: list[int]) -> dict:
    from retriever.encode.encoder import Encoder
    from retriever.evaluation.cache import CachedEncoder, resolve_cache_dir
    from retriever.evaluation.data import resolve_data_dir

    data, found = resolve_data_dir(), {"model": model, "tasks": []}
    for max_length in max_lengths:
        encoder = CachedEncoder(Encoder(model_path(model), "last-avg", None, max_length, device="cpu"),
                                resolve_cache_dir())
        for name in tasks:
            rset, long = load_task(name, data), name in LONG
            dense, keyword, weight, doc_ids, query_ids = scored(rset, encoder)
            record = {"task": name, "split": split_of(name), "max_length": max_length, "weight": weight,
                      "dense": {rule: metric(scores, doc_ids, query_ids, rset, long) for rule, scores in dense.items()},
                      "keyword": {rule: metric(scores, doc_ids, query_ids, rset, long)
                                  for rule, scores in keyword.items()},
                      "hybrid": {f"{one}+{other}": metric(fused(dense[one], keyword[other], weight), doc_ids,
                                                          query_ids, rset, long)
                                 for one in DENSE for other in KEYWORD}}
            print(json.dumps({key: record[key] for key in ("task", "max_length", "dense", "keyword")}),
                  file=sys.stderr, flush=True)
            found["tasks"].append(record)
    return found


def report(files: list[Path]) -> str:
    lines = ["# Scoring a cut document from its passages (issue 54's study)", "",
             f"{generated_from(__file__, files)}; "
             "the rules are in the script's docstring. Hybrid: dense rule + keyword rule, fused by the default "
             "fusion at the weight each index decided. nDCG@10 x100 (recall@10 on the long-document sets). "
             "*first + whole* is what a `--no-passages` build ranks by; *max + passage*, the rules before issue 54; "
             "*cover + cover*, the index's rules now.", ""]
    shown = [("first", "whole"), ("max", "passage"), ("max", "whole"), ("cover", "whole"), ("cover", "sum"),
             ("cover", "cover"), ("near", "cover"), ("cover", "near")]
    for path in files:
        found = json.loads(path.read_text())
        lines += [f"## {path.name}", "", f"Command: `{found.get('command', 'not recorded')}`.", "",
                  "| task | max length | dense: " + " / ".join(DENSE) + " | keyword: " + " / ".join(KEYWORD) + " | "
                  + " | ".join(f"{one} + {other}" for one, other in shown) + " |",
                  "|---|---:|---:|---:|" + "---:|" * len(shown)]
        for task in found["tasks"]:  # a rule added after a file was made: "-" in it
            lines.append(f"| {task['task']} | {task['max_length']} | "
                         + " / ".join(_cell(task["dense"].get(rule)) for rule in DENSE) + " | "
                         + " / ".join(_cell(task["keyword"].get(rule)) for rule in KEYWORD) + " | "
                         + " | ".join(_cell(task["hybrid"].get(f"{one}+{other}")) for one, other in shown) + " |")
        by = {}
        for task in found["tasks"]:
            by.setdefault(task["max_length"], []).append(task)
        lines += ["", "Mean by max length (difference from *first + whole*, the build without passages):", "",
                  "| max length | tasks | " + " | ".join(f"{one} + {other}" for one, other in shown) + " |",
                  "|---:|---:|" + "---:|" * len(shown)]
        for max_length, tasks in sorted(by.items()):
            base = np.mean([task["hybrid"]["first+whole"] for task in tasks])
            cells, digits = [], 3 if tasks[0]["task"] in LONG else 2
            for one, other in shown:
                if any(f"{one}+{other}" not in task["hybrid"] for task in tasks):
                    cells.append("-")
                    continue
                values = [task["hybrid"][f"{one}+{other}"] - task["hybrid"]["first+whole"] for task in tasks]
                cells.append(f"{np.mean(values) + base:.{digits}f} ({np.mean(values):+.{digits}f}, worst "
                             f"{min(values):+.{digits}f})")
            lines.append(f"| {max_length} | {len(tasks)} | " + " | ".join(cells) + " |")
        lines += ["", *held_out(found["tasks"])] if not any(task["task"] in LONG for task in found["tasks"]) else []
        lines.append("")
    return "\n".join(lines) + "\n"


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def held_out(tasks: list[dict]) -> list[str]:
    """Each collection held out of the choice of rules: the pair the other collections choose (the highest mean
    difference from *first + whole* over their tasks, every max length), and what it gives the one held out."""
    pairs = [f"{one}+{other}" for one in DENSE for other in KEYWORD if f"{one}+{other}" in tasks[0]["hybrid"]]
    collections = sorted({task["task"] for task in tasks})
    lines = [f"Each collection held out of the choice: the rules (of all {len(pairs)} pairs) with the highest mean difference "
             "from *first + whole* on the other two collections, at every max length, and what they give the one "
             "held out:", "", "| held out | chosen on the others | others' mean | held out: difference at each "
             "max length | held out: *cover + cover* |", "|---|---|---:|---|---|"]

    def differences(pair: str, chosen: list[dict]) -> list[float]:
        return [task["hybrid"][pair] - task["hybrid"]["first+whole"] for task in chosen]

    for collection in collections:
        others = [task for task in tasks if task["task"] != collection]
        mine = sorted((task for task in tasks if task["task"] == collection), key=lambda task: -task["max_length"])
        chosen = max(pairs, key=lambda pair: np.mean(differences(pair, others)))
        shown = ", ".join(f"{task['max_length']}: {value:+.2f}"
                          for task, value in zip(mine, differences(chosen, mine)))
        ours = ", ".join(f"{task['max_length']}: {value:+.2f}"
                         for task, value in zip(mine, differences("cover+cover", mine)))
        lines.append(f"| {collection} | {chosen.replace('+', ' + ')} | "
                     f"{np.mean(differences(chosen, others)):+.2f} | {shown} | {ours} |")
    return lines


def main() -> None:
    def arguments(running: argparse.ArgumentParser) -> None:
        running.add_argument("--model", default="minilm")
        running.add_argument("--tasks", default="ir-classic")
        running.add_argument("--max-lengths", default="256")

    def measured(args: argparse.Namespace) -> dict:
        tasks = [task for part in args.tasks.split(",") for task in GROUPS.get(part, (part,))]
        return run(args.model, tasks, [int(length) for length in args.max_lengths.split(",")])

    study_main(__file__, __doc__, report, run=(arguments, measured))


if __name__ == "__main__":
    main()
