"""The one error type users see: names the offending field and the fix, printed as one line."""

from __future__ import annotations


class ConfigError(ValueError):
    """Invalid input: `field` is the config key (or CLI flag) at fault, `fix` what to change."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        super().__init__(self.one_line())

    def one_line(self) -> str:
        """`field: problem; fix` on one line (line breaks inside any part become spaces)."""
        text = f"{self.field}: {self.problem}" + (f"; {self.fix}" if self.fix else "")
        return " ".join(text.splitlines())
