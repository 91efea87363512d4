"""The `fredica` command line: parse the arguments, call the daemon, render the reply.

Exit status: 0 success, 1 the daemon refused or the request failed (one `error:` line on stderr),
2 usage error, 3 the daemon is not reachable. Start-up time matters (`fredica status` is a round
trip that people and scripts run often), so heavy modules are imported inside the commands that
need them, never here.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import click

from daemon import client, config, listing, models, render, specs_input
from daemon.errors import FredicaError, WaitTimedOut

EXIT_REFUSED = 1
EXIT_UNREACHABLE = 3
FOLLOW_POLL = 0.2  # how often `logs -f` looks for new lines
FOLLOW_RECHECK = 1.0  # how often `logs -f ID` asks whether the task is still active
_CONFIG = "fredica.config"
_CLIENT = "fredica.client"
_SETTINGS = "fredica.settings"
_LIVE_ONLY = "fredica.live_only"  # set by a command that must not be answered from the database
_NOTED_DOWN = "fredica.noted_down"  # `daemon not running` said already


def _sleep(seconds: float) -> None:
    # One seam for the polling loops, so tests can step them without waiting.
    time.sleep(seconds)


class FredicaGroup(click.Group):
    """Turns the errors every command may meet into one line on stderr and the exit status.

    The acting commands (`daemon.acting_commands`) are registered the first time a command that is
    not here yet is looked up, or all are listed: `fredica status`, run from scripts and prompts,
    does not pay for importing them (SPEC §14: status within 120 ms)."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands:
            _register_acting_commands()
        return super().get_command(ctx, cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        _register_acting_commands()
        return super().list_commands(ctx)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except client.DaemonUnreachable as exc:
            click.echo(f"error: {render.one_line(exc.message)}", err=True)
            ctx.exit(EXIT_UNREACHABLE)
        except FredicaError as exc:
            click.echo(f"error: {render.one_line(exc.message)}", err=True)
            ctx.exit(EXIT_REFUSED)


def _remember_config(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # ctx.meta is shared by the whole context chain: a subcommand's --config overrides the group's.
    if value is not None:
        ctx.meta[_CONFIG] = value
    return value


def config_option(envvar: str | None = None) -> Callable[[Any], Any]:
    """`--config FILE`, accepted by the group and by every command."""
    return click.option(
        "--config",
        type=click.Path(dir_okay=False),
        metavar="FILE",
        envvar=envvar,
        expose_value=False,
        callback=_remember_config,
        help="Config file that names the daemon's socket (default: $FREDICA_CONFIG, "
        "~/.config/fredica/config.toml, /etc/fredica/config.toml).",
    )


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")


def command(group: click.Group, name: str | None = None, **kwargs: Any) -> Callable[[Any], click.Command]:
    """A subcommand of `group` that also takes --config."""

    def decorate(function: Callable[..., Any]) -> click.Command:
        return group.command(name, **kwargs)(config_option()(function))

    return decorate


def _config_path() -> str | None:
    return click.get_current_context().meta.get(_CONFIG)


def settings() -> config.Settings:
    """The daemon's settings as the config (or the defaults) name them, read once per command."""
    meta = click.get_current_context().meta
    if _SETTINGS not in meta:
        meta[_SETTINGS] = config.load_for_client(_config_path())
    return meta[_SETTINGS]


def daemon_client() -> client.Client:
    """The command's client of the daemon named by the config (one connection per command)."""
    meta = click.get_current_context().meta
    if _CLIENT not in meta:
        meta[_CLIENT] = client.Client(socket_path=settings().socket)
    return meta[_CLIENT]


def call(op: str, **args: Any) -> Any:
    """One request to the daemon named by the config; errors become the exit status (see above).

    With no daemon running, a read is answered from its database, read-only (SPEC §14), saying
    `daemon not running` on stderr once per command; a write (or `wait`) is refused as before.
    """
    try:
        return daemon_client().call(op, **args)
    except client.DaemonNotRunning as exc:
        from daemon import offline  # only when the daemon is down: its imports are not for `status`

        meta = click.get_current_context().meta
        if meta.get(_LIVE_ONLY) or not offline.answers(op):
            raise
        answer = offline.answer(settings(), op, args, exc)
        if not meta.get(_NOTED_DOWN):
            meta[_NOTED_DOWN] = True
            click.echo("daemon not running" + (f": read from {shown_database()}" * answer.read_database), err=True)
        return answer.data


def shown_database() -> str:
    """The database as the CLI names it: a PostgreSQL URL without its password."""
    from daemon.store import backend

    return backend.shown(settings().database)


def stream(op: str, **args: Any) -> client.Streamed:
    """A streamed read (`ls_pages`), as `call` does a request: from the database, read-only,
    when no daemon runs."""
    streamed = daemon_client().stream(op, **args)
    pages = iter(streamed.pages)
    try:
        first = next(pages, None)  # the request goes out with the first page's read
    except client.DaemonNotRunning as exc:
        from daemon import offline

        answers = offline.pages(settings(), op, args, exc)
        first_answer = next(answers)  # a refusal (an unknown run, no database) comes before any output
        if not click.get_current_context().meta.get(_NOTED_DOWN):
            click.get_current_context().meta[_NOTED_DOWN] = True
            click.echo(f"daemon not running: read from {shown_database()}", err=True)
        offline_streamed = client.Streamed()

        def offline_pages() -> Any:
            page = first_answer
            for following in answers:
                yield page.data
                page = following
            offline_streamed.final = page.data  # the last answer: what the last frame says besides its items

        offline_streamed.pages = offline_pages()
        return offline_streamed
    streamed.pages = itertools.chain([] if first is None else [first], pages)
    return streamed


def daemon_down() -> bool:
    """Whether this command's reads were answered from the database, with no daemon running."""
    return bool(click.get_current_context().meta.get(_NOTED_DOWN))


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def echo_lines(lines: Sequence[str]) -> None:
    for line in lines:
        click.echo(line)


def echo_results(reply: dict[str, Any]) -> None:
    """An acting command's reply, a line per id: done on stdout, refused as `error:` on stderr;
    exit 1 if any was refused."""
    refused = False
    for result in reply["results"]:
        if result["ok"]:
            click.echo(render.one_line(result["message"]))
        else:
            refused = True
            click.echo(f"error: {render.one_line(result['message'])}", err=True)
    if refused:
        raise SystemExit(EXIT_REFUSED)


@click.group(cls=FredicaGroup, context_settings={"help_option_names": ["-h", "--help"]})
@config_option(envvar="FREDICA_CONFIG")
@click.version_option(package_name="fredica-worker", prog_name="fredica")
def main() -> None:
    """Drive the fredica-worker daemon: submit tasks, watch them, control them.

    Exit status: 0 success, 1 refused or failed, 2 usage error, 3 daemon not reachable.
    """


@command(main, "daemon")
def run_daemon() -> None:
    """Run the supervisor in the foreground.

    For systemd (Type=notify) or by hand; stop it with SIGTERM or Ctrl-C.
    """
    from daemon import service

    raise SystemExit(service.main(_config_path()))


@command(main)
@click.argument("task_type", metavar="[TYPE]", required=False)
@click.option("--payload", metavar="JSON", help="The task's payload, a JSON object.")
@click.option("--priority", type=int, metavar="N", help="Higher runs first (default 0).")
@click.option("--depends-on", multiple=True, metavar="ID", help="A task to complete first (repeatable).")
@click.option("--max-retries", type=click.IntRange(min=0), metavar="N", help="Retries after a failure (0).")
@click.option("--idempotency-key", metavar="K", help="Not submitted again while one with K is active.")
@click.option("--material", "material_id", metavar="ID", help="The material the task works on.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="S",
    help="Seconds before it is stopped.",
)
@click.option("--queue", metavar="NAME", help="The queue that runs it (default: the one its type is routed to).")
@click.option("--hold", is_flag=True, help="Submit it held: it waits until `fredica release` (a batch: all).")
@click.option(
    "--batch",
    type=click.File("r", encoding="utf-8"),
    metavar="FILE",
    help="Submit the tasks of a JSON-lines file ('-' for stdin) as one run.",
)
def submit(task_type: str | None, batch: Any, **options: Any) -> None:
    """Submit one task (or a --batch); print the task ids.

    A batch is a JSON-lines file, one task object per line with `type` and the optional fields
    (payload, priority, depends_on, max_retries, idempotency_key, material_id, timeout, queue,
    key, id, hold);
    depends_on may name the id or key of an earlier line. The batch is one run, stored atomically.
    """
    if (task_type is None) == (batch is None):
        raise click.UsageError("give a task TYPE or --batch FILE (one of them)")
    if batch is not None:
        given = [flag for name, flag in specs_input.SPEC_FLAGS.items()
                 if name != "hold" and options[name] not in (None, ())]
        if given:
            flags = ", ".join(given)
            raise click.UsageError(f"{flags} cannot be combined with --batch (put the fields in the file)")
        specs, numbers = specs_input.read_numbered_batch(batch)
        if options["hold"]:
            specs = [dict(spec, hold=True) for spec in specs]
        try:
            reply = call("submit", tasks=specs)
        except FredicaError as exc:
            raise specs_input.batch_line_error(exc, numbers) from None
        _echo_submitted(reply, specs)
        return
    from daemon import submission

    specs = [specs_input.spec_from_options(task_type, options)]
    submission.parse_spec(specs[0])
    # A single task's run is about its material too.
    material = {} if options["material_id"] is None else {"material_id": options["material_id"]}
    _echo_submitted(call("submit", tasks=specs, **material), specs)


def _echo_submitted(reply: dict[str, Any], specs: Sequence[dict[str, Any]] = ()) -> None:
    """Each task's id on stdout; on stderr, a note for each that was already active."""
    for task in reply.get("tasks", []):
        click.echo(task["id"])
    _note_already_active(reply, specs)


def _note_already_active(reply: dict[str, Any], specs: Sequence[dict[str, Any]] = ()) -> None:
    """On stderr, a note for each task of the reply that was already active (not submitted),
    naming its idempotency key when the submitted `specs` say it (they are in the reply's order)."""
    submitted = list(specs)
    for index, task in enumerate(reply.get("tasks", [])):
        if not task.get("created", True):
            key = submitted[index].get("idempotency_key") if index < len(submitted) else None
            named = f" {json.dumps(key, ensure_ascii=False)}" if key is not None else ""
            click.echo(f"task {task['id']} already active with idempotency key{named} (not submitted again)", err=True)


def _parse_settings(ctx: click.Context, param: click.Parameter, values: Sequence[str]) -> dict[str, str]:
    params = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE")
        params[key.strip()] = value
    return params


@command(main, "run")
@click.argument("template")
@click.option("--material", "material_id", metavar="ID", help="The material the run works on.")
@click.option(
    "--set",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    callback=_parse_settings,
    help="A template parameter (repeatable).",
)
def run_template(template: str, material_id: str | None, params: dict[str, str]) -> None:
    """Start a workflow run from a template; print the run id.

    TEMPLATE names a [templates.NAME] table of the daemon's config.
    """
    reply = call("run", template=template, material_id=material_id, params=params)
    if reply.get("run_id") is not None:
        click.echo(reply["run_id"])
        _note_already_active(reply)
    else:  # every task of it was already active: there is no new run, only those tasks
        click.echo("no new run: every task of it is already active (idempotency keys)", err=True)
        _echo_submitted(reply)


@command(main, "ls")
@click.option(
    "--status",
    type=click.Choice(models.TASK_FILTER_WORDS),
    multiple=True,
    help="Only tasks in this status, stored or as shown: waiting, held, paused (repeatable).",
)
@click.option("--run", "run_id", metavar="ID", help="Only the tasks of this workflow run.")
@click.option("--type", "task_type", metavar="T", help="Only tasks of this type (any case).")
@click.option("--since", metavar="WHEN", help="Only tasks submitted since: 30s, 10m, 2h, 7d, 1w, or an ISO time.")
@click.option(
    "--sort",
    type=click.Choice(models.TASK_SORTS),
    help="submitted (newest first, the default), priority (claim order), status, type, duration (longest first).",
)
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help=f"At most N tasks (default {listing.DEFAULT_LIMIT}).")
@click.option("--all", "show_all", is_flag=True, help="Every task that matches.")
@json_option
def list_tasks(status: Sequence[str], run_id: str | None, task_type: str | None, since: str | None,
               sort: str | None, limit: int | None, show_all: bool, as_json: bool) -> None:
    """List tasks, newest first: the last 50 unless --limit or --all.

    --json prints every task that matches (unless --limit), as a JSON array written as the
    daemon sends it, a page at a time."""
    if show_all and limit is not None:
        raise click.UsageError("--limit and --all cannot be combined")
    now = time.time()
    args: dict[str, Any] = {}
    if status:
        args["status"] = status[0] if len(status) == 1 else list(status)
    if since is not None:
        try:
            args["since"] = listing.parse_since(since, now)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--since") from None
    if limit is None and not show_all and not as_json:
        limit = listing.DEFAULT_LIMIT
    for key, value in (("run", run_id), ("type", task_type), ("sort", sort), ("limit", limit)):
        if value is not None:
            args[key] = value
    if as_json:
        _echo_json_stream(stream("ls_pages", **args).pages)
        return
    listed = stream("ls_pages", total=True, **args)
    pages = iter(listed.pages)
    first = next(pages, [])
    if not first:
        click.echo("no tasks")
        return
    table = listing.TaskTable(first, now, listing.terminal_width())
    shown = len(first)
    echo_lines([table.header(), *table.lines(first)])
    for page in pages:
        shown += len(page)
        echo_lines(table.lines(page))
    more = listing.more_line(int(listed.final.get("total") or 0), shown)
    if more is not None:
        click.echo(more)


def _echo_json_stream(pages: Iterable[Sequence[Any]]) -> None:
    """A JSON array as `echo_json` prints it, written a page at a time as the pages come (one
    write each: click flushes every echo): a listing of any length, held one page at a time."""
    opened = False
    for page in pages:
        parts = []
        for item in page:
            text = json.dumps(item, indent=2, ensure_ascii=False)
            parts.append(("[\n" if not opened else ",\n") + "\n".join("  " + line for line in text.split("\n")))
            opened = True
        click.echo("".join(parts), nl=False)
    click.echo("\n]" if opened else "[]")


@command(main, "runs")
@click.option("--status", type=click.Choice(render.RUN_STATUSES), help="Only runs in this status.")
@click.option("--limit", type=click.IntRange(min=1), metavar="N", help="At most N runs.")
@json_option
def list_runs(status: str | None, limit: int | None, as_json: bool) -> None:
    """List workflow runs."""
    args: dict[str, Any] = {}
    if status is not None:
        args["status"] = status
    if limit is not None:
        args["limit"] = limit
    runs = call("runs", **args)
    if as_json:
        echo_json(runs)
    elif runs:
        echo_lines(render.run_table(runs, time.time()))
    else:
        click.echo("no runs")


def _duration(ctx: click.Context, param: click.Parameter, value: str) -> float:
    from daemon import durations

    try:
        return durations.parse(value)
    except durations.BadDuration as exc:
        raise click.BadParameter(exc.message) from None


@command(main)
@click.option("--older-than", default="7d", show_default=True, metavar="AGE", callback=_duration,
              help="Only runs that finished at least this long ago (90s, 30m, 12h, 7d, 2w; 0: any).")
@click.option("--status", type=click.Choice(render.FINISHED_RUN_STATUSES), help="Only runs that ended so.")
@click.option("--dry-run", is_flag=True, help="Say what would be removed, and remove nothing.")
@json_option
def clean(older_than: float, status: str | None, dry_run: bool, as_json: bool) -> None:
    """Delete finished runs older than a cutoff, with their tasks and logs.

    A run goes once all of its tasks have ended, never while an unfinished task (of another
    run) depends on one of them; its restart-log entries go with it."""
    reply = daemon_client().clean(older_than, status=status, dry_run=dry_run)
    if as_json:
        echo_json(reply)
    else:
        click.echo(render.clean_summary(reply, dry_run))


@command(main)
@click.argument("target_id", metavar="ID")
@json_option
def show(target_id: str, as_json: bool) -> None:
    """Show one task or workflow run in full."""
    # A run's tasks: all of them for a script, the first 50 and the counts of all for people.
    reply = call("show", id=target_id) if as_json else call("show", id=target_id, tasks_limit=listing.DEFAULT_LIMIT)
    obj = reply["object"]
    if as_json:
        echo_json(obj)
        return
    echo_lines(render.details(obj, skip=("tasks", "task_counts")))
    if reply.get("kind") == "run":
        tasks = obj.get("tasks") or []
        click.echo(listing.counts_line(obj.get("task_counts") or {}))
        click.echo("")
        if not tasks:
            click.echo("no tasks")
            return
        table = listing.TaskTable(tasks, time.time(), listing.terminal_width())
        echo_lines([table.header(), *table.lines(tasks)])
        more = listing.more_line(int(obj.get("total_tasks") or 0), len(tasks),
                                 f"fredica ls --run {render.short_id(obj['id'])} --all")
        if more is not None:
            click.echo(more)


@command(main)
@click.argument("task_id", metavar="[ID]", required=False)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (for a task: until it ends).")
@click.option(
    "-n", "--lines", "count", type=click.IntRange(min=0), default=50, show_default=True, help="Lines to show."
)
@click.option("--json", "as_json", is_flag=True, help="Print the daemon log's JSON lines as they are.")
def logs(task_id: str | None, follow: bool, count: int, as_json: bool) -> None:
    """Show a task's log, or the daemon's log without an ID.

    Task logs stay on the host that ran the task: on a shared PostgreSQL queue, a task another
    supervisor ran is refused with the name of its host (exit 1)."""
    args = {"id": task_id} if task_id else {}
    try:
        where = call("log_path", **args)
    except client.DaemonUnreachable as exc:
        where = _log_without_the_daemon(task_id, exc)
    readable = bool(where.get("json_lines")) and not as_json

    def emit(line: str) -> None:
        click.echo(render.log_line(line) if readable else line)

    log = client.LogFile(Path(where["path"]))
    try:
        lines = log.last(count, keep_partial=follow)
        if lines is None and not follow:
            click.echo(f"no log yet at {where['path']}", err=True)
        for line in lines or ():
            emit(line)
        if not follow or (task_id and not where.get("active")):
            return
        still_active = (lambda: bool(call("log_path", **args).get("active"))) if task_id else None
        log.follow(emit, still_active, poll=FOLLOW_POLL, recheck=FOLLOW_RECHECK, sleep=_sleep)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how one stops following the daemon log
    finally:
        log.close()


def _log_without_the_daemon(task_id: str | None, unreachable: client.DaemonUnreachable) -> dict[str, Any]:
    """Where the log is when the daemon does not answer: the logs are files, read where this
    host's config puts them (when the daemon's log matters most). On a shared PostgreSQL queue
    the task's row, read-only, says first whether it ran here (SPEC §16: else LogElsewhere)."""
    path = settings().task_log(task_id) if task_id else settings().daemon_log
    if task_id:
        from daemon.store import backend

        if backend.is_postgres(settings().database):
            from daemon import offline
            from daemon.errors import LogElsewhere

            try:
                path = Path(offline.answer(settings(), "log_path", {"id": task_id}, unreachable).data["path"])
            except LogElsewhere:
                raise
            except FredicaError:
                pass  # the database cannot be read either: the file the id names here, as on SQLite
    click.echo(f"note: {unreachable.message}; reading {path}", err=True)
    return {"path": str(path), "active": False, "json_lines": not task_id}


@command(main)
@click.argument("target", metavar="[ID]", required=False)
def watch(target: str | None) -> None:
    """Live progress bars of tasks until they end, as many as fit.

    Without ID: the running tasks, then the waiting ones, as many as fit. With ID: that task, or that run's tasks.
    """
    from daemon import watching

    # Live progress needs the daemon: read from a database that nothing changes, it would never end.
    click.get_current_context().meta[_LIVE_ONLY] = True
    tty = sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
    try:
        completed = watching.run(daemon_client(), target, tty, _sleep)
    except KeyboardInterrupt:
        click.echo("")
        return
    if target is not None and not completed:
        raise SystemExit(EXIT_REFUSED)  # as `fredica wait`: a script learns that one did not complete


@command(main)
@click.argument("ids", nargs=-1, required=True)
@click.option("--timeout", type=click.FloatRange(min=0), help="give up after this many seconds (exit 1)")
def wait(ids: tuple[str, ...], timeout: float | None) -> None:
    """Wait until every task named (a run's id: its tasks) has ended.

    One line per task; exit 0 if all completed, 1 otherwise (or when --timeout passes first)."""
    try:
        ended = daemon_client().wait(*ids, timeout=timeout)
    except WaitTimedOut as exc:
        echo_lines([render.ended_line(task) for task in exc.tasks])
        raise
    echo_lines([render.ended_line(task) for task in ended])
    if not render.all_completed(ended):
        raise SystemExit(EXIT_REFUSED)


@main.group("restarts", cls=FredicaGroup, invoke_without_command=True)
@config_option()
@click.option("--all", "show_all", is_flag=True, help="Also the entries dismissed, recreated or superseded.")
@json_option
@click.pass_context
def restarts(ctx: click.Context, show_all: bool, as_json: bool) -> None:
    """The restart log: tasks a daemon restart interrupted.

    Lists the entries awaiting review (all of them with --all); `dismiss` and `recreate` act on them.
    """
    if ctx.invoked_subcommand is not None:
        return
    entries = call("restarts", all=True) if show_all else call("restarts")
    if as_json:
        echo_json(entries)
    elif entries:
        echo_lines(render.restart_table(entries, time.time()))
    else:
        click.echo("no interrupted tasks to review" if not show_all else "the restart log is empty")


@command(main)
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print a completion script for SHELL (bash, zsh or fish).

    Commands, options and choices then complete on Tab. Install it once, e.g. `fredica completion bash > ~/.local/share/bash-completion/completions/fredica`
    (zsh: into a directory on $fpath as `_fredica`; fish: ~/.config/fish/completions/fredica.fish)."""
    from click.shell_completion import get_completion_class

    completer = get_completion_class(shell)
    assert completer is not None  # the choice above lists only the shells click knows
    click.echo(completer(main, {}, "fredica", "_FREDICA_COMPLETE").source())


@command(main)
@click.option("--format", "fmt", type=click.Choice(["csv", "jsonl"]), default="jsonl", show_default=True)
@click.option("--status", "statuses", multiple=True, help="only tasks in this status, stored or as shown: waiting, paused (repeatable)")
@click.option("--run", "run_id", help="only the tasks of this workflow run")
@click.option("-o", "--output", type=click.File("w", encoding="utf-8"), default="-", help="a file (default: stdout)")
def export(fmt: str, statuses: tuple[str, ...], run_id: str | None, output: Any) -> None:
    """Every task as CSV or JSON lines, read from the database itself.

    The database (a SQLite file or a PostgreSQL URL) is opened read-only: the daemon may be
    running, or not. Rows are read a page at a time, from one snapshot. Says on stderr how many
    tasks were written."""
    from daemon import export as exporting  # only here: the store is not for every command

    count = exporting.write(exporting.rows(settings().database, statuses=statuses, run=run_id), output, fmt)
    click.echo(f"{count} tasks exported", err=True)


@command(main)
@json_option
def status(as_json: bool) -> None:
    """Daemon health: pid, uptime, workers, tasks by status."""
    data = call("status")
    if as_json:
        echo_json(data)
    else:
        echo_lines(render.status_lines(data))
    if daemon_down():
        # Said from the database, but still what a script asks `status` for: it is not running.
        raise SystemExit(EXIT_UNREACHABLE)


@command(main, "queues")
@json_option
def list_queues(as_json: bool) -> None:
    """List the queues: workers, busy, waiting, paused."""
    rows = call("queues")
    if as_json:
        echo_json(rows)
    else:
        echo_lines(render.queue_table(rows))


@command(main, "types")
@json_option
def list_types(as_json: bool) -> None:
    """List the executor types: pausable or not, payload keys, what each does."""
    rows = call("types")
    if as_json:
        echo_json(rows)
    else:
        echo_lines(render.type_table(rows))


@command(main, "templates")
@json_option
def list_templates(as_json: bool) -> None:
    """List the workflow templates, with their parameters and descriptions.

    A parameter with a default shows as KEY=default."""
    rows = call("templates")
    if as_json:
        echo_json(rows)
    elif not rows:
        click.echo("no workflow templates are configured", err=True)
    else:
        echo_lines(render.template_table(rows))


@main.group("queue", cls=FredicaGroup)
@config_option()
def queue() -> None:
    """Control one queue: pause, resume, or resize it."""


@command(queue, "pause")
@click.argument("name")
def queue_pause(name: str) -> None:
    """Stop claiming tasks in a queue; its running tasks go on.

    The pause is kept in the database: it lasts across daemon restarts until `queue resume`.
    """
    reply = call("queue_pause", name=name)
    note = "" if reply.get("changed") else " (it already was)"
    click.echo(f"paused queue {name}{note}: running tasks go on, nothing more is claimed (kept across restarts)")


@command(queue, "resume")
@click.argument("name")
def queue_resume(name: str) -> None:
    """Claim tasks in a paused queue again."""
    reply = call("queue_resume", name=name)
    note = "" if reply.get("changed") else " (it was not paused)"
    click.echo(f"resumed queue {name}{note}")


@command(queue, "workers")
@click.argument("name")
@click.argument("workers", type=click.IntRange(min=1), metavar="N")
def queue_workers(name: str, workers: int) -> None:
    """Run up to N tasks at once in a queue, until the daemon stops.

    The config sets the size again at the next start. Fewer workers than it runs stops nothing:
    it claims again once fewer run.
    """
    call("queue_workers", name=name, workers=workers)
    click.echo(f"queue {name} now has {workers} worker{'s' * (workers != 1)} "
               "(until the daemon stops: the config sets it at the next start)")


@command(main, "http-token")
def http_token() -> None:
    """Print the bearer token of the HTTP API and web page ([http] in the config).

    The daemon creates it (0600, in [http] token_file) when it first starts with [http] listen set.
    """
    path = settings().token_file
    try:
        token = path.read_text().strip()
    except FileNotFoundError:
        raise FredicaError(f"no HTTP token in {path} yet: the daemon makes it when it starts with [http] listen set")
    except OSError as exc:
        raise FredicaError(f"cannot read the HTTP token file {path}: {exc.strerror}") from None
    if not token:
        raise FredicaError(f"the HTTP token file {path} is empty")
    click.echo(token)


def _register_acting_commands() -> None:
    """The acting commands (cancel, pause, resume, hold, release, priority, retry, restarts
    dismiss|recreate) and `db` are registered on `main` and `restarts` by their own modules, which
    use this one's helpers: imported once, when first needed (see FredicaGroup)."""
    from daemon import acting_commands, db_commands  # noqa: F401
