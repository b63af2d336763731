"""Pseudo-queries cut from a corpus: each kind's query and target, the balance of kinds, and the check set."""

from __future__ import annotations

import numpy as np

from retriever.calibration.pseudo_queries import (KINDS, CheckRounds, make_check_set, make_pseudo_queries,
                                                  split_sentences)

PROSE = ("Heaps are binary trees. Every parent is smaller than its children. The smallest element is the root, "
         "so it can be read in constant time.")


def test_each_kind_cuts_its_query_out_of_the_target():
    documents = [("heapq", PROSE)] * 40
    made = make_pseudo_queries(documents, seed=1)
    assert {query.kind for query in made} == set(KINDS)
    for query in made:
        if query.kind == "title":
            assert query.query == "heapq" and query.target == " ".join(PROSE.split())
        elif query.kind == "sentence":
            assert query.query in split_sentences(PROSE) and query.query not in query.target
            assert query.target.startswith("heapq ")  # the rest of the document, as the index holds it: with title
        elif query.kind == "span":
            assert query.query not in query.target and 3 <= len(query.query.split()) <= 16
            assert len(query.query.split()) + len(query.target.split()) == len(PROSE.split()) + 1  # + the title
        else:  # known-item: a few of the document's own words; the target is the stored document
            words = {word.strip(".,").lower() for word in PROSE.split()}
            assert query.target is None and 3 <= len(query.query.split()) <= 6
            assert set(query.query.split()) <= words


def test_kinds_are_balanced_one_query_per_document_and_reproducible():
    documents = [("heapq", PROSE)] * 400
    made = make_pseudo_queries(documents, seed=3)
    counts = {kind: sum(query.kind == kind for query in made) for kind in KINDS}
    assert counts == dict.fromkeys(KINDS, 100)
    assert [query.source for query in made] == list(range(400))
    assert make_pseudo_queries(documents, seed=3) == made and make_pseudo_queries(documents, seed=4) != made
    assert len(make_pseudo_queries(documents, seed=3, limit=10)) == 10


def test_documents_give_the_kinds_they_can_and_short_ones_none():
    one_sentence = (None, "a man is playing a large guitar on the stage tonight")
    made = make_pseudo_queries([one_sentence] * 20 + [("t", "too short"), (None, "")], seed=0)
    assert {query.kind for query in made} == {"span", "known-item"} and len(made) == 20


def test_rare_words_make_known_item_queries_more_often_than_common_ones():
    documents = [(None, f"the cat and the dog sat on the mat near word{i} and term{i}") for i in range(300)]
    made = [q for q in make_pseudo_queries(documents, seed=0) if q.kind == "known-item"]
    # p(word) follows its inverse document frequency: the two words found in one document each are drawn before the
    # eight found in all, which fill the rest of a 3 to 5 word query alike
    assert made and all(f"word{q.source}" in q.query.split() and f"term{q.source}" in q.query.split() for q in made)


class CountingEncoder:
    """Encodes a text as a vector of its length and word count, and counts what it was asked."""

    def __init__(self):
        self.texts = []

    def encode(self, texts, progress=False, description=""):
        self.texts += list(texts)
        return np.array([[len(text), len(text.split()), 1.0] for text in texts], dtype=np.float32).reshape(-1, 3)


def test_a_check_set_holds_encoded_queries_targets_and_other_documents_as_distractors():
    documents = [("heapq", PROSE)] * 30 + [(None, f"document {i} with a few more words here") for i in range(270)]
    stored = np.arange(300 * 3, dtype=np.float32).reshape(300, 3)
    asked = []

    def vectors_at(positions):
        assert np.all(np.diff(positions) > 0)  # ascending: read forward
        asked.append(positions)
        return stored[positions]

    encoder = CountingEncoder()
    check = make_check_set(300, lambda positions: [documents[i] for i in positions], vectors_at, encoder, seed=0,
                           pseudo_queries=50, distractors=100)
    assert len(check) == 50 and len(check.distractors) == 100 and check.pool_size == 150
    known = check.kinds == "known-item"
    assert known.any() and (~known).any()
    # a known-item target is the document as stored; the other targets were encoded again, without the query
    assert all((stored == target).all(axis=1).any() for target in check.targets[known])
    assert len(encoder.texts) == 50 + int((~known).sum())
    # distractors are other documents: never the source of a pseudo-query
    sources = {tuple(target) for target in check.targets[known]}
    assert not sources & {tuple(row) for row in check.distractors}


def test_a_check_is_encoded_a_round_at_a_time_and_its_last_round_is_the_whole_check():
    documents = [("heapq", PROSE)] * 400 + [(None, f"document {i} with a few more words here") for i in range(800)]
    stored = np.arange(1200 * 3, dtype=np.float32).reshape(1200, 3)

    def documents_at(positions):
        return [documents[i] for i in positions]

    def vectors_at(positions):
        return stored[positions]

    encoder = CountingEncoder()
    rounds = CheckRounds(1200, documents_at, vectors_at, encoder, seed=0, pseudo_queries=1000, distractors=100)
    assert rounds.planned == 1000 and rounds.sizes() == [250, 500, 1000] and not encoder.texts
    first = rounds.at(250)
    rewritten = sum(query.target is not None for query in rounds.made[:250])
    assert len(first) == 250 and len(encoder.texts) == 250 + rewritten  # only the first round's queries and targets
    # its pool: every document drawn but its own sources, the later rounds' sources among them
    assert len(first.distractors) == 100 + 750 and first.pool_size == 1100 and len(first.pool_texts) == 1100
    assert not {tuple(row) for row in stored[rounds.sources[:250]]} & {tuple(row) for row in first.distractors}
    asked = len(encoder.texts)
    assert len(rounds.at(500)) == 500 and len(rounds.at(250).queries) == 250 and len(encoder.texts) > asked
    last = rounds.at(1000)
    whole = make_check_set(1200, documents_at, vectors_at, CountingEncoder(), seed=0, pseudo_queries=1000,
                           distractors=100)
    for field in ("queries", "targets", "kinds", "distractors"):
        assert np.array_equal(getattr(last, field), getattr(whole, field)), field
    assert last.query_texts == whole.query_texts and last.pool_texts == whole.pool_texts
    assert rounds.counts() == whole.counts()  # the kinds every round's decision lets vote: of all made
    assert len(encoder.texts) == 1000 + sum(query.target is not None for query in rounds.made)  # each encoded once


def test_a_round_scores_as_the_same_check_read_whole_and_calibrates_the_stored_vectors_once(monkeypatch):
    import retriever.calibration.check as check_module
    from retriever.calibration.check import DEPTH, CheckSet, score_queries, target_ranks

    # the pool read a few rows at a time: a count may stop in any part of it
    monkeypatch.setattr(check_module, "POOL_ROWS", 64)
    monkeypatch.setattr(check_module, "BLOCK", 7)

    documents = [("heapq", PROSE)] * 400 + [(None, f"document {i} with a few more words here") for i in range(800)]
    stored = np.random.default_rng(0).normal(size=(1200, 3)).astype(np.float32)
    # the short documents stored as the encoder encodes them: twins of one another (a length and a word count), so
    # known-item targets tie with distractors and with the sources of the queries not yet asked
    stored[400:] = CountingEncoder().encode([text for _, text in documents[400:]])
    rounds = CheckRounds(1200, lambda positions: [documents[i] for i in positions], lambda positions: stored[positions],
                         CountingEncoder(), seed=0, pseudo_queries=1000, distractors=100)
    calls = []

    def transform(X):
        calls.append(len(X))
        return X * np.array([1.0, 2.0, 0.5], np.float32) + 1.0

    def fewer_dimensions(X):
        return (X[:, :2] * np.array([1.0, 3.0], np.float32)).astype(np.float32)

    # rounds asked out of order, by two transforms kept side by side, one of them dropping a dimension
    for size, each in [(500, transform), (250, fewer_dimensions), (250, transform), (1000, fewer_dimensions),
                       (500, fewer_dimensions), (1000, transform)]:
        current = rounds.at(size)
        plain = CheckSet(current.queries, current.targets, current.kinds, current.distractors)
        kept, fresh = score_queries(current, each), score_queries(plain, each)
        assert np.allclose(kept.ndcg, fresh.ndcg) and np.allclose(kept.reciprocal_rank, fresh.reciprocal_rank)
        # every target's rank in the top 10, and which fall below it: the round's kept counts add up to its whole
        # pool's (past the top 10 a rank is counted no further)
        ranks, kept_ranks = target_ranks(plain, each), current.kept_ranks(each)
        assert np.array_equal(np.minimum(kept_ranks, DEPTH + 1), np.minimum(ranks, DEPTH + 1))
        assert (kept_ranks < ranks).any()  # counting stopped past the top 10
    assert {tuple(row) for row in current.targets} & {tuple(row) for row in current.distractors}  # twins there
    assert len(score_queries(rounds.at(0), transform).ndcg) == 0  # a round of none scores none
    assert calls.count(len(rounds.others) + len(rounds.sources)) == 1
