"""How the CLI shows things to people: tables, key/value listings, progress bars, log lines.

Pure functions from the daemon's reply data (plain dicts) to lines of text; the CLI prints them.
`now` is passed in where ages are shown, so output is reproducible in tests.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Iterable, Mapping, Sequence

from daemon import models
from daemon.models import DisplayStatus, TaskStatus

TASK_STATUSES = tuple(status.value for status in TaskStatus)
RUN_STATUSES = tuple(status.value for status in models.RunStatus)
FINISHED_RUN_STATUSES = tuple(status.value for status in models.RunStatus
                              if status not in (models.RunStatus.PENDING, models.RunStatus.RUNNING))
# How `fredica wait`'s summary orders what it counts: the ends first, then what is still going.
_SUMMARY_ORDER = (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.RUNNING,
                  DisplayStatus.PAUSED, DisplayStatus.WAITING, DisplayStatus.HELD)
BAR_WIDTH = 20
SHORT_ID = 8


def short_id(full_id: Any) -> str:
    """An id as tables show it: its first 8 characters, a prefix that commands take (SPEC §14)."""
    return "" if full_id is None else str(full_id)[:SHORT_ID]


def one_line(text: str) -> str:
    """`text` on one printable line: what would break it or cannot be printed (a newline, a lone
    surrogate from an undecodable byte of a command line) shown as its escape (`\\n`, `\\udcff`)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode() for c in text)


def display_status(task: Mapping[str, Any]) -> str:
    """The status as people see it (SPEC §3, §14): held, waiting (pending and claimed), paused."""
    return models.display_status(str(task.get("status", "?")), bool(task.get("is_paused")), bool(task.get("is_held")))


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], right: Sequence[str] = ()) -> list[str]:
    """Aligned columns with a header line; columns named in `right` are right-aligned."""
    rows = [list(row) for row in rows]
    widths = [max([len(header)] + [len(row[i]) for row in rows]) for i, header in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = (
            cell.rjust(width) if header in right else cell.ljust(width)
            for cell, width, header in zip(cells, widths, headers)
        )
        return "  ".join(padded).rstrip()

    return [line(headers)] + [line(row) for row in rows]


def age(timestamp: float | None, now: float) -> str:
    """How long ago, in the largest sensible unit: 42s, 5m, 3h, 2d."""
    if timestamp is None:
        return "-"
    seconds = max(0, int(now - timestamp))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def duration(seconds: float) -> str:
    """An uptime: 42s, 5m 03s, 1h 02m, 3d 04h."""
    seconds = max(0, int(seconds))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def when(timestamp: float | None) -> str:
    """A Unix time as local ISO 8601 to the second; "-" for none."""
    if not timestamp:
        return "-"
    return datetime.datetime.fromtimestamp(timestamp).astimezone().isoformat(timespec="seconds")


def percent(progress: Any) -> str:
    return f"{_clamp(progress):3d}%"


def _clamp(progress: Any) -> int:
    try:
        return max(0, min(100, int(progress or 0)))
    except (TypeError, ValueError):
        return 0


def task_table(tasks: Sequence[Mapping[str, Any]], now: float) -> list[str]:
    """`fredica ls`: one row per task, ids cut to 8 characters (any 4+ of them name it again;
    scripts read `--json`)."""
    headers = ["ID", "TYPE", "STATUS", "PROGRESS", "PRI", "RETRIES", "AGE"]
    with_errors = any(task.get("error_type") for task in tasks)
    if with_errors:
        headers.append("ERROR TYPE")
    rows = []
    for task in tasks:
        row = [
            short_id(task.get("id")),
            str(task.get("type")),
            display_status(task),
            percent(task.get("progress")),
            str(task.get("priority", 0)),
            f"{task.get('retry_count', 0)}/{task.get('max_retries', 0)}",
            age(task.get("created_at"), now),
        ]
        if with_errors:
            row.append(task.get("error_type") or "")
        rows.append(row)
    return table(headers, rows, right=("PROGRESS", "PRI", "RETRIES", "AGE"))


def run_table(runs: Sequence[Mapping[str, Any]], now: float) -> list[str]:
    """`fredica runs`: one row per workflow run."""
    rows = [
        [
            short_id(run.get("id")),
            str(run.get("template")),
            str(run.get("status")),
            f"{run.get('done_tasks', 0)}/{run.get('total_tasks', 0)}",
            run.get("material_id") or "-",
            age(run.get("created_at"), now),
        ]
        for run in runs
    ]
    return table(["ID", "TEMPLATE", "STATUS", "DONE", "MATERIAL", "AGE"], rows, right=("DONE", "AGE"))


def restart_table(entries: Sequence[Mapping[str, Any]], now: float) -> list[str]:
    """`fredica restarts`: the tasks that a restart interrupted and what became of them."""
    rows = [
        [
            str(entry.get("id")),
            short_id(entry.get("task_id")),
            str(entry.get("task_type")),
            str(entry.get("status_at_restart")),
            percent(entry.get("progress")),
            str(entry.get("disposition")),
            short_id(entry.get("new_workflow_run_id")) or "-",
            age(entry.get("created_at"), now),
        ]
        for entry in entries
    ]
    headers = ["ID", "TASK", "TYPE", "WAS", "PROGRESS", "DISPOSITION", "NEW RUN", "AGE"]
    return table(headers, rows, right=("ID", "PROGRESS", "AGE"))


def _value(key: str, value: Any) -> str:
    if key.endswith("_at") or key == "not_before":
        return when(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"
    if value is None or value == [] or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if key == "depends_on" and isinstance(value, list):
        return ", ".join(str(item) for item in value)
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return str(value)


def details(obj: Mapping[str, Any], skip: Sequence[str] = ("tasks",)) -> list[str]:
    """`fredica show`: every field as `key: value`, aligned; times as local ISO 8601."""
    keys = [key for key in obj if key not in skip]
    width = max((len(key) for key in keys), default=0) + 1
    lines = []
    for key in keys:
        value = obj[key]
        if key == "payload" and obj.get("payload_refs"):
            from daemon import templates  # only here: the names a template's task refers to

            value = templates.as_written(value)
        text = _value(key, value)
        if key == "status" and "is_paused" in obj and display_status(obj) != obj["status"]:
            text = f"{display_status(obj)} ({obj['status']})"
        lines.append(f"{key + ':':<{width}} {text}")
    return lines


def status_lines(status: Mapping[str, Any]) -> list[str]:
    """`fredica status`: daemon health, one aligned line per fact."""
    counts = dict(status.get("counts") or {})
    held = counts.pop(DisplayStatus.HELD.value, 0)  # of the pending ones
    order = [name for name in TASK_STATUSES] + sorted(set(counts) - set(TASK_STATUSES))
    if "pid" in status and status["pid"] is None:  # read from the database: no daemon runs
        facts = [("daemon", "not running"), ("workers", f"none running ({status.get('max_workers', '?')} configured)")]
    else:
        facts = [
            ("pid", str(status.get("pid", "?"))),
            ("uptime", duration(float(status.get("uptime") or 0))),
            ("workers", f"{status.get('busy_workers', 0)} busy of {status.get('max_workers', '?')}"),
        ]
    shown = [f"{counts.get(name, 0)} {name}" + (f" ({held} held)" if name == TaskStatus.PENDING and held else "")
             for name in order]
    facts.append(("tasks", ", ".join(shown)))
    if status.get("queues"):
        facts.append(("queues", queues_summary(status["queues"])))
    for sup in status.get("supervisors") or ():
        lease = f"lease {sup.get('lease_age', 0):.1f} s old" + (" (expired)" if sup.get("expired") else "")
        facts.append((f"supervisor {sup.get('name')}",
                      f"{sup.get('host')} pid {sup.get('pid')}, {sup.get('busy', 0)} busy, {lease}"))
    if status.get("recovering"):
        facts.append(("state", "recovering (not claiming yet)"))
    if status.get("database_fault"):
        facts.append(("state", str(status["database_fault"])))
    for key in ("version", "database", "socket", "log_dir"):
        if status.get(key) is not None:
            facts.append((key.replace("_", " "), str(status[key])))
    width = max(len(label) for label, _ in facts)
    return [f"{label:<{width}}  {text}" for label, text in facts]


def queues_summary(queues: Mapping[str, Mapping[str, Any]]) -> str:
    """`default 1/2 busy 3 waiting; media 1/1 busy 0 waiting paused`"""
    parts = []
    for name, q in queues.items():
        text = f"{name} {q.get('busy', 0)}/{q.get('workers', '?')} busy {q.get('waiting', 0)} waiting"
        if q.get("held"):
            text += f" {q['held']} held"
        parts.append(text + (" paused" if q.get("paused") else ""))
    return "; ".join(parts)


def queue_table(queues: Sequence[Mapping[str, Any]]) -> list[str]:
    """`fredica queues`: one row per queue."""
    rows = [
        [str(q.get("name")), str(q.get("workers")), str(q.get("busy", 0)), str(q.get("waiting", 0)),
         str(q.get("held", 0)), "paused" if q.get("paused") else "-"]
        for q in queues
    ]
    headers, right = ["QUEUE", "WORKERS", "BUSY", "WAITING", "HELD", "PAUSED"], ("WORKERS", "BUSY", "WAITING", "HELD")
    if any(q.get("prefetch") for q in queues):  # only then: most configs send nothing ahead
        for row, q in zip(rows, queues):
            row.insert(2, str(q.get("prefetch", 0)))
        headers.insert(2, "PREFETCH")
        right += ("PREFETCH",)
    return table(headers, rows, right=right)


def type_table(types: Sequence[Mapping[str, Any]]) -> list[str]:
    """`fredica types`: one row per executor type."""
    rows = [
        [str(t.get("type")), "yes" if t.get("pausable") else "no", ", ".join(t.get("payload_keys") or ()) or "-",
         one_line(str(t.get("doc") or "-"))]
        for t in types
    ]
    return table(["TYPE", "PAUSABLE", "PAYLOAD KEYS", "DOC"], rows)


def template_table(templates: Sequence[Mapping[str, Any]]) -> list[str]:
    """`fredica templates`: one row per template; a parameter with a default shows it."""
    rows = []
    for t in templates:
        defaults = t.get("defaults") or {}
        params = [str(p) for p in t.get("params") or ()] + [f"{k}={v}" for k, v in defaults.items()]
        rows.append([str(t.get("name")), ", ".join(params) or "-", one_line(str(t.get("description") or "-"))])
    return table(["TEMPLATE", "PARAMETERS", "DESCRIPTION"], rows)


def counted(count: int, noun: str) -> str:
    """`1 run`, `12 runs`."""
    return f"{count} {noun}{'s' * (count != 1)}"


def clean_summary(reply: Mapping[str, Any], dry_run: bool = False) -> str:
    """`removed 12 runs, 340 tasks, 338 logs` (`would remove ...` for a dry run)."""
    verb = "would remove" if dry_run else "removed"
    return f"{verb} {counted(reply['runs'], 'run')}, {counted(reply['tasks'], 'task')}, {counted(reply['logs'], 'log')}"


def progress_line(task: Mapping[str, Any]) -> str:
    """`[#########-----------]  45%  TYPE 1a2b3c4d running status text`"""
    progress = _clamp(task.get("progress"))
    filled = round(BAR_WIDTH * progress / 100)
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    words = [str(task.get("type")), short_id(task.get("id")), display_status(task)]
    if task.get("status") in models.TERMINAL_STATUSES:
        words.append(str(task.get("error_type") or ""))  # the last status text is stale by now
    elif task.get("status_text"):
        words.append(str(task["status_text"]))
    return (f"[{bar}] {progress:3d}%  " + " ".join(words)).rstrip()


def ended_line(task: Mapping[str, Any]) -> str:
    """One task's line in `fredica wait`: `3c1d6ff8 SHELL completed`, or its error's first line."""
    line = f"{short_id(task['id'])} {task['type']} {display_status(task)}"
    if task.get("error_type"):
        first = str(task.get("error") or "").splitlines()
        line += f" {task['error_type']}" + (f": {first[0]}" if first else "")
    return line


def all_completed(tasks: Iterable[Mapping[str, Any]]) -> bool:
    """Whether every task completed: the exit status of `wait` and of `watch ID` (0, else 1)."""
    return all(task.get("status") == models.TaskStatus.COMPLETED.value for task in tasks)


def outcome_summary(tasks: Iterable[Mapping[str, Any]]) -> str:
    """`watched 3 tasks: 2 completed, 1 failed`"""
    counts: dict[str, int] = {}
    for task in tasks:
        name = display_status(task)
        counts[name] = counts.get(name, 0) + 1
    return counts_summary(counts)


def counts_summary(counts: Mapping[str, int]) -> str:
    """`watched 3 tasks: 2 completed, 1 failed` from the counts by status as people see them."""
    counts = {name: n for name, n in counts.items() if n}
    if not counts:
        return "nothing to watch"
    order = _SUMMARY_ORDER
    names = sorted(counts, key=lambda name: order.index(name) if name in order else len(order))
    total = sum(counts.values())
    return f"watched {total} task{'s' * (total != 1)}: " + ", ".join(f"{counts[n]} {n}" for n in names)


def _log_value(value: Any) -> str:
    if isinstance(value, str):
        if value and not any(ch.isspace() or ch in '"=' for ch in value):
            return value
        return json.dumps(value, ensure_ascii=False)
    return json.dumps(value, ensure_ascii=False, default=str)


def _log_time(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.datetime.fromtimestamp(value).astimezone().isoformat(timespec="milliseconds")
    return str(value)


def log_line(raw: str) -> str:
    """A daemon log line (structlog JSON) as `<time> <level> <event> key=value ...`.

    Lines that are not JSON objects (a crash's traceback, say) are shown as they are; an
    `exception` field is shown below its line, indented.
    """
    try:
        record = json.loads(raw)
    except ValueError:
        return raw
    if not isinstance(record, dict):
        return raw
    record = dict(record)
    head = [
        _log_time(record.pop("timestamp", "")),
        f"{str(record.pop('level', '')):<7}",
        str(record.pop("event", "")),
    ]
    exception = record.pop("exception", None)
    fields = [f"{key}={_log_value(value)}" for key, value in record.items()]
    line = " ".join([part for part in head if part.strip()] + fields)
    if exception:
        if not isinstance(exception, str):  # structlog's dict_tracebacks
            exception = json.dumps(exception, ensure_ascii=False, indent=2)
        line += "\n" + "\n".join("    " + part for part in exception.rstrip("\n").splitlines())
    return line
