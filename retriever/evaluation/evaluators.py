"""Scores for embedded sentence pairs: Spearman×100 for STS, ROC-AUC×100 for pair classification (QNLI).

Evaluators see only arrays (or an ``embed(texts) -> array`` callable), never a model. Results are flat
records ``{"dataset", "split", "metric", "aggregation", "score"}`` that the bench runner can emit as-is.

Aggregations for tasks made of several subsets (STS12–16) are both reported, because papers disagree:
- ``wmean``: per-subset Spearman averaged with subset sizes as weights (SentEval, BERT-flow, whitening);
- ``all``: one Spearman over all subsets concatenated (SimCSE, mteb).
A task read from one file (STS-B, SICK-R, QNLI) has one score, labelled with its split ("test", "dev").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from scipy.stats import spearmanr

from retriever.evaluation.data import PairSubset, Task

Embed = Callable[[list[str]], np.ndarray]
PairEmbeddings = tuple[np.ndarray, np.ndarray]  # rows of sent1, rows of sent2


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``a`` with the same row of ``b``; a zero vector scores 0."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"expected two (n, dim) arrays of the same shape, got {a.shape} and {b.shape}")
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.einsum("ij,ij->i", a, b) / np.maximum(norms, 1e-12)


def spearman_x100(scores: np.ndarray, gold: np.ndarray) -> float:
    return float(spearmanr(scores, gold).statistic * 100)


def roc_auc_x100(scores: np.ndarray, labels: np.ndarray) -> float:
    # Imported here: scikit-learn takes about a second to import and only QNLI needs it.
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, scores) * 100)


def embed_pairs(subsets: Sequence[PairSubset], embed: Embed) -> list[PairEmbeddings]:
    """Embed every distinct sentence of ``subsets`` once (one ``embed`` call), then lay the rows out per pair."""
    sentences = list(dict.fromkeys(s for subset in subsets for s in (*subset.sent1, *subset.sent2)))
    vectors = np.asarray(embed(sentences))
    if vectors.ndim != 2 or len(vectors) != len(sentences):
        raise ValueError(f"embed() returned shape {vectors.shape} for {len(sentences)} sentences")
    row = {sentence: i for i, sentence in enumerate(sentences)}
    return [
        (vectors[[row[s] for s in subset.sent1]], vectors[[row[s] for s in subset.sent2]]) for subset in subsets
    ]


def _record(dataset: str, split: str, metric: str, aggregation: str, score: float) -> dict:
    return {"dataset": dataset, "split": split, "metric": metric, "aggregation": aggregation, "score": score}


def sts_records(
    dataset: str,
    split: str,
    subsets: Sequence[PairSubset],
    similarities: Sequence[np.ndarray],
    per_subset: bool = False,
) -> list[dict]:
    """Spearman×100 of similarity vs gold: one ``split`` record for a single file, else ``wmean`` and ``all``.

    ``per_subset`` adds one record per subset, labelled ``subset:<name>``.
    """
    _check_aligned(subsets, similarities)
    per = [spearman_x100(sims, subset.labels) for subset, sims in zip(subsets, similarities)]
    if len(subsets) == 1:
        return [_record(dataset, split, "spearman", split, per[0])]
    sizes = [len(subset) for subset in subsets]
    wmean = float(np.average(per, weights=sizes))
    pooled = spearman_x100(np.concatenate(similarities), np.concatenate([s.labels for s in subsets]))
    records = [
        _record(dataset, split, "spearman", "wmean", wmean),
        _record(dataset, split, "spearman", "all", pooled),
    ]
    if per_subset:
        records += [_record(dataset, split, "spearman", f"subset:{s.name}", p) for s, p in zip(subsets, per)]
    return records


def pair_classification_records(
    dataset: str, split: str, subsets: Sequence[PairSubset], similarities: Sequence[np.ndarray]
) -> list[dict]:
    """ROC-AUC×100 of similarity as a score for the positive (1) label, over all subsets together."""
    _check_aligned(subsets, similarities)
    labels = np.concatenate([subset.labels for subset in subsets])
    return [_record(dataset, split, "auc", split, roc_auc_x100(np.concatenate(similarities), labels))]


def evaluate(
    task: Task,
    subsets: Sequence[PairSubset],
    embeddings: Embed | Sequence[PairEmbeddings],
    split: str | None = None,
    per_subset: bool = False,
) -> list[dict]:
    """Score one loaded split of ``task`` (default: its evaluation split) with cosine similarity.

    ``embeddings`` is either ``embed(texts) -> (n, dim) array`` or, per subset, the (sent1, sent2) arrays.
    """
    split = split or task.eval_split
    pairs = embed_pairs(subsets, embeddings) if callable(embeddings) else list(embeddings)
    if len(pairs) != len(subsets):
        raise ValueError(f"got embeddings for {len(pairs)} subsets, {task.name}/{split} has {len(subsets)}")
    similarities = [cosine_rows(a, b) for a, b in pairs]
    if task.metric == "spearman":
        return sts_records(task.name, split, subsets, similarities, per_subset)
    if task.metric == "auc":
        return pair_classification_records(task.name, split, subsets, similarities)
    raise ValueError(f"{task.name}: unknown metric {task.metric!r}")


def _check_aligned(subsets: Sequence[PairSubset], similarities: Sequence[np.ndarray]) -> None:
    if len(subsets) != len(similarities):
        raise ValueError(f"{len(similarities)} similarity arrays for {len(subsets)} subsets")
    for subset, sims in zip(subsets, similarities):
        if len(sims) != len(subset):
            raise ValueError(f"subset {subset.name}: {len(sims)} similarities for {len(subset)} pairs")
