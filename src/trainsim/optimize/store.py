"""The results store: one embedded DuckDB file with one table, `runs`, that sweeps and searches share.

One row per evaluated job (`evaluate.columns()`: a column per job key, the results, `key` the job's
identity as PRIMARY KEY) plus `study` (which sweep or search wrote it) and `created_at` (UTC). Rows are
committed as they are added, so a killed run keeps every finished job; a job already stored is never
stored twice. Any SQL tool reads it, e.g. `duckdb.connect("runs.db").sql("select * from runs").df()`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .evaluate import columns

SEARCH_INSTALL = "pip install 'trainsim[search]'"
META_COLUMNS: dict[str, str] = {"study": "VARCHAR", "created_at": "TIMESTAMP"}
"""Columns the store adds to each row: what wrote it, and when (UTC)."""


def import_duckdb(field: str = "--db") -> Any:  # noqa: ANN401 - the duckdb module
    """The duckdb module, or a one-line ConfigError naming the extra to install."""
    try:
        import duckdb
    except ImportError:
        raise ConfigError(field, "DuckDB (the results store) is not installed", f"{SEARCH_INSTALL}, or drop {field}") \
            from None
    return duckdb


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:200] if text else type(exc).__name__


class ResultsStore:
    """The `runs` table of the DuckDB file `path` (created when missing, an empty file included); a file that
    is not a DuckDB database, or whose `runs` table has other columns, is a one-line ConfigError on `field`."""

    def __init__(self, path: str | os.PathLike[str], field: str = "--db") -> None:
        duckdb = import_duckdb(field)
        self.path = Path(path)
        self.field = field
        self._duckdb = duckdb
        self._check_path()
        try:
            self._con = duckdb.connect(str(self.path))
        except duckdb.Error as exc:
            raise self._open_error(exc) from None
        try:
            self._ensure_table()
        except BaseException:
            self._con.close()
            raise
        self._columns = list(columns())
        names = ", ".join(_q(c) for c in [*self._columns, *META_COLUMNS])
        marks = ", ".join("?" for _ in range(len(self._columns) + len(META_COLUMNS)))
        self._insert = f"INSERT INTO runs ({names}) VALUES ({marks}) ON CONFLICT DO NOTHING"

    def _check_path(self) -> None:
        fix = "pass a file path such as runs.db"
        text = str(self.path)
        if text in ("", "-") or "\0" in text:
            raise ConfigError(self.field, f"'{text}' is not a database file path", fix)
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        except OSError as exc:
            raise ConfigError(self.field, f"cannot open {text}: {exc.strerror or exc}", fix) from None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise ConfigError(self.field, f"{text} is a directory", "pass a database file path inside it")
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise ConfigError(self.field, f"{text} is not a regular file (a DuckDB database is one)", fix)
        if st is None:
            parent = Path(os.path.realpath(self.path.expanduser())).parent
            if not parent.is_dir():
                raise ConfigError(self.field, f"cannot create {text}: directory {parent} does not exist",
                                  "create the directory first or choose another path")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise ConfigError(self.field, f"cannot create {text}: directory {parent} is not writable",
                                  "choose a writable path")
        elif not os.access(self.path, os.R_OK | os.W_OK):
            raise ConfigError(self.field, f"cannot open {text}: permission denied", "choose a writable file")
        elif st.st_size == 0:  # `touch runs.db`: nothing in it to keep, DuckDB would refuse it
            self.path.unlink()

    def _open_error(self, exc: BaseException) -> ConfigError:
        text = _first_line(exc)
        if "not a valid DuckDB database" in text:
            return ConfigError(self.field, f"{self.path} is not a DuckDB database",
                               "pass a new file name, or a database that trainsim sweep or search wrote")
        if "lock" in text.lower():
            return ConfigError(self.field, f"{self.path} is in use by another process ({text})",
                               "wait for that run to finish, or pass another database file")
        return ConfigError(self.field, f"cannot open {self.path} as a DuckDB database ({text})",
                           "pass a new file name, or a database that trainsim sweep or search wrote")

    def _ensure_table(self) -> None:
        want = {**columns(), **META_COLUMNS}
        try:
            have = self._con.execute(
                "SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = 'main' "
                "AND table_name = 'runs' ORDER BY ordinal_position").fetchall()
            if not have:
                cols = ", ".join(f"{_q(c)} {t}" + (" PRIMARY KEY" if c == "key" else "") for c, t in want.items())
                self._con.execute(f"CREATE TABLE runs ({cols})")
                return
        except self._duckdb.Error as exc:
            raise ConfigError(self.field, f"cannot use {self.path} ({_first_line(exc)})",
                              "pass a new database file") from None
        have_map = {str(c): str(t) for c, t in have}
        if have_map != want:
            missing = [c for c in want if c not in have_map]
            extra = [c for c in have_map if c not in want]
            typed = [c for c in want if c in have_map and have_map[c] != want[c]]
            what = "; ".join(part for part in (
                f"missing {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}" if missing else "",
                f"unknown {', '.join(extra[:4])}{' ...' if len(extra) > 4 else ''}" if extra else "",
                f"other types for {', '.join(typed[:4])}" if typed else "") if part)
            raise ConfigError(self.field, f"{self.path} has a runs table with other columns ({what})",
                              "pass a new database file (this one was written by another trainsim version or "
                              "program), or drop its runs table")

    def rows(self, keys: Iterable[str], *, meta: bool = False) -> dict[str, dict[str, Any]]:
        """The stored rows of these job keys (those not stored are absent): key -> row with the columns
        of `evaluate.columns()`, and `study` and `created_at` too when `meta`."""
        wanted = sorted(set(keys))
        if not wanted:
            return {}
        cols = [*self._columns, *META_COLUMNS] if meta else self._columns
        names = ", ".join(_q(c) for c in cols)
        cur = self._con.execute(f"SELECT {names} FROM runs WHERE key IN (SELECT unnest(?::VARCHAR[]))", [wanted])
        return {r[cols.index("key")]: dict(zip(cols, r, strict=True)) for r in cur.fetchall()}

    def add(self, rows: Iterable[dict[str, Any]], study: str = "") -> None:
        """Insert rows (evaluate's) and commit; a row whose key is stored already is skipped. `study`
        names what wrote them (a row's own `study` wins)."""
        now = datetime.now(UTC).replace(tzinfo=None)
        values = [[row.get(c) for c in self._columns] + [row.get("study") or study, now] for row in rows]
        if not values:
            return
        try:
            self._con.executemany(self._insert, values)
        except self._duckdb.Error as exc:
            raise ConfigError(self.field, f"cannot write to {self.path} ({_first_line(exc)})",
                              "free some space, or pass another database file") from None

    def count(self) -> int:
        """How many rows are stored."""
        return int(self._con.execute("SELECT count(*) FROM runs").fetchone()[0])

    def close(self) -> None:
        """Close the database (its write-ahead log is folded into the file)."""
        self._con.close()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
