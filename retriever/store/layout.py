"""The names of a segment's files, in one place: what every writer and reader of a segment agrees on.

    segments/NNNNNN/         a segment folder, named by `segment_name`
      vectors.faiss          VECTORS: the calibrated vectors (FAISS), keyed by row id
      raw.npy                RAW: the uncalibrated vectors
      rowids.npy             ROWIDS: the row id of each document, ascending
      passages.npy           PASSAGES, with SPANS: where a document is cut into passages, each raw vector's passage
      spans.npy              key and its character span (`retriever.store.passages`); absent: keyed by row id
      documents.db           DOCUMENTS: the documents (SQLite)
      keywords.db            KEYWORDS, with POSTINGS and COUNTS: the keyword index (`retriever.store.keywords`)
"""

from __future__ import annotations

import re

VECTORS, RAW, ROWIDS, DOCUMENTS = "vectors.faiss", "raw.npy", "rowids.npy", "documents.db"
PASSAGES, SPANS = "passages.npy", "spans.npy"
KEYWORDS, POSTINGS, COUNTS = "keywords.db", "keyword-postings.npy", "keyword-counts.npy"
# A segment's folder name, as `segment_name` writes it: a manifest naming anything else ('../x') is refused.
SEGMENT_NAME = re.compile(r"\d{6,9}")


def segment_name(number: int) -> str:
    return f"{number:06d}"
