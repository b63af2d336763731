"""The keyword index (retriever.store.keywords): FTS5's tokenizer, BM25 against a reference written from the
formula, statistics from the whole version (any split into segments, deletions included, ranks the same), and
every write keeping it consistent with the documents."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from retriever.corpus import Document
from retriever.errors import RetrieverError
from retriever.index import Index
from retriever.versions.layout import SEGMENTS
from retriever.store.layout import KEYWORDS
from retriever.store.keywords import Tokenizer
from tests.helpers import write_corpus

WORDS = ("harbour lighthouse keeper storm night lamp ship rocks sailor fog bell tide wind wave island coast "
         "beacon signal boat rope anchor gull cliff").split()


def corpus(count: int, seed: int = 0, prefix: str = "d") -> list[dict]:
    """Documents of 3-30 words from a small vocabulary (so terms repeat, and lengths and frequencies vary)."""
    rng = np.random.default_rng(seed)
    return [{"_id": f"{prefix}{i}", "title": " ".join(rng.choice(WORDS, int(rng.integers(0, 3)))),
             "text": " ".join(rng.choice(WORDS, int(rng.integers(3, 30))))} for i in range(count)]


def reference_bm25(records: list[dict], query: str, k1: float = 1.2, b: float = 0.75) -> dict[str, float]:
    """BM25 written from the formula over title and text, with Lucene's idf; documents matching no term left out."""
    tokenize = Tokenizer.get()
    bags = {r["_id"]: Counter(tokenize(f"{r.get('title') or ''} {r['text']}")) for r in records}
    n = len(bags)
    average = sum(sum(bag.values()) for bag in bags.values()) / n
    terms = tokenize(query)
    scores = {}
    for doc, bag in bags.items():
        length, score = sum(bag.values()), 0.0
        for term, count in terms.items():
            df = sum(1 for other in bags.values() if term in other)
            if bag[term]:
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                score += count * idf * bag[term] * (k1 + 1) / (bag[term] + k1 * (1 - b + b * length / average))
        if score:
            scores[doc] = score
    return scores


def keyword_scores(index: Index, query: str) -> dict[str, float]:
    hits = index.search(query, k=max(len(index), 1), mode="keyword")
    return {hit.doc_id: hit.score for hit in hits}


def test_the_tokenizer_is_fts5_unicode61_with_porter_stemming():
    tokenize = Tokenizer.get()
    assert tokenize("The Cafés were RUNNING; running runs!") == {"the": 1, "cafe": 1, "were": 1, "run": 3}
    assert tokenize("") == {} and tokenize("... !!!") == {}
    assert Tokenizer.get() is tokenize  # one per tokenizer setting, each thread with its own FTS5 table


def test_a_word_keeps_its_combining_marks():
    """From a QA run beyond English: vowel signs and points split words into pieces, so Thai "rice" (ข้าว) and
    "news" (ข่าว) were the same two terms, and a Hindi or Tamil word was found by none of its own."""
    tokenize = Tokenizer.get()
    assert tokenize("ข้าว ข่าว") == {"ข้าว": 1, "ข่าว": 1}
    assert tokenize("किताबें पढ़ना") == {"किताबें": 1, "पढ़ना": 1}
    assert tokenize("סֵפֶר") == {"סֵפֶר": 1}
    # Latin accents go as before
    assert tokenize("Déjà vu, naïve cafés") == {"deja": 1, "vu": 1, "naiv": 1, "cafe": 1}


def test_a_mark_with_no_letter_before_it_is_no_term_and_the_index_builds(tmp_path, tiny_bert):
    """An accent after a space (or a text of marks alone), its marks removed, was an empty term that FTS5 reads back
    as NULL: a 365,000-page build stopped with SQLite's NOT NULL error, and a query held a term None."""
    tokenize = Tokenizer.get()
    assert tokenize("a \u0301 b") == {"a": 1, "b": 1} and tokenize("\u0308\u0301") == {}
    records = corpus(30) + [{"_id": "mark", "text": "storm \u0301 lighthouse"}, {"_id": "marks", "text": "\u0301"}]
    built = Index.build(write_corpus(tmp_path / "c.jsonl", records), "marks", tmp_path / "ix", model=str(tiny_bert),
                        calibrator="none", device="cpu").open()
    assert "mark" in keyword_scores(built, "lighthouse \u0301")
    plain = [record for record in records if record["_id"] != "marks"]
    plain[-1] = {"_id": "mark", "text": "storm lighthouse"}
    reference = reference_bm25(plain + [{"_id": "marks", "text": ""}], "lighthouse storm")
    assert keyword_scores(built, "lighthouse storm") == pytest.approx(reference, rel=1e-5)


def test_an_emoji_s_variation_selector_is_no_term(tmp_path, tiny_bert):
    """From a QA run: U+FE0F after an emoji (a separator) was a term of its own, so every coloured emoji matched
    every other; a mark after a space that diacritic removal keeps (Devanagari's stress sign) likewise."""
    assert Tokenizer.get()("I love this \u2764\ufe0f \u0951") == {"i": 1, "love": 1, "thi": 1}
    records = [{"_id": "heart", "text": "I love this \u2764\ufe0f"}, {"_id": "plain", "text": "the weather"}]
    built = Index.build(write_corpus(tmp_path / "c.jsonl", records), "emoji", tmp_path / "ix", model=str(tiny_bert),
                        calibrator="none", device="cpu").open()
    assert keyword_scores(built, "\u2600\ufe0f") == {}
    assert set(keyword_scores(built, "\u26a0\ufe0f weather")) == {"plain"}


def test_a_run_longer_than_fts5_keeps_in_one_token_builds_and_is_found(tmp_path, tiny_bert):
    """From a QA run: FTS5 cuts a token at 32,768 bytes, inside a character where a text has no separator that long
    (10,923 Chinese characters): every write of such a text stopped with SQLite's UTF-8 error and a traceback, and a
    query of one said the index was damaged. The character cut is dropped, by the index and the query alike."""
    run = "\u7684" * 10923
    records = corpus(20) + [{"_id": "run", "text": f"{run} harbour"}]
    built = Index.build(write_corpus(tmp_path / "c.jsonl", records), "runs", tmp_path / "ix", model=str(tiny_bert),
                        calibrator="none", device="cpu").open()
    assert next(iter(keyword_scores(built, run))) == "run"
    assert "run" in keyword_scores(built, "harbour")


def test_an_index_written_before_marks_were_kept_reads_both_tokenizers_after_an_add(tmp_path, tiny_bert,
                                                                                 monkeypatch):
    """An index whose segments were tokenized without marks takes a new segment written with them: a query finds
    the documents of both, and English text scores exactly as in an index of one tokenizer."""
    import retriever.store.keywords as keywords

    def mixed(name: str, old: list[dict], new: list[dict]) -> Index:
        with monkeypatch.context() as patched:
            patched.setattr(keywords, "default_tokenizer", lambda: keywords.PLAIN_TOKENIZER)
            Index.build(write_corpus(tmp_path / f"{name}-old.jsonl", old), name, tmp_path / "ix",
                        model=str(tiny_bert), calibrator="none", device="cpu")
        return Index.open(name, tmp_path / "ix").add(write_corpus(tmp_path / f"{name}-new.jsonl", new)).open()

    hindi = mixed("hindi", corpus(40) + [{"_id": "hi-old", "text": "मुझे किताबें पढ़ना पसंद है"}],
                  corpus(30, seed=1, prefix="n") + [{"_id": "hi-new", "text": "किताबें पढ़ना अच्छा है"}])
    assert [segment.keywords.tokenizer for segment in hindi.snapshot.segments] == [
        keywords.PLAIN_TOKENIZER, keywords.MARKS_TOKENIZER]
    assert {hit.doc_id for hit in hindi.search("किताबें", k=5, mode="keyword")} == {"hi-old", "hi-new"}
    english = mixed("english", corpus(40), corpus(30, seed=1, prefix="n"))
    one = Index.build(write_corpus(tmp_path / "all.jsonl", corpus(40) + corpus(30, seed=1, prefix="n")), "one",
                      tmp_path / "ix", model=str(tiny_bert), calibrator="none", device="cpu").open()
    for query in ("lighthouse keeper", "storm fog bell", "anchor"):
        assert keyword_scores(english, query) == pytest.approx(keyword_scores(one, query), rel=1e-6)


def test_a_text_tokenized_leaves_nothing_behind_for_the_next():
    tokenize = Tokenizer.get()
    assert tokenize("storm storm lighthouse keeper") == {"storm": 2, "lighthous": 1, "keeper": 1}
    assert tokenize("a keeper") == {"a": 1, "keeper": 1}  # none of the text before
    assert tokenize("") == {}


def test_keyword_scores_are_bm25_over_the_whole_version(tmp_path, tiny_bert):
    records = corpus(60)
    index = Index.build(write_corpus(tmp_path / "c.jsonl", records), "k", tmp_path / "ix", model=str(tiny_bert),
                        calibrator="none", device="cpu").open()
    for query in ("lighthouse keeper", "storm storm fog", "anchor rope gull cliff", "tide"):
        expected = reference_bm25(records, query)
        got = keyword_scores(index, query)
        assert set(got) == set(expected)
        assert all(got[doc] == pytest.approx(expected[doc], rel=1e-5) for doc in expected)
    assert index.search("nothing known here", k=5, mode="keyword") == []


def test_the_best_few_found_by_maxscore_are_the_best_of_every_match(tmp_path, tiny_bert):
    """MaxScore skips the common terms' postings for most documents: the top k must still be exactly the top k of
    scoring every document (ties by row id, here the corpus order)."""
    rng = np.random.default_rng(5)
    common, rare = WORDS[:3], WORDS[3:]
    records = [{"_id": f"d{i}", "text": " ".join([*rng.choice(common, int(rng.integers(3, 12))),
                                                  *rng.choice(rare, int(rng.integers(0, 3)))])} for i in range(400)]
    index = Index.build(write_corpus(tmp_path / "c.jsonl", records), "m", tmp_path / "ix", model=str(tiny_bert),
                        calibrator="none", device="cpu").open()
    order = {record["_id"]: number for number, record in enumerate(records)}
    for query in ("harbour lighthouse storm", "harbour lighthouse keeper rocks", "keeper tide", "harbour"):
        expected = sorted(reference_bm25(records, query).items(), key=lambda item: (-item[1], order[item[0]]))
        for k in (1, 5, 20):
            hits = index.search(query, k=k, mode="keyword")
            assert [hit.doc_id for hit in hits] == [doc for doc, _ in expected[:k]], (query, k)


def test_three_segments_rank_exactly_as_the_same_documents_in_one_in_every_mode(tmp_path, tiny_bert):
    records = corpus(90, seed=1)
    whole = Index.build(write_corpus(tmp_path / "all.jsonl", records), "one", tmp_path / "ix", model=str(tiny_bert),
                        calibrator="none", index_type="flat", device="cpu").open()
    split = Index.build(write_corpus(tmp_path / "a.jsonl", records[:40]), "three", tmp_path / "ix",
                        model=str(tiny_bert), calibrator="none", index_type="flat", device="cpu").open()
    split = split.add(write_corpus(tmp_path / "b.jsonl", records[40:70])).open()
    split = split.add(write_corpus(tmp_path / "c.jsonl", records[70:])).open()
    assert len(split.snapshot.segments) == 3 and len(whole.snapshot.segments) == 1

    def same(first: Index, second: Index) -> None:
        for query in ("lighthouse keeper at night", "storm fog bell", "a boat near the island coast"):
            for mode in ("dense", "keyword", "hybrid"):
                one, three = first.search(query, k=20, mode=mode), second.search(query, k=20, mode=mode)
                assert [hit.doc_id for hit in one] == [hit.doc_id for hit in three], (query, mode)
                assert [hit.score for hit in one] == pytest.approx([hit.score for hit in three], abs=1e-5)

    same(whole, split)
    # Deleted documents leave the statistics too: the split index after deletions ranks as the rest in one.
    gone = ["d3", "d45", "d46", "d80"]
    split = split.delete(gone).open()
    rest = Index.build(write_corpus(tmp_path / "rest.jsonl", [r for r in records if r["_id"] not in gone]), "rest",
                       tmp_path / "ix", model=str(tiny_bert), calibrator="none", index_type="flat",
                       device="cpu").open()
    assert len(split.snapshot.tombstones) == 4
    same(rest, split)


def test_every_write_keeps_the_keyword_index_consistent_with_the_documents(tmp_path, tiny_bert):
    records = corpus(50, seed=2)
    live = {r["_id"]: r for r in records}
    index = Index.build(write_corpus(tmp_path / "a.jsonl", records), "w", tmp_path / "ix", model=str(tiny_bert),
                        calibrator="whitening", device="cpu").open()

    def consistent(index: Index) -> None:
        for segment in index.snapshot.segments:
            assert (segment.folder / KEYWORDS).is_file()
            assert f"{SEGMENTS}/{segment.name}/{KEYWORDS}" in index.snapshot.manifest.files
        for query in ("lighthouse keeper", "rope anchor", "wave"):
            expected = reference_bm25(list(live.values()), query)
            got = keyword_scores(index, query)
            assert set(got) == set(expected)
            assert all(got[doc] == pytest.approx(expected[doc], rel=1e-5) for doc in expected)

    consistent(index)
    added = corpus(20, seed=3, prefix="n")
    live.update((r["_id"], r) for r in added)
    index = index.add(write_corpus(tmp_path / "b.jsonl", added)).open()
    consistent(index)
    for doc in ("n0", "n1", "n2", "n3", "n4", "n5", "n6", "d1"):  # 30% of the new segment: merged away
        del live[doc]
    index = index.delete(["n0", "n1", "n2", "n3", "n4", "n5", "n6", "d1"]).open()
    assert [len(segment) for segment in index.snapshot.segments] == [50, 13]
    consistent(index)
    index = index.refit("sn").open()
    consistent(index)
    index = index.compact().open()
    assert len(index.snapshot.segments) == 1
    consistent(index)
    assert index.snapshot.verify() > 0


def test_documents_given_in_python_get_a_keyword_index_too(tmp_path, tiny_bert):
    documents = [Document(f"p{i}", text, None, "memory", i) for i, text in
                 enumerate(["the lighthouse keeper lit the lamp", "a ship hit the rocks in fog", "gulls over cliffs"])]
    index = Index.build(documents, "py", tmp_path / "ix", model=str(tiny_bert), calibrator="none",
                        device="cpu").open()
    assert [hit.doc_id for hit in index.search("lamp", k=3, mode="keyword")] == ["p0"]


def test_modes_fusions_and_weights_are_checked(tmp_path, tiny_bert):
    index = Index.build(write_corpus(tmp_path / "a.jsonl", corpus(20)), "m", tmp_path / "ix", model=str(tiny_bert),
                        calibrator="none", device="cpu").open()
    assert index.info()["default_mode"] == "hybrid"
    with pytest.raises(RetrieverError, match="unknown mode 'fuzzy'; known: dense, keyword, hybrid"):
        index.search("storm", mode="fuzzy")
    with pytest.raises(RetrieverError, match="unknown fusion 'max'"):
        index.search("storm", mode="hybrid", fusion="max")
    with pytest.raises(RetrieverError, match="weight is the dense side's share, from 0 to 1"):
        index.search("storm", mode="hybrid", weight=1.5)


def test_stop_words_leave_a_query_that_has_other_words(tmp_path, tiny_bert):
    records = [{"_id": "a", "text": "the storm and the fog"}, {"_id": "b", "text": "to be or not to be"},
               {"_id": "c", "text": "storm warning"}]
    index = Index.build(write_corpus(tmp_path / "s.jsonl", records), "s", tmp_path / "ix", model=str(tiny_bert),
                        calibrator="none", device="cpu").open()
    def scores(query: str, stop_words: bool) -> dict[str, float]:
        return {hit.doc_id: hit.score for hit in index.search(query, k=3, mode="keyword", stop_words=stop_words)}

    assert scores("the storm", True) == pytest.approx(reference_bm25(records, "storm"))
    assert scores("the storm", False) == pytest.approx(reference_bm25(records, "the storm"))
    assert list(scores("to be or not", True)) == ["b"]  # nothing but stop words: all of them kept


def test_maxscore_keeps_its_best_where_float32_rounding_exceeds_a_common_term_s_ceiling(tmp_path):
    """Scores in the thousands (a query repeating rare words) against a term in every document, whose ceiling is
    below a float32 step there: the bound must leave room for rounding, or the true best is dropped."""
    from types import SimpleNamespace

    from retriever.search.fusion import top_list
    from retriever.store.keywords import KeywordIndex, KeywordScorer, KeywordSegment

    rng = np.random.default_rng(0)
    texts = []
    for number in range(5000):
        words = ["common", *(f"f{value}" for value in rng.integers(0, 500, int(rng.integers(3, 30))))]
        if number % 100 == 0:
            words += ["zzz", "yyy", *(f"f{value}" for value in rng.integers(0, 500, int(rng.integers(300, 500))))]
        texts.append(" ".join(rng.permutation(words)))

    class Table:
        def documents(self):
            return ((rowid, SimpleNamespace(title=None, text=text)) for rowid, text in enumerate(texts, start=1))

    KeywordIndex().build(tmp_path, Table())
    scorer = KeywordScorer([KeywordSegment(tmp_path)], [np.ones(len(texts), bool)])
    for repeats in range(1, 20000, 997):
        matches = scorer.match("common " + "zzz " * repeats + "yyy " * (repeats + 3), stop_words=False)
        _, every, every_scores = matches.every_match()
        for count in (1, 2, 3, 5):
            _, found, scores = matches.candidates(count)
            assert found[top_list(scores, found, count)].tolist() == every[top_list(every_scores, every, count)].tolist()


@pytest.mark.parametrize(("cores", "spread"), [(1, True), (3, True), (3, False)])
def test_maxscore_on_zipf_text_in_three_segments_keeps_the_best_of_every_match(tmp_path, monkeypatch, cores, spread):
    """Word frequencies as in real text (a few words in most documents, a long tail), three segments and some
    deletions: for queries mixing common and rare words, every COUNT the best found by MaxScore (common terms
    skipped, then replacing their ceilings one by one) are the best of every match, scores included; searched a
    segment at a time, and each segment in slices on three cores (merged, ties to the lower position) unless the
    query keeps to one thread (as hybrid search's keyword side does)."""
    from types import SimpleNamespace

    from retriever.search.fusion import top_list
    from retriever.store import keywords
    from retriever.store.keywords import KeywordIndex, KeywordScorer, KeywordSegment

    monkeypatch.setattr(keywords, "SLICE_UNITS", 500)  # segments of 2,500: three slices where three cores are
    monkeypatch.setattr(keywords, "available_cpus", lambda: cores)

    rng = np.random.default_rng(7)
    vocabulary = np.array([f"w{number}" for number in range(3000)])
    weights = 1.0 / np.arange(1, len(vocabulary) + 1) ** 1.1
    weights /= weights.sum()
    segments, live = [], []
    for part in range(3):
        texts = [" ".join(rng.choice(vocabulary, int(rng.integers(5, 60)), p=weights)) for _ in range(2500)]

        class Table:
            def documents(self, texts=texts):
                return ((rowid, SimpleNamespace(title=None, text=text)) for rowid, text in enumerate(texts, start=1))

        folder = tmp_path / f"s{part}"
        folder.mkdir()
        KeywordIndex().build(folder, Table())
        segments.append(KeywordSegment(folder))
        live.append(rng.random(len(texts)) > 0.05)
    scorer = KeywordScorer(segments, live)
    skipped_somewhere = False
    for _ in range(40):
        words = [*rng.choice(vocabulary[:20], int(rng.integers(1, 5))), *rng.choice(vocabulary[20:], int(rng.integers(1, 5)))]
        matches = scorer.match(" ".join(words), stop_words=False, spread=spread)
        every_segments, every, every_scores = matches.every_match()
        every_keys = every_segments.astype(np.int64) * 10**6 + every
        for count in (1, 10, 100):
            found_segments, found, scores = matches.candidates(count)
            keys = found_segments.astype(np.int64) * 10**6 + found
            expected = top_list(every_scores, every_keys, count)
            chosen = top_list(scores, keys, count)
            assert keys[chosen].tolist() == every_keys[expected].tolist()
            assert scores[chosen].tolist() == every_scores[expected].tolist()
            skipped_somewhere |= len(found) < len(every)
    assert skipped_somewhere  # the pruning ran, not only the every-match fallback


def test_a_segment_is_cut_into_slices_of_about_equal_work(tmp_path):
    """Short units first, long ones after: the slices searched side by side hold about equal work (length plus
    the mean length each), not equal counts, so the long units' slice does not set the pace alone."""
    from types import SimpleNamespace

    from retriever.store.keywords import KeywordIndex, KeywordSegment

    texts = ["word"] * 1000 + [" ".join(f"w{number}" for number in range(49))] * 1000  # lengths 1, then 49

    class Table:
        def documents(self):
            return ((rowid, SimpleNamespace(title=None, text=text)) for rowid, text in enumerate(texts, start=1))

    KeywordIndex().build(tmp_path, Table())
    segment = KeywordSegment(tmp_path)
    assert segment.cuts(1) == [0, 2000]
    # A short unit costs 1 + 25, a long one 49 + 25: half the work is the short ones and 324 long ones.
    first, cut, last = segment.cuts(2)
    assert (first, last) == (0, 2000) and abs(cut - 1324) <= 1
    assert segment.cuts(4) == sorted(set(segment.cuts(4)))


def test_a_segment_remembers_where_terms_lie_and_answers_alike_when_it_starts_over(tmp_path, monkeypatch):
    """Term places are read from SQLite once, then remembered (absent terms too); past TERM_PLACES terms the
    segment starts over. Every answer equals a fresh segment's, the first and the later."""
    from types import SimpleNamespace

    from retriever.store import keywords
    from retriever.store.keywords import KeywordIndex, KeywordSegment

    texts = [" ".join(np.random.default_rng(number).choice(WORDS, 12)) for number in range(200)]

    class Table:
        def documents(self):
            return ((rowid, SimpleNamespace(title=None, text=text)) for rowid, text in enumerate(texts, start=1))

    KeywordIndex().build(tmp_path, Table())
    monkeypatch.setattr(keywords, "TERM_PLACES", 4)
    remembering = KeywordSegment(tmp_path)
    asked = [["harbour", "nowhere", "storm"], ["storm", "fog"], ["nowhere", "bell", "tide", "wind", "wave"],
             ["harbour", "nowhere", "storm"]]
    for terms in asked:
        fresh = KeywordSegment(tmp_path).postings(terms)
        found = remembering.postings(terms)
        assert "nowhere" not in found and sorted(found) == sorted(fresh)
        for term, (positions, counts, start) in fresh.items():
            assert found[term][2] == start
            assert found[term][0].tolist() == positions.tolist() and found[term][1].tolist() == counts.tolist()
        assert len(remembering._places) <= 5  # at most one query's terms past the bound


def test_text_from_every_kind_of_character_builds_and_queries_read_it_as_the_index_does(tmp_path):
    """Random text from marks, scripts without spaces, emoji, joiners, variation selectors, private use and
    mathematical letters: the index builds, holds no empty term, and a text's terms as a query reads them are its
    postings in the index, counts included."""
    import random
    from types import SimpleNamespace

    from retriever.store.keywords import KeywordIndex, KeywordSegment

    rng = random.Random(0)
    pools = [range(0x300, 0x370), range(0x0E00, 0x0E7F), range(0x0900, 0x097F), range(0x0590, 0x05FF),
             range(0x1F300, 0x1F600), range(0xFE00, 0xFE10), [0x200D, 0x200C, 0x200B, 0xFEFF, 0xAD, 0x85, 0xA0],
             range(0xE000, 0xE010), range(0x20, 0x7F), range(0x3040, 0x30FF), range(0xAC00, 0xAC40),
             range(0x1D400, 0x1D420), range(0xFF00, 0xFF60)]
    texts = ["".join(chr(rng.choice(rng.choice(pools))) for _ in range(rng.randint(0, 30))) for _ in range(2000)]

    class Table:
        def documents(self):
            return ((rowid, SimpleNamespace(title=None, text=text)) for rowid, text in enumerate(texts, start=1))

    KeywordIndex().build(tmp_path, Table())
    segment = KeywordSegment(tmp_path)
    tokenize = Tokenizer.get()
    assert segment.documents == len(texts)
    for position in rng.sample(range(len(texts)), 200):
        terms = tokenize(texts[position])
        assert all(terms) and sum(terms.values()) == segment.lengths[position]
        for term, (positions, counts, _) in segment.postings(list(terms)).items():
            at = int(np.searchsorted(positions, position))
            assert positions[at] == position and counts[at] == terms[term]
