"""dreamshard: place the embedding tables of recommender models on GPUs (see README.md)."""

from __future__ import annotations


def _version() -> str:
    """The installed distribution's version, else (a source tree run with PYTHONPATH=., as on the
    GPU machines) the one in the pyproject.toml beside the package."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("dreamshard")
    except PackageNotFoundError:
        import re
        from pathlib import Path

        try:
            text = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
        except OSError:
            return "unknown"
        found = re.search(r'^version\s*=\s*"([^"]+)"', text, re.MULTILINE)
        return found.group(1) if found else "unknown"


def __getattr__(name: str):
    # computed on first use: reading package metadata costs ~60 ms, which every command would pay
    if name == "__version__":
        globals()["__version__"] = value = _version()
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
