"""User-facing errors.

Anything a user can cause (bad input, missing model, missing index) raises ``RetrieverError`` with a message
that fits on one line; the CLI prints it and exits non-zero instead of showing a traceback.
"""


class RetrieverError(Exception):
    """An error caused by input or environment, reported to the user as one clear line."""


class NotFoundError(RetrieverError):
    """What was asked for does not exist: an index, or a document id (the server answers 404)."""


class ConflictError(RetrieverError):
    """The request clashes with the index's state: an id already in it, or another writer at work (409)."""


class DamagedIndexError(RetrieverError):
    """An index's files fail their checks (a checksum, a parse, a count): that index cannot be used until it is
    restored or rebuilt; the others can (the server answers 503 for it alone)."""
