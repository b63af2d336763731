"""retriever: vector search over a calibrated index.

text -> Encoder (frozen transformer + pooling) -> Calibrator (BERT-flow by default) -> L2 -> FAISS + SQLite.

    from retriever import Index
    Index.build("corpus.jsonl", "docs")
    hits = Index.open("docs").search("how do I read a file", k=5)

The names below load on first use, so `import retriever` (and the CLI's --help) does not import torch or FAISS.
"""

__version__ = "0.1.0"

_PUBLIC = {
    "Index": "retriever.index", "SearchOptions": "retriever.search.options", "SearchHit": "retriever.search.results",
    "ChangeSummary": "retriever.engines.steps",
    "Document": "retriever.corpus", "Encoder": "retriever.encode.encoder", "RetrieverError": "retriever.errors",
    "NotFoundError": "retriever.errors", "ConflictError": "retriever.errors", "DamagedIndexError": "retriever.errors",
    "UnavailableError": "retriever.errors", "FilterWarning": "retriever.filters",
    "make_calibrator": "retriever.calibration", "load_calibrator": "retriever.calibration",
}
__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'retriever' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value  # once loaded, an ordinary attribute
    return value
