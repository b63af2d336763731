"""The `retriever` console script's first step. Loading the command line (typer, rich, the library) takes a moment;
a Ctrl-C in it printed Python's traceback of whichever import it landed in. Until `cli.main` is loaded, Ctrl-C
ends the process with one line and exit code 130; from then on `cli.main.main` says what an interruption leaves
behind, as every command does."""

from __future__ import annotations

import os
import signal


def _interrupted_while_loading(number, frame) -> None:
    os.write(2, b"interrupted\n")
    os._exit(130)  # nothing is written yet, and an import half done is no state to unwind through


def main() -> None:
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN:  # a job started in the background ignores Ctrl-C: it goes on ignoring it
        signal.signal(signal.SIGINT, _interrupted_while_loading)
    from cli.main import main as run

    signal.signal(signal.SIGINT, previous)
    run()
