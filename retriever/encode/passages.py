"""Long documents cut into passages the encoder reads whole, by the model's own tokenizer.

An encoder reads a window of tokens (256 for MiniLM); past it a document was invisible to dense search. A document
longer than the encoder reads keeps, as its first passage, what the encoder reads of it (its vector exactly the
one it always had: whatever a query found before, it still finds), and the rest of its text is cut into
overlapping passages of at most `window` tokens, the title and the special tokens counted in (the title goes with
every passage, as it goes with a whole document). A cut falls at the end of a sentence where one lies in the
window's second half (a line break counts as one), and the next passage starts `overlap` tokens back, moved forward
to the first sentence start inside the overlap: a sentence is whole in at least one passage wherever the text has
sentences short enough. Every cut falls between words: a word the tokenizer splits into pieces ("fr", "##ob", ...)
stays whole, and a letter keeps its combining marks (accents, Indic vowel signs) whatever the tokenizer's offsets
leave out. A document the encoder reads whole is one passage whose text is exactly what a document always encoded
(`corpus.document_text`), so its vector is today's; a cut one gets passages in proportion to its text past the
read.

The window of the later passages is shorter than the encoder's by default (`DEFAULT_WINDOW`): on pages far longer
than the read, a vector is the mean of its tokens and a long window dilutes any one part of it (issue 42's
yardstick, `benchmarks/results/long_documents.md`). A document whose rest, past its first passage, fits in one more
read (`whole_rest`: by default the encoder's read) keeps that rest as one passage: on real questions over abstracts
a little longer than the read (`benchmarks/results/passages_real.md`), short windows and one as long as the read
scored alike once a document is scored from its first passage and its best
(`retriever.store.passages.document_scores`), and the whole rest costs one encoder call where short windows cost
several.

A passage is a character span of the document's text; the passages of the documents of a write are described by
`Passages` (per document, its spans), which the store keys and keeps beside the vectors.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from retriever.corpus import Document, document_text
from retriever.errors import RetrieverError, param

# A cut document's passages: this many tokens (or the encoder's max_length, if less), each repeating this share of
# the one before. Measured on the long-document yardstick's development sets (benchmarks/results/long_documents.md)
# and checked on its held-out sets.
DEFAULT_WINDOW = 64
DEFAULT_OVERLAP_SHARE = 0.125
# A document cut into more passages than this keeps its first ones (row id and passage number share one int64
# key, `retriever.store.passages`): at the default window, about 13 MB of English text (the rest of such a
# document reaches keyword search only).
MAX_PASSAGES = 2**16
# A text longer than this many characters is tokenized a piece at a time (`PassageCutter._token_offsets`).
PIECE_CHARACTERS = 2**17
# The tokens past a cut document's first read that its first passage's text holds: the encoder, reading the title
# and the text together, reads the same tokens of it as of the whole text, and still finds more than it reads.
HEAD_MARGIN = 16
_WHITE_SPACE = re.compile(r"\s")
_SENTENCE_ENDS = ".!?\u3002\uff01\uff1f"
_CLOSING = "\"')]}\u201d\u2019"


@dataclass(frozen=True)
class PassageSettings:
    """How documents longer than the encoder reads are cut: WINDOW tokens per passage (title and special tokens
    included; None: DEFAULT_WINDOW, or the encoder's max_length if less) with OVERLAP tokens repeated from the
    passage before (None: DEFAULT_OVERLAP_SHARE of the window); a document whose rest past its first passage fits
    in WHOLE_REST tokens (title and special tokens included) keeps it as one passage (None: the encoder's
    max_length where the window is the default, else the window: a window given is the size of every passage).
    ENABLED False: one vector per document, cut at max_length (as before passages)."""

    window: int | None = None
    overlap: int | None = None
    enabled: bool = True
    whole_rest: int | None = None

    def checked(self, max_length: int) -> PassageSettings:
        """These settings for an encoder reading MAX_LENGTH tokens, the window resolved; a bad value refused."""
        if not self.enabled:
            return self
        window = min(DEFAULT_WINDOW, max_length) if self.window is None else self.window  # 0 is refused, not 64
        if window > max_length:
            raise RetrieverError(f"{param('passage_window', window)} is more than the encoder reads: at most "
                                 f"{max_length} tokens")
        if window < 16:
            raise RetrieverError(f"{param('passage_window', window)} is too short: at least 16 tokens")
        overlap = round(window * DEFAULT_OVERLAP_SHARE) if self.overlap is None else self.overlap
        if not 0 <= overlap <= window // 2:
            raise RetrieverError(f"{param('passage_overlap', overlap)} must be between 0 and half the window "
                                 f"({window // 2} tokens)")
        whole_rest = self.whole_rest or (max_length if self.window is None else window)
        if not window <= whole_rest <= max_length:
            raise RetrieverError(f"a whole rest of {whole_rest} tokens must be between the window ({window}) and "
                                 f"what the encoder reads ({max_length})")
        return PassageSettings(window, overlap, whole_rest=whole_rest)

    def to_record(self) -> dict | None:
        """The manifest's record (None: one vector per document)."""
        if not self.enabled:
            return None
        return {"window": self.window, "overlap": self.overlap, "whole_rest": self.whole_rest}

    @classmethod
    def from_record(cls, record: dict | None) -> PassageSettings:
        if record is None:
            return cls(enabled=False)
        # An index built before `whole_rest` cut every passage at its window.
        return cls(int(record["window"]), int(record["overlap"]),
                   whole_rest=int(record.get("whole_rest") or record["window"]))


@dataclass
class Passages:
    """The passages of a run of documents: document i's spans (start, end) in its text are
    `spans[offsets[i]:offsets[i + 1]]`, and `texts` what each passage encodes (title included)."""

    spans: np.ndarray  # int64 (passages, 2)
    offsets: np.ndarray  # int64 (documents + 1,)
    texts: list[str]
    truncated: int = 0  # documents with more than MAX_PASSAGES passages, cut after those

    def counts(self) -> np.ndarray:
        """Passages per document."""
        return np.diff(self.offsets)


class PassageCutter:
    """Cuts the documents longer than MAX_LENGTH tokens (what the encoder reads) into passages with TOKENIZER (the
    encoder's: a Hugging Face fast tokenizer, or its Rust backend, a `tokenizers.Tokenizer`, as a query kit keeps
    it), as SETTINGS say (already `checked`). Holds its own copy of the tokenizer: the encoder's may be tokenizing on
    another thread meanwhile."""

    def __init__(self, tokenizer, settings: PassageSettings, max_length: int):
        from tokenizers import Tokenizer

        self.settings = settings
        self.max_length = int(max_length)
        self.window = int(settings.window)
        self.overlap = int(settings.overlap)
        self.whole_rest = int(settings.whole_rest)
        backend = tokenizer if isinstance(tokenizer, Tokenizer) else tokenizer.backend_tokenizer
        # A fast tokenizer's count is its backend's (transformers asks the backend).
        self.specials = int(backend.num_special_tokens_to_add(False))
        self._backend = Tokenizer.from_str(backend.to_str())
        self._backend.no_truncation()
        self._backend.no_padding()

    def cut(self, documents: Sequence[Document]) -> Passages:
        """The passages of DOCUMENTS, in order."""
        texts = [document_text(document) for document in documents]
        fits = self.max_length - self.specials
        # A text of no more UTF-8 bytes than the encoder has room for tokens fits without tokenizing: no tokenizer
        # makes more tokens than bytes, bar a leading word-start marker.
        long = [i for i, text in enumerate(texts) if len(text.encode("utf-8")) + 1 > fits]
        long = [i for i, (tokens, _) in zip(long, self._token_offsets([texts[i] for i in long], fits + 1))
                if len(tokens) > fits]
        room = self.window - self.specials
        spans_of: dict[int, list[tuple[int, int]]] = {}
        truncated = 0
        titles_of: dict[int, str | None] = {}
        heads: dict[int, int] = {}
        if long:
            titles = self._backend.encode_batch([documents[i].title or "" for i in long], add_special_tokens=False)
            # Past the tokens MAX_PASSAGES passages and one more can reach, a text is not read.
            tokens = self._token_offsets([documents[i].text for i in long], fits + (MAX_PASSAGES + 1) * room)
            for i, title, (token_offsets, whole) in zip(long, titles, tokens):
                title_room = len(title.ids) + (1 if title.ids else 0)
                # The first passage is what the encoder reads of the whole document (its vector today's).
                first = max(fits - title_room, 1)
                # A passage's text has at least half the window: a title longer than the rest goes with each
                # passage cut short, at a word's end (else the encoder, reading title first, would see no text).
                titles_of[i], kept = _title_within(documents[i].title, title.offsets, room - self.window // 2 - 1)
                title_cost = kept + 1 if kept else 0
                spans = cut_spans(documents[i].text, token_offsets, room - title_cost, self.overlap, first,
                                  whole_rest=self.whole_rest - self.specials - title_cost, most=fits - title_cost)
                if len(spans) > MAX_PASSAGES or not whole:
                    spans, truncated = spans[:MAX_PASSAGES], truncated + 1
                spans_of[i] = spans
                heads[i] = _head_end(documents[i].text, token_offsets, first + HEAD_MARGIN)
        all_spans, offsets, passage_texts = [], [0], []
        for i, (document, text) in enumerate(zip(documents, texts)):
            spans = spans_of.get(i)
            if spans is None:
                all_spans.append((0, len(document.text)))
                passage_texts.append(text)
            else:
                all_spans.extend(spans)
                # The encoder reads the first `max_length` tokens of the whole text: given only its head, it reads
                # the same tokens without tokenizing the rest (a text of megabytes took seconds and gigabytes).
                passage_texts.append(passage_text(document.title, document.text[: heads[i]]))
                passage_texts.extend(passage_text(titles_of[i], document.text[start:end]) for start, end in spans[1:])
            offsets.append(len(all_spans))
        return Passages(np.asarray(all_spans, np.int64).reshape(-1, 2), np.asarray(offsets, np.int64),
                        passage_texts, truncated)

    def _token_offsets(self, texts: list[str], most: int) -> list[tuple[np.ndarray, bool]]:
        """Each text's tokens' (start, end) offsets (int64, tokens x 2), at least MOST of them where it has more,
        and whether they are all of its tokens. A text of more than PIECE_CHARACTERS is tokenized a piece at a
        time, each piece but the first starting at a space or line break, and stops once it has MOST: the
        tokenizer splits words at white space before anything else, so the pieces' tokens are the whole text's,
        and a text of tens of megabytes never holds all its tokens' objects at once (they took gigabytes)."""
        short = [text for text in texts if len(text) <= PIECE_CHARACTERS]
        encoded = iter(self._backend.encode_batch(short, add_special_tokens=False) if short else [])
        found = []
        for text in texts:
            if len(text) <= PIECE_CHARACTERS:
                found.append((_offset_array(next(encoded).offsets), True))
                continue
            parts, count, start = [], 0, 0
            while start < len(text) and count < most:
                end = _piece_end(text, start)
                piece = _offset_array(self._backend.encode(text[start:end], add_special_tokens=False).offsets)
                parts.append(piece + start)
                count, start = count + len(piece), end
            found.append((np.concatenate(parts), start >= len(text)))
        return found


def _offset_array(offsets: Sequence[tuple[int, int]]) -> np.ndarray:
    return np.array(offsets, np.int64).reshape(-1, 2)


def _piece_end(text: str, start: int) -> int:
    """Where the piece of TEXT from START ends: at the last space or line break within PIECE_CHARACTERS (the next
    piece starts with it), else (no white space there: the tokens at the seam may differ from the whole text's by
    a word piece) after PIECE_CHARACTERS, or at the text's end."""
    end = start + PIECE_CHARACTERS
    if end >= len(text):
        return len(text)
    cut = max(text.rfind(" ", start + 1, end), text.rfind("\n", start + 1, end))
    return cut if cut > start else end


def _head_end(text: str, offsets: np.ndarray, tokens: int) -> int:
    """Where TEXT's head of at least TOKENS tokens (their OFFSETS) ends: at the first white space after them, so
    that no word of the head is cut; the whole text where it has no more."""
    if tokens >= len(offsets):
        return len(text)
    space = _WHITE_SPACE.search(text, int(offsets[tokens - 1, 1]))
    return space.start() if space else len(text)


def _title_within(title: str | None, offsets: Sequence[tuple[int, int]], tokens: int) -> tuple[str | None, int]:
    """TITLE as a passage carries it, and how many of its tokens (their OFFSETS) that is: whole where it has at
    most TOKENS, else cut after its last whole word within them (None, 0 where not one fits)."""
    if not title or len(offsets) <= tokens:
        return title or None, len(offsets) if title else 0
    if tokens <= 0:
        return None, 0
    starts = np.fromiter((start for start, _ in offsets), np.int64, len(offsets))
    ends = np.fromiter((end for _, end in offsets), np.int64, len(offsets))
    word_start = _word_starts(title, starts, ends)
    # The token after the last kept one must start a word: step back to the start of the word it is in.
    cut = tokens
    while cut > 0 and not word_start[cut]:
        cut -= 1
    if cut == 0:
        return None, 0
    return title[: _mark_end(title, int(ends[cut - 1]))], cut


def passage_text(title: str | None, text: str) -> str:
    """What a passage encodes: its document's title joined to its text, as a whole document is."""
    return f"{title} {text}" if title else text


def cut_spans(text: str, offsets: Sequence[tuple[int, int]] | np.ndarray, budget: int, overlap: int,
              first: int | None = None, whole_rest: int | None = None, most: int | None = None
              ) -> list[tuple[int, int]]:
    """Character spans of TEXT cut from its tokens (their OFFSETS) into runs of at most BUDGET tokens, each next
    run starting OVERLAP tokens back; cuts fall at sentence ends where the run's second half has one, and always
    between words (a word the tokenizer splits into pieces is never cut, unless one word is longer than a run).
    FIRST: the first run is the first FIRST tokens as they are (what an encoder reading that many sees); its span
    ends at the last whole word in them (where they hold the head of the first word alone, at that word's end, and
    the next run starts with it). WHOLE_REST (with FIRST): where the tokens after the first run (from
    OVERLAP back) are at most this many, they are one run. MOST: the most tokens the encoder reads of a run (None:
    no bound): a word longer than a run keeps the run going to its end while the run stays within MOST, and is cut
    between whole characters past it; the first run never goes past FIRST."""
    offsets = np.asarray(offsets, np.int64).reshape(-1, 2)
    count = len(offsets)
    if count <= (budget if first is None else first):
        return [(0, len(text))]
    starts, ends = offsets[:, 0], offsets[:, 1]
    sentence_end = _sentence_ends(text, starts, ends)
    word_start = _word_starts(text, starts, ends)
    character_start = _character_starts(text, starts, ends)
    spans = []
    begin = 0
    if first is not None:
        later = np.flatnonzero(word_start[1:]) + 1  # the tokens after the first that start a word
        second_word = int(later[0]) if len(later) else count
        if second_word > first and second_word <= budget:
            # The first run holds the head of the first word alone (a title longer than the window leaves it a
            # token or two): its span is that word, and the next run starts with it, so that neither ends or
            # begins inside it.
            spans.append((0, _mark_end(text, int(ends[second_word - 1]))))
            begin = 0
        else:
            spans.append((0, _mark_end(text, int(ends[_word_back(word_start, first, 0, character_start, first)
                                                       - 1]))))
            begin = _word_back(word_start, _next_start(sentence_end, first, max(first - overlap, 1), overlap), 0,
                               character_start, first)
        if whole_rest is not None and count - begin <= whole_rest:
            spans.append((int(starts[begin]), _mark_end(text, int(ends[count - 1]))))
            return spans
    while True:
        last = begin + budget  # one past the run's last token
        if last >= count:
            spans.append((int(starts[begin]), _mark_end(text, int(ends[count - 1]))))
            return spans
        half = begin + budget // 2
        found = np.flatnonzero(sentence_end[half:last])
        last = half + int(found[-1]) + 1 if len(found) else _word_back(
            word_start, last, begin, character_start, None if most is None else begin + most)
        spans.append((int(starts[begin]), _mark_end(text, int(ends[last - 1]))))
        following = _next_start(sentence_end, last, max(last - overlap, begin + 1), overlap)
        begin = _word_back(word_start, following, begin, character_start, last)  # no text between two runs lost


def _next_start(sentence_end: np.ndarray, last: int, following: int, overlap: int) -> int:
    """Where the run after one ending before token LAST starts: FOLLOWING (OVERLAP tokens back), moved forward to
    the first sentence start inside the overlap, so the repeated text begins with a whole sentence."""
    if overlap:
        found = np.flatnonzero(sentence_end[following - 1 : last - 1])
        if len(found):
            following += int(found[0])
    return following


def _word_back(word_start: np.ndarray, position: int, floor: int, character_start: np.ndarray | None = None,
               limit: int | None = None) -> int:
    """POSITION moved back to the start of the word its token belongs to, but never to FLOOR or before. Where the
    word starts at or before FLOOR (one word longer than a run), the next word's start after POSITION, where that
    is at most LIMIT (None: no limit): the word stays whole, in a passage the encoder still reads whole. Past
    LIMIT (text without spaces between words, as Thai or Chinese, runs far longer than a window), the last token
    after FLOOR that starts a whole character (CHARACTER_START); POSITION itself where there is none."""
    back = position
    while back > floor and not word_start[back]:
        back -= 1
    if back > floor:
        return back
    ahead = position
    while ahead < len(word_start) and not word_start[ahead]:
        ahead += 1
    if limit is None or ahead <= limit:
        return ahead if ahead < len(word_start) else position
    back = position
    while character_start is not None and back > floor and not character_start[back]:
        back -= 1
    return back if back > floor else position


def _word_starts(text: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each token starts a word: the first token, and any token that begins where a cut would not split a
    word (`_inside_word`: WordPiece's "##ob" of "frobnicator" is glued to "fr"; "." and "g" of "e.g" are not) and
    shares no character with the token before (a Hangul syllable the tokenizer decomposed into pieces)."""
    result = np.ones(len(starts), bool)
    if text.isascii():  # no marks, no joiners, no character split: only letters and digits glue
        for number in range(1, len(starts)):
            start = int(starts[number])
            if start == int(ends[number - 1]) and 0 < start < len(text) and text[start - 1].isalnum() \
                    and text[start].isalnum():
                result[number] = False
        return result
    for number in range(1, len(starts)):
        start = int(starts[number])
        if start < int(ends[number - 1]) or _inside_word(text, start):
            result[number] = False
    return result


def _character_starts(text: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each token starts a character whole: it shares no character with the token before (a syllable the
    tokenizer decomposed), and begins on no combining mark or joiner, nor right after a zero-width joiner."""
    result = np.ones(len(starts), bool)
    if text.isascii():
        return result
    for number in range(1, len(starts)):
        start = int(starts[number])
        if start < int(ends[number - 1]) or _joins_before(text, start):
            result[number] = False
    return result


# Zero-width non-joiner and joiner: inside a word (Persian, the Indic scripts) or an emoji sequence.
_JOINERS = "\u200c\u200d"


def _in_word(character: str) -> bool:
    """Whether CHARACTER belongs to a word: a letter or digit, a combining mark (an accent, an Indic vowel sign,
    Arabic's short vowels: none of them alphanumeric to Python) or a joiner."""
    return character.isalnum() or unicodedata.category(character)[0] == "M" or character in _JOINERS


def _joins_before(text: str, position: int) -> bool:
    """Whether TEXT[POSITION] belongs to the character before it: a combining mark, a joiner, or what a zero-width
    joiner joins (False at either end of TEXT)."""
    return 0 < position < len(text) and (unicodedata.category(text[position])[0] == "M"
                                         or text[position] in _JOINERS or text[position - 1] == "\u200d")


def _inside_word(text: str, position: int) -> bool:
    """Whether a cut before TEXT[POSITION] would split a word, or a character from its marks (an uncased
    tokenizer drops accents, and its tokens' offsets leave them out: "de" and "##ja" of "déjà" written with
    combining accents)."""
    return _joins_before(text, position) or (0 < position < len(text) and _in_word(text[position - 1])
                                             and _in_word(text[position]))


def _mark_end(text: str, end: int) -> int:
    """END moved past the combining marks and joiners that follow it, and the character a joiner joins: a passage
    ending in a word ends with its last character's accents (an uncased tokenizer's offsets leave them out)."""
    while _joins_before(text, end):
        end += 1
    return end


def _sentence_ends(text: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Whether each token ends a sentence: it ends in . ! ? (closing quotes or brackets after it allowed) and
    whitespace or the text's end follows; or a line break follows it."""
    count = len(starts)
    result = np.zeros(count, bool)
    following = np.append(starts[1:], len(text))
    for number in range(count):
        end = int(ends[number])
        if end <= 0:
            continue
        gap = text[end : int(following[number])]
        if "\n" in gap:
            result[number] = True
            continue
        tail = text[int(starts[number]) : end].rstrip(_CLOSING)
        if tail and tail[-1] in _SENTENCE_ENDS and (not gap or gap[0].isspace() or number == count - 1):
            result[number] = True
    return result
