"""retriever: vector search over a calibrated index.

text -> Encoder (frozen transformer + pooling) -> Calibrator (BERT-flow by default) -> L2 -> FAISS + SQLite.
"""

__version__ = "0.1.0"
