"""Writing files: the project's one atomic-write helper and the check of an output path.

`atomic_write` writes to `NAME.tmp<pid>` beside the target and renames it over the target, so a
reader never sees half a file, and of two processes writing one file at once the file ends as one
of them wrote it. `one_writer` does the same for a command's set of files in one folder. A failure (an exception, Ctrl-C) removes the temporary file; one
left by a process that was killed outright (SIGKILL, power loss) is removed by the next write to
the same target, once its process is gone.

Every write failure (the disk full, a folder not writable, torch's zip writer failing on the disk
under it) becomes one `OptionError` naming the file, and the old file stays as it was. A target
that is not a regular file (a FIFO, a device node, a socket, a folder), a name the filesystem
cannot hold, or a path ending in "/" is refused before anything is written: renaming over a FIFO
or `/dev/null` would replace it with a regular file.
"""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import hashlib
import os
import re
import stat
from pathlib import Path
from typing import BinaryIO, Callable

import click

# load_torch_file: nets.py and training.py import it from here, beside atomic_write
from dreamshard.validation import OptionError, load_torch_file, one_line  # noqa: F401

NAME_MAX = 255  # bytes in one path component on the filesystems we meet (ext4, xfs, btrfs, tmpfs, APFS)
_TMP_ROOM = len(".tmp") + 10  # the temporary file's suffix: ".tmp" and a pid


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # somebody else's live process
        return True
    return True


def _temp_stem(path: Path) -> str:
    """The temporary file's name before `.tmp<pid>`: the target's own name, or, where that would
    leave no room for the suffix within NAME_MAX, a hidden name derived from it."""
    if len(os.fsencode(path.name)) + _TMP_ROOM <= NAME_MAX:
        return path.name
    return "." + hashlib.sha1(os.fsencode(path.name)).hexdigest()[:20]


def remove_stale_temps(path: str | Path) -> list[Path]:
    """Remove `NAME.tmp<pid>` files beside `path` whose writer is no longer running."""
    path = Path(path)
    pattern = re.compile(re.escape(_temp_stem(path)) + r"\.tmp(\d+)")
    removed = []
    try:
        siblings = list(path.parent.iterdir())
    except OSError:
        return removed
    for p in siblings:
        m = pattern.fullmatch(p.name)
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            try:
                p.unlink()
                removed.append(p)
            except OSError:
                pass
    return removed


def target_problem(path: str | Path) -> str | None:
    """Why `path` cannot be written as a file by replacing it (None if it can): a path ending in
    "/", a component longer than the filesystem holds, or an existing entry that is not a regular
    file (a folder, a FIFO, a device node, a socket: renaming over it would destroy it)."""
    text = os.fspath(path)
    if text.endswith(("/", os.sep)):
        return "ends in '/'; give a file name"
    for part in Path(text).parts:
        size = len(os.fsencode(part))
        if size > NAME_MAX:
            return f"a name of {size} bytes, over the limit of {NAME_MAX} bytes a name may have"
    try:
        mode = os.stat(text).st_mode
    except OSError:  # no such file, or a folder in the way is a file: the writer says which
        return None
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "is a folder; give a file name"
    kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device node" if (stat.S_ISCHR(mode) or stat.S_ISBLK(mode)) else \
        "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
    return f"is {kind}, not a regular file; give the path of a file to write"


class _Recorder:
    """The binary file a writer function is given: it passes every call on and remembers the first
    OSError of a write, which a library may turn into an error of its own (torch's zip writer
    raises a RuntimeError whose cause is the full disk)."""

    def __init__(self, f: BinaryIO):
        self._f, self.error = f, None

    def write(self, b):
        try:
            return self._f.write(b)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self):
        try:
            return self._f.flush()
        except OSError as e:
            self.error = self.error or e
            raise

    def __getattr__(self, name):
        return getattr(self._f, name)


def atomic_write(path: str | Path, data: str | bytes | Callable[[BinaryIO], None], make_parents: bool = True) -> None:
    """Write `data` (text, bytes, or a function writing to a binary file) to `path` atomically.
    OptionError (one line naming `path`) if the path cannot be written or any write fails; the
    old file, if any, is then as it was."""
    problem = target_problem(path)
    if problem:
        raise OptionError(f"{os.fspath(path)}: {problem}")
    # a symlink stays one: the file it points to is replaced, not the link by a file of its own
    path = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    if make_parents:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OptionError(f"{path}: cannot create its folder ({one_line(e.strerror or e)})") from None
    remove_stale_temps(path)
    tmp = path.with_name(f"{_temp_stem(path)}.tmp{os.getpid()}")
    recorder = None
    try:
        with open(tmp, "wb") as f:
            if callable(data):
                recorder = _Recorder(f)
                data(recorder)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except OSError as e:
        _unlink(tmp)
        raise OptionError(f"{path}: cannot write ({one_line(e.strerror or e)})") from None
    except BaseException:
        _unlink(tmp)
        if recorder is not None and recorder.error is not None:  # a library's own error over a failed write
            raise OptionError(f"{path}: cannot write ({one_line(recorder.error.strerror or recorder.error)})") from None
        raise


@contextlib.contextmanager
def one_writer(folder: str | Path):
    """Hold `folder` (created if need be) for one command's set of files: two commands writing the
    same folder at once (`data tasks --out D` twice) each write all their files while holding it,
    so that the folder ends with one command's whole set, never train.jsonl of one run beside
    test.jsonl of the other. Each file is still written by `atomic_write`. An advisory lock
    (flock) on the folder; where the filesystem has none, the files are written without it."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OptionError(f"{folder}: cannot create this folder ({one_line(e.strerror or e)})") from None
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # a folder that cannot be opened for reading: the writes say what is wrong
        fd = None
    if fd is None:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # no locks here (some network filesystems): each file is still whole
            pass
        yield
    finally:
        os.close(fd)  # releases the lock


def write_text(path: str | Path, text: str) -> None:
    """`atomic_write` of `text`, gzipped where the name ends in .gz (files of JSON lines: plans and
    calibration records compress 4–8 times)."""
    atomic_write(path, gzip.compress(text.encode(), mtime=0) if Path(path).suffix == ".gz" else text)


def read_text(path: str | Path, errors: str = "strict") -> str:
    """A file's text, gunzipped first where its name ends in .gz; OSError or EOFError (gzip's
    BadGzipFile is an OSError) and UnicodeDecodeError for the caller to say in one line."""
    path = Path(path)
    return gzip.decompress(path.read_bytes()).decode(errors=errors) if path.suffix == ".gz" else path.read_text(errors=errors)


def append_line(path: str | Path, line: str) -> None:
    """Append one line to a log (a training run's JSONL log grows by a line an iteration; rewriting
    it whole each time would cost its size squared). A failed write is the atomic writer's one
    line; the lines before it stay."""
    try:
        with open(path, "a") as f:
            f.write(line if line.endswith("\n") else line + "\n")
    except OSError as e:
        raise OptionError(f"{path}: cannot write ({one_line(e.strerror or e)})") from None


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except OSError:
        pass


def check_out_path(path: str | Path, what: str = "--out", directory: bool = False) -> Path:
    """Raise OptionError unless `path` can be written (as a file, or as a folder to create files in):
    a name the filesystem can hold, no regular file in the way of its folders, not an existing
    folder, FIFO or device where a file is wanted (nor a path ending in "/"), and the nearest
    existing folder writable. Checked before any work is done."""
    if str(path).strip() == "":
        raise OptionError(f"{what}: empty path")
    if not directory:
        problem = target_problem(path)
        if problem:
            raise OptionError(f"{what} {os.fspath(path)}: {problem}")
    else:
        long = [p for p in Path(path).parts if len(os.fsencode(p)) > NAME_MAX]
        if long:
            raise OptionError(f"{what} {os.fspath(path)}: a name of {len(os.fsencode(long[0]))} bytes, over the limit of {NAME_MAX} bytes a name may have")
    path = Path(path)
    if path.exists() and directory and not path.is_dir():
        raise OptionError(f"{what} {path}: is a file, not a folder")
    parent = path if directory else path.parent
    probe = parent.absolute()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise OptionError(f"{what} {path}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OptionError(f"{what} {path}: folder {probe} is not writable")
    return path


class OutPath(click.ParamType):
    """A path to write (a file, or a folder with `directory`), checked before any work is done;
    the CLI also refuses a file output that is one of the command's inputs (cli.refuse_outputs_onto_inputs).
    `beside`: suffixes of the files written next to it (`train --out MODEL.pt` also writes
    MODEL.pt.ckpt), checked as well and counted among the command's outputs."""

    def __init__(self, directory: bool = False, beside: tuple[str, ...] = ()) -> None:
        self.directory, self.beside = directory, tuple(beside)
        self.name = "DIR" if directory else "FILE"

    def companions(self, value: str) -> list[str]:
        return [os.fspath(value) + suffix for suffix in self.beside]

    def convert(self, value, param, ctx):
        try:
            checked = str(check_out_path(value, "path", self.directory))
            for other in self.companions(checked):
                problem = target_problem(other)
                if problem:
                    raise OptionError(f"path {checked}: {other}, written beside it, {problem if problem.startswith('is ') else 'has ' + problem}")
            return checked
        except OptionError as e:
            self.fail(str(e).removeprefix("path "), param, ctx)
