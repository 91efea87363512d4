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

from daemon import cli, models, render


def echo_results(results: Sequence[dict[str, Any]]) -> None:
    """Each result on its own line (stdout when done, stderr when refused); exit 1 if any was."""
    refused = False
    for result in results:
        message = render.one_line(str(result.get("message") or ""))
        if result.get("ok"):
            click.echo(message)
        else:
            refused = True
            click.echo(f"error: {message}", err=True)
    if refused:
        raise SystemExit(cli.EXIT_REFUSED)


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
        **args: Any) -> None:
    """Ask the daemon to do `op` to what the ids or selectors name, and print its results."""
    selectors = {key: value for key, value in (("run", run_id), ("type", task_type)) if value is not None}
    if statuses:
        selectors["status"] = list(statuses)
    if ids and selectors:
        raise click.UsageError("give IDs or selectors (--run, --status, --type), not both")
    if not ids and not selectors:
        raise click.UsageError("give at least one ID, or --run, --status or --type")
    named = {"ids": list(ids)} if ids else selectors
    echo_results(cli.call(op, **named, **args)["results"])


def _acting_command(op: str, summary: str, help_text: str) -> None:
    """Define `fredica <op> [ID]... [selectors]` for a bulk operation that takes nothing else."""

    def command(ids: tuple[str, ...], run_id: str | None, statuses: tuple[str, ...], task_type: str | None) -> None:
        act(op, ids, run_id, statuses, task_type)

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
    act("priority", ids, run_id, statuses, task_type, priority=priority)


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
        echo_results(cli.call(f"restarts_{op}", **args)["results"])

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
_entries_command("recreate", "Run interrupted tasks again, each as a new run; print what it made.")
