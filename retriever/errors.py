"""User-facing errors.

Anything a user can cause (bad input, missing model, missing index) raises ``RetrieverError`` with a message
that fits on one line; the CLI prints it and exits non-zero instead of showing a traceback.
"""


class RetrieverError(Exception):
    """An error caused by input or environment, reported to the user as one clear line."""
