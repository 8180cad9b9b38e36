"""Running the CLI in-process from tests: the one-line error a refusal must give."""

from __future__ import annotations

import pytest

from trainsim.cli import main


def one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run `trainsim ARGV`, assert exit 2 with one `error:` line on stderr (no traceback), return the line."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err
    return err
