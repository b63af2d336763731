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
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from retriever.calibration.check import DEPTH, CheckSet, count_ahead, paired_scores
from retriever.numeric import l2_normalize_in_place

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
# The pseudo-queries a check's first round holds (`CheckRounds`); each later round holds twice the last's.
FIRST_ROUND = 250


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
    """A `CheckSet` of every pseudo-query `CheckRounds` makes for a corpus of ROWS documents, encoded at once."""
    rounds = CheckRounds(rows, documents_at, vectors_at, encoder, seed, pseudo_queries, distractors, progress)
    return rounds.at(rounds.planned)


class CheckRounds:
    """A corpus's pseudo-queries, encoded a round at a time as a decision asks for them.

    The pseudo-queries come from a seeded sample of the corpus's ROWS documents, and the distractors are the stored
    vectors of other documents: DOCUMENTS_AT(positions) gives (title, text) and VECTORS_AT(positions) the raw
    vectors of ascending 0-based document positions (the build reads them from its SQLite table and encoded
    vectors, `Index.check` from an index's segments). Making them costs little; encoding them, each query and each
    target cut from its document (encoded again), costs about as much as encoding that many documents, which for a
    small corpus is most of a build. So a check reads them in rounds (`sizes`: FIRST_ROUND, twice that, ... up to
    all, `planned`), and a decision settled on the first rounds (`check.settled`) leaves the rest unencoded.

    The round of N (`at`) is the first N pseudo-queries, searched among their targets and the stored vectors of
    every other document drawn: the distractors, and the sources of the pseudo-queries not yet in use (documents
    like any other until their query is asked). Its last round is the whole check (up to the last bits of the
    vectors: the encoder batches a round's texts by length, so a text may share a batch with others than when all
    are encoded at once)."""

    def __init__(self, rows: int, documents_at: Callable[[np.ndarray], list[tuple[str | None, str]]],
                 vectors_at: Callable[[np.ndarray], np.ndarray], encoder, seed: int = 0,
                 pseudo_queries: int = PSEUDO_QUERIES, distractors: int = DISTRACTORS, progress: bool = False):
        rng = np.random.default_rng(seed)
        self.made, self.sources = sample_pseudo_queries(rows, documents_at, rng, seed, pseudo_queries)
        self.encoder, self.progress = encoder, progress
        others = rng.choice(rows, size=min(rows, distractors + len(self.sources)), replace=False)
        self.others = np.sort(others[~np.isin(others, self.sources)][:distractors])
        # The stored vectors and texts (a stored document as the keyword index reads it: title and text) of every
        # document a round may search among, read once.
        stored = np.unique(np.concatenate([self.sources, self.others]))
        self._stored_at = {int(position): row for row, position in enumerate(stored.tolist())}
        self._stored = vectors_at(stored) if len(stored) else None
        self._stored_texts = ([f"{title} {text}" if title else text for title, text in documents_at(stored)]
                              if len(stored) else [])
        self._queries: list[np.ndarray] = []
        self._targets: list[np.ndarray] = []
        # What ranking the pseudo-queries by each transform a round was scored with needs, kept: a candidate is
        # scored in every round, and each round's pool is mostly the same distractors.
        self._ranked: dict[Callable[[np.ndarray], np.ndarray], _Ranked] = {}
        self.seconds = 0.0  # spent encoding

    @property
    def planned(self) -> int:
        return len(self.made)

    def __len__(self) -> int:
        return self.planned

    def counts(self) -> dict[str, int]:
        """How many pseudo-queries of each kind were made (`CheckSet.counts` of the last round)."""
        kinds = Counter(query.kind for query in self.made)
        return {kind: kinds[kind] for kind in sorted(kinds)}

    def sizes(self) -> list[int]:
        """How many pseudo-queries each round holds: FIRST_ROUND, doubling, the last all of them."""
        sizes, size = [], FIRST_ROUND
        while size < self.planned:
            sizes.append(size)
            size *= 2
        return sizes + [self.planned]

    @property
    def encoded(self) -> int:
        """The pseudo-queries encoded so far."""
        return sum(len(block) for block in self._queries)

    def at(self, size: int) -> CheckSet:
        """The round of the first SIZE pseudo-queries (encoding those not encoded yet)."""
        self._encode(size)
        dim = self._dim()
        queries = np.concatenate(self._queries)[:size] if self._queries else np.empty((0, dim), np.float32)
        targets = np.concatenate(self._targets)[:size] if self._targets else np.empty((0, dim), np.float32)
        pool = np.sort(np.concatenate([self.others, self.sources[size:]]))
        at = np.array([self._stored_at[int(position)] for position in pool.tolist()], np.int64)
        distractors = self._stored[at] if len(at) else np.empty((0, dim), np.float32)
        made = self.made[:size]
        target_texts = [query.target if query.target is not None else self._stored_texts[self._stored_at[int(source)]]
                        for query, source in zip(made, self.sources[:size].tolist())]
        return CheckSet(queries, targets, np.asarray([query.kind for query in made], dtype=str), distractors,
                        [query.query for query in made], target_texts + [self._stored_texts[i] for i in at.tolist()],
                        kept_ranks=lambda transform: self._target_ranks(size, transform))

    def _target_ranks(self, size: int, transform: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """The rank of each of the first SIZE pseudo-queries' targets (1: first) among the round of SIZE's pool by
        TRANSFORM, as the function `check.target_ranks` ranks a whole check to `check.DEPTH` (a rank past it is some
        number above it: a check scores the top DEPTH). The pool is the first SIZE targets, the sources of the
        pseudo-queries not yet asked, and the other documents drawn, which every round shares: how many of those
        rank ahead of a target is counted once per pseudo-query and transform, and kept (a transform is a fitted
        calibrator's, which never changes once fitted)."""
        if size == 0:
            return np.empty(0, np.int64)
        ranked = self._ranked.get(transform)
        if ranked is None:
            # the stored vectors through TRANSFORM, L2-normalized, once: the others' block and the sources' (in
            # pseudo-query order); the rest of a round's pool is the targets, calibrated as they are first asked
            stored = l2_normalize_in_place(transform(self._stored))
            ranked = self._ranked[transform] = _Ranked(*(
                stored[np.array([self._stored_at[int(p)] for p in positions.tolist()], np.int64)]
                for positions in (self.others, self.sources)))
        asked = len(ranked.target_scores)
        if asked < size:
            ranked.extend(np.concatenate(self._queries)[asked:size], np.concatenate(self._targets)[asked:size],
                          transform)
        queries, targets, floor = ranked.queries[:size], ranked.targets[:size], ranked.target_scores[:size]
        ranks = 1 + ranked.others_ahead[:size] + count_ahead(queries, floor, ranked.sources[size:], cap=DEPTH)
        return ranks + count_ahead(queries, floor, targets, leave_out_own=True, cap=DEPTH)

    def _dim(self) -> int:
        if self._stored is not None:
            return int(self._stored.shape[1])
        return int(self._queries[0].shape[1]) if self._queries else 0

    def _encode(self, size: int) -> None:
        start, clock = self.encoded, time.perf_counter()
        if size <= start:
            return
        made, sources = self.made[start:size], self.sources[start:size]
        rewritten = np.array([query.target is not None for query in made], dtype=bool)
        # the queries and the rewritten targets in one call: the encoder batches texts of like length together,
        # and two calls would each end in a short, padded batch
        encoded = np.asarray(self.encoder.encode([query.query for query in made]
                                                 + [query.target for query in made if query.target is not None],
                                                 progress=self.progress, description="Encoding pseudo-queries"),
                             np.float32)
        queries = encoded[: len(made)]
        targets = np.empty_like(queries)
        targets[rewritten] = encoded[len(made):]
        if (~rewritten).any():  # known-item: the document as stored
            targets[~rewritten] = self._stored[[self._stored_at[int(source)] for source in sources[~rewritten]]]
        self._queries.append(queries)
        self._targets.append(targets)
        self.seconds += time.perf_counter() - clock


class _Ranked:
    """One transform's pseudo-queries as far as ranked: the others' and the sources' stored vectors through it
    (L2-normalized), the queries and targets asked so far likewise, each target's score for its query, and how many
    of the others rank ahead of it (to `check.DEPTH`: past it, some number above it)."""

    def __init__(self, others: np.ndarray, sources: np.ndarray):
        self.others, self.sources = others, sources
        dim = others.shape[1]
        self.queries = self.targets = np.empty((0, dim), np.float32)
        self.target_scores = np.empty(0, np.float32)
        self.others_ahead = np.empty(0, np.int64)

    def extend(self, queries: np.ndarray, targets: np.ndarray, transform: Callable[[np.ndarray], np.ndarray]) -> None:
        """Add the next pseudo-queries (raw QUERIES and TARGETS) passed through TRANSFORM."""
        if not len(queries):
            return
        queries, targets = l2_normalize_in_place(transform(queries)), l2_normalize_in_place(transform(targets))
        scores = paired_scores(queries, targets)
        self.others_ahead = np.concatenate([self.others_ahead, count_ahead(queries, scores, self.others, cap=DEPTH)])
        self.queries, self.targets = np.concatenate([self.queries, queries]), np.concatenate([self.targets, targets])
        self.target_scores = np.concatenate([self.target_scores, scores])


def check_rounds(check: CheckSet | CheckRounds) -> Iterator[tuple[CheckSet, int]]:
    """Each round of CHECK, with the pseudo-queries its last holds: a `CheckSet` is one round."""
    if isinstance(check, CheckSet):
        yield check, len(check)
        return
    for size in check.sizes():
        yield check.at(size), check.planned
