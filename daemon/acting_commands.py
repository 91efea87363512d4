"""The acting commands of `fredica` (SPEC §14 Bulk): cancel, pause, resume, hold, release, priority,
and `restarts dismiss|recreate`.

Each takes several ids, or selectors (`--run`, `--status`, `--type`, all of which must match; the
restart log's: `--all`, `--run`), and prints a line per task the daemon reports: its message on
stdout when it was done, `error: <message>` on stderr when it was refused. The exit status is 1 if
any was refused. Registered on `daemon.cli`'s groups when that module is imported.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import click

from daemon import cli, models


def selector_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """`--run`, `--status` and `--type`, as `fredica ls` takes them."""
    for option in reversed([
        click.option("--run", "run_id", metavar="ID", help="Every task of this workflow run."),
        click.option("--status", "statuses", type=click.Choice(models.TASK_FILTER_WORDS), multiple=True,
                     help="Every task in this status, stored or as shown (repeatable)."),
        click.option("--type", "task_type", metavar="T", help="Every task of this type (any case)."),
    ]):
        function = option(function)
    return function


def act(op: str, ids: Sequence[str], run_id: str | None, statuses: Sequence[str], task_type: str | None,
        **args: Any) -> list[dict[str, Any]]:
    """Ask the daemon to do `op` to what the ids or selectors name; its results."""
    selectors = {key: value for key, value in (("run", run_id), ("type", task_type)) if value is not None}
    if statuses:
        selectors["status"] = list(statuses)
    if ids and selectors:
        raise click.UsageError("give IDs or selectors (--run, --status, --type), not both")
    if not ids and not selectors:
        raise click.UsageError("give at least one ID, or --run, --status or --type")
    named = {"ids": list(ids)} if ids else selectors
    return cli.call(op, **named, **args)["results"]


def _acting_command(op: str, summary: str, help_text: str) -> None:
    """Define `fredica <op> [ID]... [selectors]` for a bulk operation that takes nothing else."""

    def command(ids: tuple[str, ...], run_id: str | None, statuses: tuple[str, ...], task_type: str | None) -> None:
        cli.echo_results({"results": act(op, ids, run_id, statuses, task_type)})

    command.__doc__ = f"{summary}\n\n{help_text}"
    command.__name__ = op
    decorated = selector_options(click.argument("ids", nargs=-1, metavar="[ID]...")(command))
    cli.command(cli.main, op)(decorated)


_EVERY = "Each ID (a task, or a unique prefix of 4+ characters) is reported on its own line; exit 1 if any was refused."
_acting_command("cancel", "Cancel tasks, or every unfinished task of workflow runs.",
                "An ID may name a run: all its unfinished tasks. " + _EVERY)
_acting_command("pause", "Pause running, pausable tasks.", _EVERY)
_acting_command("resume", "Resume paused tasks.", _EVERY)
_acting_command("hold", "Hold waiting tasks: they are not started until released.",
                "A held task shows as `held`; the tasks that depend on it wait. " + _EVERY)
_acting_command("release", "Release held tasks: they may start again.", _EVERY)


# ignore_unknown_options: a negative N (`-5`) is a number, not an unknown option.
@cli.command(cli.main, "priority", context_settings={"ignore_unknown_options": True},
             help="Change the priority of waiting (and held) tasks to N.\n\n"
                  "Higher runs first; the next claim honours it. N may be negative. " + _EVERY)
@click.argument("priority", type=int, metavar="N")
@click.argument("ids", nargs=-1, metavar="[ID]...")
@selector_options
def priority(priority: int, ids: tuple[str, ...], run_id: str | None, statuses: tuple[str, ...],
             task_type: str | None) -> None:
    cli.echo_results({"results": act("priority", ids, run_id, statuses, task_type, priority=priority)})


@cli.command(cli.main, "retry")
@click.argument("ids", nargs=-1, metavar="[ID]...")
@selector_options
@cli.json_option
def retry(ids: tuple[str, ...], run_id: str | None, statuses: tuple[str, ...], task_type: str | None,
          as_json: bool) -> None:
    """Run failed or cancelled tasks again, with the tasks their failure cancelled.

    Each task runs again as a new task (same type, payload, priority, retries, timeout,
    material, idempotency key, queue) in a new run, with a copy of each task that was cancelled
    because it failed (DEPENDENCY_FAILED, transitively), wired as before. Tasks of one run given
    together make one new run, no task copied twice. A dependency on a task that completed stays
    on that task, already done; a task that depends on one that failed is refused (retry that
    one: it brings this one along). Selectors reach the failed and cancelled tasks.

    One line per task: the new task, how many cancelled tasks came along, and the new run (exit 1
    if any was refused: not failed or cancelled, unknown, ambiguous). --json: the results,
    with full ids (new_id, run_id, copies)."""
    results = act("retry", ids, run_id, statuses, task_type)
    if as_json:
        cli.echo_json(results)
        if not all(result["ok"] for result in results):
            raise SystemExit(cli.EXIT_REFUSED)
        return
    cli.echo_results({"results": results})


def _entries_command(op: str, summary: str) -> None:
    """Define `fredica restarts <op> [ID]... [--all] [--run ID]`."""

    def command(ids: tuple[int, ...], every: bool, run_id: str | None) -> None:
        if ids and (every or run_id is not None):
            raise click.UsageError("give entry IDs or --all/--run, not both")
        if not ids and not every and run_id is None:
            raise click.UsageError("give at least one entry ID, or --all or --run")
        args: dict[str, Any] = {"ids": [str(entry_id) for entry_id in ids]} if ids else {"all": every}
        if run_id is not None:
            args["run"] = run_id
        cli.echo_results(cli.call(f"restarts_{op}", **args))

    command.__doc__ = f"{summary}\n\nEach entry is reported on its own line; exit 1 if any was refused."
    command.__name__ = f"restarts_{op}"
    options = [
        click.argument("ids", nargs=-1, type=int, metavar="[ID]..."),
        click.option("--all", "every", is_flag=True, help="Every entry awaiting review."),
        click.option("--run", "run_id", metavar="ID", help="The entries of this workflow run's tasks."),
    ]
    for option in reversed(options):
        command = option(command)
    cli.command(cli.restarts, op)(command)


_entries_command("dismiss", "Mark entries as reviewed, without running their tasks again.")
_entries_command("recreate", "Run interrupted tasks again, with the tasks their failure cancelled.\n\n"
                "Entries whose tasks came from one run make one new run, their dependencies kept.")
