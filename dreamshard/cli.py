"""The `dreamshard` command line. Bad input → one line on stderr and exit status 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dreamshard.tables import TableError

console = Console()
err_console = Console(stderr=True)

USER_ERRORS = (TableError, ValueError, FileNotFoundError)


class Group(click.Group):
    """A click group that turns our user-facing errors into one line and exit status 2."""

    group_class = type  # nested groups are of this class too

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except USER_ERRORS as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except RuntimeError as e:  # kernels/runners report their failures as RuntimeError
            click.echo(f"error: {e}", err=True)
            sys.exit(1)


def progress_bar() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err_console, transient=True)


def memory_option(f):
    return click.option("--max-memory", required=True, help="per-device memory cap: 5GB, 5GiB, 512MB or bytes")(f)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dreamshard")
def cli() -> None:
    """Place embedding tables on GPUs so one training step's embedding work finishes fastest."""


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------


@cli.group(cls=Group)
def data() -> None:
    """Table pools, their statistics, and tasks."""


@data.command("synth")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="directory for tables.csv and pool.json")
@click.option("--tables", "n_tables", default=856, show_default=True, type=click.IntRange(1), help="number of tables")
@click.option("--seed", default=0, show_default=True, type=int)
def data_synth(out: str, n_tables: int, seed: int) -> None:
    """Write a synthetic DLRM-like table pool (specs + regenerable index streams)."""
    from dreamshard.synth import PoolConfig, synth_pool, write_pool

    config = PoolConfig(tables=n_tables, seed=seed)
    with progress_bar() as bar:
        job = bar.add_task("synthesizing tables", total=n_tables)
        tables = synth_pool(config, progress=lambda k: bar.advance(job, k))
    path = write_pool(tables, out, config)
    console.print(f"wrote {len(tables)} tables to {path}")


@data.command("stats")
@click.argument("pool", type=click.Path(exists=True, file_okay=False))
@click.option("--reference", default="2021", type=click.Choice(["2021", "2022"]), show_default=True, help="published file to compare with")
def data_stats(pool: str, reference: str) -> None:
    """Aggregate statistics of a pool beside the published DLRM dataset's."""
    import numpy as np

    from dreamshard.synth import load_pool, pool_stats, published_stats
    from dreamshard.tables import BIN_LABELS

    ref = published_stats(reference)
    tables = load_pool(pool)
    if any((t.distribution or "").startswith("dlrm:") for t in tables):
        raise ValueError(f"{pool}: stats are computed from synthetic stream descriptors; this pool replays DLRM files")
    mine = pool_stats(tables, ref.batch_size)
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
    l1 = float(np.abs(np.array(mine.lookup_hist) - ref.lookup_hist).sum())
    l1_rows = float(np.abs(np.array(mine.row_hist) - ref.row_hist).sum())
    rel = mine.lookups_per_table_sample / ref.lookups_per_table_sample - 1
    console.print(f"L1 distance, lookup-weighted reuse histogram: {l1:.3f} (target ≤ 0.10)")
    console.print(f"L1 distance, distinct-row reuse histogram: {l1_rows:.3f}")
    console.print(f"mean lookups per table-sample: {rel:+.1%} vs published (target within ±10%)")
    console.print("[dim]Pool figures are expected values of its synthetic streams (analytic); the published ones are measured on the real files.[/dim]")


@data.command("tasks")
@click.option("--pool", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--tables", "count", required=True, help="tables per task: T or LO:HI")
@click.option("--devices", required=True, type=click.IntRange(1))
@memory_option
@click.option("--num-train", default=50, show_default=True, type=click.IntRange(0))
@click.option("--num-test", default=50, show_default=True, type=click.IntRange(0))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--precision", default="fp16", type=click.Choice(["fp16", "fp32"]), show_default=True)
@click.option("--optimizer", default="sgd", type=click.Choice(["sgd", "rowwise_adagrad"]), show_default=True)
@click.option("--out", required=True, type=click.Path(file_okay=False))
def data_tasks(pool, count, devices, max_memory, num_train, num_test, seed, precision, optimizer, out) -> None:
    """Split the pool 50/50 into train/test tables and draw random tasks from each half."""
    from dreamshard.synth import load_pool
    from dreamshard.tasks import parse_memory, parse_range, sample_tasks, save_tasks, split_pool

    cap, rng = parse_memory(max_memory), parse_range(count)
    tables = load_pool(pool)
    train, test = split_pool(tables, seed)
    pool_path = str(Path(pool).resolve())
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, half, n, s in (("train", train, num_train, seed), ("test", test, num_test, seed + 1)):
        tasks = sample_tasks(half, n, rng, devices, cap, s, pool_path, precision, optimizer)
        save_tasks(tasks, out_dir / f"{name}.jsonl")
        console.print(f"wrote {len(tasks)} {name} tasks ({rng[0]}–{rng[1]} of {len(half)} {name} tables, {devices} devices) to {out_dir / f'{name}.jsonl'}")


@data.command("dlrm")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="pool directory to write")
@click.option("--dim", default=64, show_default=True, type=click.IntRange(4), help="embedding dim (the files hold none)")
def data_dlrm(file, out, dim) -> None:
    """Turn a DLRM-dataset file ((indices, offsets, lengths), .pt or .pt.gz) into a pool."""
    from dreamshard.streams import tables_from_dlrm
    from dreamshard.tables import save_tables

    if dim % 4:
        raise ValueError(f"--dim {dim} is not a multiple of 4")
    tables = tables_from_dlrm(file, dim)
    Path(out).mkdir(parents=True, exist_ok=True)
    save_tables(tables, Path(out) / "tables.csv")
    console.print(f"wrote {len(tables)} tables from {file} to {Path(out) / 'tables.csv'}")


# --------------------------------------------------------------------------------------------
# planning
# --------------------------------------------------------------------------------------------


@cli.command("planners")
def planners_cmd() -> None:
    """List the registered planners."""
    from dreamshard.planners import PLANNERS

    t = Table("name", "description")
    for name, cls in sorted(PLANNERS.items()):
        t.add_row(name, cls.description)
    console.print(t)


def device_summary(plan, title: str) -> Table:
    from dreamshard.tasks import format_bytes

    t = Table(title=title)
    for col in ("device", "tables", "memory", "dim sum", "lookups·dim / sample"):
        t.add_column(col, justify="right")
    used = plan.device_bytes()
    for d, shard in enumerate(plan.shards()):
        t.add_row(str(d), str(len(shard)), format_bytes(used[d]), str(sum(x.dim for x in shard)), f"{sum(x.lookup for x in shard):,.0f}")
    return t


@cli.command("plan")
@click.argument("tables_file", required=False, type=click.Path())
@click.option("--tasks", "tasks_file", type=click.Path(), help="plan every task of a JSONL task file instead")
@click.option("--devices", type=click.IntRange(1), help="number of devices (with TABLES_FILE)")
@click.option("--max-memory", help="per-device memory cap (with TABLES_FILE): 5GB, 5GiB, 512MB or bytes")
@click.option("--precision", default="fp16", type=click.Choice(["fp16", "fp32"]), show_default=True)
@click.option("--optimizer", default="sgd", type=click.Choice(["sgd", "rowwise_adagrad"]), show_default=True)
@click.option("--planner", "planner_name", default="size_lookup", show_default=True, help="see `dreamshard planners`")
@click.option("--seed", default=0, show_default=True, type=int, help="for randomized planners")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="PLAN.json, or PLANS.jsonl with --tasks")
def plan_cmd(tables_file, tasks_file, devices, max_memory, precision, optimizer, planner_name, seed, out) -> None:
    """Place the tables of TABLES_FILE (or of every task in --tasks) on devices."""
    from dreamshard.plan import save_plans
    from dreamshard.planners import PLANNERS, get_planner
    from dreamshard.tables import load_tables
    from dreamshard.tasks import Task, load_tasks, parse_memory

    if planner_name not in PLANNERS:
        raise ValueError(f"unknown planner {planner_name!r}; choose from {', '.join(sorted(PLANNERS))}")
    if (tables_file is None) == (tasks_file is None):
        raise ValueError("give either TABLES_FILE (with --devices and --max-memory) or --tasks FILE.jsonl")
    if tasks_file:
        tasks = load_tasks(tasks_file)
    else:
        if devices is None or max_memory is None:
            raise ValueError("TABLES_FILE needs --devices and --max-memory")
        tables = load_tables(tables_file)
        pool = str(Path(tables_file).resolve().parent)
        tasks = [Task(tables, devices, parse_memory(max_memory), precision, optimizer, pool)]
    kwargs = {"seed": seed} if planner_name == "random" else {}
    planner = get_planner(planner_name, **kwargs)
    with progress_bar() as bar:
        job = bar.add_task(f"planning with {planner_name}", total=len(tasks))
        plans = planner.plan_many(tasks, progress=lambda: bar.advance(job))
    save_plans(plans, out)
    if len(plans) == 1:
        console.print(device_summary(plans[0], f"{planner_name}: {len(tasks[0].tables)} tables on {tasks[0].devices} devices"))
    for note in {n for p in plans for n in p.notes}:
        console.print(f"[yellow]note:[/yellow] {note}")
    console.print(f"wrote {len(plans)} plan{'s' if len(plans) > 1 else ''} to {out}")


# --------------------------------------------------------------------------------------------
# demo
# --------------------------------------------------------------------------------------------


@cli.command("demo")
@click.option("--workdir", default="runs/demo", show_default=True, type=click.Path(file_okay=False))
@click.option("--devices", default=8, show_default=True, type=click.IntRange(1))
@click.option("--tables", "n_tables", default=80, show_default=True, type=click.IntRange(1), help="tables per task")
def demo(workdir: str, devices: int, n_tables: int) -> None:
    """Synthesize the DLRM-like pool, draw a task, plan it with every heuristic, compare."""
    from dreamshard.planners import get_planner
    from dreamshard.synth import PoolConfig, load_pool, synth_pool, write_pool
    from dreamshard.tasks import sample_tasks, split_pool

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
    for name in ("random", "size", "dim", "lookup", "size_lookup"):
        plan = get_planner(name).plan(task)
        console.print(device_summary(plan, f"planner {name}"))


def main() -> None:
    cli(prog_name="dreamshard")


if __name__ == "__main__":
    main()
