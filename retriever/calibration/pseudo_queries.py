"""Pseudo-queries made from a corpus alone, for judging calibration without labels (`calibration.check`).

Real queries find their documents partly by the words they share with them and partly by meaning. The check
mixes pseudo-queries of both sorts, four kinds, each after a task that retrieval research uses for it:

- ``title``: a document's title -> its text without the title (title/body pairs, Chang et al., ICLR 2020);
- ``sentence``: one sentence of a document of several -> the rest of the document (the inverse cloze task, Lee et
  al., ACL 2019, with the sentence always removed);
- ``span``: a short run of words -> the document without those words (cropping in the manner of Contriever,
  Izacard et al., TMLR 2022, with the two sides disjoint): the kind a one-sentence corpus still gives;
- ``known-item``: a few of a document's words, drawn in proportion to their inverse document frequency -> the
  document as stored (simulated known-item queries, Azzopardi, de Rijke & Balog, SIGIR 2007).

The first three never let the target contain the query (it is cut out, and the rest encoded again), so they judge
meaning alone; known-item queries judge matching by shared words. Each sampled document gives one pseudo-query,
of the kind it qualifies for that has been used least so far, so the kinds are balanced as far as the corpus
allows and no single kind (in particular no purely lexical one) decides.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from retriever.calibration.check import CheckSet

KINDS = ("title", "sentence", "span", "known-item")
# A sentence ends at . ! or ? (and any closing quote or bracket) followed by space and a capital, digit or opening
# quote: good enough for English prose, and a wrong split only makes one pseudo-query a little easier or harder.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_TERM = re.compile(r"\w[\w'-]*")
# Fewer words than this leave a query or a target too vague to have one right answer.
MIN_WORDS = 3
# A span is SPAN_SHARE of a document's words (drawn uniformly in this range), at most SPAN_MAX_WORDS: short,
# like a typed query, and short enough to leave most of the document as its target.
SPAN_SHARE = (0.25, 0.5)
SPAN_MAX_WORDS = 16
# A known-item query has this many distinct terms (drawn uniformly), at most half of the document's: the lengths
# of typed keyword queries.
KNOWN_ITEM_TERMS = (3, 6)


@dataclass(frozen=True)
class PseudoQuery:
    kind: str  # one of KINDS
    query: str
    target: str | None  # the source document without the query, to encode; None: the document as stored
    source: int  # position of the source document in the sequence given to `make_pseudo_queries`


def make_pseudo_queries(documents: Sequence[tuple[str | None, str]], seed: int = 0,
                        limit: int | None = None) -> list[PseudoQuery]:
    """At most one pseudo-query per (title, text) document, in the order given (callers pass a random sample),
    at most LIMIT in all; documents too short for every kind give none. Inverse document frequencies for the
    known-item kind are those of DOCUMENTS."""
    rng = np.random.default_rng(seed)
    frequencies = Counter(term for _, text in documents for term in set(_terms(text)))
    used = dict.fromkeys(KINDS, 0)
    made: list[PseudoQuery] = []
    for position, (title, text) in enumerate(documents):
        if limit is not None and len(made) >= limit:
            break
        title = " ".join((title or "").split())
        words = text.split()
        sentences = split_sentences(text)
        terms = list(dict.fromkeys(_terms(text)))
        qualifies = {"title": _title_ok(title, words), "sentence": len(sentences) >= 2 and bool(_removable(sentences)),
                     "span": len(words) >= 2 * MIN_WORDS, "known-item": len(terms) >= 2 * KNOWN_ITEM_TERMS[0]}
        kinds = [kind for kind in KINDS if qualifies[kind]]
        if not kinds:
            continue
        fewest = min(used[kind] for kind in kinds)
        kind = str(rng.choice([kind for kind in kinds if used[kind] == fewest]))
        used[kind] += 1
        prefix = f"{title} " if title else ""
        if kind == "title":
            query, target = title, " ".join(words)
        elif kind == "sentence":
            pick = int(rng.choice(_removable(sentences)))
            query = sentences[pick]
            target = prefix + " ".join(sentences[:pick] + sentences[pick + 1:])
        elif kind == "span":
            low, high = SPAN_SHARE
            length = min(SPAN_MAX_WORDS, max(MIN_WORDS, round(len(words) * rng.uniform(low, high))))
            start = int(rng.integers(0, len(words) - length + 1))
            query = " ".join(words[start : start + length])
            target = prefix + " ".join(words[:start] + words[start + length:])
        else:
            count = min(int(rng.integers(KNOWN_ITEM_TERMS[0], KNOWN_ITEM_TERMS[1] + 1)), len(terms) // 2)
            weights = np.array([math.log((len(documents) + 1) / frequencies[term]) for term in terms]) + 1e-6
            picks = np.sort(rng.choice(len(terms), size=count, replace=False, p=weights / weights.sum()))
            query, target = " ".join(terms[i] for i in picks), None
        made.append(PseudoQuery(kind, query, target, position))
    return made


def split_sentences(text: str) -> list[str]:
    return [part.strip() for part in _SENTENCE_END.split(" ".join(text.split())) if part.strip()]


def _terms(text: str) -> list[str]:
    return [term.lower() for term in _TERM.findall(text)]


def _title_ok(title: str, words: list[str]) -> bool:
    return bool(title) and len(words) >= MIN_WORDS and title.lower() != " ".join(words).lower()


def _removable(sentences: list[str]) -> list[int]:
    """The sentences of at least MIN_WORDS words whose removal leaves at least MIN_WORDS."""
    total = sum(len(sentence.split()) for sentence in sentences)
    return [i for i, sentence in enumerate(sentences) if MIN_WORDS <= len(sentence.split()) <= total - MIN_WORDS]


# --- from a corpus to a check set ---------------------------------------------------------------------------------

# Pseudo-queries a check makes: enough for an interval of about +-1 nDCG@10 point on a difference between two
# calibrators, few enough that encoding them costs seconds next to a build.
PSEUDO_QUERIES = 2000
# Documents drawn per pseudo-query wanted (some are too short for any kind).
OVERSAMPLE = 3
# Other corpus documents searched among: bounds the cost on large corpora.
DISTRACTORS = 50_000


def sample_pseudo_queries(rows: int, documents_at: Callable[[np.ndarray], list[tuple[str | None, str]]],
                          rng: np.random.Generator, seed: int = 0, pseudo_queries: int = PSEUDO_QUERIES,
                          ) -> tuple[list[PseudoQuery], np.ndarray]:
    """Pseudo-queries from a random sample of a corpus of ROWS documents (drawn with RNG; the pseudo-queries made
    with SEED), and each one's source position."""
    drawn = rng.choice(rows, size=min(rows, OVERSAMPLE * pseudo_queries), replace=False)
    ascending = np.sort(drawn)  # read forward; the pseudo-queries then follow the random draw
    found = dict(zip(ascending.tolist(), documents_at(ascending)))
    made = make_pseudo_queries([found[position] for position in drawn.tolist()], seed, pseudo_queries)
    return made, drawn[[query.source for query in made]].astype(np.int64)


def make_check_set(rows: int, documents_at: Callable[[np.ndarray], list[tuple[str | None, str]]],
                   vectors_at: Callable[[np.ndarray], np.ndarray], encoder, seed: int = 0,
                   pseudo_queries: int = PSEUDO_QUERIES, distractors: int = DISTRACTORS,
                   progress: bool = False) -> CheckSet:
    """A `CheckSet` for a corpus of ROWS documents: pseudo-queries from a seeded sample of them, encoded with
    ENCODER, and the stored vectors of other documents as distractors.

    DOCUMENTS_AT(positions) gives (title, text) and VECTORS_AT(positions) the raw vectors of ascending 0-based
    document positions: the build reads them from its SQLite table and encoded vectors, `Index.check` from an
    index's segments."""
    rng = np.random.default_rng(seed)
    made, sources = sample_pseudo_queries(rows, documents_at, rng, seed, pseudo_queries)
    queries = encoder.encode([query.query for query in made], progress=progress,
                             description="Encoding pseudo-queries")
    dim = queries.shape[1]
    targets = np.empty((len(made), dim), np.float32)
    rewritten = np.array([query.target is not None for query in made], dtype=bool)
    if rewritten.any():
        targets[rewritten] = encoder.encode([query.target for query in made if query.target is not None],
                                            progress=progress, description="Encoding their targets")
    if (~rewritten).any():  # known-item: the document as stored
        order = np.argsort(sources[~rewritten])
        stored = np.empty((int((~rewritten).sum()), dim), np.float32)
        stored[order] = vectors_at(sources[~rewritten][order])
        targets[~rewritten] = stored
    others = rng.choice(rows, size=min(rows, distractors + len(sources)), replace=False)
    others = np.sort(others[~np.isin(others, sources)][:distractors])
    pool = vectors_at(others) if len(others) else np.empty((0, dim), np.float32)
    # The texts too, for the hybrid check's keyword side: a target as encoded, a stored document as the keyword
    # index reads it (title and text).
    stored_texts = {}
    if (~rewritten).any() or len(others):
        wanted = np.unique(np.concatenate([sources[~rewritten], others]))
        stored_texts = dict(zip(wanted.tolist(), (f"{title} {text}" if title else text
                                                  for title, text in documents_at(wanted))))
    target_texts = [query.target if query.target is not None else stored_texts[int(source)]
                    for query, source in zip(made, sources.tolist())]
    return CheckSet(queries, targets, np.asarray([query.kind for query in made], dtype=str), pool,
                    [query.query for query in made], target_texts + [stored_texts[i] for i in others.tolist()])
