"""Ctrl-C as one line: each command notes what an interruption at that point leaves behind ("index 'x' is
unchanged ..."), and `cli.main.main` prints it as `interrupted: ...` with exit code 130.

Commands run wrapped by `interruptible`, which carries a KeyboardInterrupt past click as `Interrupted`: click
would turn it into "Aborted!" and exit code 1."""

from __future__ import annotations

import functools

_note = ""  # what the running command's interruption leaves behind; "" when nothing needs saying


class Interrupted(Exception):
    """Ctrl-C during a command; its message is what the user needs to know."""


def on_interrupt(note: str) -> None:
    global _note
    _note = note


def interruptible(command):
    @functools.wraps(command)
    def run(*args, **kwargs):
        on_interrupt("")
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt:
            raise Interrupted(_note) from None

    return run


def message(interrupted: BaseException | None = None) -> str:
    note = str(interrupted) if isinstance(interrupted, Interrupted) else _note
    return f"interrupted: {note}" if note else "interrupted"
