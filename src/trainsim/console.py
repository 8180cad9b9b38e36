"""Progress bars for the commands: on stderr, transient, and only on a terminal (never a stray line in
a pipe or a log, so an error stays one line and `--json -` stays pure JSON)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import Progress

from .limits import PROGRESS_MIN_TASKS


def progress_bar(*columns: Any, quiet: bool = False) -> Progress:  # noqa: ANN401 - rich's column types
    """A transient rich Progress on stderr, disabled when quiet or when stderr is not a terminal."""
    console = Console(stderr=True)
    return Progress(*columns, console=console, transient=True, disable=quiet or not console.is_terminal)


class PhaseProgress:
    """A progress(phase, done, total) callback drawing one transient bar that restarts for each new phase.
    The bar is made on the first call whose total reaches `min_total` (short work shows nothing) from
    `columns()`, so rich's column objects are only built when a bar is drawn; a context manager."""

    def __init__(self, columns: Callable[[], tuple[Any, ...]], *, quiet: bool = False, min_total: int = 0) -> None:
        self._columns, self._quiet, self._min_total = columns, quiet, min_total
        self._bar: Progress | None = None
        self._task: Any = None
        self._phase = ""
        self._off = quiet

    def __call__(self, phase: str, done: int, total: int) -> None:
        if self._off:
            return
        if self._bar is None:
            if total < self._min_total:
                return
            bar = progress_bar(*self._columns(), quiet=self._quiet)
            if bar.disable:
                self._off = True
                return
            self._bar = bar
            bar.start()
        if self._task is None:
            self._task = self._bar.add_task(phase, total=total)
        elif phase != self._phase:
            self._bar.reset(self._task, total=total, description=phase)
        self._phase = phase
        self._bar.update(self._task, completed=min(done, total), total=total)

    def __enter__(self) -> PhaseProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def simulate_bar() -> PhaseProgress:
    """api.simulate's progress callback: a transient rich bar on stderr (a terminal only) for jobs predicted to
    build at least PROGRESS_MIN_TASKS tasks (a few seconds); nothing for smaller ones."""

    def columns() -> tuple[Any, ...]:
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

        return (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("tasks"),
                TimeElapsedColumn())

    return PhaseProgress(columns, min_total=PROGRESS_MIN_TASKS)
