"""TorchRec's warnings and logs kept off the user's terminal (a module of its own: the topology
and the TorchRec integration both build TorchRec objects, and neither imports the other)."""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager


@contextmanager
def quiet():
    """TorchRec warns about a directly built Topology and its heuristic reservation on every plan,
    and logs its stats and every method call (its "...-NullHandler" loggers): keep all of it off
    the user's terminal while it plans."""
    names = ["torchrec"] + [n for n in list(logging.root.manager.loggerDict) if n.endswith("-NullHandler")]
    loggers = [logging.getLogger(n) for n in names]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for log, level in zip(loggers, levels):
            log.setLevel(level)
