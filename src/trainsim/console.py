"""Progress bars for the commands: on stderr, transient, and only on a terminal (never a stray line in
a pipe or a log, so an error stays one line and `--json -` stays pure JSON)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import Progress


def progress_bar(*columns: Any, quiet: bool = False) -> Progress:  # noqa: ANN401 - rich's column types
    """A transient rich Progress on stderr, disabled when quiet or when stderr is not a terminal."""
    console = Console(stderr=True)
    return Progress(*columns, console=console, transient=True, disable=quiet or not console.is_terminal)
