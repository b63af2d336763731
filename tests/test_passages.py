"""Long documents as passages: cut by the model's tokenizer, a vector each, a document scored by its best passage
in every search mode and through every write (add, delete, filters, compaction, refit, the Ray workers)."""

from __future__ import annotations

import numpy as np
import pytest

from retriever.corpus import Document, document_text
from retriever.encode.passages import PassageCutter, PassageSettings, cut_spans
from retriever.errors import RetrieverError
from retriever.index import Index
from retriever.search.options import SearchOptions
from retriever.search.searcher import Searcher
from retriever.store.passages import coverages, document_of, document_scores, keys_of, passage_keys
from tests.helpers import SUBJECTS, THINGS, VERBS, long_text

WINDOW = 32


def late_sentence(number: int, line: int = 31) -> str:
    """Line LINE of long document NUMBER."""
    return long_text(number).split(". ")[line] + "."


def corpus(longs: int = 3, shorts: int = 40) -> list[Document]:
    short = [Document(f"s{i}", f"{SUBJECTS[i % 7]} {VERBS[i % 8]} {THINGS[i % 6]} on day {i}.", None, "c", i,
                      {"kind": "short"}) for i in range(shorts)]
    long = [Document(f"long{i}", long_text(i), f"Page {i}", "c", shorts + i, {"kind": "long"}) for i in range(longs)]
    return short + long


def search(index: Index, query: str, **options):
    return index.search([query], **options)[0]


def assert_reads_as(tokenizer, head: str, whole: str, max_length: int) -> None:
    """HEAD, a cut document's first passage, is WHOLE's head, cut at white space, and an encoder reading MAX_LENGTH
    tokens reads of it what it reads of WHOLE, and still truncates it."""
    assert whole.startswith(head) and len(head) < len(whole) and whole[len(head)].isspace()
    read = [tokenizer(text, truncation=True, max_length=max_length)["input_ids"] for text in (whole, head)]
    assert read[0] == read[1] and len(tokenizer(head)["input_ids"]) > max_length


@pytest.fixture(scope="module")
def tokenizer(tiny_bert):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_bert))


@pytest.fixture()
def index(tiny_bert, tmp_path):
    summary = Index.build(corpus(), "p", tmp_path, model=str(tiny_bert), max_length=WINDOW, calibrator="none",
                          device="cpu")
    with summary.open() as opened:
        yield opened


def test_a_document_that_fits_is_one_passage_encoding_exactly_its_text(tokenizer):
    cutter = PassageCutter(tokenizer, PassageSettings().checked(WINDOW), WINDOW)
    documents = corpus(longs=0, shorts=5)
    passages = cutter.cut(documents)
    assert passages.counts().tolist() == [1] * 5
    assert passages.texts == [document_text(d) for d in documents]
    assert passages.spans.tolist() == [[0, len(d.text)] for d in documents]


def test_a_long_document_is_cut_into_overlapping_windows_that_cover_it(tokenizer):
    cutter = PassageCutter(tokenizer, PassageSettings(overlap=16).checked(WINDOW), WINDOW)  # a sentence is ~13 tokens
    document = Document("long", long_text(0), "Page 0", "c", 1)
    passages = cutter.cut([document])
    spans = passages.spans.tolist()
    assert len(spans) > 5 and spans[0][0] == 0 and spans[-1][1] == len(document.text)
    # The first passage is what the encoder reads of the whole document: its vector is the one it always had. It
    # is given the document's head alone (the tokenizer need not read the rest), cut at white space, which the
    # encoder still truncates at the same token.
    assert_reads_as(tokenizer, passages.texts[0], document_text(document), WINDOW)
    for number, ((start, end), (next_start, _)) in enumerate(zip(spans, spans[1:])):
        assert next_start < end  # each next passage repeats the end of the one before
        assert number == 0 or document.text[end - 1] == "."  # the later ones cut at a sentence's end
        assert document.text[next_start - 2] == "."  # the overlap begins with a sentence
    for text in passages.texts[1:]:  # the title goes with every passage, and the whole passage fits the window
        assert text.startswith("Page 0 ")
        assert len(tokenizer(text)["input_ids"]) <= WINDOW


def test_cut_spans_cuts_without_sentences_too():
    text = "word " * 100
    offsets = [(5 * i, 5 * i + 4) for i in range(100)]
    spans = cut_spans(text, offsets, budget=30, overlap=5)
    assert spans[0] == (0, 5 * 29 + 4) and spans[1][0] == 5 * 25 and spans[-1][1] == 5 * 99 + 4


def test_passages_start_and_end_between_words():
    # "frobnicator" as WordPiece pieces, glued: fr|ob|nica|tor; a cut may fall only before "fr" or after "tor".
    text = " ".join(["frobnicator quux"] * 30)
    offsets = []
    for at in range(0, len(text), len("frobnicator quux ")):
        offsets += [(at, at + 2), (at + 2, at + 4), (at + 4, at + 8), (at + 8, at + 11), (at + 12, at + 16)]
    # a first run of one or three tokens: the head of "frobnicator" alone (what a title longer than the window
    # leaves of the encoder's read; 2 of 365,140 pages at 64 tokens began their second passage inside a word)
    for budget, overlap, first in ((7, 2, None), (9, 3, 11), (6, 0, 8), (7, 2, 1), (9, 3, 3)):
        spans = cut_spans(text, offsets, budget=budget, overlap=overlap, first=first)
        assert len(spans) > 3 and spans[-1][1] == len(text)
        for start, end in spans:
            assert start == 0 or text[start - 1] == " ", text[start:end]
            assert end == len(text) or text[end] == " ", text[start:end]


def test_arabic_text_is_cut_between_words_too(tokenizer):
    """A probe found spans beginning mid-word in Arabic text: its letters are word characters like any others."""
    words = ["المكتبة", "الوطنية", "تحتفظ", "بالمخطوطات", "القديمة", "منذ", "قرون", "طويلة"]
    text = " ".join(words[number % len(words)] for number in range(400))
    document = Document("ar", text, None, "c", 1)
    passages = PassageCutter(tokenizer, PassageSettings().checked(WINDOW), WINDOW).cut([document])
    spans = passages.spans.tolist()
    assert len(spans) > 5 and spans[-1][1] == len(text)
    for start, end in spans:
        assert start == 0 or text[start - 1] == " ", text[start:end]
        assert end == len(text) or text[end] == " ", text[start:end]


def test_a_cut_never_parts_a_letter_from_its_marks_or_a_word_in_any_script(tokenizer):
    """From a QA run on text beyond English: a passage ended before a combining accent ("déja" of "déjà" written
    with combining accents: an uncased tokenizer's offsets leave accents out), began on a Hindi vowel sign or inside
    a Korean word whose syllables the tokenizer decomposed, and cut Arabic words between their short vowels."""
    import unicodedata

    sentences = {"fr": unicodedata.normalize("NFD", "ça coûte très cher à noël déjà réservé"),
                 "hi": "भारत एक विशाल देश है मुझे किताबें पढ़ना पसंद है",
                 "ko": "서울은 한국의 수도입니다 한국어를 공부합니다",
                 "ar": "ذَهَبَ الوَلَدُ إِلَى المَدْرَسَةِ صَبَاحًا",
                 "ta": "தமிழ் மொழி மிகவும் பழமையானது",
                 "emoji": "family 👨‍👩‍👧 flag 🇫🇷 ok 👍🏽 done"}
    cutter = PassageCutter(tokenizer, PassageSettings().checked(WINDOW), WINDOW)
    for name, sentence in sentences.items():
        text = " ".join([sentence] * 60)
        spans = cutter.cut([Document(name, text, None, "c", 1)]).spans.tolist()
        assert len(spans) > 5 and spans[-1][1] == len(text)
        for start, end in spans:  # every passage starts and ends at a space or the text's ends
            assert start == 0 or text[start - 1] == " ", (name, text[start - 3:start + 3])
            assert end == len(text) or text[end] == " ", (name, text[end - 3:end + 3])


def test_text_without_spaces_is_cut_within_the_window_between_whole_characters():
    """From the review: once marks glued Thai into words, a run between spaces longer than the window was one
    "word", and the passage ran on to its end (360 tokens where 64 were read): the rest was in no vector."""
    import unicodedata

    run = "ข้าวมันไก่อร่อยมาก" * 120  # 720 pieces of three characters: past what the encoder reads
    text = "เริ่ม " + run + " จบ"
    offsets = [(0, 5)]  # a multilingual tokenizer's pieces of three characters inside the run
    offsets += [(at, min(at + 3, 6 + len(run))) for at in range(6, 6 + len(run), 3)]
    offsets += [(len(text) - 2, len(text))]
    spans = cut_spans(text, offsets, budget=64, overlap=8, most=256)  # a window of 64, an encoder reading 256
    assert spans[0][0] == 0 and spans[-1][1] == len(text) and len(spans) >= 4
    for start, end in spans:
        tokens = sum(1 for low, high in offsets if low >= start and high <= end)
        assert tokens <= 256, (start, end, tokens)  # all of it read: no text past what the encoder reads
        for at in (start, end):  # never on a mark: a character stays whole
            assert at in (0, len(text)) or unicodedata.category(text[at])[0] != "M", text[at - 2:at + 2]


def test_settings_are_checked_against_the_encoder():
    assert PassageSettings().checked(256) == PassageSettings(64, 8, whole_rest=256)
    assert PassageSettings().checked(64) == PassageSettings(64, 8, whole_rest=64)
    assert PassageSettings(window=64).checked(256) == PassageSettings(64, 8, whole_rest=64)  # a window given: every passage
    with pytest.raises(RetrieverError, match="passage_window=300 is more than the encoder reads"):
        PassageSettings(window=300).checked(256)
    with pytest.raises(RetrieverError, match="passage_overlap=200 must be between 0 and half the window"):
        PassageSettings(overlap=200).checked(256)
    assert PassageSettings(enabled=False).checked(256).to_record() is None


def test_a_rest_that_fits_in_one_more_read_is_one_passage_and_a_longer_one_is_cut_at_the_window(tokenizer):
    read = 128
    cutter = PassageCutter(tokenizer, PassageSettings().checked(read), read)
    words = long_text(0).split()
    a_little_longer = Document("a", " ".join(words[:190]), "Title", "c", 1)  # past the read, within twice it
    far_longer = Document("b", " ".join(words[:600]), "Title", "c", 2)
    lengths = [len(tokenizer(document_text(d))["input_ids"]) for d in (a_little_longer, far_longer)]
    assert read + 80 < lengths[0] < 2 * read - 20 and lengths[1] > 3 * read
    passages = cutter.cut([a_little_longer, far_longer])
    assert passages.counts()[0] == 2  # what the encoder reads, and the rest whole
    (_, first_end), (rest_start, rest_end) = passages.spans[:2].tolist()
    assert rest_start < first_end and rest_end == len(a_little_longer.text)
    assert len(tokenizer(passages.texts[1])["input_ids"]) <= read
    assert passages.counts()[1] > 2 * lengths[1] // read  # cut at the 64-token window
    assert all(len(tokenizer(text)["input_ids"]) <= 64 for text in passages.texts[3:])
    # A window given is the size of every later passage; an index built before `whole_rest` keeps cutting so.
    for settings in (PassageSettings(window=64).checked(read), PassageSettings.from_record({"window": 64, "overlap": 8})):
        assert PassageCutter(tokenizer, settings, read).cut([a_little_longer]).counts()[0] > 2


def test_passage_keys_name_their_documents():
    keys = passage_keys(np.array([3, 7, 8]), np.array([2, 1, 3]))
    assert document_of(keys).tolist() == [3, 3, 7, 8, 8, 8]
    assert keys_of(keys, np.array([8, 3])).tolist() == [keys[0], keys[1], keys[3], keys[4], keys[5]]


def test_a_cut_document_weighs_its_first_passage_by_the_share_of_text_it_spans():
    keys = passage_keys(np.array([3, 7, 8]), np.array([2, 1, 3]))
    spans = np.array([[0, 30], [25, 120], [0, 50], [0, 40], [35, 90], [85, 160]])
    np.testing.assert_allclose(coverages(keys, spans), [0.25, 0.25, 1.0, 0.25, 0.25, 0.25])
    # first 0.2 and best 0.6 with a quarter of the text read: mostly the best passage; one passage: its score
    np.testing.assert_allclose(document_scores(np.array([0.2, 0.5]), np.array([0.6, 0.5]), np.array([0.25, 1.0])),
                               [0.5, 0.5])
    # Float rounding never takes a weighing outside its two parts: the keyword side's search stops on it.
    rng = np.random.default_rng(0)
    first = rng.uniform(0, 30, 100_000).astype(np.float32)
    best = (first * rng.uniform(1, 1 + 1e-6, len(first))).astype(np.float32)
    coverage = rng.uniform(0, 1, len(first)).astype(np.float32)
    weighed = document_scores(first, best, coverage)
    assert (first <= weighed).all() and (weighed <= best).all()


def test_the_index_keeps_a_vector_per_passage_and_counts_both(index):
    segment = index.snapshot.segments[0]
    assert segment.split and len(segment) == 43 and len(segment.keys) > 43
    assert index.snapshot.manifest.passages == {"window": WINDOW, "overlap": 4, "whole_rest": WINDOW}
    assert index.snapshot.manifest.segments[0].vectors == len(segment.keys)
    info = index.info()
    assert info["documents"] == 43 and info["passages"] == len(segment.keys)


def test_the_keyword_index_of_passages_holds_the_cut_documents_passages_alone(index):
    """A document that is one passage scores as a whole document: a passage unit of its own would repeat it."""
    segment = index.snapshot.segments[0]
    keys = np.asarray(segment.keys)
    owners, counts = np.unique(segment.documents_of(keys), return_counts=True)
    cut = np.isin(segment.documents_of(keys), owners[counts > 1])
    assert 0 < cut.sum() < len(keys) and segment.passage_keywords.documents == cut.sum()
    np.testing.assert_array_equal(segment.passage_unit_keys, keys[cut])


def test_dense_search_scores_a_document_from_its_first_and_best_passages_exactly(index):
    snapshot = index.snapshot
    segment = snapshot.segments[0]
    queries = snapshot.calibrate(index._encoder_for(snapshot).encode(["The orchestra sold the budget on page 1 "
                                                                      "line 33.", "A dog painted a violin"]))
    scores, rowids = Searcher(snapshot).dense_top(queries, SearchOptions(k=10, mode="dense"))
    # Brute force: every passage scored; a document by its first passage, weighed by the share of its text that
    # passage spans, and its best passage by the rest.
    stored = segment.vectors.stored_vectors()
    order = np.argsort(segment.vectors.ids())
    passage_scores = queries @ stored[order].T
    owners = segment.documents_of(np.asarray(segment.keys))
    spans = np.asarray(segment.spans)

    def score(q: int, owner: int) -> float:
        mine = np.flatnonzero(owners == owner)
        share = spans[mine[0], 1] / spans[mine[-1], 1]
        return share * passage_scores[q][mine[0]] + (1 - share) * max(passage_scores[q][mine])

    assert any(np.count_nonzero(owners == owner) > 1 for owner in rowids[0])  # cut documents among the hits
    expected = [sorted({owner: score(q, owner) for owner in set(owners.tolist())}.items(),
                       key=lambda item: -item[1])[:10] for q in range(len(queries))]
    assert rowids.tolist() == [[owner for owner, _ in row] for row in expected]
    np.testing.assert_allclose(scores, [[score for _, score in row] for row in expected], atol=1e-5)
    assert all(len(set(row)) == 10 for row in rowids.tolist())  # k distinct documents


@pytest.mark.parametrize("mode", ["dense", "keyword", "hybrid"])
def test_each_hit_says_where_it_matched(index, mode):
    sentence = late_sentence(2)
    hits = search(index, sentence, k=5, mode=mode)
    assert len({hit.doc_id for hit in hits}) == len(hits) == 5
    for hit in hits:
        start, end = hit.span
        assert hit.text[start:end] == hit.passage and 0 <= start < end <= len(hit.text)
    if mode == "keyword":  # the sentence is in one passage of that page (or two, overlapping): one shown
        assert hits[0].doc_id == "long2" and sentence in hits[0].passage
    if mode == "hybrid":  # the keyword side's passage where it has one (it holds the query's words)
        by_keywords = {hit.doc_id: hit.span for hit in search(index, sentence, k=50, mode="keyword")}
        shown = [(hit.doc_id, hit.span) for hit in hits if hit.keyword_rank and hit.doc_id.startswith("long")]
        assert shown and all(span == by_keywords[doc_id] for doc_id, span in shown)


def test_deletes_filters_and_compaction_reach_every_passage(index):
    query = "A dog painted the harbour on page 0 line 20."
    with_filter = search(index, query, k=50, mode="dense", where={"kind": "long"})
    assert {hit.doc_id for hit in with_filter} == {"long0", "long1", "long2"}
    index = index.delete(["long0"]).open()
    assert "long0" not in {hit.doc_id for hit in search(index, query, k=50, mode="dense")}
    before = {mode: [(hit.doc_id, round(hit.score, 5), hit.span) for hit in search(index, query, k=10, mode=mode)]
              for mode in ("hybrid", "keyword")}
    compacted = index.compact().open()
    rowids = np.asarray(compacted.snapshot.segments[0].rowids)
    assert rowids[-1] - rowids[0] + 1 > len(rowids)  # a gap where long0 was: positions are searched for, not counted
    for mode in ("hybrid", "keyword"):
        assert [(hit.doc_id, round(hit.score, 5), hit.span) for hit in search(compacted, query, k=10, mode=mode)] == before[mode]
    assert compacted.snapshot.manifest.documents == 42 and compacted.check()


def test_a_compacted_segment_whose_cut_documents_were_all_deleted_is_searched_as_before(index):
    """Compaction keeps a segment split where every cut document was deleted: it then holds no passage at all, and
    keyword and hybrid search still answer, as they did before the compaction."""
    query = "A dog painted the harbour on day 3."
    index = index.delete(["long0", "long1", "long2"]).open()
    before = {mode: [(hit.doc_id, round(hit.score, 5), hit.span) for hit in search(index, query, k=5, mode=mode)]
              for mode in ("hybrid", "keyword")}
    compacted = index.compact().open()
    segment = compacted.snapshot.segments[0]
    assert segment.split and len(segment.passage_unit_keys) == 0
    for mode in ("hybrid", "keyword"):
        assert [(hit.doc_id, round(hit.score, 5), hit.span) for hit in search(compacted, query, k=5, mode=mode)] == before[mode]
    assert len(before["keyword"]) == 5


def test_a_title_longer_than_the_window_leaves_each_passage_half_of_it_for_text(tokenizer, tiny_bert, tmp_path):
    """With a 300-word title every passage was title only: its text never reached dense search. The title is cut
    to at most half the window, so each passage is read whole (its text, up to the other half, at a sentence's end
    where one falls in the run's second half)."""
    title = " ".join(f"heading{number % 7} subject" for number in range(150))
    document = Document("titled", long_text(3), title, "c", 1)
    passages = PassageCutter(tokenizer, PassageSettings().checked(WINDOW), WINDOW).cut([document])
    assert passages.spans.tolist()[-1][1] == len(document.text)
    for (start, end), text in zip(passages.spans.tolist()[1:], passages.texts[1:]):
        assert text.endswith(document.text[start:end]) and text.startswith("heading0 subject")
        assert len(tokenizer(text)["input_ids"]) <= WINDOW  # read whole: title cut short, at a word's end
    summary = Index.build([document, Document("short", "a short note", None, "c", 2)], "t", tmp_path,
                          model=str(tiny_bert), max_length=WINDOW, calibrator="none", device="cpu")
    assert summary.truncated == 0  # once: every passage counted as a truncated document


def test_an_add_is_cut_as_the_build_was_and_merges_with_one_vector_segments(tiny_bert, tmp_path):
    summary = Index.build(corpus(longs=0), "p", tmp_path, model=str(tiny_bert), max_length=WINDOW,
                          calibrator="none", device="cpu")
    index = summary.open()
    assert not index.snapshot.segments[0].split  # short documents only: keyed by row id, as before passages
    added = index.add([Document("late", long_text(9), "Late page", "c", 1)])
    assert added.cut == 1 and added.passages > 1 and added.truncated == 0  # cut, so nothing of it unseen
    index = added.open()
    assert [segment.split for segment in index.snapshot.segments] == [False, True]
    query = "A dog painted the harbour on page 9 line 30."
    before = [(hit.doc_id, round(hit.score, 5), hit.span) for hit in search(index, query, k=8, mode="dense")]
    merged = index.compact().open()  # one segment: the short documents' row ids become passage keys
    assert len(merged.snapshot.segments) == 1 and merged.snapshot.segments[0].split
    assert [(hit.doc_id, round(hit.score, 5), hit.span) for hit in search(merged, query, k=8, mode="dense")] == before


def test_a_build_without_passages_keeps_one_vector_per_document(tiny_bert, tmp_path):
    index = Index.build(corpus(), "p", tmp_path, model=str(tiny_bert), max_length=WINDOW, calibrator="none",
                        device="cpu", passages=PassageSettings(enabled=False)).open()
    assert not index.snapshot.segments[0].split and index.snapshot.manifest.passages is None
    index = index.add([Document("late", long_text(9), "Late page", "c", 1)]).open()
    assert not index.snapshot.segments[1].split  # an add is cut as the build was: not at all


def test_the_calibrator_is_fitted_on_the_documents_own_vectors(tiny_bert, tmp_path):
    """Fitted on what the encoder reads of each document (a cut one's first passage), not on every passage: the
    same calibrator a build without passages fits, so a document's own vector is calibrated exactly alike."""
    built = {setting.enabled: Index.build(corpus(), f"p{setting.enabled}", tmp_path, model=str(tiny_bert),
                                          max_length=WINDOW, calibrator="whitening", device="cpu",
                                          passages=setting).open()
             for setting in (PassageSettings(), PassageSettings(enabled=False))}
    probe = np.random.default_rng(0).normal(size=(5, built[True].snapshot.manifest.encoder["dim"])).astype(np.float32)
    assert built[True].snapshot.segments[0].split and not built[False].snapshot.segments[0].split
    np.testing.assert_allclose(built[True].snapshot.calibrate(probe), built[False].snapshot.calibrate(probe), atol=1e-6)
    # A refit reads the same vectors from the stored raw ones (float16 here): both indexes refit alike.
    refitted = {cut: index.refit(calibrator="whitening").open() for cut, index in built.items()}
    np.testing.assert_allclose(refitted[True].snapshot.calibrate(probe), refitted[False].snapshot.calibrate(probe),
                               atol=1e-6)


def test_refit_and_check_see_passage_vectors(index):
    refitted = index.refit(calibrator="whitening").open()
    assert len(refitted.snapshot.segments[0].keys) == len(index.snapshot.segments[0].keys)
    query = "An old sailor forgot an ancient map on page 1 line 12."
    assert search(refitted, query, k=3, mode="dense")[0].doc_id in {hit.doc_id for hit in
                                                                   search(refitted, query, k=10, mode="dense")}
    check = refitted.check(fit_sample=None)
    assert check["auto"]["chosen"] is not None


def test_a_ray_worker_cuts_as_the_local_engine_does(tiny_bert, tmp_path):
    from retriever.calibration import make_calibrator
    from retriever.encode.encoder import Encoder
    from retriever.engines.workers import EncodeWorker, document_columns, read_shard, write_segment
    from retriever.store.segment import Segment
    from retriever.store.spec import IndexSpec
    from retriever.versions.layout import CALIBRATOR, SEGMENTS

    documents = corpus()
    folder, shard_dir = tmp_path / "version", tmp_path / "version" / "shards"
    shard_dir.mkdir(parents=True)
    encoder = Encoder(str(tiny_bert), max_length=WINDOW, device="cpu")
    worker = EncodeWorker(encoder.config(), str(shard_dir), device="cpu",
                          passages=PassageSettings().checked(WINDOW).to_record())
    worker(document_columns(documents, 1))
    _, _, vectors, passages = read_shard(shard_dir, 1)
    cutter = PassageCutter(encoder.tokenizer, PassageSettings().checked(WINDOW), WINDOW)
    expected = cutter.cut(documents)
    assert passages[:, 1:].tolist() == expected.spans.tolist()
    np.testing.assert_allclose(vectors, encoder.encode(expected.texts), atol=1e-5)
    calibrator = make_calibrator("none")
    calibrator.fit(vectors)
    calibrator.save(folder / CALIBRATOR)
    assert write_segment(folder, "000001", [1], shard_dir, {"type": "flat"}) == (43, len(expected.texts))
    segment = Segment(folder / SEGMENTS / "000001", IndexSpec(type="flat"), device="cpu")
    assert segment.split and segment.rowids.tolist() == list(range(1, 44))
    segment.close()


def test_vectors_given_per_passage_build_what_the_encoder_would(index, tiny_bert, tmp_path):
    from retriever.encode.encoder import Encoder

    documents = corpus()
    encoder = Encoder(str(tiny_bert), max_length=WINDOW, device="cpu")
    cut = PassageCutter(encoder.tokenizer, PassageSettings().checked(WINDOW), WINDOW).cut(documents)
    spans = np.column_stack([np.repeat(np.arange(len(documents)), cut.counts()), cut.spans])
    given = Index.build(documents, "given", tmp_path, model=str(tiny_bert), max_length=WINDOW, calibrator="none",
                        device="cpu", vectors=encoder.encode(cut.texts), vector_spans=spans).open()
    query = late_sentence(1)
    assert ([(hit.doc_id, hit.span) for hit in search(given, query, k=5, mode="hybrid")] ==
            [(hit.doc_id, hit.span) for hit in search(index, query, k=5, mode="hybrid")])
    with pytest.raises(RetrieverError, match="documents must be numbered from 0, ascending"):
        Index.build(documents, "bad", tmp_path, model=str(tiny_bert), calibrator="none", device="cpu",
                    vectors=encoder.encode(cut.texts), vector_spans=spans[::-1])


def test_a_document_the_encoder_reads_whole_is_never_cut(tokenizer):
    """The window is for documents the encoder cannot read whole: one that fits its max_length stays one passage,
    its vector today's, even where it is longer than a passage."""
    cutter = PassageCutter(tokenizer, PassageSettings(window=16, overlap=2).checked(64), 64)  # 64: 62 and 2 special
    middle = Document("middle", long_text(0, sentences=3), None, "c", 1)  # ~40 tokens: more than 16, under 64
    long = Document("long", long_text(0, sentences=12), None, "c", 2)
    passages = cutter.cut([middle, long])
    assert passages.counts()[0] == 1 and passages.texts[0] == middle.text
    assert passages.counts()[1] > 5  # its first: what the encoder reads of it
    assert_reads_as(tokenizer, passages.texts[1], long.text, 64)
    assert len(tokenizer(long.text[: passages.spans[1][1]])["input_ids"]) == 64
    assert all(len(tokenizer(text)["input_ids"]) <= 16 for text in passages.texts[2:])


@pytest.mark.parametrize("mode", ["keyword", "hybrid", "dense"])
def test_k_distinct_documents_come_back_when_long_ones_crowd_the_top(index, mode):
    # 'harbour' is in 7 short documents and in many passages of each of the 3 long ones.
    hits = search(index, "harbour", k=10, mode=mode)
    assert len(hits) == len({hit.doc_id for hit in hits}) == 10
    if mode == "keyword":
        assert {hit.doc_id for hit in hits} == {f"s{i}" for i in range(40) if i % 6 == 0} | {"long0", "long1", "long2"}


def test_keyword_top_documents_are_exact_across_segments(tiny_bert, tmp_path):
    """Each segment prunes passages below an earlier segment's floor: the documents must still be the exact best
    ones, with the same best passages, as scoring every match (what a filter does) ranks them."""
    from retriever.filters import parse_where

    documents = corpus(longs=6, shorts=30)
    index = Index.build(documents[:12], "p", tmp_path, model=str(tiny_bert), max_length=WINDOW, calibrator="none",
                        device="cpu").open()
    index = index.add(documents[12:30]).open().add(documents[30:]).open()
    searcher = Searcher(index.snapshot)
    everything = searcher.matches.matches(parse_where({"kind": {"$in": ["short", "long"]}}))
    queries = ["harbour", "robot violin page 4", "sailor map budget line 7", "page 5 line 30", "dog"]
    for k in (3, 10):
        pruned = searcher.keyword.lists(queries, k, False)
        exact = searcher.keyword.lists(queries, k, False, everything)
        for fast, slow in zip(pruned, exact):
            assert fast.rowids.tolist() == slow.rowids.tolist()
            assert fast.keys.tolist() == slow.keys.tolist()
            np.testing.assert_allclose(fast.scores, slow.scores, rtol=1e-6)


def _bm25(texts: list[str], query: str, also: list[str] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Okapi BM25 (k1 1.2, b 0.75, Lucene's idf) of QUERY over TEXTS, written out: what the index must compute; and
    of ALSO, each scored as a text of its length among TEXTS would be (TEXTS' statistics)."""
    from retriever.store.keywords import Tokenizer

    tokenize = Tokenizer.get()
    counts, others = [tokenize(text) for text in texts], [tokenize(text) for text in also]
    average = np.mean([sum(found.values()) for found in counts])
    scores = [np.zeros(len(texts)), np.zeros(len(also))]
    for term, many in tokenize(query).items():
        holding = sum(term in found for found in counts)
        idf = np.log1p((len(texts) - holding + 0.5) / (holding + 0.5))
        for side, units in zip(scores, (counts, others)):
            for i, found in enumerate(units):
                if term in found:
                    tf, length = found[term], sum(found.values())
                    side[i] += many * idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / average))
    return scores[0], scores[1]


def test_keyword_search_scores_a_document_whole_and_by_its_best_passage(index):
    """Documents are scored whole (BM25 over the documents); a cut one also by its best passage, scored as a
    document of the passage's length: the first passage's share of the text weighs the document, the rest the
    better of it and that passage. Every score checked against BM25 written out."""
    snapshot = index.snapshot
    segment = snapshot.segments[0]
    rows = snapshot.rows(np.asarray(segment.rowids))
    documents = [rows[rowid] for rowid in np.asarray(segment.rowids).tolist()]
    owners = segment.documents_of(np.asarray(segment.keys))
    spans = np.asarray(segment.spans)
    passages = [f"{rows[owner]['title'] or ''} {rows[owner]['text'][start:end]}"
                for owner, (start, end) in zip(owners.tolist(), spans.tolist())]
    share = np.array([spans[owners == rowid][0, 1] / spans[owners == rowid][-1, 1]
                      for rowid in np.asarray(segment.rowids)])
    assert (share < 1).sum() == 3 and (share[share < 1] < 0.5).all()  # the three long pages
    for query in ("harbour violin page 2", "dog painted ancient map", "sailor line 30"):
        whole, parts = _bm25([f"{row['title'] or ''} {row['text']}" for row in documents], query, passages)
        best = np.maximum(whole, [parts[owners == rowid].max() for rowid in np.asarray(segment.rowids)])
        expected = share * whole + (1 - share) * best
        hits = search(index, query, k=8, mode="keyword")
        assert [hit.doc_id for hit in hits] == [documents[i]["doc_id"] for i in np.argsort(-expected, kind="stable")[:8]]
        np.testing.assert_allclose([hit.score for hit in hits], np.sort(expected)[::-1][:8], rtol=1e-5)


def test_keyword_search_without_cut_documents_is_plain_bm25(tiny_bert, tmp_path):
    documents = corpus(longs=0)
    index = Index.build(documents, "p", tmp_path, model=str(tiny_bert), max_length=WINDOW, calibrator="none",
                        device="cpu").open()
    assert not index.snapshot.segments[0].split
    expected = _bm25([document.text for document in documents], "dog harbour")[0]
    hits = search(index, "dog harbour", k=5, mode="keyword")
    np.testing.assert_allclose([hit.score for hit in hits], np.sort(expected)[::-1][:5], rtol=1e-5)


def test_long_documents_scored_from_memory_score_as_read(index, monkeypatch):
    import retriever.search.dense as dense

    monkeypatch.setattr(dense, "LONG_DOCUMENT_PASSAGES", 2)  # every long document here is kept once read
    snapshot = index.snapshot
    query = snapshot.calibrate(index._encoder_for(snapshot).encode([late_sentence(1)]))[0]
    rowids = np.arange(1, 44)
    searcher = Searcher(snapshot).dense
    first = searcher.scores_of(query, rowids)  # read from the segment
    for warm in (searcher.scores_of(query, rowids), Searcher(snapshot).dense.scores_of(query, rowids)):
        np.testing.assert_array_equal(warm[0], first[0])
        np.testing.assert_array_equal(warm[1], first[1])
    reordered = searcher.scores_of(query, rowids[::-1])  # the long ones from memory, the others read
    np.testing.assert_array_equal(reordered[0], first[0][::-1])
    np.testing.assert_array_equal(reordered[1], first[1][::-1])
    assert (first[1][-3:] >> 16).tolist() == [41, 42, 43]  # the long documents' best passages, named by key


@pytest.mark.parametrize("window", [0, 15, -5])
def test_a_window_too_short_is_refused_zero_included(window):
    """0 once built with the default window, where 15 and -5 were refused."""
    with pytest.raises(RetrieverError, match="too short"):
        PassageSettings(window=window).checked(256)


def test_a_text_of_megabytes_is_tokenized_in_pieces_and_only_as_far_as_its_passages_reach(tokenizer, monkeypatch):
    """A 50 MB file held all its tokens' objects at once (12 GB at its peak) and was tokenized past the last
    passage a document may have. Cut a piece at a time (small pieces here), a text gets the very spans it gets whole;
    past MAX_PASSAGES it keeps the first of them, counted as truncated, and the tokenizer stops soon after."""
    import retriever.encode.passages as passages_module

    text = " ".join(f"{long_text(number)} Déjà vu, naïve café № {number}:\nnext line." for number in range(6))
    documents = [Document("big", text, "A title", "c", 1), Document("small", "A short one.", None, "c", 2)]
    cutter = PassageCutter(tokenizer, PassageSettings().checked(WINDOW), WINDOW)
    whole = cutter.cut(documents)
    monkeypatch.setattr(passages_module, "PIECE_CHARACTERS", 300)
    pieces = cutter.cut(documents)
    assert len(text) > 30 * 300 and whole.counts().tolist()[0] > 20
    assert pieces.spans.tolist() == whole.spans.tolist() and pieces.texts == whole.texts and pieces.truncated == 0

    read = []
    monkeypatch.setattr(cutter._backend, "encode", lambda piece, **options: read.append(piece) or
                        type(cutter._backend).encode(cutter._backend, piece, **options), raising=False)
    monkeypatch.setattr(passages_module, "MAX_PASSAGES", 5)
    capped = cutter.cut(documents)
    assert capped.counts().tolist() == [5, 1] and capped.truncated == 1
    assert capped.spans.tolist() == whole.spans.tolist()[:5] + whole.spans.tolist()[-1:]
    assert read and sum(map(len, read)) < len(text) / 3  # not read to its end


def test_compaction_of_a_segment_of_passages_with_nothing_to_drop_writes_no_version(index):
    summary = index.compact()
    assert summary.version == index.snapshot.manifest.version and summary.changed == 0
    assert summary.notes == ["index 'p' is compact already (1 segment, no deleted document): no new version"]
    index.delete(["long1"])
    deleted = index.snapshot.manifest.version
    assert index.compact().version == deleted + 1  # a deleted document to drop: a new version


def test_a_document_of_a_title_alone_is_one_passage_found_by_its_title(tokenizer, tiny_bert, tmp_path):
    """A record with a title and no text (a paper without its abstract) is found by its title on both sides, as one
    passage however long the title: there is no text past the read to cut."""
    title = " ".join(f"heading{number % 7} subject" for number in range(150))  # far past the read
    documents = [Document("short", "", "Violin harbour maps", "c", 1), Document("long", "", title, "c", 2),
                 *corpus(longs=1, shorts=10)]
    passages = PassageCutter(tokenizer, PassageSettings().checked(WINDOW), WINDOW).cut(documents[:2])
    assert passages.spans.tolist() == [[0, 0], [0, 0]]
    index = Index.build(documents, "t", tmp_path, model=str(tiny_bert), max_length=WINDOW, calibrator="none",
                        device="cpu").open()
    for mode in ("keyword", "dense", "hybrid"):
        hits = search(index, "Violin harbour maps", k=3, mode=mode)
        assert (hits[0].doc_id, hits[0].text, hits[0].passage, hits[0].span) == ("short", "", "", (0, 0)), mode
    assert search(index, "heading3 subject", k=1, mode="keyword")[0].doc_id == "long"
