"""Labeled retrieval sets made from the real passages in the data folder (`passages/passages.jsonl.gz`), whose
relevance comes from how the sources are organised, not from anybody's judgement of our system:

- ``bible-parallel``: a King James verse retrieves the same verse in the World English Bible among every verse
  of the WEB New Testament (a paraphrase: archaic against modern English);
- ``wordnet-define``: a WordNet lemma ("contract killing") retrieves the glosses of the synsets it names, among
  the glosses of a sample of synsets (a word against its definition, which rarely repeats it);
- ``debian-package``: a package's one-line synopsis retrieves the paragraphs of its long description, among the
  paragraphs of a sample of packages; documents carry the package name as title (a summary against its body);
- ``foldoc-term``: a FOLDOC headword retrieves the paragraphs that define it (a term against its definition);
- ``python-doc-page`` and ``linux-doc-page``: a documentation page's title (three words or more, e.g. "multiprocessing
  — Process-based parallelism") retrieves that page's paragraphs (up to 20, sampled), among the sampled paragraphs
  of a sample of pages; documents carry no title (a topic against its text, as in documentation search).
  The same task over six more manuals (`FRESH_DOC_PAGES`: PostgreSQL, Perl, Qt, Rust, Racket, SQLite), whose
  titles are thick with identifiers ("alloc_zeroed in alloc::alloc"), was added for issue 44 as tasks nobody had
  looked at while designing the hybrid search.

Samples are seeded and the file is read in its fixed order, so a set is the same on every machine. Every set
stays small enough (at most 2,000 queries, at most about 10,000 documents) to encode with a base-size model on a
CPU in minutes.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from retriever.errors import RetrieverError
from retriever.evaluation.retrieval import Qrels, RetrievalSet

PASSAGES = Path("passages") / "passages.jsonl.gz"
QUERIES = 2000
SEED = 0
_NEW_TESTAMENT = ("Matt", "Mark", "Luke", "John", "Acts", "Rom", "1Cor", "2Cor", "Gal", "Eph", "Phil", "Col",
                  "1Thess", "2Thess", "1Tim", "2Tim", "Titus", "Phlm", "Heb", "Jas", "1Pet", "2Pet", "1John",
                  "2John", "3John", "Jude", "Rev")
_VERSE = re.compile(r"^(KJV|WEB) (\S+) (\d+:\d+)$")


def read_sources(data_dir: Path, sources: set[str]) -> dict[str, list[dict]]:
    """The records of SOURCES (`_id` prefixes), in file order; stops reading after the last of them."""
    path = Path(data_dir) / PASSAGES
    if not path.is_file():
        raise RetrieverError(f"missing {path}: the passage tasks are made from it")
    found: dict[str, list[dict]] = defaultdict(list)
    with gzip.open(path, "rt", encoding="utf-8") as file:
        for line in file:
            record = json.loads(line)
            source = record["_id"].rsplit("-", 1)[0]
            if source in sources:
                found[source].append(record)
            elif len(found) == len(sources):  # sources are contiguous: every one asked for is complete
                break
    return dict(found)


def bible_parallel(data_dir: Path) -> RetrievalSet:
    records = read_sources(data_dir, {"bible-kjv", "bible-web"})
    verses: dict[str, dict[str, str]] = {"KJV": {}, "WEB": {}}
    for record in records["bible-kjv"] + records["bible-web"]:
        match = _VERSE.match(record["title"])
        if match and match.group(2) in _NEW_TESTAMENT:
            verses[match.group(1)].setdefault(f"{match.group(2)} {match.group(3)}", record["text"])
    corpus = {f"web:{reference}": (None, text) for reference, text in verses["WEB"].items()}
    shared = sorted(set(verses["KJV"]) & set(verses["WEB"]))
    picked = _sample(shared, QUERIES)
    queries = {f"kjv:{reference}": verses["KJV"][reference] for reference in picked}
    qrels = {f"kjv:{reference}": {f"web:{reference}": 1} for reference in picked}
    return RetrievalSet("bible-parallel", corpus, queries, qrels)


def wordnet_define(data_dir: Path, synsets: int = 8000) -> RetrievalSet:
    records = _sample(read_sources(data_dir, {"wordnet"})["wordnet"], synsets)
    corpus = {record["_id"]: (None, record["text"]) for record in records}
    by_lemma: dict[str, list[str]] = defaultdict(list)
    for record in records:
        for lemma in dict.fromkeys(part.strip().lower() for part in record["title"].split(",")):
            if lemma:
                by_lemma[lemma].append(record["_id"])
    first_lemmas = [record["title"].split(",")[0].strip().lower() for record in records]
    picked = _sample(list(dict.fromkeys(first_lemmas)), QUERIES)
    queries = {f"q:{lemma}": lemma for lemma in picked}
    qrels: Qrels = {f"q:{lemma}": dict.fromkeys(by_lemma[lemma], 1) for lemma in picked}
    return RetrievalSet("wordnet-define", corpus, queries, qrels)


def debian_package(data_dir: Path) -> RetrievalSet:
    packages: dict[str, tuple[str, list[dict]]] = {}
    for record in read_sources(data_dir, {"debian-desc"})["debian-desc"]:
        name, _, synopsis = record["title"].partition(": ")
        if synopsis.strip():
            packages.setdefault(name, (synopsis.strip(), []))[1].append(record)
    picked = _sample(sorted(packages), QUERIES)
    corpus, queries, qrels = {}, {}, {}
    for name in picked:
        synopsis, paragraphs = packages[name]
        queries[f"q:{name}"] = synopsis
        qrels[f"q:{name}"] = {record["_id"]: 1 for record in paragraphs}
        corpus.update((record["_id"], (name, record["text"])) for record in paragraphs)
    return RetrievalSet("debian-package", corpus, queries, qrels)


def foldoc_term(data_dir: Path) -> RetrievalSet:
    terms: dict[str, list[dict]] = defaultdict(list)
    for record in read_sources(data_dir, {"foldoc"})["foldoc"]:
        terms[record["title"]].append(record)
    picked = _sample(sorted(terms), QUERIES)
    corpus = {record["_id"]: (None, record["text"]) for term in picked for record in terms[term]}
    queries = {f"q:{term}": term for term in picked}
    qrels: Qrels = {f"q:{term}": {record["_id"]: 1 for record in terms[term]} for term in picked}
    return RetrievalSet("foldoc-term", corpus, queries, qrels)


def doc_page(data_dir: Path, source: str, name: str, pages: int = 500, per_page: int = 20) -> RetrievalSet:
    by_title: dict[str, list[dict]] = defaultdict(list)
    for record in read_sources(data_dir, {source})[source]:
        by_title[record["title"]].append(record)
    picked = _sample(sorted(title for title in by_title if len(title.split()) >= 3), pages)
    corpus, queries, qrels = {}, {}, {}
    for number, title in enumerate(picked):
        paragraphs = _sample(by_title[title], per_page)
        queries[f"q{number}"] = title
        qrels[f"q{number}"] = {record["_id"]: 1 for record in paragraphs}
        corpus.update((record["_id"], (None, record["text"])) for record in paragraphs)
    return RetrievalSet(name, corpus, queries, qrels)


def python_doc_page(data_dir: Path) -> RetrievalSet:
    return doc_page(data_dir, "python-doc", "python-doc-page")


def linux_doc_page(data_dir: Path) -> RetrievalSet:
    return doc_page(data_dir, "linux-doc", "linux-doc-page")


# (task name, source prefix in passages/): the manuals held out of every hybrid-search design (issue 44).
FRESH_DOC_PAGES = (("postgresql-doc-page", "postgresql-doc"), ("perl-doc-page", "perl-doc"),
                   ("qt-doc-page", "qt-doc"), ("rust-doc-page", "rust-doc"), ("racket-doc-page", "racket-doc"),
                   ("sqlite-doc-page", "sqlite-doc"))


def _sample(items: list, size: int) -> list:
    if len(items) <= size:
        return list(items)
    picks = np.sort(np.random.default_rng(SEED).choice(len(items), size=size, replace=False))
    return [items[i] for i in picks]
