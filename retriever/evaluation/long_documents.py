"""Long documents among short ones: can a sentence from the last quarter of a long page find that page?

Made from the real passages in the data folder (`passages/passages.jsonl.gz`): a documentation page is the run
of paragraphs that share its title in one source; a page of at least `LONG_WORDS` words (far past the 256 tokens,
about 190 words, an encoder like all-MiniLM-L6-v2 reads) is a long document, its paragraphs joined as they stand.
The other pages of the source give short documents (single paragraphs, with their page's title), the
distractors. For each long page a query is one sentence from its last quarter (8 to 40 words), or a few of that
sentence's rarest words (`RARE_WORDS`, the rarest in the set's documents, in the sentence's order); relevance is
that page and nothing else (`recall@10` of the source document: issue 42's probe, on texts of our own).

Sources are split beforehand into dev ones, which a change may be tuned on, and held-out ones, which only say
whether it generalises. Samples are seeded and the file is read in its fixed order, so a set is the same on every
machine.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from retriever.evaluation.passage_tasks import read_sources
from retriever.evaluation.retrieval import RetrievalSet

LONG_WORDS = 600
PAGES = 200  # long pages (queries) per set, at most
DISTRACTORS = 4000  # short documents per set, at most
RARE_WORDS = 5
SEED = 0
_SENTENCE = re.compile(r"[^.!?]+[.!?](?=\s|$)")
_WORD = re.compile(r"[A-Za-z][A-Za-z_]{3,}")


@dataclass(frozen=True)
class LongDocumentTask:
    """One source's set, in its two query forms: the sentence, and its rarest words."""

    name: str
    source: str
    split: str  # "dev" or "held-out"

    def load(self, data_dir: Path, rare: bool = False) -> RetrievalSet:
        return long_document_set(data_dir, self.source, self.name + ("-rare" if rare else ""), rare)


LONG_DOCUMENT_TASKS = {task.name: task for task in (
    LongDocumentTask("long-python-doc", "python-doc", "dev"),
    LongDocumentTask("long-postgresql-doc", "postgresql-doc", "dev"),
    LongDocumentTask("long-perl-doc", "perl-doc", "held-out"),
    LongDocumentTask("long-git-doc", "git-doc", "held-out"),
    LongDocumentTask("long-debian-handbook", "debian-handbook", "held-out"),
    LongDocumentTask("long-erlang-doc", "erlang-doc", "held-out"),
)}


def long_document_set(data_dir: Path, source: str, name: str, rare: bool = False) -> RetrievalSet:
    """SOURCE's long pages, each queried by a sentence of its last quarter (RARE: by that sentence's rarest
    words), among short paragraphs of its other pages."""
    pages: dict[str, list[str]] = {}
    for record in read_sources(data_dir, {source})[source]:
        pages.setdefault(record["title"], []).append(record["text"])
    rng = np.random.default_rng(SEED)
    long_titles = [title for title, paragraphs in pages.items()
                   if sum(len(text.split()) for text in paragraphs) >= LONG_WORDS and _late_sentences(paragraphs)]
    chosen = _sample(long_titles, PAGES, rng)
    others = [(title, text) for title, paragraphs in pages.items() if title not in set(chosen)
              for text in paragraphs]
    corpus: dict[str, tuple[str | None, str]] = {}
    for number, (title, text) in enumerate(_sample(others, DISTRACTORS, rng)):
        corpus[f"{source}:p{number}"] = (title, text)
    sentences = {}
    for number, title in enumerate(chosen):
        corpus[f"{source}:page{number}"] = (title, "\n\n".join(pages[title]))
        late = _late_sentences(pages[title])
        sentences[number] = late[int(rng.integers(len(late)))]
    frequency = _document_frequency(text for _, text in corpus.values()) if rare else Counter()
    queries, qrels = {}, {}
    for number, sentence in sentences.items():
        queries[f"q{number}"] = rarest_words(sentence, frequency) if rare else sentence
        qrels[f"q{number}"] = {f"{source}:page{number}": 1}
    return RetrievalSet(name, corpus, queries, qrels)


def rarest_words(sentence: str, frequency: Counter) -> str:
    """The RARE_WORDS words of SENTENCE that the fewest documents hold (FREQUENCY), in the sentence's order."""
    words = list(dict.fromkeys(_WORD.findall(sentence)))
    rarest = sorted(range(len(words)), key=lambda position: (frequency[words[position].lower()], position))
    return " ".join(words[position] for position in sorted(rarest[:RARE_WORDS]))


def _late_sentences(paragraphs: list[str]) -> list[str]:
    """The sentences (8 to 40 words, at least RARE_WORDS words of 4 letters or more) that start in the last quarter
    of the page PARAGRAPHS make."""
    text = "\n\n".join(paragraphs)
    start = int(len(text) * 0.75)
    found = []
    for match in _SENTENCE.finditer(text):
        sentence = " ".join(match.group().split())
        if match.start() >= start and 8 <= len(sentence.split()) <= 40 and \
                len(set(_WORD.findall(sentence))) >= RARE_WORDS:
            found.append(sentence)
    return found


def _document_frequency(texts) -> Counter:
    frequency: Counter = Counter()
    for text in texts:
        frequency.update({word.lower() for word in _WORD.findall(text)})
    return frequency


def _sample(items: list, size: int, rng: np.random.Generator) -> list:
    if len(items) <= size:
        return list(items)
    return [items[i] for i in np.sort(rng.choice(len(items), size=size, replace=False))]
