"""The names of a segment's files, in one place: what every writer and reader of a segment agrees on.

    segments/NNNNNN/         a segment folder, named by `segment_name`
      vectors.faiss          VECTORS: the calibrated vectors (FAISS), keyed by row id
      raw.npy                RAW: the uncalibrated vectors
      rowids.npy             ROWIDS: the row id of each document, ascending
      passages.npy           PASSAGES, with SPANS: where a document is cut into passages, each raw vector's passage
      spans.npy              key and its character span (`retriever.store.passages`); absent: keyed by row id
      documents.db           DOCUMENTS: the documents (SQLite)
      keywords.db            KEYWORDS, with POSTINGS and COUNTS: the keyword index of the documents
                             (`retriever.store.keywords`)
      keyword-passages.db    PASSAGE_KEYWORDS, with PASSAGE_POSTINGS and PASSAGE_COUNTS: the keyword index of the
                             passages of the documents cut into passages, where some are (of every passage, in
                             an index written before 2026-11-29)
"""

from __future__ import annotations

import re

VECTORS, RAW, ROWIDS, DOCUMENTS = "vectors.faiss", "raw.npy", "rowids.npy", "documents.db"
PASSAGES, SPANS = "passages.npy", "spans.npy"
KEYWORDS, POSTINGS, COUNTS = "keywords.db", "keyword-postings.npy", "keyword-counts.npy"
PASSAGE_KEYWORDS, PASSAGE_POSTINGS, PASSAGE_COUNTS = ("keyword-passages.db", "keyword-passage-postings.npy",
                                                      "keyword-passage-counts.npy")
# A segment's folder name, as `segment_name` writes it: a manifest naming anything else ('../x') is refused.
SEGMENT_NAME = re.compile(r"\d{6,9}")


def segment_name(number: int) -> str:
    return f"{number:06d}"
