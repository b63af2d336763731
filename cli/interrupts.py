"""Ctrl-C as one line: each command notes what an interruption at that point leaves behind ("index 'x' is
unchanged ..."), and `cli.main.main` prints it as `interrupted: ...` with exit code 130.

Commands run wrapped by `interruptible`, which carries a KeyboardInterrupt past click as `Interrupted`: click
would turn it into "Aborted!" and exit code 1."""

from __future__ import annotations

import functools
import signal

_note = ""  # what the running command's interruption leaves behind; "" when nothing needs saying


class Interrupted(Exception):
    """Ctrl-C during a command; its message is what the user needs to know."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (`kill`, a service manager stopping a job): unwound as Ctrl-C is, so a write cleans up after itself
    and a build keeps what it finished to resume from; it exited silently with 143, its partial folder left."""


def _terminate(signum, frame) -> None:
    raise Terminated()


def on_terminate() -> None:
    """Take SIGTERM as Ctrl-C is taken, where this process has not been told otherwise (a server's loop installs
    its own, for a graceful stop)."""
    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, _terminate)


def on_interrupt(note: str) -> None:
    global _note
    _note = note


def interruptible(command):
    @functools.wraps(command)
    def run(*args, **kwargs):
        on_interrupt("")
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt as interruption:
            raise Interrupted(_note, isinstance(interruption, Terminated)) from None

    return run


def message(interrupted: BaseException | None = None) -> str:
    note = interrupted.args[0] if isinstance(interrupted, Interrupted) else _note
    said = "terminated" if terminated(interrupted) else "interrupted"
    return f"{said}: {note}" if note else said


def terminated(interrupted: BaseException | None) -> bool:
    """Whether INTERRUPTED came of SIGTERM (exit code 143, as a shell reports it) rather than Ctrl-C (130)."""
    return isinstance(interrupted, Terminated) or (isinstance(interrupted, Interrupted) and len(interrupted.args) > 1
                                                    and bool(interrupted.args[1]))
