"""Lexical-similarity analysis (BERT-flow, Table 6): how strongly does a similarity follow word overlap?

For each pair we take the word-level edit distance between the two sentences and report the Spearman
correlation (×100) between it and the gold score, and between it and each embedding similarity. A similarity
that correlates with edit distance much more strongly (more negatively) than gold does is judging pairs by
surface form rather than meaning.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np
from rapidfuzz.distance import Levenshtein

from retriever.evaluation.evaluators import spearman_x100

_TOKEN = re.compile(r"\w+|[^\w\s]")


def word_tokens(sentence: str) -> list[str]:
    """Lower-cased words and punctuation marks, so the original and SentEval layouts tokenize alike."""
    return _TOKEN.findall(sentence.lower())


def word_edit_distances(
    sent1: Sequence[str], sent2: Sequence[str], tokenize: Callable[[str], list[str]] = word_tokens
) -> np.ndarray:
    """Levenshtein distance between token lists: insertions, deletions and substitutions of whole words."""
    return np.array([Levenshtein.distance(tokenize(a), tokenize(b)) for a, b in zip(sent1, sent2, strict=True)])


def lexical_analysis(
    sent1: Sequence[str],
    sent2: Sequence[str],
    gold: np.ndarray,
    sims: Mapping[str, np.ndarray],
    max_distance: int | None = None,
) -> dict[str, float]:
    """Spearman×100 between word edit distance and ``gold`` (key "gold") and each named similarity.

    ``max_distance`` keeps only pairs at most that many word edits apart (the paper's lexically similar pairs).
    """
    distances = word_edit_distances(sent1, sent2)
    keep = np.ones(len(distances), bool) if max_distance is None else distances <= max_distance
    if keep.sum() < 2:
        raise ValueError(f"only {int(keep.sum())} pairs within edit distance {max_distance}")
    if "gold" in sims:
        raise ValueError('"gold" is reserved for the gold scores; rename that similarity')
    columns = {"gold": np.asarray(gold), **{name: np.asarray(values) for name, values in sims.items()}}
    for name, values in columns.items():
        if len(values) != len(distances):
            raise ValueError(f"{name}: {len(values)} values for {len(distances)} pairs")
    return {name: spearman_x100(values[keep], distances[keep]) for name, values in columns.items()}
