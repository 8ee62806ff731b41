"""Writing files: the project's one atomic-write helper and the check of an output path.

`atomic_write` writes to `NAME.tmp<pid>` beside the target and renames it over the target, so a
reader never sees half a file. A failure (an exception, Ctrl-C) removes the temporary file; one
left by a process that was killed outright (SIGKILL, power loss) is removed by the next write to
the same target, once its process is gone.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import BinaryIO, Callable

# load_torch_file: nets.py and training.py import it from here, beside atomic_write
from dreamshard.validation import OptionError, load_torch_file, one_line  # noqa: F401


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


def remove_stale_temps(path: str | Path) -> list[Path]:
    """Remove `NAME.tmp<pid>` files beside `path` whose writer is no longer running."""
    path = Path(path)
    pattern = re.compile(re.escape(path.name) + r"\.tmp(\d+)")
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


def atomic_write(path: str | Path, data: str | bytes | Callable[[BinaryIO], None], make_parents: bool = True) -> None:
    """Write `data` (text, bytes, or a function writing to a binary file) to `path` atomically."""
    path = Path(path)
    if make_parents:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OptionError(f"{path}: cannot create its folder ({one_line(e.strerror or e)})") from None
    remove_stale_temps(path)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except OSError as e:
        _unlink(tmp)
        raise OptionError(f"{path}: cannot write ({one_line(e.strerror or e)})") from None
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(p: Path) -> None:
    try:
        p.unlink()
    except OSError:
        pass


def check_out_path(path: str | Path, what: str = "--out", directory: bool = False) -> Path:
    """Raise OptionError unless `path` can be written (as a file, or as a folder to create files in):
    no regular file in the way of its folders, not an existing folder where a file is wanted, and
    the nearest existing folder writable. Checked before any work is done."""
    path = Path(path)
    if str(path).strip() == "":
        raise OptionError(f"{what}: empty path")
    if path.exists():
        if directory and not path.is_dir():
            raise OptionError(f"{what} {path}: is a file, not a folder")
        if not directory and path.is_dir():
            raise OptionError(f"{what} {path}: is a folder; give a file name")
    parent = path if directory else path.parent
    probe = parent.absolute()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise OptionError(f"{what} {path}: {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise OptionError(f"{what} {path}: folder {probe} is not writable")
    return path
