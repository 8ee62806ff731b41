"""The one validation layer: typed input errors, the limits on sizes, the field parsers and the safe torch-file reader.

Every boundary (table, task, plan, model, checkpoint and DLRM files, every CLI option) checks its
input with the parsers below and raises a subclass of `InputError` whose message names the file,
the place (line, key or option) and what to fix. The CLI catches these in one place
(`cli.Group.main`): `InputError` → one line on stderr, exit status 2; `MeasurementError` → one
line, exit status 1. Anything else is a bug and keeps its traceback.

The limits are here and nowhere else (README: "Limits"). They reject absurd sizes up front, with
the limit named, instead of letting a plan claiming a billion devices run for minutes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class InputError(ValueError):
    """Bad input from a user: the message names the file or option, the place, and what to fix."""


class TableError(InputError):
    """A table file or table spec is invalid."""


class TaskError(InputError):
    """A task file (JSON lines) is invalid."""


class PlanError(InputError):
    """A plan file is invalid (a tampered plan is checked as strictly as a table file)."""


class ModelError(InputError):
    """A model file or a training checkpoint cannot be used."""


class DataError(InputError):
    """A data file (DLRM dataset, calibration, comm model, records) is invalid."""


class NoPlanError(InputError):
    """A planner has no plan for this one task (memory too tight for it, or a sharding our plans
    cannot express); the task file and the options are fine, so planning a file of tasks goes on
    to the next task."""


class OptionError(InputError):
    """A command-line option (or a combination of them) is invalid, or an output path is unusable."""


class MeasurementError(RuntimeError):
    """A measurement failed (a worker raised, died or hung): the message names the failing worker."""


# --------------------------------------------------------------------------------------------
# Limits: the one place. Documented in README ("Limits").
# --------------------------------------------------------------------------------------------

MAX_DEVICES = 1024  # devices of a task or plan
MAX_TABLES = 100_000  # tables in a table file, a task or a plan
MAX_ROWS = 10**12  # rows of one table
MIN_DIM, MAX_DIM, DIM_MULTIPLE = 4, 1024, 4  # embedding dim: a multiple of 4 in [4, 1024] (the kernels')
MAX_POOLING_FACTOR = 10_000.0  # mean lookups per sample of one table
MIN_POOLING_FACTOR = 1e-9  # ... when not 0: rarer than once in 10^9 samples underflows the reuse bins
MAX_MEMORY_BYTES = 10**15  # per-device memory cap (1 PB)
MAX_BATCH_SIZE = 2**22  # global batch size B of a measurement or of training
MAX_SEED = 2**63 - 1  # seeds: 0 .. 2^63 - 1
MAX_ZIPF_ALPHA = 100.0  # zipf:<alpha> streams
MAX_TASKS = 100_000  # tasks in a task file or drawn by `data tasks`
MAX_ITERS = 100_000  # timed iterations / warm-ups of a measurement, training iterations
MAX_BUDGET = 10_000_000  # real measurements of a training run
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # seconds before a distributed measurement is killed
MAX_CHUNK_BYTES = 2**32  # bytes one rank sends another in `calibrate comm --sizes`


# --------------------------------------------------------------------------------------------
# Field parsers. `where` names the file and place ("tables.csv: line 3"), `key` the column,
# JSON key or option; CSV cells arrive as strings, JSON values as themselves.
# --------------------------------------------------------------------------------------------


def one_line(text: Any) -> str:
    """A message (an exception's, say) folded onto one line."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        self.key = key


def _unique_pairs(pairs: list) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):  # the fast check: only a file with a duplicate pays for finding it
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return d


def loads_unique(text: str, where: str, error: type[InputError], lines: bool = True) -> Any:
    """json.loads, refusing an object that names a key twice (json keeps the last one silently,
    so a hand-edited file would mean something other than it says): `error` naming `where`, the
    line of the second key (with `lines`: a document over several lines) and the key. Invalid
    JSON raises json's own errors, as json.loads does."""
    try:
        return json.loads(text, object_pairs_hook=_unique_pairs)
    except _DuplicateKey as e:
        line = _duplicate_line(text) if lines and len(text) <= LINE_SEARCH_CHARS else None
        raise error(f"{where}: {f'line {line}: ' if line else ''}key {_show(e.key)} is given twice in one object") from None


def load_json_document(text: str, where: str, error: type[InputError]) -> Any:
    """`loads_unique` of a file holding one JSON document: invalid or too deeply nested JSON is
    `error` naming `where` (and the line), in one line."""
    try:
        return loads_unique(text, where, error)
    except json.JSONDecodeError as e:
        raise error(f"{where}: line {e.lineno}: invalid JSON ({e.msg})") from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply") from None


# The line of a duplicate key is found by parsing again in pure Python, about 3 s per 10 MB on a
# slow CPU: a larger file is refused without it rather than kept waiting.
LINE_SEARCH_CHARS = 4_000_000


def _duplicate_line(text: str) -> int | None:
    """The line of the first object member that repeats a key of its object: the document parsed
    again by json's pure-Python scanner, whose object parser sees each value's offset. Slow, so
    only once a duplicate is known."""
    import json.decoder
    import json.scanner

    found: list[int] = []

    def parse_object(s_and_end, strict, scan_once, object_hook, object_pairs_hook, memo=None):
        starts: list[int] = []

        def scan(s, idx):  # called for each of this object's values, at its offset
            starts.append(idx)
            return scan_once(s, idx)

        pairs, end = json.decoder.JSONObject(s_and_end, strict, scan, None, list, memo)
        seen = set()
        for (k, _), at in zip(pairs, starts):
            if k in seen and not found:
                found.append(s_and_end[0].count("\n", 0, at) + 1)
            seen.add(k)
        return dict(pairs), end

    decoder = json.JSONDecoder()
    decoder.parse_object = parse_object
    decoder.scan_once = json.scanner.py_make_scanner(decoder)
    try:
        decoder.decode(text)
    except (ValueError, RecursionError):
        return None
    return found[0] if found else None


def _number(value: Any, where: str, key: str, error: type[InputError], text: bool = True) -> int | float:
    """An int (exact, however large: it is compared with the limits) or a float; CSV strings parsed.
    With `text` False (a JSON value: task, plan and JSON table files) a string is refused: JSON
    has numbers, and "1" where 1 belongs is a file edited by hand or written by something else."""
    if isinstance(value, str) and not text:
        raise error(f"{where}, {key}: {_show(value)} is a string, not a number")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise error(f"{where}, {key}: {_show(value)} is not a number")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)  # exact: '9223372036854775807' is not rounded through a float
        except ValueError:
            pass
    try:
        return float(value)
    except (ValueError, OverflowError):
        raise error(f"{where}, {key}: {_show(value)} is not a number") from None


def parse_int(value: Any, where: str, key: str, minimum: int, maximum: int | None = None, error: type[InputError] = InputError, text: bool = True) -> int:
    """An integer in [minimum, maximum]: '12' (with `text`: a CSV cell), 12 or 12.0; not 2.7, true,
    'nan', or 1e30 past the limit."""
    number = _number(value, where, key, error, text)
    if isinstance(number, float):
        if not math.isfinite(number) or number != int(number):
            raise error(f"{where}, {key}: {_show(value)} is not an integer")
        number = int(number)
    if number < minimum:
        raise error(f"{where}, {key}: {_show(value)} must be >= {minimum}")
    if maximum is not None and number > maximum:
        raise error(f"{where}, {key}: {_show(value)} is over the limit of {maximum:,}")
    return number


def parse_float(value: Any, where: str, key: str, minimum: float = 0.0, maximum: float | None = None, error: type[InputError] = InputError,
                text: bool = True) -> float:
    """A finite number in [minimum, maximum] (a string only with `text`: a CSV cell)."""
    number = _number(value, where, key, error, text)
    try:
        number = float(number)
    except OverflowError:  # an int too large for a float
        raise error(f"{where}, {key}: {_show(value)} is not finite") from None
    if not math.isfinite(number):
        raise error(f"{where}, {key}: {_show(value)} is not finite")
    if number < minimum:
        raise error(f"{where}, {key}: {_show(value)} must be >= {minimum:g}")
    if maximum is not None and number > maximum:
        raise error(f"{where}, {key}: {_show(value)} is over the limit of {maximum:g}")
    return number


def parse_choice(value: Any, where: str, key: str, choices: Iterable[str], error: type[InputError] = InputError) -> str:
    choices = list(choices)
    if not isinstance(value, str) or value not in choices:
        raise error(f"{where}, {key}: {_show(value)} is not one of {', '.join(choices)}")
    return value


def parse_str(value: Any, where: str, key: str, error: type[InputError] = InputError) -> str:
    """A non-empty string (names, paths)."""
    if not isinstance(value, str) or not value.strip():
        raise error(f"{where}, {key}: {_show(value)} must be a non-empty string")
    return value


def require_dict(value: Any, where: str, what: str, error: type[InputError] = InputError) -> dict:
    if not isinstance(value, dict):
        raise error(f"{where}: expected {what} (a JSON object), got {_json_kind(value)}")
    return value


def require_list(value: Any, where: str, key: str, error: type[InputError] = InputError, maximum: int | None = None, nonempty: bool = True) -> list:
    if not isinstance(value, list):
        raise error(f"{where}, {key}: expected a list, got {_json_kind(value)}")
    if nonempty and not value:
        raise error(f"{where}, {key}: the list is empty")
    if maximum is not None and len(value) > maximum:
        raise error(f"{where}, {key}: {len(value):,} entries, over the limit of {maximum:,}")
    return value


def require_keys(d: dict, keys: Iterable[str], where: str, error: type[InputError] = InputError) -> None:
    for key in keys:
        if key not in d:
            raise error(f"{where}: missing key {key!r}")


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    return {dict: "an object", list: "a list", str: "a string", int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    """A value as the user wrote it (JSON spelling for true/false/null), cut to 40 characters."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --------------------------------------------------------------------------------------------
# Torch files (models, checkpoints, DLRM datasets)
# --------------------------------------------------------------------------------------------


def load_torch_file(path: str | Path, what: str, error: type[InputError] = InputError):
    """`torch.load(..., weights_only=True)` of a file (gunzipped first if its name ends in .gz):
    `error` with one line naming the file if it is not a readable torch file. Nothing in it runs."""
    import gzip
    import io
    import pickle
    import warnings

    import torch

    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: no such {what} file")
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        with warnings.catch_warnings():  # torch warns about a raw pickle's protocol before refusing it: our one line says it all
            warnings.simplefilter("ignore")
            return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch's own text suggests weights_only=False, which would run the file's code
        raise error(f"{path}: cannot read this {what} file (not a torch file of tensors and plain data; a raw pickle, "
                    f"or one holding other objects, is never loaded: nothing in it runs)") from None
    except Exception as e:  # noqa: BLE001 - any unreadable or unpicklable file is one user-facing error, never our bug
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise error(f"{path}: cannot read this {what} file ({type(e).__name__}: {first[:200]})") from None


# --------------------------------------------------------------------------------------------
# DLRM dataset files (streams.load_dlrm_file reads them; this is what they must hold)
# --------------------------------------------------------------------------------------------


def check_dlrm_file(path):
    """(indices, offsets, lengths) as int64 tensors, or DataError unless `path` (.pt or .pt.gz)
    holds them as the DLRM dataset stores them: integer tensors (float indices are refused, not
    truncated), indices >= 0 and below MAX_ROWS, offsets running from 0 to len(indices) without
    going back, and lengths [tables, batch] equal to the offsets' differences."""
    import torch

    data = load_torch_file(path, "DLRM dataset", DataError)
    if not (isinstance(data, (tuple, list)) and len(data) == 3 and all(isinstance(x, torch.Tensor) for x in data)):
        raise DataError(f"{path}: expected a tuple of three tensors (indices, offsets, lengths)")
    indices, offsets, lengths = data
    for label, x, dims in (("indices", indices, 1), ("offsets", offsets, 1), ("lengths", lengths, 2)):
        if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
            raise DataError(f"{path}: {label} are {str(x.dtype).removeprefix('torch.')}, not integers (refusing to truncate them)")
        if x.dim() != dims:
            raise DataError(f"{path}: {label} must have {dims} dimension{'s' if dims > 1 else ''}, got shape {tuple(x.shape)}")
    T, B = lengths.shape
    if not (1 <= T <= MAX_TABLES and B >= 1):
        raise DataError(f"{path}: lengths has shape {(T, B)}; need 1..{MAX_TABLES:,} tables and a batch of at least 1")
    if indices.numel():
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0:
            raise DataError(f"{path}: index {lo} at position {int(torch.argmin(indices))} is negative; indices must be >= 0")
        if hi >= MAX_ROWS:
            raise DataError(f"{path}: index {hi} is over the limit of {MAX_ROWS:,} rows")
    if offsets.numel() != T * B + 1 or int(offsets[0]) != 0 or int(offsets[-1]) != indices.numel():
        raise DataError(f"{path}: offsets ({offsets.numel()} from {int(offsets[0])} to {int(offsets[-1])}) must run from 0 to "
                        f"{indices.numel()} (the indices) in {T} tables × {B} samples + 1 entries")
    steps = offsets[1:] - offsets[:-1]
    if bool((steps < 0).any()):
        raise DataError(f"{path}: offsets go back at position {int(torch.nonzero(steps < 0)[0])}; they must not decrease")
    if not torch.equal(steps.reshape(T, B).to(torch.int64), lengths.to(torch.int64)):
        raise DataError(f"{path}: lengths differ from the offsets' differences")
    if float(lengths.double().mean(dim=1).max()) > MAX_POOLING_FACTOR:
        raise DataError(f"{path}: a table's mean bag length is over the limit of {MAX_POOLING_FACTOR:g} lookups per sample")
    return indices.to(torch.int64), offsets.to(torch.int64), lengths.to(torch.int64)
