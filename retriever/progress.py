"""Rich progress bars on stderr, so stdout stays clean for JSON output."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

stderr_console = Console(stderr=True)


class RateColumn(TextColumn):
    """Items per second, e.g. '812 it/s'; '…' until a rate is known, nothing for a stage done before one was."""

    def __init__(self, unit: str = "it"):
        super().__init__("")
        self.unit = unit

    def render(self, task):
        speed = task.finished_speed or task.speed
        if speed:
            return f"{speed:,.0f} {self.unit}/s"
        return "" if task.finished else "…"


@contextmanager
def progress_bar(description: str, total: int | None, enabled: bool = True, unit: str = "texts",
                 transient: bool = False) -> Iterator[Callable[[int], None]]:
    """Yields `advance(n)`. Disabled bars cost nothing, so library code can always call advance.

    TOTAL None: not known in advance (a streamed corpus). TRANSIENT: the bar disappears when done, for quick
    stages whose bar would only clutter an error message that follows."""
    # A transient bar is gone when done, and where stderr is no terminal it is drawn only then: as a blank line.
    if not enabled or (transient and not stderr_console.is_terminal):
        yield lambda n: None
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TaskProgressColumn(),
        RateColumn(unit),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=stderr_console, transient=transient) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)
