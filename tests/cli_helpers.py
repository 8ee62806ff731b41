"""What the command-line tests share: running the CLI in-process and reading its one-line error."""

from __future__ import annotations

from click.testing import CliRunner

from dreamshard.cli import cli


def invoke(*args, **kwargs):
    """`dreamshard ARGS` in-process (arguments as strings), click's Result."""
    return CliRunner().invoke(cli, [str(a) for a in args], **kwargs)


def one_line_error(r, status: int = 2) -> str:
    """The one line a refused command prints (``error: ...``, no traceback), after checking its status."""
    assert r.exit_code == status, (r.exit_code, r.stderr, r.exception)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def small_pool(tmp_path_factory, tables: int, seed: int, name: str = "pool"):
    """A synthetic pool of `tables` tables (seed `seed`) written to a fresh folder (tables.csv, ...)."""
    from dreamshard.synth import PoolConfig, synth_pool, write_pool

    out = tmp_path_factory.mktemp(name)
    write_pool(synth_pool(PoolConfig(tables=tables, seed=seed)), out, PoolConfig(tables=tables, seed=seed))
    return out
