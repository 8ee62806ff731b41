"""The `dreamshard` command line.

Bad input (a typed `validation.InputError`, or a click usage error) → one line on stderr, exit
status 2; a failed measurement (`validation.MeasurementError`) → one line, exit status 1; `--help`
and `--version` → exit status 0. All of that is decided in one place, `Group.main`. Anything else
is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from dreamshard import validation as limits
from dreamshard.files import OutPath, atomic_write, check_out_path, one_writer
from dreamshard.validation import InputError, MeasurementError, NoPlanError, OptionError, one_line

# Piped or redirected output has no width of its own: rich would take 80 columns, which cuts the
# wider tables' numbers, and a forced wide width makes every line wrap in the reader's terminal.
# A terminal's own width, else $COLUMNS (rich reads it), else PIPED_WIDTH.
PIPED_WIDTH = 100


def make_console(stderr: bool = False) -> Console:
    c = Console(stderr=stderr)
    if not c.is_terminal and not os.environ.get("COLUMNS"):
        c.width = PIPED_WIDTH
    return c


console = make_console()
err_console = make_console(stderr=True)


def is_user_error(e: BaseException) -> bool:
    """Bad input: an InputError (packing.InfeasibleError among them: no placement within memory)."""
    return isinstance(e, InputError)


def fail(status: int, message: str) -> None:
    """The one way the CLI ends on an error: one line on stderr."""
    click.echo(f"error: {one_line(message)}", err=True)
    sys.exit(status)


class Group(click.Group):
    """The root group decides every exit: see the module docstring."""

    group_class = type  # nested groups are of this class too

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:  # a bare group: its help, as --help would
            click.echo(e.ctx.get_help())
            sys.exit(0)
        except click.UsageError as e:
            where = f"{e.ctx.command_path}: " if e.ctx is not None else ""
            hint = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
            fail(e.exit_code, f"{where}{e.format_message()}{hint}")
        except click.ClickException as e:
            fail(e.exit_code, e.format_message())
        except click.Abort:  # Ctrl-C
            fail(130, "interrupted")
        except MeasurementError as e:
            fail(1, str(e))
        except ValueError as e:  # InputError and InfeasibleError are ValueErrors; any other is a bug
            if not is_user_error(e):
                raise
            fail(2, str(e))
        sys.exit(rv if isinstance(rv, int) else 0)


class Memory(click.ParamType):
    """A per-device memory cap: 5GB, 5GiB, 512MB or bytes (packing.parse_memory)."""

    name = "MEMORY"

    def convert(self, value, param, ctx):
        from dreamshard.packing import parse_memory

        try:
            return parse_memory(value)
        except InputError as e:
            self.fail(str(e), param, ctx)


MEMORY = Memory()
OUT_FILE = OutPath()
OUT_DIR = OutPath(directory=True)
OUT_MODEL = OutPath(beside=(".ckpt",))  # a training run's checkpoint goes beside its model
DEVICES = click.IntRange(1, limits.MAX_DEVICES)
SEED = click.IntRange(0, limits.MAX_SEED)
BATCH = click.IntRange(1, limits.MAX_BATCH_SIZE)
ITERS = click.IntRange(1, limits.MAX_ITERS)
WARMUP = click.IntRange(0, limits.MAX_ITERS)
# The measurement protocol's defaults (3 warm-ups, 10 timed iterations, medians; workers killed
# after 300 s): `measure`'s and `calibrate`'s options, and what `train`, `compare` and
# `plan --backend` measure with.
DEFAULT_ITERS, DEFAULT_WARMUP, DEFAULT_TIMEOUT_S = 10, 3, 300.0


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that also refuses nan (which every comparison lets through)."""

    def convert(self, value, param, ctx):
        value = super().convert(value, param, ctx)
        if value != value:
            self.fail(f"{value} is not a number", param, ctx)
        return value


TIMEOUT = FiniteFloatRange(min=0, max=limits.MAX_TIMEOUT_S, min_open=True)


def progress_bar():
    """A bar on stderr with the time left, on a terminal; elsewhere a line for each stage that
    runs longer than a few seconds (`progress.Lines`: a quick command's stderr stays empty, or
    its one line on error)."""
    from dreamshard import progress

    return progress.bar(err_console)


def given(ctx: click.Context, name: str) -> bool:
    """Whether the user gave the option `name` (not its default)."""
    return ctx.get_parameter_source(name) not in (None, click.core.ParameterSource.DEFAULT)


def refuse_unused(ctx: click.Context, names: list[str], reason: str) -> None:
    """OptionError for any of `names` given where it would have no effect (silently ignored options are garbage in)."""
    for name in names:
        if given(ctx, name):
            raise OptionError(f"--{name.replace('_', '-')} has no effect {reason}")


def memory_option(f):
    return click.option("--max-memory", required=True, type=MEMORY, help="per-device memory cap: 5GB, 5GiB, 512MB or bytes")(f)


def topology_option(f):
    """`--topology`, `--hosts`, `--gpus-per-host`: the machine of a task (topology.py)."""
    f = click.option("--gpus-per-host", type=DEVICES, help="GPUs in each host, with --hosts (or with --devices: hosts = devices / this)")(f)
    f = click.option("--hosts", type=DEVICES, help="hosts of the machine: with --gpus-per-host or --devices (links: --topology's, else an H100 SXM host's), or the host count of --topology's preset")(f)
    f = click.option("--topology", "topology_text", metavar="PRESET[:HOSTS]|FILE",
                     help="the machine: a preset (h100-sxm, h200-sxm, a100-sxm; NAME:HOSTS for several hosts) or a topology JSON/YAML file (docs/topology.md)")(f)
    return f


def resolve_topology(topology_text: str | None, hosts: int | None, gpus_per_host: int | None, devices: int | None):
    """(Topology or None, devices) of `--topology` / `--hosts` / `--gpus-per-host` / `--devices`:
    none of the first three is one host of --devices (no topology); OptionError (one line) where
    they disagree."""
    from dataclasses import replace

    from dreamshard.topology import PRESETS, parse_topology

    if topology_text is None and hosts is None and gpus_per_host is None:
        return None, devices
    if topology_text is not None:
        topo = parse_topology(topology_text, hosts)
        if gpus_per_host is not None:
            topo = replace(topo, gpus_per_host=gpus_per_host)
    else:
        if hosts is None:
            if devices is None or devices % gpus_per_host:
                raise OptionError(f"--gpus-per-host {gpus_per_host}: give --hosts, or --devices a multiple of it")
            hosts = devices // gpus_per_host
        elif gpus_per_host is None:
            if devices is None or devices % hosts:
                raise OptionError(f"--hosts {hosts}: give --gpus-per-host, or --devices a multiple of it")
            gpus_per_host = devices // hosts
        base = PRESETS["h100-sxm"]  # the links of the GPU the shipped comm models were fitted on
        topo = replace(base, hosts=hosts, gpus_per_host=gpus_per_host, hbm_bytes=None, name="H100 SXM hosts (NVLink 4, 400 Gb/s per GPU)")
    topo = topo.validate("--topology", OptionError)
    if devices is not None and devices != topo.devices:
        raise OptionError(f"--devices {devices}, but the topology is {topo.hosts} hosts × {topo.gpus_per_host} GPUs = {topo.devices} devices")
    return topo, topo.devices


def tasks_on(tasks: list, topo, where: str) -> list:
    """Every task of a task file on `topo` (None: as the file says); OptionError where a task's
    device count is not the topology's."""
    from dataclasses import replace

    if topo is None:
        return tasks
    for i, t in enumerate(tasks, 1):
        if t.devices != topo.devices:
            raise OptionError(f"{where}: task {i} has {t.devices} devices, but the topology is {topo.hosts} hosts × {topo.gpus_per_host} GPUs = {topo.devices}")
    return [replace(t, topology=topo) for t in tasks]


def show_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """--version: `dreamshard.__version__`, which also answers in a source tree that was never
    installed (click's own option reads the installed package's metadata only)."""
    if value and not ctx.resilient_parsing:
        import dreamshard

        click.echo(f"dreamshard, version {dreamshard.__version__}")
        ctx.exit()


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=show_version, help="Show the version and exit.")
def cli() -> None:
    """Place embedding tables on GPUs so one training step's embedding work finishes fastest."""


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------


@cli.group(cls=Group)
def data() -> None:
    """Table pools, their statistics, and tasks."""


# the names of dreamshard.families.FAMILIES (tests/test_families.py keeps them in step), written
# out so that `--help` does not import NumPy
FAMILY_NAMES = ["dlrm", "dlrm2022", "wide", "hot", "heavy", "onehot", "mixed", "rmc", "din"]
HELD_OUT_NAMES = ["mixed", "rmc", "din"]  # dreamshard.families.HELD_OUT_FAMILIES, the same way


@data.command("synth")
@click.option("--out", required=True, type=OUT_DIR, help="directory for tables.csv and pool.json")
@click.option("--tables", "n_tables", type=click.IntRange(1, limits.MAX_TABLES), help="number of tables  [the family's: 856; 788 for dlrm2022]")
@click.option("--seed", default=0, show_default=True, type=SEED)
@click.option("--family", default="dlrm", show_default=True, type=click.Choice(FAMILY_NAMES), help=f"table family (docs/families.md); held out: {', '.join(HELD_OUT_NAMES)}")
@click.option("--dim", type=click.IntRange(limits.MIN_DIM, limits.MAX_DIM), help="give every table this dim (the DreamShard reference code's pools: 16)  [the family's dims]")
def data_synth(out: str, n_tables: int | None, seed: int, family: str, dim: int | None) -> None:
    """Write a synthetic table pool of a family (specs + regenerable index streams)."""
    from dreamshard.families import FAMILIES, synth_family
    from dreamshard.synth import PoolConfig, synth_pool, write_pool

    n = n_tables or FAMILIES[family].default_tables
    config = PoolConfig(tables=n, seed=seed)
    with progress_bar() as bar:
        job = bar.add_task(f"synthesizing {family} tables", total=n)
        if family == "dlrm":
            tables = synth_pool(config, progress=lambda k: bar.advance(job, k))
        else:
            tables = synth_family(family, n, seed)
            bar.advance(job, n)
    if dim is not None:
        if dim % limits.DIM_MULTIPLE:
            raise OptionError(f"--dim {dim} is not a multiple of {limits.DIM_MULTIPLE}")
        from dataclasses import replace

        tables = [replace(t, dim=dim) for t in tables]
    path = write_pool(tables, out, config, family=None if family == "dlrm" else family)
    console.print(f"wrote {len(tables)} {family} tables to {path}")


@data.command("stats")
@click.argument("pool", type=click.Path(exists=True, file_okay=False))
@click.option("--reference", default="2021", type=click.Choice(["2021", "2022"]), show_default=True, help="published file to compare with")
@click.option("--json", "as_json", is_flag=True, help="print the statistics as a JSON document instead of a table")
def data_stats(pool: str, reference: str, as_json: bool) -> None:
    """Aggregate statistics of a pool beside the published DLRM dataset's."""
    import numpy as np

    from dreamshard.synth import load_pool, pool_stats, published_stats
    from dreamshard.tables import BIN_LABELS

    ref = published_stats(reference)
    tables = load_pool(pool)
    if any((t.distribution or "").startswith("dlrm:") for t in tables):
        raise OptionError(f"{pool}: stats are computed from synthetic stream descriptors; this pool replays DLRM files")
    mine = pool_stats(tables, ref.batch_size)
    l1 = float(np.abs(np.array(mine.lookup_hist) - ref.lookup_hist).sum())
    l1_rows = float(np.abs(np.array(mine.row_hist) - ref.row_hist).sum())
    rel = mine.lookups_per_table_sample / ref.lookups_per_table_sample - 1
    if as_json:
        def stats(x) -> dict:
            return {"source": x.source, "tables": x.tables, "batch_size": x.batch_size, "lookups_per_batch": x.indices, "distinct_rows_per_batch": x.unique,
                    "lookups_per_table_sample": x.lookups_per_table_sample, "lookup_hist": list(x.lookup_hist), "row_hist": list(x.row_hist)}

        click.echo(json.dumps({"pool": str(pool), "reference": reference, "bins": list(BIN_LABELS), "this_pool": {**stats(mine), "zero_lookup_tables": sum(x.pooling_factor == 0 for x in tables)},
                               "published": stats(ref), "l1_lookup_hist": l1, "l1_row_hist": l1_rows, "lookups_per_table_sample_vs_published": rel}, indent=1))
        return
    t = Table(title=f"{pool} vs {ref.source} (batch {ref.batch_size})")
    t.add_column("statistic")
    t.add_column("this pool", justify="right")
    t.add_column(f"published {reference}", justify="right")
    t.add_row("tables", f"{mine.tables}", f"{ref.tables}")
    t.add_row("lookups per batch", f"{mine.indices:,.0f}", f"{ref.indices:,.0f}")
    t.add_row("lookups per table-sample", f"{mine.lookups_per_table_sample:.2f}", f"{ref.lookups_per_table_sample:.2f}")
    t.add_row("distinct rows per batch", f"{mine.unique:,.0f}", f"{ref.unique:,.0f}")
    t.add_row("zero-lookup tables", f"{sum(x.pooling_factor == 0 for x in tables)}", "")
    for i, label in enumerate(BIN_LABELS):
        t.add_row(f"lookups on rows used {label}", f"{mine.lookup_hist[i]:.3f}", f"{ref.lookup_hist[i]:.3f}")
    for i, label in enumerate(BIN_LABELS[:8]):
        t.add_row(f"distinct rows used {label}", f"{mine.row_hist[i]:.3f}", f"{ref.row_hist[i]:.3f}")
    console.print(t)
    console.print(f"L1 distance, lookup-weighted reuse histogram: {l1:.3f} (target ≤ 0.10)")
    console.print(f"L1 distance, distinct-row reuse histogram: {l1_rows:.3f}")
    console.print(f"mean lookups per table-sample: {rel:+.1%} vs published (target within ±10%)")
    console.print("[dim]Pool figures are expected values of its synthetic streams (analytic); the published ones are measured on the real files.[/dim]")


@data.command("tasks")
@click.option("--pool", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--tables", "count", required=True, help="tables per task: T or LO:HI")
@click.option("--devices", required=True, type=DEVICES)
@memory_option
@click.option("--num-train", default=50, show_default=True, type=click.IntRange(0, limits.MAX_TASKS))
@click.option("--num-test", default=50, show_default=True, type=click.IntRange(0, limits.MAX_TASKS))
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0, limits.MAX_SEED - 1))
@click.option("--precision", default="fp16", type=click.Choice(["fp16", "fp32"]), show_default=True)
@click.option("--optimizer", default="sgd", type=click.Choice(["sgd", "rowwise_adagrad"]), show_default=True)
@click.option("--out", required=True, type=OUT_DIR)
def data_tasks(pool, count, devices, max_memory, num_train, num_test, seed, precision, optimizer, out) -> None:
    """Split the pool 50/50 into train/test tables and draw random tasks from each half."""
    from dreamshard.synth import load_pool
    from dreamshard.tasks import Workload, parse_range, sample_tasks, save_tasks, split_pool

    cap, rng = max_memory, parse_range(count)
    tables = load_pool(pool)
    train, test = split_pool(tables, seed)
    pool_path = str(Path(pool).resolve())
    out_dir = Path(out)
    refused = {"train": [0], "test": [0]}
    drawn = [(name, half, sample_tasks(half, n, rng, devices, cap, s, pool_path, Workload(precision=precision, optimizer=optimizer), refused=refused[name]))
             for name, half, n, s in (("train", train, num_train, seed), ("test", test, num_test, seed + 1))]
    with one_writer(out_dir):  # train and test of one draw, also where another command writes the folder at once
        for name, half, tasks in drawn:  # nothing is written unless both halves could be drawn
            save_tasks(tasks, out_dir / f"{name}.jsonl")
    for name, half, tasks in drawn:
        again = f"; {refused[name][0]} draws did not fit memory and were drawn again (this favours small tables)" if refused[name][0] else ""
        console.print(f"wrote {len(tasks)} {name} tasks ({rng[0]}–{rng[1]} of {len(half)} {name} tables, {devices} devices) to {out_dir / f'{name}.jsonl'}{again}")


@data.command("dlrm")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=OUT_DIR, help="pool directory to write")
@click.option("--dim", default=64, show_default=True, type=click.IntRange(limits.MIN_DIM, limits.MAX_DIM), help="embedding dim (the files hold none)")
def data_dlrm(file, out, dim) -> None:
    """Turn a DLRM-dataset file ((indices, offsets, lengths), .pt or .pt.gz) into a pool."""
    from dreamshard.streams import tables_from_dlrm
    from dreamshard.tables import save_tables

    if dim % limits.DIM_MULTIPLE:
        raise OptionError(f"--dim {dim} is not a multiple of {limits.DIM_MULTIPLE}")
    tables = tables_from_dlrm(file, dim)
    save_tables(tables, Path(out) / "tables.csv")
    console.print(f"wrote {len(tables)} tables from {file} to {Path(out) / 'tables.csv'}")


# --------------------------------------------------------------------------------------------
# planning
# --------------------------------------------------------------------------------------------


@cli.command("planners")
@click.option("--json", "as_json", is_flag=True, help="print the registry as JSON (a list of name, kind, options with their defaults, requires, description)")
def planners_cmd(as_json: bool) -> None:
    """List the registered planners."""
    from dreamshard.planners import PLANNERS

    if as_json:
        entries = [{"name": name, "kind": cls.kind, "options": cls.options(), "requires": list(cls.requires), "description": cls.description}
                   for name, cls in sorted(PLANNERS.items())]
        click.echo(json.dumps({"planners": entries}, indent=1, default=str))
        return
    t = Table("name", "kind", "options", "description")
    t.columns[0].no_wrap = True  # a name is what the user types: never cut or broken
    t.columns[2].overflow = "fold"  # a long option name breaks across lines rather than losing its end
    for name, cls in sorted(PLANNERS.items()):
        t.add_row(name, cls.kind, ", ".join(f"{k}={v}" for k, v in cls.options().items()), cls.description)
    console.print(t)


# Above MAX_DEVICE_ROWS devices a per-device table shows the SHOWN_DEVICES slowest (a plan's cost
# is its slowest device's) and says how many it leaves out: 64 rows would fill three screens.
MAX_DEVICE_ROWS = 16
SHOWN_DEVICES = 8


def shown_devices(loads: list[float]) -> list[int]:
    """The devices a table shows, in order: all of them, or the SHOWN_DEVICES with the largest loads."""
    if len(loads) <= MAX_DEVICE_ROWS:
        return list(range(len(loads)))
    return sorted(sorted(range(len(loads)), key=lambda d: (-loads[d], d))[:SHOWN_DEVICES])


def device_caption(devices: int, shown: list[int], which: str, every: str | None) -> str | None:
    """The line under a table that leaves devices out: how many, which are shown, where to see all."""
    hidden = devices - len(shown)
    if not hidden:
        return None
    return f"{hidden} of {devices} devices not shown: these are the {len(shown)} {which}" + (f"; {every}" if every else "")


def compact_table(title: str | None = None, caption: str | None = None) -> Table:
    """A table whose columns are separated by spaces only: nine columns of numbers fit in 80."""
    from rich import box

    return Table(title=title, caption=caption, box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True, caption_justify="left")


def device_summary(plan, title: str, report=None, every: str | None = "--json lists every device") -> Table:
    """Per-device table of a plan: what is placed where, and its costs (ms) when a report is given;
    for many devices the slowest only (by the report, else by the planner's estimate, else by
    lookups × dim)."""
    from dreamshard.packing import format_bytes

    held = plan.device_tables()
    if report is not None:
        loads, which = [c.total_ms for c in report.devices], "slowest"
    elif plan.predicted:
        loads, which = [c["total_ms"] for c in plan.predicted["devices"]], "slowest by the planner's estimate"
    else:
        loads, which = [sum(x.lookup for x in shard) for shard in held], "with the most lookups × dim"
    shown = shown_devices(loads)
    t = compact_table(title, device_caption(len(held), shown, which, every))
    cols = ["device", "tables", "memory", "dims"]
    cols += ["fwd comp", "fwd comm", "bwd comm", "bwd comp", "total ms"] if report is not None else ["lookups·dim / sample"]
    for col in cols:
        t.add_column(col, justify="right", no_wrap=True)
    used = plan.device_bytes()
    worst = max(range(len(loads)), key=lambda d: loads[d]) if report is not None else -1
    for d in shown:
        shard = held[d]
        row = [str(d), str(len(shard)), format_bytes(used[d]), str(sum(x.dim for x in shard))]
        if report is not None:
            c = report.devices[d]
            total = f"[bold]{c.total_ms:.3f}[/bold]" if d == worst else f"{c.total_ms:.3f}"
            row += [f"{c.fwd_comp_ms:.3f}", f"{c.fwd_comm_ms:.3f}", f"{c.bwd_comm_ms:.3f}", f"{c.bwd_comp_ms:.3f}", total]
        else:
            row.append(f"{sum(x.lookup for x in shard):,.0f}")
        t.add_row(*row)
    return t


def model_defaults() -> str:
    """What `plan --model` defaults to per planner with a model, from the shipped files
    (`dreamshard.shipped`, the folder alone): "dreamshard, neuroshard: the shipped H200 model by
    default; autoshard, rnn: required"."""
    from dreamshard import shipped

    uses = {"dreamshard": "dreamshard", "neuroshard": "dreamshard", "autoshard": "autoshard", "rnn": "rnn"}  # planner → whose model it plans with
    groups: dict[str, list[str]] = {}
    for planner, model in uses.items():
        default = shipped.describe_default(model)
        groups.setdefault(f"{default} by default" if default else "required", []).append(planner)
    return "; ".join(f"{', '.join(names)}: {text}" for text, names in groups.items())


@cli.command("plan")
@click.argument("tables_file", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--tasks", "tasks_file", type=click.Path(exists=True, dir_okay=False), help="plan every task of a JSONL task file instead")
@click.option("--devices", type=DEVICES, help="number of devices (with TABLES_FILE)")
@click.option("--max-memory", type=MEMORY, help="per-device memory cap (with TABLES_FILE): 5GB, 5GiB, 512MB or bytes  [default with --topology: its GPUs' HBM]")
@click.option("--host-memory", type=MEMORY, help="per-device host memory for the tables that do not fit in HBM (with TABLES_FILE; docs/tiers.md): 512GB, ...")
@topology_option
@click.option("--precision", default="fp16", type=click.Choice(["fp16", "fp32"]), show_default=True)
@click.option("--optimizer", default="sgd", type=click.Choice(["sgd", "rowwise_adagrad"]), show_default=True)
@click.option("--planner", "planner_name", default="size_lookup", show_default=True, help="see `dreamshard planners`")
@click.option("--seed", default=0, show_default=True, type=SEED, help="for randomized planners")
@click.option("--model", "model_path", type=click.Path(exists=True, dir_okay=False), help=f"for the planners with a model ({model_defaults()}): a model from `dreamshard train --planner NAME`")
@click.option("--backend", "backend_name", type=click.Choice(["sim", "auto", "fbgemm", "triton", "torch"]),
              help="for the planners that search on a cost backend (oracle) and dreamshard's --verify: the simulator, or a kernel measured by the sequential runner")
@click.option("--verify", type=click.IntRange(1, 64), help="dreamshard: make this many variants of the plan (itself, its search with a penalty per table cut, the other start of its last stage, seeds in turn) and keep the one --backend measures fastest (a GPU: --backend triton)")
@click.option("--split/--no-split", default=None, help="let the planner cut tables into shards (heuristics: the tables whose proxy alone exceeds the per-device average; dreamshard: its search, on by default; neuroshard always splits) [planner's]")
@click.option("--budget", type=click.IntRange(1, limits.MAX_BUDGET),
              help="for the search planners: the work of each task's search (oracle: evaluations; neuroshard: beam-search steps; dreamshard: split moves of a descent) [planner's]")
@click.option("--budget-ms", type=click.FloatRange(1, 3.6e6), help="dreamshard: plan each task for this long, more rounds of the learned search while time is left [one round]")
@click.option("--row-layouts", type=click.Choice(["any", "torchrec"]),  # tasks.ROW_LAYOUTS (not imported here: the CLI starts light)
              help="the row splits a planner may make: any (rows over k devices, which our runners run) or torchrec (TorchRec's row_wise and "
                   "table_row_wise only: the plan exports to TorchRec)  [with TABLES_FILE: any; with --tasks: each task's]")
@click.option("--out", required=True, type=OUT_FILE, help="PLAN.json, or PLANS.jsonl with --tasks")
@click.option("--json", "as_json", is_flag=True, help="print a JSON document of what was planned (per plan: devices, splits, the planner's prediction, notes) instead of tables")
@click.option("--quiet", "-q", is_flag=True, help="print the one summary line only")
@click.pass_context
def plan_cmd(ctx, tables_file, tasks_file, devices, max_memory, topology_text, hosts, gpus_per_host, precision, optimizer, planner_name, seed, model_path, backend_name, verify,
             split, budget, budget_ms, row_layouts, out, as_json, quiet, host_memory=None) -> None:
    """Place the tables of TABLES_FILE (or of every task in --tasks) on devices."""
    import contextlib
    from dataclasses import replace

    from dreamshard.plan import save_plans
    from dreamshard.planners import PLANNERS, get_planner
    from dreamshard.tables import load_tables
    from dreamshard.tasks import Task, Workload, load_tasks

    if as_json and quiet:
        raise OptionError("--json and --quiet: give one (--json prints a document, --quiet one line)")
    if planner_name not in PLANNERS:
        raise OptionError(f"--planner: unknown planner {planner_name!r}; choose from {', '.join(sorted(PLANNERS))}")
    if (tables_file is None) == (tasks_file is None):
        raise OptionError("give either TABLES_FILE (with --devices and --max-memory) or --tasks FILE.jsonl")
    options = PLANNERS[planner_name].options()
    if model_path is not None and "model" not in options:
        raise OptionError(f"--model is for the planners with a model ({', '.join(n for n, c in sorted(PLANNERS.items()) if 'model' in c.options())}), not {planner_name!r}")
    if backend_name is not None and "backend" not in options:
        raise OptionError(f"--backend is for the planners that search on a cost backend ({', '.join(n for n, c in sorted(PLANNERS.items()) if 'backend' in c.options())}), not {planner_name!r}")
    if verify is not None and "verify" not in options:
        raise OptionError(f"--verify is for {', '.join(n for n, c in sorted(PLANNERS.items()) if 'verify' in c.options())}, not {planner_name!r}")
    if "verify" in options and (verify is None) != (backend_name is None):
        raise OptionError(f"{planner_name}: --verify K and --backend go together (the backend measures the K variants' plans)")
    if split and "split" not in options:
        raise OptionError(f"--split: planner {planner_name!r} does not split tables; these do: {', '.join(n for n, c in sorted(PLANNERS.items()) if 'split' in c.options())}")
    splits_on = split if split is not None else bool(options.get("split", False))
    bound = PLANNERS[planner_name].budget_option
    if (budget is not None or budget_ms is not None) and (bound is None or (PLANNERS[planner_name].budget_with_split_only and not splits_on)):
        searches = ", ".join(n for n, c in sorted(PLANNERS.items()) if c.budget_option)
        flag = "--budget" if budget is not None else "--budget-ms"
        raise OptionError(f"{flag} is for the search planners ({searches}); {planner_name}{' with --no-split' if bound else ''} does a fixed amount of work per task")
    if budget_ms is not None and "budget_ms" not in options:
        raise OptionError(f"--budget-ms is for the planners with a time budget ({', '.join(n for n, c in sorted(PLANNERS.items()) if 'budget_ms' in c.options())}), not {planner_name!r}")
    if tasks_file:
        if devices is not None or max_memory is not None or host_memory is not None:
            raise OptionError("--devices, --max-memory and --host-memory are for TABLES_FILE; a task file gives its own")
        refuse_unused(ctx, ["precision", "optimizer"], "with --tasks (each task gives its own)")
        tasks = tasks_on(load_tasks(tasks_file), resolve_topology(topology_text, hosts, gpus_per_host, None)[0], str(tasks_file))
    else:
        topo, devices = resolve_topology(topology_text, hosts, gpus_per_host, devices)
        if max_memory is None and topo is not None and topo.hbm_bytes:
            max_memory = topo.hbm_bytes
        if devices is None or max_memory is None:
            raise OptionError("TABLES_FILE needs --devices (or --topology, or --hosts with --gpus-per-host) and --max-memory")
        tables = load_tables(tables_file)
        pool = str(Path(tables_file).resolve().parent)
        tasks = [Task(tables, devices, max_memory, Workload(precision=precision, optimizer=optimizer), pool, topology=topo,
                      host_memory_bytes=host_memory or 0).validate(str(tables_file), OptionError)]
    if row_layouts is not None:
        tasks = [replace(t, row_layouts=row_layouts) for t in tasks]
    limit_threads(cpu_kernel=backend_name not in (None, "sim"))
    kwargs = {"seed": seed} if "seed" in options else {}
    if model_path is not None:
        kwargs["model"] = model_path
    if split is not None and "split" in options:
        kwargs["split"] = split
    if budget is not None:
        kwargs[bound[0]] = budget
    if budget_ms is not None:
        kwargs["budget_ms"] = budget_ms
    if backend_name is not None:
        kwargs["backend"] = _cost_backend(backend_name, "sequential", "auto")[0]
    if verify is not None:
        kwargs["verify"] = verify
    planner = get_planner(planner_name, **kwargs)
    if backend_name is not None and backend_name != "sim" and budget is None and bound is not None and bound[1] == "evaluations":
        refuse_long_search(planner_name, options[bound[0]], kwargs["backend"], tasks)
    plans, unplaced, planned = [], [], []
    # --json: stdout is the document's alone, whatever a library prints while planning
    with _stdout_to_stderr() if as_json else contextlib.nullcontext(), progress_bar() as bar:
        job = bar.add_task(f"planning with {planner_name}", total=len(tasks))
        if bound is not None:
            search = bar.add_task(f"  {planner_name}'s search ({bound[1]})", total=None)
            planner.progress = lambda done, total: bar.update(search, completed=done, total=total)
        for i, task in enumerate(tasks):
            try:
                plans.append(planner.plan(task))
                planned.append(i)
            except NoPlanError as e:
                if tasks_file is None:
                    raise
                unplaced.append((i, e))  # one task this planner cannot place: the others are still worth planning
            bar.advance(job)
    if not plans:
        i, e = unplaced[0]
        raise type(e)(f"no task of {tasks_file} was planned by {planner_name}; task {i + 1}: {e}")
    save_plans(plans, out)
    summary = plan_summary(plans, len(tasks), len(unplaced), planner_name, out, warned=not (as_json or quiet))
    if as_json:
        document = {"planner": planner_name, "out": str(out), "summary": summary,
                    "plans": [plan_record(p, i + 1) for p, i in zip(plans, planned)],
                    "unplaced": [{"task": i + 1, "error": one_line(e)} for i, e in unplaced]}
        click.echo(json.dumps(document, indent=1))
        return
    if quiet:
        click.echo(summary)
        return
    if len(plans) == 1:
        cols, rows = split_counts(plans[0])
        console.print(device_summary(plans[0], f"{planner_name}: {len(tasks[0].tables)} tables on {tasks[0].devices} devices"
                                     + (f", {cols} cut into column shards" if cols else "") + (f", {rows} split by rows" if rows else "")))
        if plans[0].predicted:
            console.print(predicted_table(plans[0].predicted))
    for note in {n for p in plans for n in p.notes}:
        console.print(f"[yellow]note:[/yellow] {note}")
    for i, e in unplaced:
        console.print(f"[yellow]warning:[/yellow] task {i + 1} (line {i + 1} of {tasks_file}) has no plan from {planner_name}: {e}")
    click.echo(summary)  # plain: a script's `tail -1` reads it as --quiet prints it


def split_counts(plan) -> tuple[int, int]:
    """(tables cut into column shards, tables split by rows)."""
    cut = plan.split_tables()
    rows = {plan.task.tables[s.table].name for s in plan.shards if s.is_row_shard}
    return len(set(cut) - rows), len(rows)


def plan_summary(plans: list, tasks: int, unplaced: int, planner_name: str, out, warned: bool = True) -> str:
    """The one line `plan` ends with (and all that --quiet prints): what was planned on how many
    devices, what was split, the step predicted and by what, and where the plans went (`warned`:
    a warning per unplaced task was printed above it)."""
    cols, rows = (sum(c) for c in zip(*(split_counts(p) for p in plans)))
    devices = sorted({p.devices for p in plans})
    on = f"{devices[0]}" if len(devices) == 1 else f"{devices[0]}–{devices[-1]}"
    if len(plans) == 1:
        what = f"{planner_name}: {len(plans[0].task.tables)} tables on {on} devices"
    else:
        what = f"{planner_name}: {len(plans)} plans on {on} devices"
    splits = ", ".join(x for x in (f"{cols} cut into column shards" if cols else "", f"{rows} split by rows" if rows else "") if x) or "none split"
    predicted = [p.predicted for p in plans if p.predicted]
    if predicted and len(predicted) == len(plans):
        mean = sum(d["overall_ms"] for d in predicted) / len(predicted)
        sources = sorted({d["source"] for d in predicted})
        step = f"{'predicted step' if len(plans) == 1 else 'mean predicted step'} {mean:.3f} ms, the planner's own estimate by the {' / '.join(sources)}"
    else:
        step = f"no predicted step ({planner_name} gives no estimate; `dreamshard measure {out} --backend sim` prices {'it' if len(plans) == 1 else 'them'})"
    missing = f" — {unplaced} of {tasks} tasks have none{' (warnings above)' if warned else ''}; each plan carries its task" if unplaced else ""
    return f"{what}, {splits}; {step}; wrote {len(plans)} plan{'s' if len(plans) > 1 else ''} to {out}{missing}"


def plan_record(plan, task: int) -> dict:
    """`plan --json`: one plan as a script reads it (the plan itself is in the --out file)."""
    cols, rows = split_counts(plan)
    used = plan.device_bytes()
    return {"task": task, "tables": len(plan.task.tables), "devices": plan.devices, "max_memory_bytes": plan.task.max_memory_bytes,
            "split_tables": plan.split_tables(), "column_split_tables": cols, "row_split_tables": rows,
            "per_device": [{"device": d, "tables": len(held), "memory_bytes": used[d], "dim_sum": sum(x.dim for x in held)}
                           for d, held in enumerate(plan.device_tables())],
            "predicted": plan.predicted, "notes": list(plan.notes),
            **({"host_memory_bytes": plan.task.host_memory_bytes, "device_host_bytes": plan.device_host_bytes(),
                "tiers": {k: sum(s.tier == k for s in plan.shards) for k in ("hbm", "uvm_caching", "uvm")}} if plan.has_tiers() else {}),
            **({"topology": plan.task.topology.to_json()} if plan.task.topology is not None else {})}


# A default budget expected to run longer than this on a measured backend is refused up front:
# past it a user who did not choose the budget is better told how to lower it than kept waiting.
MAX_DEFAULT_SEARCH_S = 600.0


def refuse_long_search(planner_name: str, default_budget: int, backend, tasks) -> None:
    """OptionError when `default_budget` evaluations per task on the measured `backend` would take
    longer than MAX_DEFAULT_SEARCH_S: an evaluation's cost is timed on the lookup plan of the
    largest task (the faster of two, the first paying the kernels' warm-up)."""
    import time

    from dreamshard.planners.heuristics import LookupGreedyPlanner

    task = max(tasks, key=lambda t: len(t.tables))
    try:
        probe = LookupGreedyPlanner().plan(task)
    except InputError:
        return  # no table-wise plan to time: the search itself will say what it can do
    seconds = []
    for _ in range(2):
        start = time.perf_counter()
        backend.evaluate_plan(probe)
        seconds.append(time.perf_counter() - start)
    each = min(seconds)
    expected = default_budget * each * len(tasks)
    if expected > MAX_DEFAULT_SEARCH_S:
        fits = max(1, int(MAX_DEFAULT_SEARCH_S / (each * len(tasks))))
        raise OptionError(f"planner {planner_name} on the {backend.name}: its default budget of {default_budget:,} evaluations per task would take about "
                          f"{format_duration(expected)} ({each * 1e3:,.1f} ms each, measured); give --budget N (--budget {fits:,} takes about "
                          f"{format_duration(fits * each * len(tasks))}) or --backend sim")


def format_duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def predicted_table(predicted: dict) -> Table:
    devices = predicted["devices"]
    shown = shown_devices([c["total_ms"] for c in devices])
    t = compact_table(f"the planner's own estimate, by the {predicted['source']}: overall {predicted['overall_ms']:.3f} ms",
                      device_caption(len(devices), shown, "slowest", "--json lists every device"))
    for col in ("device", "fwd comp", "bwd comp", "comm", "total (ms)"):
        t.add_column(col, justify="right", no_wrap=True)
    for d in shown:
        c = devices[d]
        t.add_row(str(d), f"{c['fwd_comp_ms']:.3f}", f"{c['bwd_comp_ms']:.3f}", f"{c['comm_ms']:.3f}", f"{c['total_ms']:.3f}")
    return t


# --------------------------------------------------------------------------------------------
# training: a learned planner's fit (its loop in dreamshard/learned/)
# --------------------------------------------------------------------------------------------


@cli.command("train")
@click.option("--planner", "planner_name", default="dreamshard", show_default=True, help="the learned planner to train: dreamshard, autoshard or rnn")
@click.option("--tasks", "tasks_file", required=True, type=click.Path(exists=True, dir_okay=False), help="training tasks (JSONL, from `dreamshard data tasks`)")
@click.option("--backend", default="sim", show_default=True, type=click.Choice(["sim", "auto", "fbgemm", "triton", "torch"]),
              help="what measures the sampled plans: the calibrated simulator, or a kernel on real hardware (auto: as for `measure`)")
@click.option("--calibration", type=click.Path(exists=True, dir_okay=False), help="with --backend sim: a calibration file (default: the shipped one of the GPU here, else the H200's)")
@click.option("--runner", default="sequential", show_default=True, type=click.Choice(["distributed", "sequential"]),
              help="with a kernel: sequential measures each device's shard in turn on one device (comm from a fitted model); distributed runs one process per device")
@click.option("--device", default="auto", show_default=True, type=click.Choice(["auto", "cpu", "cuda"]), help="with a kernel: auto lets the kernel decide")
@click.option("--comm-model", type=click.Path(exists=True, dir_okay=False), help="with --runner sequential: comm model  [default: the one shipped for the device]")
@click.option("--out", required=True, type=OUT_MODEL, help="MODEL.pt to write (the checkpoint goes to MODEL.pt.ckpt)")
@click.option("--config", "config_name", help="named hyperparameters [dreamshard: default (our ablated changes) or paper (the reference code); autoshard: paper, or masked (devices without room masked in training); rnn: paper]")
@click.option("--iterations", type=click.IntRange(1, limits.MAX_ITERS), help="training iterations [config's]")
@click.option("--budget", type=click.IntRange(1, limits.MAX_BUDGET), help="real measurements (measured plans) in all, spread over the iterations [config's]")
@click.option("--batch-size", type=BATCH, help="workload batch size the backend measures  [65536; 1024 for a kernel on CPU]")
@click.option("--seed", type=SEED, help="[0]")
@click.option("--eval-tasks", type=click.Path(exists=True, dir_okay=False), help="also measure the planner on these tasks after every iteration (logged)")
@click.option("--log", "log_file", type=OUT_FILE, help="JSONL log, one line of numbers per iteration")
@click.option("--resume", is_flag=True, help="continue from MODEL.pt.ckpt where a previous run stopped")
@click.option("--prior-plans", type=int, help="dreamshard: first fit the cost net on this many plans priced by the simulator (default calibration: an H200 with the triton kernel); they are not measurements  [config's: 0; 8000 for an H200, docs/costs.md]")
@click.option("--kernel-features/--no-kernel-features", default=None,
              help="dreamshard: also give the cost net each table's kernel terms (the work counts the simulator prices), scaled by their mean over the training tables  [config's: no; docs/costs.md]")
@click.option("--comm", "comm_source", help="dreamshard: a device's all-to-all from the cost net's comm head ('head') or from the comm model of the backend trained against ('model'; its parameters are stored in the model)  [config's: head]")
@click.option("--cost-linear/--no-cost-linear", default=None,
              help="dreamshard, with --kernel-features: the cost net also weighs the kernel terms linearly (non-negative weights), as the simulator prices a kernel  [config's: no; docs/costs.md]")
@click.option("--shared-terms/--no-shared-terms", default=None,
              help="dreamshard, with --cost-linear: the cost net also prices the terms a shard pays once (its launch, set-up, launches per tile class, wide path, branches), as the simulator does  [config's: no; docs/costs.md]")
@click.option("--prior-singles/--no-prior-singles", default=None,
              help="dreamshard, with --prior-plans: every training table alone on a device is priced by the simulator too  [config's: no]")
@click.option("--prior-span", type=click.IntRange(0, 10**4), help="dreamshard, with --prior-plans: this many more tasks for the prior, of tables spread over every shape the tool accepts (not a family's), so the cost net has seen shapes beyond the training families  [config's: 0; docs/dreamshard.md]")
@click.option("--search-plans", type=click.IntRange(0, 10**6), help="dreamshard, with --prior-plans: after training, refine the cost net on this many plans around its own search on the training tasks, priced by the simulator  [config's: 0; docs/dreamshard.md]")
@click.option("--search-rank", type=click.FloatRange(0, 1e6), help="dreamshard, with --search-plans: the weight of the refinement's term on differences between plans of one task (the net's error the same share on each of them, so it orders them as the simulator does)  [config's: 0; docs/dreamshard.md]")
@click.option("--plot", "plot_file", type=OUT_FILE, help="also draw the --log file's curves (measured cost, cost-net error, policy loss) to this .png or .svg (matplotlib)")
@click.option("--threads", type=click.IntRange(1, 1024), help="CPU threads for the nets  [1; $OMP_NUM_THREADS where set; torch's default with a kernel measured on the CPU]")
@click.pass_context
def train_cmd(ctx, planner_name, tasks_file, backend, calibration, runner, device, comm_model, out, config_name, iterations, budget, batch_size, seed, eval_tasks, log_file, resume,
              prior_plans, kernel_features, comm_source, cost_linear, shared_terms, prior_singles, prior_span, search_plans, search_rank, plot_file, threads) -> None:
    """Train a learned planner (DreamShard, AutoShard, the RNN placer) against a cost backend."""
    from dreamshard.learned.dreamshard import COMM_SOURCES
    from dreamshard.learned.loop import check_training_tasks
    from dreamshard.planners import PLANNERS
    from dreamshard.tasks import load_tasks

    learned = sorted(n for n, c in PLANNERS.items() if c.kind == "learned")
    if planner_name not in learned:
        raise OptionError(f"--planner: {planner_name!r} is not a learned planner; choose from {', '.join(learned)}")
    planner_cls = PLANNERS[planner_name]
    if config_name is not None and config_name not in planner_cls.CONFIGS:
        raise OptionError(f"--config: planner {planner_name} has no config {config_name!r}; choose from {', '.join(planner_cls.CONFIGS)}")
    if calibration and backend != "sim":
        raise OptionError("--calibration is for --backend sim")
    if prior_plans is not None and planner_name != "dreamshard":
        raise OptionError(f"--prior-plans is for --planner dreamshard, not {planner_name}")
    if prior_plans is not None and prior_plans < 0:
        raise OptionError(f"--prior-plans must be >= 0, got {prior_plans}")
    dreamshard_only = (("--kernel-features", kernel_features), ("--comm", comm_source), ("--cost-linear", cost_linear), ("--shared-terms", shared_terms),
                       ("--prior-singles", prior_singles),
                       ("--prior-span", prior_span), ("--search-plans", search_plans), ("--search-rank", search_rank))
    for option, value in dreamshard_only:
        if value is not None and planner_name != "dreamshard":
            raise OptionError(f"{option} is for --planner dreamshard, not {planner_name}")
    if comm_source is not None and comm_source not in COMM_SOURCES:
        raise OptionError(f"--comm: {comm_source!r:.40} is not {' or '.join(map(repr, COMM_SOURCES))}")
    if comm_source == "model" and backend != "sim" and runner == "distributed":
        raise OptionError("--comm model: the distributed runner measures real all-to-alls, there is no comm model to add; use --runner sequential or --comm head")
    if backend == "sim":
        refuse_unused(ctx, ["runner", "device", "comm_model"], "with --backend sim (the simulator measures nothing)")
    elif runner == "distributed":
        refuse_unused(ctx, ["comm_model"], "with --runner distributed (its all-to-alls are real)")
    if plot_file:
        from dreamshard import plots

        if not log_file:
            raise OptionError("--plot draws the curves of the --log file: give --log FILE.jsonl too")
        plots.check_path(plot_file, "--plot")
        plots.require("--plot")
    cost_backend, dev_type = _cost_backend(backend, runner, device, comm_model=comm_model, calibration=calibration)
    if prior_plans and backend == "sim" and cost_backend.name == _cost_backend("sim", runner, device)[0].name:  # train's prior: the default simulator
        raise OptionError(f"--prior-plans: the backend is already the simulator that prices the prior ({cost_backend.name}); raise --budget instead")
    if batch_size is None and backend != "sim" and dev_type == "cpu":
        batch_size = 1024  # B = 65,536 on a CPU would take minutes per measured plan
    cfg = planner_cls.config(config_name, iterations=iterations, budget=budget, batch_size=batch_size, seed=seed, prior_plans=prior_plans,
                             **({"kernel_features": kernel_features, "comm": comm_source, "cost_linear": cost_linear, "shared_terms": shared_terms, "prior_singles": prior_singles,
                                 "prior_span": prior_span, "search_plans": search_plans, "search_rank": search_rank}
                              if planner_name == "dreamshard" else {}))
    tasks = load_tasks(tasks_file)
    evals = load_tasks(eval_tasks) if eval_tasks else None
    check_training_tasks(tasks, evals, tasks_file, eval_tasks)  # the loop checks them too; here first, naming the files, before anything is printed
    threads = training_threads(threads, backend != "sim" and dev_type == "cpu")
    console.print(f"training {planner_name} ({cfg.name} config) on {len(tasks)} tasks against {cost_backend.name}: {cfg.iterations} iterations, "
                  f"up to {cfg.total_budget()} measured plans, {threads} CPU thread{'s' if threads > 1 else ''}")
    # the simulator prior's plans are priced by the shipped calibration (a learned module imports no backend: it is given one)
    prior = {"prior": _cost_backend("sim", runner, device)[0]} if getattr(cfg, "prior_plans", 0) else {}
    planner = planner_cls.fit(tasks, cost_backend, out, cfg, log=log_file, resume=resume, eval_tasks=evals, **prior)
    drawn = f"; curves: {training_plot(log_file, plot_file, planner_name, cost_backend.name)}" if plot_file else ""
    note = getattr(planner.model, "end_note", None)  # a resumed run that had finished (learned.loop.finished_run)
    if note:
        console.print(note + drawn, soft_wrap=True)
        return
    meta = planner.model.meta
    shards = f", {meta['shard_measurements']} shards" if "shard_measurements" in meta else ""
    console.print(f"wrote {out} ({meta['measurements']} measured plans{shards} by {cost_backend.name})" + (f"; log: {log_file}" if log_file else "") + drawn)


def training_plot(log_file: str, plot_file: str, planner_name: str, backend: str) -> str:
    """`train --plot`: the log's curves (every iteration it holds, a resumed run's earlier ones too)."""
    from dreamshard import plots

    rows = [json.loads(line) for line in Path(log_file).read_text().splitlines() if line.strip()]  # the run's own lines (RunLog checked them)
    return str(plots.training_curves(rows, plot_file, f"training {planner_name} against {backend}"))


def limit_threads(threads: int | None = None, cpu_kernel: bool = False) -> None:
    """One CPU thread for torch, unless `threads` (`train --threads`) or $OMP_NUM_THREADS says
    otherwise. The learned planners' and training's nets are small: a step is a few hundred small
    matrix products, which a second thread does not make faster but which threads spin-waiting
    on a busy machine make many times slower (2 cores beside four busy processes: a training
    iteration took 28–39 s with one thread, over 4 minutes with two; beside two, `compare` took
    12 s of CPU instead of 25). A kernel measured on the CPU (`cpu_kernel`) keeps torch's default,
    which its measurements (and `measure`'s) are taken with."""
    if threads is None and (os.environ.get("OMP_NUM_THREADS") or cpu_kernel):
        return
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads or 1)
    else:  # torch reads it when it loads (importing it here would cost a command that never needs it a second)
        os.environ["OMP_NUM_THREADS"] = str(threads or 1)


def training_threads(threads: int | None, cpu_kernel: bool) -> int:
    """`limit_threads` for a training run, → torch's thread count."""
    import torch

    limit_threads(threads, cpu_kernel)
    return torch.get_num_threads()


# --------------------------------------------------------------------------------------------
# measurement: `measure` and `calibrate` (runners, comm model — dreamshard/costs/runners, comm.py)
# --------------------------------------------------------------------------------------------


def _stdout_to_stderr():
    """While measuring for --json: anything a library prints goes to stderr, even from C."""
    import contextlib
    import os

    @contextlib.contextmanager
    def redirect():
        sys.stdout.flush()
        try:
            saved = os.dup(1)
        except OSError:  # no fd 1 (embedded use): Python-level redirect only
            saved = None
        try:
            if saved is not None:
                os.dup2(2, 1)
            with contextlib.redirect_stdout(sys.stderr):
                yield
        finally:
            sys.stdout.flush()
            if saved is not None:
                os.dup2(saved, 1)
                os.close(saved)

    return redirect()


def _report_path(plan_path: str, backend: str, runner: str) -> Path:
    p = Path(plan_path)
    suffix = ".jsonl" if p.suffix == ".jsonl" else ".json"
    tag = "sim" if backend == "sim" else f"{backend}-{runner}"
    return p.with_name(f"{p.stem}.cost-{tag}{suffix}")


def _cost_backend(backend: str, runner: str, device: str, iters: int = DEFAULT_ITERS, warmup: int = DEFAULT_WARMUP, timeout: float = DEFAULT_TIMEOUT_S,
                  comm_model: str | None = None, calibration: str | None = None):
    """(CostBackend, device type) for the --backend/--runner/--device options of `measure` and `train`:
    the calibrated simulator, or a kernel measured by a runner (auto: triton on CUDA, else fbgemm
    where it loads, else torch)."""
    if backend == "sim":
        from dreamshard.costs.sim import SimBackend

        return SimBackend(calibration), "cuda"  # None: the shipped calibration of the GPU here (sim.default_calibration)
    from dreamshard.costs.kernels import available_kernels, unavailable_reason
    from dreamshard.costs.runners import DistributedRunner, SequentialRunner, default_device

    if backend == "auto":
        import torch

        have = available_kernels("cuda" if torch.cuda.is_available() else "cpu")
        backend = next(k for k in ("triton", "fbgemm", "torch") if k in have)
    dev_type = default_device(backend) if device == "auto" else device
    problem = unavailable_reason(backend, dev_type)
    if problem:
        raise OptionError(f"--backend {backend}: the kernel cannot run on {dev_type} here: {one_line(problem)}")
    if runner == "distributed":
        return DistributedRunner(backend, dev_type, warmup, iters, timeout_s=timeout), dev_type
    return SequentialRunner(backend, comm_model, dev_type, warmup, iters), dev_type


MEASURE_PANELS = 4  # `measure --plot` draws this many plans of a file side by side


@cli.command("measure")
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(exists=True, dir_okay=False))
@click.option("--backend", default="auto", show_default=True, type=click.Choice(["auto", "fbgemm", "triton", "torch", "sim"]),
              help="kernel to measure with (auto: triton on CUDA, else fbgemm where it loads, else torch), or the calibrated simulator")
@click.option("--runner", default="distributed", show_default=True, type=click.Choice(["distributed", "sequential"]),
              help="distributed: one process per device, real all-to-all; sequential: one device, comm from a fitted model")
@click.option("--batch-size", type=BATCH, help="global batch B  [default: the plan's (65536) on GPUs and the simulator, 1024 on CPU]")
@click.option("--iters", default=DEFAULT_ITERS, show_default=True, type=ITERS, help="timed iterations (medians are reported)")
@click.option("--warmup", default=DEFAULT_WARMUP, show_default=True, type=WARMUP, help="untimed iterations first")
@click.option("--timeout", default=DEFAULT_TIMEOUT_S, show_default=True, type=TIMEOUT, help="seconds before the distributed runner kills its workers")
@click.option("--comm-model", type=click.Path(exists=True, dir_okay=False), help="comm model for --runner sequential  [default: the one shipped for the device]")
@click.option("--device", default="auto", show_default=True, type=click.Choice(["auto", "cpu", "cuda"]), help="auto: the kernel decides")
@click.option("--precision", type=click.Choice(["fp16", "fp32"]), help="weights/outputs  [default: the plan's, fp16]")
@topology_option
@click.option("--out", type=OUT_FILE, help="report file  [default: PLAN.cost-BACKEND-RUNNER.json next to the plan]")
@click.option("--json", "as_json", is_flag=True, help="print the report JSON (top-level overall_ms) to stdout instead of tables")
@click.option("--plot", "plot_file", type=OUT_FILE, help=f"also draw each device's fwd comp, fwd comm, bwd comm and bwd comp (of the first {MEASURE_PANELS} plans) to this .png or .svg (matplotlib)")
@click.pass_context
def measure_cmd(ctx, plan_file, backend, runner, batch_size, iters, warmup, timeout, comm_model, device, precision, topology_text, hosts, gpus_per_host, out, as_json,
                plot_file) -> None:
    """Cost of a placement: per device fwd comp, fwd comm, bwd comm, bwd comp; overall = max total."""
    import contextlib

    from dreamshard.costs.sim import default_calibration  # what `--backend sim` prices with (_cost_backend)
    from dreamshard.plan import load_plans

    if backend == "sim":
        refuse_unused(ctx, ["runner", "iters", "warmup", "timeout", "comm_model", "device"], "with --backend sim (the simulator measures nothing)")
    elif runner == "distributed":
        refuse_unused(ctx, ["comm_model"], "with --runner distributed (its all-to-alls are real)")
    else:
        refuse_unused(ctx, ["timeout"], "with --runner sequential (no worker processes)")

    if plot_file:
        from dreamshard import plots

        plots.check_path(plot_file, "--plot")
        plots.require("--plot")
    plans = load_plans(plan_file)
    topo = resolve_topology(topology_text, hosts, gpus_per_host, None)[0]
    if topo is not None:  # the same plans priced on another machine
        for i, p in enumerate(plans):
            p.task = tasks_on([p.task], topo, f"{plan_file}: plan {i + 1}")[0]
    cost_backend, dev_type = _cost_backend(backend, runner, device, iters, warmup, timeout, comm_model)
    backend = cost_backend.kernel if backend == "auto" else backend
    if batch_size is None and dev_type != "cuda":
        batch_size = 1024  # a plan's own batch (65,536 by default) takes minutes per plan on a CPU
    path = Path(out) if out else check_out_path(_report_path(plan_file, backend, runner), "report")
    reports = []
    quiet = _stdout_to_stderr() if as_json else contextlib.nullcontext()
    with quiet:
        for i, plan in enumerate(plans):
            workload = plan.workload.with_overrides(batch_size, precision)
            label = f"plan {i + 1}/{len(plans)}: " if len(plans) > 1 else ""
            with err_console.status(f"{label}measuring {len(plan.shards)} shards of {len(plan.task.tables)} tables on {plan.devices} devices ({backend}, {runner if backend != 'sim' else 'simulator'}, B={workload.batch_size})"):
                reports.append(cost_backend.evaluate_plan(plan, workload.batch_size, workload.precision))
    from dreamshard.costs.runners.launch import torchrun_rank
    from dreamshard.topology import several_hosts

    launched = torchrun_rank()
    if launched is not None and launched[0] != 0:  # under torchrun every rank measured; rank 0 alone writes and prints
        return
    if len(reports) == 1 and path.suffix != ".jsonl":
        reports[0].save(path)
    else:
        atomic_write(path, "".join(json.dumps(r.to_json()) + "\n" for r in reports))
    wrote = [path]
    if plot_file:
        panels = [(f"{p.planner} plan" + (f" {i + 1}" if len(plans) > 1 else ""), r) for i, (p, r) in enumerate(zip(plans, reports))][:MEASURE_PANELS]
        wrote.append(plots.device_components(panels, plot_file, f"{reports[0].source}, B={reports[0].batch_size}"))
    if as_json:
        for r in reports:
            click.echo(json.dumps(r.to_json(), indent=None if len(reports) > 1 else 1))
        err_console.print(f"wrote {', '.join(map(str, wrote))}")
        return
    for plan, r in zip(plans, reports):
        console.print(device_summary(plan, f"{plan.planner} plan: {len(plan.task.tables)} tables on {plan.devices} devices, B={r.batch_size}, {r.precision}", r))
        by = f"simulator (calibration {default_calibration()})" if backend == "sim" else f"measured ({backend} kernel, {runner} runner)"
        console.print(f"{by}: [bold]{r.overall_ms:.3f} ms[/bold] overall (max over devices of the total)")
        if r.e2e_ms is not None:
            console.print(f"end-to-end step (synchronized, measured): {r.e2e_ms:.3f} ms")
        console.print(f"[dim]{r.source}[/dim]")
        if r.comm_modelled and "comm_model" in r.details:
            console.print(f"[dim]comm modelled: {r.details['comm_model']}[/dim]")
        if several_hosts(plan.task.topology) is not None:
            console.print(f"[dim]topology: {plan.task.topology.describe()}[/dim]")
        if "topology_note" in r.details:
            console.print(f"[yellow]note:[/yellow] {r.details['topology_note']}")
        if plan.predicted:  # the planner's own number for the same plan: say which is which
            console.print(f"[dim]{plan.predicted['source']}, the planner's own estimate: {plan.predicted['overall_ms']:.3f} ms[/dim]")
    console.print(f"wrote {', '.join(map(str, wrote))}")


@cli.group("calibrate", cls=Group, invoke_without_command=True)
@click.option("--backend", "kernel", type=click.Choice(["triton", "fbgemm", "torch"]), help="kernel whose costs the simulator is fitted to")
@click.option("--out", type=OUT_FILE, help="calibration JSON to write (with --backend)")
@click.option("--validate", "validate_file", type=click.Path(exists=True, dir_okay=False), help="calibration to validate on held-out shards and placements")
@click.option("--shards", default=240, show_default=True, type=click.IntRange(10, limits.MAX_TASKS), help="random shards to measure")
@click.option("--placements", default=30, show_default=True, type=click.IntRange(0, limits.MAX_TASKS), help="whole placements to measure (--validate)")
@click.option("--batch-size", type=BATCH, help="[default: 65536 on GPUs, 2048 on CPU]")
@click.option("--device", default="auto", show_default=True, type=click.Choice(["auto", "cpu", "cuda"]))
@click.option("--seed", type=click.IntRange(0, limits.MAX_SEED), help="pool seed of the shards  [default: 0 to calibrate, 1 to validate: held-out tables]")
@click.option("--comm-model", type=click.Path(exists=True, dir_okay=False), help="all-to-all model to embed  [default: the one shipped for the device]")
@click.option("--records", type=OUT_FILE, help="also write every measurement here (JSON lines)")
@click.option("--from-records", type=click.Path(exists=True, dir_okay=False), multiple=True,
              help="fit or validate these measurements instead of measuring (repeat for several files, fitted as one)")
@click.option("--report", type=OUT_FILE, help="validation report JSON to write")
@click.option("--cache-size", type=MEMORY, help="the device's L2, which the forward's repeated row gathers are priced against (H200: 60MiB)  "
              "[default: read off the CUDA device measured; with --from-records, none: every repeat may hit]")
@click.option("--host-link", type=click.Path(exists=True, dir_okay=False),
              help="host-memory terms to embed (benchmarks/gpu_tiers.py's host_link.json; docs/tiers.md)  [default: none: the H100's]")
@click.option("--iters", default=DEFAULT_ITERS, show_default=True, type=ITERS)
@click.option("--warmup", default=DEFAULT_WARMUP, show_default=True, type=WARMUP)
@click.pass_context
def calibrate(ctx, kernel, out, validate_file, shards, placements, batch_size, device, seed, comm_model, records, from_records, report, cache_size, host_link,
              iters, warmup) -> None:
    """Fit the simulator to real measurements (--backend K --out FILE), or check a fit (--validate FILE)."""
    if ctx.invoked_subcommand is not None:
        return
    if not validate_file and not kernel and not out:
        click.echo(ctx.get_help())
        return
    if not validate_file and not (kernel and out):
        raise OptionError("calibrate needs --backend KERNEL with --out FILE, or --validate FILE")
    from dreamshard.costs import calibrate as cal
    from dreamshard.costs.comm import load_comm_model
    from dreamshard.costs.runners import default_device
    from dreamshard.tasks import Workload
    from dreamshard.validation import DataError

    calibration = cal.Calibration.load(validate_file) if validate_file else None
    if host_link and validate_file:
        raise OptionError("--host-link is for a fit (--backend KERNEL --out FILE)")
    host = _host_link_entry(host_link) if host_link else {}  # checked before any measurement
    kernel = kernel or calibration.kernel
    dev = default_device(kernel) if device == "auto" else device
    batch_size = batch_size or (calibration.batch_size if calibration else 65_536 if dev == "cuda" else 2048)
    if from_records:
        measured = [r for path in from_records for r in cal.load_records(path)]
    else:
        seed = (1 if validate_file else 0) if seed is None else seed
        cap = cal.MAX_SHARD_BYTES[dev]
        designed = cal.design_shards(shards, seed, cap)
        groups = cal.design_placements(placements, seed, cap) if validate_file else []
        todo = [(s, None, None) for s in designed] + [(s, p, d) for p, g in enumerate(groups) for d, s in enumerate(g)]
        measured = []
        with progress_bar() as bar:
            job = bar.add_task(f"measuring shards ({kernel}, {dev}, B={batch_size})", total=len(todo))
            for shard, p, d in todo:
                if shard:
                    (r,) = cal.measure_shards([shard], kernel, dev, Workload(batch_size), iters=iters, warmup=warmup)
                    r.placement, r.device = p, d
                    measured.append(r)
                elif p is not None:  # an empty device of a placement costs nothing but still counts
                    measured.append(cal.ShardRecord([], batch_size, "fp16", "sgd", 0.0, 0.0, p, d))
                bar.advance(job)
        if records:
            cal.save_records(measured, records)
    if validate_file:
        result = cal.validation_report(calibration, measured)
        _print_validation(result, calibration)
        if report:
            atomic_write(report, json.dumps(result, indent=1))
        return
    comm = load_comm_model(comm_model, dev)
    comm_info = {"latency_ms": comm.latency_ms, "bandwidth_GBps": comm.bandwidth_GBps, "serial_fraction": comm.serial_fraction,
                 "source": f"{comm.process_group} all-to-all measured on {comm.hardware}, {comm.date}"}
    if cache_size is None and not from_records:
        from dreamshard.costs.hardware import cache_bytes

        cache_size = cache_bytes(dev)
    try:
        fitted = cal.fit(measured, kernel, comm_info, cache_size or 0.0)
    except DataError as e:  # records that cannot be fitted: name the file they came from
        raise DataError(f"{', '.join(from_records)}: {e}" if from_records else str(e)) from None
    fitted.host = host
    fitted.save(out)
    console.print(f"fitted on {fitted.fit['shards']} shards: forward MAPE {fitted.fit['fwd_mape']:.1f}%, backward {fitted.fit['bwd_mape']:.1f}%, "
                  f"total {fitted.fit['total_mape']:.1f}% (training error; validate with --validate on held-out shards)")
    console.print(f"wrote {out}")


def _host_link_entry(path: str) -> dict:
    """The `host` entry a calibration embeds, read from FILE and checked as the simulator reads it."""
    from dreamshard.costs.host import HostLink
    from dreamshard.validation import DataError

    try:
        entry = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{path}: not a host-link JSON file ({one_line(e)})") from None
    if not isinstance(entry, dict):
        raise DataError(f"{path}: not a host-link JSON object (benchmarks/gpu_tiers.py writes one: host_link.json)")
    HostLink.from_json(entry, path)
    return entry


def _print_validation(result: dict, calibration) -> None:
    t = Table(title=f"simulator vs measurement on {result['shards']} held-out shards ({calibration.hardware}, {calibration.kernel})")
    for col in ("component", "MAPE", "Spearman"):
        t.add_column(col, justify="right")
    for key in ("fwd", "bwd", "total"):
        t.add_row(f"{key} compute", f"{result[key]['mape']:.1f}%", f"{result[key]['spearman']:.3f}")
    if "placements" in result:
        p = result["placements"]
        t.add_row(f"overall cost, {p['count']} placements", f"{p['mape']:.1f}%", f"{p['spearman']:.3f}")
    console.print(t)
    z = Table(title="total compute by shard size")
    for col in ("tables", "shards", "MAPE", "mean signed error"):
        z.add_column(col, justify="right")
    for b in result["by_size"]:
        z.add_row(b["tables"], str(b["shards"]), f"{b['mape']:.1f}%", f"{b['mean_signed_error']:+.1f}%")
    console.print(z)
    w = Table(title="worst shards")
    for col in ("tables", "dims", "lookups/sample", "measured ms", "simulated ms", "error %"):
        w.add_column(col, justify="right")
    for x in result["worst"]:
        w.add_row(str(x["tables"]), ",".join(map(str, x["dims"])), str(x["lookups_per_sample"]), str(x["measured_ms"]), str(x["simulated_ms"]), str(x["error"]))
    console.print(w)
    # where the model fails: per table family (the held-out one marked) and per shape bucket
    placed = {b["key"]: b for b in result.get("placements_by_family", [])}
    breakdowns = ([("total compute by table family", "family", result["by_family"])] if "by_family" in result else []) + \
                 [(f"total compute by shape bucket: {axis}", axis, rows) for axis, rows in result.get("by_bucket", {}).items()]
    for title, label, rows in breakdowns:
        b = Table(title=title, caption="* held-out family: nothing is calibrated on it" if label == "family" else None)
        for col in (label, "shards", "MAPE", "mean signed", "fwd MAPE", "bwd MAPE") + (("plans", "plan MAPE") if label == "family" else ()):
            b.add_column(col, justify="right")
        for r in rows:
            p = placed.get(r["key"]) if label == "family" else None
            extra = ((str(p["count"]), f"{p['mape']:.1f}%") if p else ("", "")) if label == "family" else ()
            b.add_row(r["key"] + ("*" if r["held_out"] and label == "family" else ""), str(r["shards"]), f"{r['mape']:.1f}%",
                      f"{r['mean_signed_error']:+.1f}%", f"{r['fwd_mape']:.1f}%", f"{r['bwd_mape']:.1f}%", *extra)
        console.print(b)


def _comm_fit_table(model) -> Table:
    """Measured vs modelled, per collective, set, pattern and size (medians over ranks and directions)."""
    from statistics import median

    from dreamshard.packing import format_bytes

    t = Table(title=f"collectives, {model.devices} ranks: measured vs model (median over ranks and directions)")
    for col in ("op", "set", "pattern", "size", "measured ms", "model ms", "error"):
        t.add_column(col, justify="right")
    groups: dict = {}
    for p in model.measurements:
        op = p.get("op", "all_to_all")
        size = max(p["chunks_bytes"]) if "chunks_bytes" in p else p.get("buffer_bytes", max(p.get("send_bytes", 0), p.get("recv_bytes", 0)))
        groups.setdefault((op, p.get("set", "fit"), p.get("pattern", ""), size), []).append(p)
    for (op, part, pattern, size), pts in sorted(groups.items()):
        measured, modelled = median(p["ms"] for p in pts), median(model.point_ms(p) for p in pts)
        t.add_row(op.replace("_", "-"), part, pattern, format_bytes(size), f"{measured:.4f}", f"{modelled:.4f}", f"{modelled / measured - 1:+.1%}")
    return t


@calibrate.command("comm")
@click.option("--out", required=True, type=OUT_FILE, help="comm model JSON to write")
@click.option("--devices", default=2, show_default=True, type=click.IntRange(2, limits.MAX_DEVICES), help="processes (CPU) or GPUs taking part")
@click.option("--sizes", help="all-to-all: bytes each rank sends to each other rank, comma-separated (e.g. 256,4KB,1MB)  [default: 256 B–4 MB on CPU, 16 KB–192 MB on GPUs]")
@click.option("--buffers", help="reduce-scatter and all-gather: buffer bytes, comma-separated  [default: 4 KB–8 MB on CPU, 256 KB–256 MB on GPUs]")
@click.option("--iters", default=20, show_default=True, type=ITERS, help="timed collectives per pattern (median kept)")
@click.option("--warmup", default=3, show_default=True, type=WARMUP)
@click.option("--device", default="auto", show_default=True, type=click.Choice(["auto", "cpu", "cuda"]), help="auto: NCCL when CUDA devices >= --devices, else gloo on CPU")
@click.option("--timeout", default=300.0, show_default=True, type=TIMEOUT)
@click.option("--refit", "refit_file", type=click.Path(exists=True, dir_okay=False), help="measure nothing: fit again to the measurements of this comm model file")
def calibrate_comm(out, devices, sizes, buffers, iters, warmup, device, timeout, refit_file) -> None:
    """Measure every collective the distributed runner issues (the all-to-all over balanced and
    skewed patterns, the reduce-scatter and all-gather of row-wise tables; gloo on CPU, NCCL on
    GPUs), fit the comm model, and report its error on held-out patterns."""
    from dreamshard.costs.comm import CommModel, fit_comm, parse_sizes
    from dreamshard.costs.comm import calibrate as run_calibration

    if refit_file:
        old = CommModel.load(refit_file)
        if not old.measurements or not any("chunks_bytes" in p for p in old.measurements):
            raise InputError(f"{refit_file}: has no measurements of patterns to fit again (made by `dreamshard calibrate comm`)")
        model = fit_comm(old.measurements, hardware=old.hardware, date=old.date, versions=old.versions, process_group=old.process_group, devices=old.devices)
    else:
        import torch

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= devices else "cpu"
        chunks = parse_sizes(sizes) if sizes else None
        sizes_rs = parse_sizes(buffers) if buffers else None
        with err_console.status(f"collectives on {devices} {'GPUs (NCCL)' if device == 'cuda' else 'CPU processes (gloo)'}"):
            model = run_calibration(devices, chunks, device, iters, warmup, timeout, sizes_rs)
    model.save(out)
    console.print(_comm_fit_table(model))
    console.print(f"model: {model.describe()}")
    for kind in ("reduce_scatter", "all_gather"):
        fit = getattr(model, kind)
        if fit:
            console.print(f"{kind.replace('_', '-')}: {fit['latency_ms'] * 1e3:.1f} µs + ring bytes / {fit['bandwidth_GBps']:.2f} GB/s")
    fd = model.fit_details
    console.print(f"all-to-all relative error over its {fd['points']} fitted points: median {fd['median_rel_error']:.1%}, max {fd['max_rel_error']:.1%}")
    for op, e in fd.get("held_out", {}).items():
        console.print(f"held-out {op.replace('_', '-')} ({e['points']} points): median {e['median_rel_error']:.1%}, max {e['max_rel_error']:.1%}")
    console.print(f"wrote {out}")


# --------------------------------------------------------------------------------------------
# comparing planners: `compare` and `demo` (dreamshard/report.py)
# --------------------------------------------------------------------------------------------


def every_planner() -> tuple[list[str], dict[str, list[str]]]:
    """The registered planners that plan with their defaults, `random` (the baseline) first and the
    rest by name, so a planner added to the registry shows up in `demo` and `compare` by itself;
    and those that need arguments → the arguments."""
    from dreamshard.planners import PLANNERS
    from dreamshard.report import missing_arguments

    names = sorted(PLANNERS, key=lambda n: (n != "random", n))
    needs = {n: missing_arguments(n) for n in names}
    return [n for n in names if not needs[n]], {n: m for n, m in needs.items() if m}


def parse_planner_list(text: str) -> list[str]:
    """--planners a,b,c: registered names, each once, each able to plan with its defaults."""
    from dreamshard.planners import PLANNERS
    from dreamshard.report import missing_arguments

    names = [n.strip() for n in text.split(",")]
    for i, n in enumerate(names):
        if not n:
            raise OptionError(f"--planners {text!r:.60}: an empty name; give comma-separated names, e.g. lookup,dreamshard")
        if n not in PLANNERS:
            raise OptionError(f"--planners: unknown planner {n!r:.40}; choose from {', '.join(sorted(PLANNERS))}")
        if n in names[:i]:
            raise OptionError(f"--planners: {n} is listed twice")
        if missing_arguments(n):
            raise OptionError(f"--planners: {n} needs {', '.join(missing_arguments(n))}, which compare cannot give it")
    return names


def model_planner(path: str) -> str:
    """The learned planner whose model file `path` is (by the format it names); ModelError otherwise."""
    from dreamshard.learned import autoshard, nets, rnn
    from dreamshard.validation import ModelError, load_torch_file

    owners = {nets.MODEL_FORMAT: "dreamshard", autoshard.MODEL_FORMAT: "autoshard", rnn.MODEL_FORMAT: "rnn"}
    state = load_torch_file(path, "model", ModelError)
    fmt = state.get("format") if isinstance(state, dict) else None
    if fmt not in owners:
        raise ModelError(f"{path}: not a model of a learned planner ({', '.join(sorted(owners.values()))}); train one with `dreamshard train`")
    return owners[fmt]


def parse_models(values: tuple[str, ...], taken: list[str]) -> dict[str, tuple[str, str]]:
    """--model NAME=FILE (repeatable) → {NAME: (planner, FILE)}; NAME is the row's name in the
    results, so it may be none of the planners' (`taken`) nor another model's."""
    out: dict[str, tuple[str, str]] = {}
    for value in values:
        name, eq, path = value.partition("=")
        name = name.strip()
        if not eq or not name or not path:
            raise OptionError(f"--model {value!r:.80}: give NAME=FILE, e.g. mine=model.pt")
        if name in taken or name in out:
            raise OptionError(f"--model {name}=…: the name {name!r:.40} is already {'a planner' if name in taken else 'another model'} of this comparison; choose another")
        if not Path(path).is_file():
            raise OptionError(f"--model {name}={path}: no such file")
        out[name] = (model_planner(path), path)
    return out


def split_variants(planners: dict, options_of) -> dict:
    """{NAME: (planner, build)} → {NAME: planner}, each planner that can cut tables followed by
    itself the other way, `build(split)`: NAME --split, or NAME --no-split for one that cuts by
    default. `options_of(NAME)`: the registry's options of the planner behind NAME."""
    out = {}
    for name, (planner, build) in planners.items():
        out[name] = planner
        default = options_of(name).get("split")
        if default is not None:
            out[f"{name} --no-split" if default else f"{name} --split"] = build(not default)
    return out


@cli.command("compare")
@click.option("--tasks", "tasks_file", required=True, type=click.Path(exists=True, dir_okay=False), help="tasks JSONL (from `dreamshard data tasks`)")
@click.option("--planners", "planner_list", help="comma-separated, e.g. lookup,size_lookup,dreamshard  [default: every planner that needs no arguments]")
@click.option("--model", "models", multiple=True, metavar="NAME=FILE",
              help="also plan with a model from `dreamshard train` (its planner read off the file), named NAME in the results; repeatable")
@click.option("--split", "variants", is_flag=True, help="also each planner that can cut tables the other way (NAME --split; dreamshard --no-split)")
@click.option("--backend", default="sim", show_default=True, type=click.Choice(["sim", "auto", "fbgemm", "triton", "torch"]),
              help="what prices the plans: the calibrated simulator, or a kernel measured by --runner (auto: as for `measure`)")
@click.option("--runner", default="sequential", show_default=True, type=click.Choice(["distributed", "sequential"]),
              help="with a kernel: sequential measures each device's shard in turn on one device (comm from a fitted model); distributed runs one process per device")
@click.option("--device", default="auto", show_default=True, type=click.Choice(["auto", "cpu", "cuda"]), help="with a kernel: auto lets the kernel decide")
@click.option("--batch-size", type=BATCH, help="global batch B  [default: each task's (65536) on GPUs and the simulator, 1024 for a kernel on CPU]")
@topology_option
@click.option("--out", type=OUT_DIR, help="folder for results.md, results.csv, results.json and, with matplotlib, the figures planners.png/.svg and devices.png/.svg")
@click.option("--json", "as_json", is_flag=True, help="print the results as a JSON document (results.json's) instead of tables")
@click.option("--quiet", "-q", is_flag=True, help="print one summary line only")
@click.pass_context
def compare_cmd(ctx, tasks_file, planner_list, models, variants, backend, runner, device, batch_size, topology_text, hosts, gpus_per_host, out, as_json, quiet) -> None:
    """Plan every task with each planner, price every plan with one backend, and compare."""
    import contextlib

    from dreamshard import plots
    from dreamshard.planners import PLANNERS, get_planner
    from dreamshard.report import evaluate
    from dreamshard.tasks import load_tasks

    if as_json and quiet:
        raise OptionError("--json and --quiet: give one (--json prints a document, --quiet one line)")
    if backend == "sim":
        refuse_unused(ctx, ["runner", "device"], "with --backend sim (the simulator measures nothing)")
    names = parse_planner_list(planner_list) if planner_list is not None else every_planner()[0]
    mine = parse_models(models, names)
    cost_backend, dev_type = _cost_backend(backend, runner, device)
    limit_threads(cpu_kernel=backend != "sim" and dev_type == "cpu")
    if batch_size is None and dev_type == "cpu":
        batch_size = 1024  # B = 65,536 on a CPU would take minutes per measured plan
    tasks = tasks_on(load_tasks(tasks_file), resolve_topology(topology_text, hosts, gpus_per_host, None)[0], str(tasks_file))
    chosen = {n: (get_planner(n), lambda split, n=n: get_planner(n, split=split)) for n in names}
    chosen.update({name: (get_planner(planner, model=path), lambda split, planner=planner, path=path: get_planner(planner, model=path, split=split))
                   for name, (planner, path) in mine.items()})
    behind = {**{n: n for n in names}, **{name: planner for name, (planner, _) in mine.items()}}
    planners = split_variants(chosen, lambda n: PLANNERS[behind[n]].options()) if variants else {n: p for n, (p, _) in chosen.items()}
    # --json: stdout is the document's alone, whatever a library prints while planning
    with _stdout_to_stderr() if as_json else contextlib.nullcontext(), progress_bar() as bar:
        job = bar.add_task(f"planning and pricing ({cost_backend.name})", total=len(tasks) * len(planners))
        results = evaluate(planners, tasks, cost_backend, batch_size, progress=lambda row: bar.advance(job))
    paths = results.write(out) if out else []
    figures_note = None
    if out:
        if plots.available():
            paths += plots.compare_figures(results, out)
        else:
            figures_note = f"no figures: they need matplotlib, which is not installed here ({plots.EXTRA})"
    if as_json:
        click.echo(json.dumps({**results.to_json(), "wrote": [str(p) for p in paths]}, indent=1))
        if figures_note:
            err_console.print(f"note: {figures_note}", highlight=False)
        return
    line = compare_summary(results) + (f"; wrote {len(paths)} files to {out}" if paths else "")
    if quiet:
        click.echo(line)
        return
    console.print(results.summary_table())
    for note in results.note_lines() + ([figures_note] if figures_note else []):
        console.print(f"[yellow]note:[/yellow] {note}")
    if paths:
        console.print(f"wrote {', '.join(str(p) for p in paths)}")
    click.echo(line)  # plain: a script's `tail -1` reads it as --quiet prints it


def compare_summary(results) -> str:
    """The line `compare` ends with (all that --quiet prints): the best planner and how far the
    others are from each task's best plan."""
    ranked = [s for s in results.ranked() if s.failures < s.tasks]
    tasks = f"{results.tasks} task{'s' if results.tasks != 1 else ''}"
    if not ranked:
        return f"no planner placed any of the {tasks}"
    best = ranked[0]
    rest = ", ".join(f"{s.planner} {(s.mean_ratio_to_best - 1):+.1%}" for s in ranked[1:4])
    return (f"best on {tasks}: {best.planner}, mean {best.mean_ms:.3f} ms ({(best.mean_ratio_to_best - 1):+.1%} above each task's best plan)"
            + (f"; then {rest}" if rest else "") + (f" and {len(ranked) - 4} more" if len(ranked) > 4 else "") + f" — {results.source}")


@cli.group("bench", cls=Group)
def bench() -> None:
    """The results suite: the DreamShard paper's table and the field's, in one command."""


@bench.command("paper")
@click.option("--out", required=True, type=OUT_DIR, help="run folder: rows.jsonl, plans.jsonl, models/, results.md, results.csv (an existing run resumes)")
@click.option("--quick", is_flag=True, help="two paper settings and one held-out family, 3 tasks each, the shipped models (minutes on a CPU)")
@click.option("--suite", default=",".join(["paper", "families", "mlperf"]), show_default=True,
              help="comma-separated: paper (its ten settings), families (every table family, 4 and 8 devices), mlperf (DLRM-DCNv2's 26 tables)")
@click.option("--tasks", default=50, show_default=True, type=click.IntRange(1, limits.MAX_TASKS), help="train and test tasks per paper setting")
@click.option("--test-tasks", type=click.IntRange(1, limits.MAX_TASKS), help="test tasks per paper setting  [--tasks]")
@click.option("--family-tasks", default=5, show_default=True, type=click.IntRange(1, limits.MAX_TASKS), help="test tasks per family setting")
@click.option("--seeds", default=1, show_default=True, type=click.IntRange(1, 100), help="runs of each setting (pool split, tasks, training): cells are mean ± std over them")
@click.option("--train-budget", default=100, show_default=True, type=click.IntRange(0, limits.MAX_BUDGET),
              help="measured plans per learned planner, trained per paper setting on its train tasks (0: the shipped models)")
@click.option("--oracle-budget", default=4000, show_default=True, type=click.IntRange(1, limits.MAX_BUDGET), help="the oracle's evaluations on the simulator per task")
@click.option("--planners", "planner_labels", help="comma-separated columns to make  [default: every one: random, size, dim, lookup, size_lookup, rnn, "
              "'dreamshard --no-split', autoshard, dreamshard, neuroshard, torchrec, oracle]; a run given more later adds theirs")
@click.option("--backend", default="sim", show_default=True, type=click.Choice(["sim", "auto", "fbgemm", "triton", "torch"]),
              help="what prices the plans and trains the learned planners (as for `compare`)")
@click.option("--runner", default="sequential", show_default=True, type=click.Choice(["distributed", "sequential"]), help="with a kernel: as for `compare`")
@click.option("--device", default="auto", show_default=True, type=click.Choice(["auto", "cpu", "cuda"]), help="with a kernel: auto lets the kernel decide")
@click.pass_context
def bench_paper(ctx, out, quick, suite, tasks, test_tasks, family_tasks, seeds, train_budget, oracle_budget, planner_labels, backend, runner, device) -> None:
    """Every planner on the paper's ten settings (DLRM-20…100 on 4 devices, 40…200 on 8, dim-16
    tables, 5 GB), the table families and MLPerf DLRM-DCNv2: results.md, results.csv."""
    from dreamshard import bench as results

    if backend == "sim":
        refuse_unused(ctx, ["runner", "device"], "with --backend sim (the simulator measures nothing)")
    names = [s.strip() for s in suite.split(",") if s.strip()]
    unknown = [s for s in names if s not in results.SUITES]
    if unknown or not names:
        raise OptionError(f"--suite: {', '.join(unknown) or 'nothing given'}: choose from {', '.join(results.SUITES)}")
    if quick:
        refuse_unused(ctx, ["suite", "tasks", "test_tasks", "family_tasks", "train_budget"], "with --quick (its settings are fixed)")
        chosen, train_budget, oracle_budget = results.quick_settings(), 0, min(oracle_budget, 1000)
    else:
        chosen = results.settings(names, tasks, family_tasks, test_tasks)
    columns = results.PAPER_COLUMNS + results.FIELD_COLUMNS
    labels = columns if planner_labels is None else [x.strip() for x in planner_labels.split(",") if x.strip()]
    if not labels or any(x not in columns for x in labels):
        raise OptionError(f"--planners: {', '.join(x for x in labels if x not in columns) or 'nothing given'}: choose from {', '.join(columns)}")
    cost_backend, _ = _cost_backend(backend, runner, device)
    run = results.Run(Path(out))
    # the planners (--planners) may grow between calls; what the rows and models depend on may not
    run.check_config({"settings": [s.name for s in chosen], "tasks": [[s.train, s.test] for s in chosen], "seeds": seeds, "train_budget": train_budget,
                      "oracle_budget": oracle_budget, "backend": cost_backend.name})
    console.print(f"{len(chosen)} settings × {seeds} seed(s), priced by {cost_backend.name}; "
                  f"learned planners {'trained per paper setting on ' + str(train_budget) + ' measured plans' if train_budget else 'as shipped'}; rows in {run.rows_path}")
    with progress_bar() as bar:
        job = bar.add_task("tasks planned and priced", total=None)
        results.run_suite(run, chosen, cost_backend, seeds, train_budget, oracle_budget, say=lambda line: err_console.print(line),
                          progress=lambda done, total: bar.update(job, completed=done, total=total), labels=labels)
    paths = results.write_report(run)
    console.print(Path(paths[0]).read_text(), markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {', '.join(str(p) for p in paths)}")
    if quick:
        console.print("the whole suite (10 paper settings, 16 family settings, MLPerf DLRM-DCNv2) and its measured runs on GPUs: docs/results.md")


@bench.command("report")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@click.option("--costs", "costs_file", type=click.Path(exists=True, dir_okay=False), help="measured costs of the run's test plans (CSV of benchmarks/gpu_bench.py): the tables of those")
@click.option("--out", type=OUT_DIR, help="folder for results.md and results.csv  [default: FOLDER]")
def bench_report(folder, costs_file, out) -> None:
    """The tables of a `bench paper` run again, from its rows (or from measured costs of its plans)."""
    from dreamshard import bench as results

    paths = results.write_report(results.Run(Path(folder)), Path(costs_file) if costs_file else None, Path(out) if out else None)
    console.print(Path(paths[0]).read_text(), markup=False, highlight=False, soft_wrap=True)
    console.print(f"wrote {', '.join(str(p) for p in paths)}")


@cli.command("demo")
@click.option("--workdir", default="runs/demo", show_default=True, type=OUT_DIR)
@click.option("--devices", default=8, show_default=True, type=DEVICES)
@click.option("--tables", "n_tables", default=80, show_default=True, type=click.IntRange(1, limits.MAX_TABLES), help="tables per task")
def demo(workdir: str, devices: int, n_tables: int) -> None:
    """Synthesize the DLRM-like pool, draw a held-out task, plan it with every planner, compare."""
    from dreamshard.costs.sim import SimBackend
    from dreamshard.report import evaluate
    from dreamshard.synth import PoolConfig, load_pool, synth_pool, write_pool
    from dreamshard.tasks import sample_tasks, split_pool

    limit_threads()
    pool_dir = Path(workdir) / "pool"
    if (pool_dir / "tables.csv").exists():
        tables = load_pool(pool_dir)
    else:
        with progress_bar() as bar:
            job = bar.add_task("synthesizing the 856-table pool", total=856)
            tables = synth_pool(PoolConfig(), progress=lambda k: bar.advance(job, k))
        write_pool(tables, pool_dir, PoolConfig())
    _, test = split_pool(tables, 0)
    task = sample_tasks(test, 1, (n_tables, n_tables), devices, 5 * 10**9, seed=1, pool=str(pool_dir.resolve()))[0]
    console.print(f"task: {n_tables} held-out tables on {devices} devices, 5 GB each (pool: {pool_dir})")
    from dreamshard.planners import PLANNERS, get_planner

    names, skipped = every_planner()
    for name, needs in skipped.items():
        console.print(f"[dim]skipped planner {name}: it needs {', '.join(needs)}[/dim]")
    # every planner as it comes, and those that can cut tables also the other way (--split, or
    # --no-split for dreamshard, whose search cuts by default)
    built = {}
    for n in names:
        try:
            built[n] = (get_planner(n), lambda split, n=n: get_planner(n, split=split))
        except OptionError as e:  # e.g. torchrec where TorchRec is not installed
            console.print(f"[dim]skipped planner {n}: {one_line(e)}[/dim]")
    planners = split_variants(built, lambda n: PLANNERS[n].options())
    results = evaluate(planners, [task], SimBackend())  # dreamshard: the shipped model, trained on the pool's train tables
    placed = [row for row in results.rows if row.ok]
    for row in results.rows:
        if not row.ok:
            console.print(f"planner {row.planner}: {row.error}")
    # the cheapest table-wise plan beside the cheapest plan of all (a split one where splitting pays)
    table_wise = min((r for r in placed if not r.split_tables), key=lambda r: r.overall_ms, default=None)
    best = min(placed, key=lambda r: r.overall_ms, default=None)
    for row, what in ((table_wise, "best table-wise plan"), (best, "best plan")):
        if row is not None and (what == "best table-wise plan" or row is not table_wise):
            cut = f", split: {', '.join(f'{t} in {n}' for t, n in row.split_tables.items())}" if row.split_tables else ""
            console.print(device_summary(row.plan, f"{what}: {row.planner}, cost {row.overall_ms:.3f} ms{cut}", row.report, every=None))
    console.print(results.summary_table(baseline="random"))
    for line in results.note_lines():
        console.print(f"[yellow]note:[/yellow] {line}")


def exit_on_sigterm() -> None:
    """SIGTERM (kill, a job scheduler) unwinds like Ctrl-C: temporary files are removed, workers killed."""
    import signal

    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


# export torchrec: the group lives with the TorchRec integration (torchrec_io imports nothing of
# cli.py, and TorchRec itself only when the command runs)
from dreamshard.torchrec_io import export  # noqa: E402

cli.add_command(export)


def refuse_outputs_onto_inputs(ctx: click.Context) -> None:
    """OptionError if a file the command writes (an `OutPath` option, and the files written beside
    it: `train --out M.pt` writes M.pt.ckpt) is one of the files it reads (any other path option or
    argument: the same file, through a link too) or another of its outputs: `plan t.csv --out t.csv`
    would replace its own input. One check for every command."""
    import os

    outs, ins = [], []
    for p in ctx.command.params:
        values = ctx.params.get(p.name)
        for v in values if isinstance(values, (list, tuple)) else [values]:
            if v is None:
                continue
            if isinstance(p.type, OutPath):
                if not p.type.directory:
                    outs.extend((p, w, v) for w in (v, *p.type.companions(v)))
            elif isinstance(p.type, click.Path):
                ins.append((p, v))

    def name(p: click.Parameter) -> str:
        return max(p.opts, key=len) if isinstance(p, click.Option) else p.human_readable_name

    def same(a: str, b: str) -> bool:
        try:
            return os.path.samefile(a, b)
        except OSError:  # one does not exist (yet): the same file only by name, links followed (a dangling one too)
            return os.path.realpath(a) == os.path.realpath(b)

    def written(p: click.Parameter, path: str, given: str) -> str:
        return f"{name(p)} {given}" + ("" if path == given else f" (which also writes {path})")

    for i, (p, out, given) in enumerate(outs):
        for q, other, other_given in [(q, v, v) for q, v in ins] + outs[:i]:
            if same(out, other):
                role = "reads" if (q, other) in ins else "also writes"
                raise OptionError(f"{written(p, out, given)}: the same file as {name(q)} {other}, which this command {role}; give another file to write")


def _guard_outputs(command: click.Command) -> None:
    """Run `refuse_outputs_onto_inputs` before `command` (and each of its subcommands) does any work."""
    import functools

    callback = command.callback
    if callback is not None and not getattr(callback, "_outputs_guarded", False):
        @functools.wraps(callback)
        def guarded(*args, **kwargs):
            refuse_outputs_onto_inputs(click.get_current_context())
            return callback(*args, **kwargs)

        guarded._outputs_guarded = True
        command.callback = guarded
    for sub in getattr(command, "commands", {}).values():
        _guard_outputs(sub)


_guard_outputs(cli)


def main() -> None:
    exit_on_sigterm()
    cli(prog_name="dreamshard")


if __name__ == "__main__":
    main()
