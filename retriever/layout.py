"""The names of an index version's files and folders, in one place: what every writer and reader of a version
(`Index`, both build engines, their workers) agrees on.

    VERSION/
      manifest.json          (`index_folder.MANIFEST`): every file's size and hash, the segments, the counts
      calibrator/            CALIBRATOR: the fitted calibrator (calibrator.json and its weights)
      trained.faiss          TEMPLATE: the trained IVF quantizer every segment shares (IVF index types only)
      tombstones.npy         TOMBSTONES: row ids deleted since the segments were written
      segments/NNNNNN/       SEGMENTS, named by `segment_name`: documents.db, raw.npy, rowids.npy, vectors.faiss
      encoded.npy            ENCODED: a build's raw vectors, in its partial folder until the segment is written
"""

from __future__ import annotations

import re

FORMAT_VERSION = 2
CALIBRATOR, TEMPLATE, TOMBSTONES, SEGMENTS = "calibrator", "trained.faiss", "tombstones.npy", "segments"
ENCODED = "encoded.npy"
# A segment's folder name, as `segment_name` writes it: a manifest naming anything else ('../x') is refused.
SEGMENT_NAME = re.compile(r"\d{6,9}")


def segment_name(number: int) -> str:
    return f"{number:06d}"
