"""One way to read an input file and one way to write outputs, for every command.

Inputs: bounded in size (so `/dev/zero` is refused, not read until killed), UTF-8 checked, YAML loaded
safely with duplicate keys, recursive aliases and deep nesting refused, JSON and CSV likewise; every
failure is a one-line ConfigError naming the field. Outputs: every path is checked before any work is
done, then all are written or none (temporary files beside the targets, renamed at the end);
symlinks are followed, devices, pipes and `-` (stdout) are written in place.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math
import os
import secrets
import stat
import sys
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from .errors import ConfigError

MAX_TEXT_BYTES = 64 * 2**20  # YAML, JSON and CSV inputs: far above any real job, tree or measurement file
MAX_BINARY_BYTES = 2 * 2**30  # one Chakra ET file
MAX_TRACE_BYTES = 4 * 2**30  # one profiler (Kineto) trace, compressed or inflated: real per-rank traces reach ~1 GB
MAX_YAML_DEPTH = 64  # nesting levels of a YAML/JSON document (a strategy tree needs about 6)
MAX_YAML_NODES = 5_000_000  # YAML nodes once aliases are expanded (a GPT-3 strategy tree has ~40k)

Payload = str | bytes | Callable[[BinaryIO], None]
STDOUT_PATHS = frozenset({"-", "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"})


# ---------------------------------------------------------------------------------------------- inputs


def _size_text(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"


def read_bytes(path: str | Path, field: str, *, max_bytes: int = MAX_TEXT_BYTES, what: str = "file",
               fix: str = "pass an existing file") -> bytes:
    """The bytes of `path`, refusing directories, unreadable paths and anything over `max_bytes`."""
    p = Path(path)
    if str(path) == "":
        raise ConfigError(field, f"empty path for the {what}", fix)
    try:
        with open(p, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except IsADirectoryError:
        raise ConfigError(field, f"{p} is a directory, not a {what}", fix) from None
    except OSError as exc:
        raise ConfigError(field, f"cannot read {p}: {exc.strerror or exc}", fix) from None
    if len(data) > max_bytes:
        raise ConfigError(field, f"{p} is larger than the {_size_text(max_bytes)} limit for a {what}",
                          f"pass the {what} itself (is {p} the right path?)")
    return data


def decode_text(data: bytes, field: str, source: str, what: str = "file") -> str:
    """UTF-8 text (a leading BOM dropped); other encodings are one line naming the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(field, f"{source} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
                          f"save the {what} as UTF-8") from None


def gunzip_bounded(raw: bytes, field: str, *, max_bytes: int, what: str = "file",
                   fix: str = "re-write or re-compress the file") -> bytes:
    """Inflate gzip bytes, refusing corrupt or truncated data and output past `max_bytes` (a gzip bomb)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(raw, max_bytes + 1)
    except zlib.error:
        raise ConfigError(field, "corrupt gzip data", fix) from None
    if len(out) > max_bytes:
        raise ConfigError(field, f"inflates past the {_size_text(max_bytes)} limit for a {what}",
                          "split the input or check the file")
    if not d.eof:
        raise ConfigError(field, "truncated gzip data", fix)
    return out


def read_text(path: str | Path, field: str, *, what: str = "file", fix: str = "pass an existing file",
              max_bytes: int = MAX_TEXT_BYTES) -> str:
    """The UTF-8 text of `path` (bounded, decoded); see read_bytes."""
    return decode_text(read_bytes(path, field, max_bytes=max_bytes, what=what, fix=fix), field, str(path), what)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys, aliases of an enclosing node (cycles) and deep nesting."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._open_anchors: set[str] = set()

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: ANN401 - PyYAML's own signature
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            if event.anchor in self._open_anchors:
                raise _YamlRefused(f"alias *{event.anchor} refers to a node that contains it (a cycle)",
                                   event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise _YamlRefused(f"nested deeper than {MAX_YAML_DEPTH} levels", self.peek_event().start_mark)
        anchor = getattr(self.peek_event(), "anchor", None)
        if anchor:
            self._open_anchors.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if anchor:
                self._open_anchors.discard(anchor)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:  # noqa: ANN401
        if isinstance(node, yaml.MappingNode):
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    dup = key in seen
                except TypeError:  # an unhashable key: the base class reports it
                    break
                if dup:
                    raise _YamlRefused(f"key '{key}' appears twice in one mapping", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _YamlRefused(Exception):
    def __init__(self, problem: str, mark: Any) -> None:  # noqa: ANN401
        super().__init__(problem)
        self.problem = problem
        self.mark = mark


def _count_nodes(root: Any) -> int:
    """YAML nodes with aliases expanded (memoised per node, so an alias bomb is counted, not built)."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        children: list[Any] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [x for kv in node.value for x in kv]
        if done:
            sizes[id(node)] = min(1 + sum(sizes[id(c)] for c in children), MAX_YAML_NODES + 1)
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def parse_yaml(text: str, field: str, source: str) -> Any:  # noqa: ANN401 - any YAML document
    """Safely parse one YAML document (no object construction); one-line ConfigError on any problem."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _count_nodes(node) > MAX_YAML_NODES:
            raise ConfigError(field, f"{source} expands to more than {MAX_YAML_NODES:,} YAML nodes (aliases)",
                              "write the document out without nested aliases")
        return loader.construct_document(node)
    except _YamlRefused as exc:
        where = f" at line {exc.mark.line + 1}" if exc.mark is not None else ""
        raise ConfigError(field, f"{source}{where}: {exc.problem}", "fix the YAML") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(field, f"malformed YAML in {source}{where} ({problem})", "fix the YAML syntax") from None
    except RecursionError:
        raise ConfigError(field, f"{source} is nested too deeply", "flatten the document") from None
    finally:
        loader.dispose()


def load_yaml(path: str | Path, field: str, *, what: str = "YAML file",
              fix: str = "pass an existing YAML file") -> Any:  # noqa: ANN401
    """Read and safely parse a YAML file (see read_text and parse_yaml)."""
    return parse_yaml(read_text(path, field, what=what, fix=fix), field, str(path))


def parse_json(text: str, field: str, source: str) -> Any:  # noqa: ANN401 - any JSON document
    """Parse JSON; NaN/Infinity (not JSON) and deep nesting are refused with one line."""
    def no_constants(name: str) -> Any:  # noqa: ANN401
        raise ValueError(f"{name} is not JSON")

    try:
        data = json.loads(text, parse_constant=no_constants)
    except json.JSONDecodeError as exc:
        raise ConfigError(field, f"{source} is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
                          "fix the JSON") from None
    except ValueError as exc:
        raise ConfigError(field, f"{source}: {exc}", "write a finite number") from None
    except RecursionError:
        raise ConfigError(field, f"{source} is nested too deeply", "flatten the document") from None
    if _json_depth(data) > MAX_YAML_DEPTH:
        raise ConfigError(field, f"{source} is nested deeper than {MAX_YAML_DEPTH} levels", "flatten the document")
    return data


def parse_json_bytes(data: bytes, field: str, source: str, what: str = "JSON file") -> Any:  # noqa: ANN401
    """Parse JSON bytes with orjson when it is installed (about 3x faster; strict: no NaN, UTF-8 checked,
    nesting capped at 1024 levels), else decode_text + parse_json; one-line ConfigError on any problem."""
    try:
        import orjson
    except ImportError:
        return parse_json(decode_text(data, field, source, what), field, source)
    if data[:3] == b"\xef\xbb\xbf":
        data = data[3:]
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        msg = str(exc.msg).splitlines()[0] if exc.msg else "malformed"
        raise ConfigError(field, f"{source} is not JSON ({msg} at line {exc.lineno} column {exc.colno})",
                          "fix the JSON") from None


def _json_depth(data: Any) -> int:  # noqa: ANN401
    depth, level = 0, [data]
    while level:
        depth += 1
        nxt: list[Any] = []
        for x in level:
            if isinstance(x, dict):
                nxt.extend(x.values())
            elif isinstance(x, list):
                nxt.extend(x)
        level = nxt
        if depth > MAX_YAML_DEPTH:
            break
    return depth


def load_json(path: str | Path, field: str, *, what: str = "JSON file",
              fix: str = "pass an existing JSON file") -> Any:  # noqa: ANN401
    """Read and parse a JSON file (see read_text and parse_json)."""
    return parse_json(read_text(path, field, what=what, fix=fix), field, str(path))


def read_csv(path: str | Path, field: str, *, what: str = "CSV file",
             fix: str = "pass an existing CSV file") -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of a comma-separated file (every cell a string; a missing cell is '')."""
    text = read_text(path, field, what=what, fix=fix)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""), restval="")
        rows = [{k: v if isinstance(v, str) else "" for k, v in row.items() if k is not None} for row in reader]
        header = [h for h in (reader.fieldnames or []) if h is not None]
    except csv.Error as exc:
        raise ConfigError(field, f"{path} is not a readable CSV ({exc})", "pass a comma-separated file") from None
    return header, rows


# --------------------------------------------------------------------------------------------- outputs


@dataclass(frozen=True)
class OutputTarget:
    """A checked output: `field` names the flag, `path` is as given; `final` is where the bytes go."""

    field: str
    path: str
    final: Path | None  # None: standard output
    in_place: bool  # stdout, a device or a pipe: written directly, not through a temporary file

    @property
    def to_stdout(self) -> bool:
        return self.final is None


def check_output(path: str | Path, field: str) -> OutputTarget:
    """Check that `path` can be written (before any work is done); '-' is standard output."""
    text = str(path)
    fix = "choose a writable file path"
    if text == "":
        raise ConfigError(field, "empty path", "pass a file name such as out.json, or - for standard output")
    if "\0" in text:
        raise ConfigError(field, "the path contains a NUL byte", fix)
    if text in STDOUT_PATHS:  # written through sys.stdout, whatever fd 1 is (terminal, pipe, a file `>` made)
        return OutputTarget(field, text, None, True)
    p = Path(text).expanduser()
    try:
        st = os.stat(p)  # follows symlinks
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise ConfigError(field, f"cannot write {text}: {exc.strerror}", fix) from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise ConfigError(field, f"{text} is a directory", "pass a file path inside it")
        if not stat.S_ISREG(st.st_mode):  # a device, pipe or socket: write in place
            if not os.access(p, os.W_OK):
                raise ConfigError(field, f"cannot write {text}: permission denied", fix)
            return OutputTarget(field, text, p, True)
        if not os.access(p, os.W_OK):
            raise ConfigError(field, f"cannot write {text}: permission denied", fix)
    final = Path(os.path.realpath(p))  # a symlink's target is replaced, the link stays
    parent = final.parent
    if not parent.is_dir():
        raise ConfigError(field, f"cannot write {text}: directory {parent} does not exist",
                          "create the directory first or choose another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(field, f"cannot write {text}: directory {parent} is not writable", fix)
    return OutputTarget(field, text, final, False)


def check_output_dir(path: str | Path, field: str) -> Path:
    """A directory that outputs will be written into: an existing one, or one that can be created."""
    text = str(path)
    if text == "" or "\0" in text:
        raise ConfigError(field, "empty or invalid directory path", "pass a directory such as chakra/")
    p = Path(os.path.realpath(Path(text).expanduser()))
    probe = p
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(field, f"{probe} is not a directory", "pass a directory path")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(field, f"cannot write into {probe}", "choose a writable directory")
    return p


def check_file_prefix(prefix: str, field: str) -> str:
    """A file-name prefix that stays inside its output directory (no separators, no '..')."""
    if not prefix or prefix in (".", "..") or any(c in prefix for c in ("/", "\\", "\0")) or len(prefix) > 200:
        raise ConfigError(field, f"'{prefix}' is not a plain file-name prefix",
                          "use a name without slashes or '..', e.g. gpt3 (files go into --out)")
    return prefix


@dataclass
class Outputs:
    """The outputs of one command: checked when added, written all together or not at all."""

    targets: list[OutputTarget] = field(default_factory=list)

    def add(self, path: str | Path | None, field: str) -> OutputTarget | None:
        """Check one output path now (None: the output was not asked for)."""
        if path is None:
            return None
        target = check_output(path, field)
        for other in self.targets:
            same = (target.to_stdout and other.to_stdout) or (
                not target.in_place and not other.in_place and target.final == other.final)
            if same:
                raise ConfigError(field, f"{target.path} is also the {other.field} output", "give each output its own path")
        self.targets.append(target)
        return target

    @property
    def to_stdout(self) -> bool:
        """Whether an output goes to standard output (the summary then stays off it)."""
        return any(t.to_stdout for t in self.targets)

    def write(self, payloads: dict[OutputTarget, Payload] | Iterable[tuple[OutputTarget, Payload]]) -> None:
        """Write every payload or none: temporary files first (one payload at a time, so a generator of
        pairs keeps one in memory), then devices/stdout, then renames."""
        staged: list[tuple[Path, Path]] = []
        in_place: list[tuple[OutputTarget, Payload]] = []
        current: OutputTarget | None = None
        items = payloads.items() if isinstance(payloads, dict) else payloads
        try:
            for current, payload in items:
                if current.in_place:
                    in_place.append((current, payload))
                else:
                    assert current.final is not None
                    staged.append((_stage(current, payload), current.final))
            for current, payload in in_place:
                _write_in_place(current, payload)
            for tmp, final in staged:
                os.replace(tmp, final)
        except OSError as exc:
            name = current.field if current is not None else "output"
            where = current.path if current is not None else ""
            raise ConfigError(name, f"cannot write {where}: {exc.strerror or exc}",
                              "free some space or choose another path") from None
        finally:
            for tmp, _ in staged:
                tmp.unlink(missing_ok=True)


def _emit(fh: BinaryIO, payload: Payload) -> None:
    if isinstance(payload, str):
        fh.write(payload.encode("utf-8"))
    elif isinstance(payload, bytes):
        fh.write(payload)
    else:
        payload(fh)


def _stage(target: OutputTarget, payload: Payload) -> Path:
    """Write `payload` to a new temporary file beside the target (created with the umask's mode)."""
    assert target.final is not None
    tmp = target.final.with_name(f".{target.final.name}.{secrets.token_hex(4)}.part")
    existing_mode: int | None = None
    with contextlib.suppress(OSError):
        existing_mode = os.stat(target.final).st_mode & 0o777  # a replaced file keeps its permissions
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if existing_mode is not None else 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            _emit(fh, payload)
        if existing_mode is not None:
            os.chmod(tmp, existing_mode)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def _write_in_place(target: OutputTarget, payload: Payload) -> None:
    if target.final is None:
        sys.stdout.flush()
        _emit(sys.stdout.buffer, payload)
        sys.stdout.buffer.flush()
        return
    with open(target.final, "wb") as fh:
        _emit(fh, payload)


def write_outputs(payloads: dict[OutputTarget | None, Payload]) -> None:
    """Write the given outputs all or nothing (targets from check_output; None entries are skipped)."""
    Outputs().write({t: p for t, p in payloads.items() if t is not None})


def json_text(data: Any, field: str, indent: int | None = 2) -> str:  # noqa: ANN401
    """Strict JSON: a non-finite number (not JSON) is a ConfigError naming where it is."""
    bad = _non_finite(data, "")
    if bad is not None:
        raise ConfigError(field, f"the result has a non-finite value at {bad.lstrip('.') or 'top level'}",
                          "an input is out of range (check bandwidths and sizes)")
    return json.dumps(data, indent=indent, allow_nan=False) + "\n"


def _non_finite(x: Any, where: str) -> str | None:  # noqa: ANN401
    if isinstance(x, float) and not math.isfinite(x):
        return where
    if isinstance(x, dict):
        for k, v in x.items():
            bad = _non_finite(v, f"{where}.{k}")
            if bad is not None:
                return bad
    elif isinstance(x, list | tuple):
        for i, v in enumerate(x):
            bad = _non_finite(v, f"{where}[{i}]")
            if bad is not None:
                return bad
    return None
