"""The names of an index version's files and folders, in one place: what every writer and reader of a version
(`Index`, both build engines, their workers) agrees on.

    indexes/NAME -> .versions/NAME/VERSION    (VERSIONS; .versions/NAME/LOCK is the writer lock)
    VERSION/
      manifest.json          MANIFEST (`retriever.manifest`): every file's size and hash, the segments, the counts
      calibrator/            CALIBRATOR: the fitted calibrator (calibrator.json and its weights)
      trained.faiss          TEMPLATE: the trained IVF quantizer every segment shares (IVF index types only)
      tombstones.npy         TOMBSTONES: row ids deleted since the segments were written
      segments/NNNNNN/       SEGMENTS, named by `segment_name`: DOCUMENTS, RAW, ROWIDS, VECTORS, KEYWORDS, POSTINGS, COUNTS
      encoded.npy            ENCODED: a build's raw vectors, in its partial folder until the segment is written
      build-state.json       BUILD_STATE: in a build's partial folder, what it has finished, for resuming
"""

from __future__ import annotations

import re

MANIFEST, BUILD_STATE, VERSIONS, LOCK = "manifest.json", "build-state.json", ".versions", "lock"
CALIBRATOR, TEMPLATE, TOMBSTONES, SEGMENTS = "calibrator", "trained.faiss", "tombstones.npy", "segments"
ENCODED = "encoded.npy"
VECTORS, RAW, ROWIDS, DOCUMENTS = "vectors.faiss", "raw.npy", "rowids.npy", "documents.db"
KEYWORDS, POSTINGS, COUNTS = "keywords.db", "keyword-postings.npy", "keyword-counts.npy"
# A segment's folder name, as `segment_name` writes it: a manifest naming anything else ('../x') is refused.
SEGMENT_NAME = re.compile(r"\d{6,9}")


def segment_name(number: int) -> str:
    return f"{number:06d}"
