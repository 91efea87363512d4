"""Workflow templates: named DAGs in the config that `fredica run NAME --set key=value` starts.

```toml
[templates.download_and_transcode]
params = ["url", "name"]                  # required with --set
defaults = { dir = "/srv/media" }         # optional params and their values

[templates.download_and_transcode.tasks.download]
type = "DOWNLOAD"
payload = { url = "{url}", output = "{dir}/{name}.source" }
max_retries = 3

[templates.download_and_transcode.tasks.transcode]
type = "TRANSCODE_MP4"
depends_on = ["download"]
payload = { input = "{download.output}", output = "{dir}/{name}.mp4" }
```

String values of a payload may hold placeholders: `{param}` is filled when the run starts;
`{task.key.path}` names a field of the result of `task`, one of this task's dependencies, and is
filled when the task is dispatched (stored as `{@N-task.key.path}` until then, N being the
position of that dependency in `depends_on`: a position survives a dependency resolved to an
existing task by its idempotency key, where a name or a new id would not; so a task lists each
dependency once. The name is kept beside it only to show the payload as it was written
(`as_written`); tasks stored before it was kept have `{@N.key.path}`). Only such a task's payload is read for `{@...}` at dispatch (`payload_refs`): a payload
submitted as it is, or a parameter's value, is never taken for a placeholder. `{{` and `}}`
stand for literal braces. An `idempotency_key` may use parameters, never results (the key must
be known when the run is submitted). Everything is checked when the config loads.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Container, Mapping, Sequence

from daemon.errors import TemplateError  # noqa: F401 (re-exported: this module's errors live in the catalogue)
from daemon.submission import SubmissionRefused, TaskSpec, parse_spec

PLACEHOLDER = re.compile(r"\{\{|\}\}|\{(@?[\w-]+(?:\.[\w-]+)*)\}")
TEMPLATE_KEYS = {"description", "params", "defaults", "tasks"}
TASK_KEYS = {"type", "payload", "depends_on", "priority", "max_retries", "timeout", "idempotency_key", "queue"}



@dataclasses.dataclass(frozen=True)
class TemplateTask:
    name: str
    spec: TaskSpec  # payload and idempotency key still hold placeholders


@dataclasses.dataclass(frozen=True)
class Template:
    name: str
    description: str
    params: tuple[str, ...]
    defaults: Mapping[str, str]
    tasks: tuple[TemplateTask, ...]  # dependencies first

    def instantiate(self, values: Mapping[str, str]) -> list[TaskSpec]:
        """Task specs for one run, params filled in and results referenced by dependency position."""
        unknown = sorted(set(values) - set(self.params) - set(self.defaults))
        if unknown:
            raise TemplateError(f"template {self.name} has no parameter {', '.join(unknown)}")
        missing = [p for p in self.params if p not in values]
        if missing:
            raise TemplateError(
                f"template {self.name} needs " + ", ".join(f"--set {p}=VALUE" for p in missing)
            )
        params = {**self.defaults, **values}
        specs = []
        for t in self.tasks:
            deps = list(t.spec.depends_on)
            fill = lambda text, deps=deps: _fill_params(text, params, deps)  # noqa: E731
            payload = _map_strings(t.spec.payload, fill)
            refs = any(p.startswith("@") for p in placeholders(payload))
            if not refs:
                payload = _map_strings(payload, _unescape)  # nothing left for dispatch to fill
            key = t.spec.idempotency_key
            specs.append(
                dataclasses.replace(
                    t.spec, key=t.name, payload=payload, idempotency_key=_unescape(fill(key)) if key else None,
                    payload_refs=refs,
                )
            )
        return specs


def _map_strings(value: Any, fn: Any) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, list):
        return [_map_strings(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _map_strings(v, fn) for k, v in value.items()}
    return value


def placeholders(value: Any) -> set[str]:
    """Every placeholder name in the strings of `value`."""
    found: set[str] = set()
    _map_strings(value, lambda text: found.update(m.group(1) for m in PLACEHOLDER.finditer(text) if m.group(1)))
    return found


def _unescape(text: str) -> str:
    return PLACEHOLDER.sub(lambda m: m.group(0)[0] if m.group(1) is None else m.group(0), text)


def _fill_params(text: str, params: Mapping[str, str], deps: list[str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return match.group(0)  # keep {{ and }} escaped until dispatch
        head, _, rest = name.partition(".")
        if rest:  # an upstream result, filled at dispatch
            return "{@" + f"{deps.index(head)}-{head}" + "." + rest + "}"
        return str(params[name]).replace("{", "{{").replace("}", "}}")

    return PLACEHOLDER.sub(replace, text)


def resolve_results(
    payload: Mapping[str, Any], depends_on: Sequence[str], upstream: Mapping[str, Any]
) -> dict[str, Any]:
    """Fill `{@N.path}` placeholders from the result of dependency N, at dispatch.

    A placeholder that is the whole string keeps the result's type (a number stays a number).
    Raises SubmissionRefused (a PAYLOAD_ERROR for the task) when a result lacks the field.
    """

    def lookup(name: str) -> Any:
        position, _, path = name[1:].partition(".")
        position = position.partition("-")[0]  # the name after it is for people (`as_written`)
        if not position.isdigit() or int(position) >= len(depends_on):
            raise SubmissionRefused(f"{{{name}}} names no dependency of the task")
        task_id = depends_on[int(position)]
        value: Any = upstream.get(task_id)
        for part in path.split("."):
            if not isinstance(value, Mapping) or part not in value:
                raise SubmissionRefused(f"the result of dependency {task_id} has no field {path!r}")
            value = value[part]
        return value

    def fill(text: str) -> Any:
        whole = PLACEHOLDER.fullmatch(text)
        if whole and whole.group(1) and whole.group(1).startswith("@"):
            return lookup(whole.group(1))

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name is None:
                return match.group(0)[0]
            return str(lookup(name)) if name.startswith("@") else match.group(0)

        return PLACEHOLDER.sub(replace, text)

    if not any(p.startswith("@") for p in placeholders(payload)):
        return dict(payload)
    return _map_strings(dict(payload), fill)


def as_written(payload: Any) -> Any:
    """A stored payload as its template wrote it: `{@0-download.output}` is shown as
    `{download.output}` (one stored without the name keeps its `{@0.output}`)."""

    def show(text: str) -> str:
        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name is None or not name.startswith("@"):
                return match.group(0)
            position, dash, rest = name[1:].partition("-")
            return "{" + rest + "}" if dash and position.isdigit() else match.group(0)

        return PLACEHOLDER.sub(replace, text)

    return _map_strings(payload, show)


def parse_all(data: Mapping[str, Any]) -> dict[str, Template]:
    """Every `[templates.NAME]` table, validated; TemplateError names the template and the problem."""
    return {name: parse(name, body) for name, body in data.items()}


def check_task_types(templates: Mapping[str, Template], known_types: Container[str]) -> None:
    """Refuse templates naming a task type no executor handles (known once executors are loaded)."""
    for template in templates.values():
        for task in template.tasks:
            if task.spec.type not in known_types:
                raise TemplateError(
                    f"template {template.name}, task {task.name}: no executor for type {task.spec.type}"
                )


def parse(name: str, body: Any) -> Template:
    where = f"template {name}"
    if not isinstance(body, Mapping):
        raise TemplateError(f"{where} must be a table")
    unknown = sorted(set(body) - TEMPLATE_KEYS)
    if unknown:
        raise TemplateError(f"{where}: unknown key(s) {', '.join(unknown)}")
    params = body.get("params", [])
    defaults = body.get("defaults", {})
    if not isinstance(params, list) or not all(isinstance(p, str) for p in params):
        raise TemplateError(f"{where}: params must be a list of names")
    if not isinstance(defaults, Mapping) or not all(isinstance(v, (str, int, float)) for v in defaults.values()):
        raise TemplateError(f"{where}: defaults must map names to strings or numbers")
    raw_tasks = body.get("tasks")
    if not isinstance(raw_tasks, Mapping) or not raw_tasks:
        raise TemplateError(f"{where} has no tasks")
    parsed: dict[str, tuple[TaskSpec, list[str]]] = {}
    for task_name, task in raw_tasks.items():
        if not isinstance(task, Mapping):
            raise TemplateError(f"{where}, task {task_name}: must be a table")
        extra = sorted(set(task) - TASK_KEYS)
        if extra:
            raise TemplateError(f"{where}, task {task_name}: unknown key(s) {', '.join(extra)}")
        deps = task.get("depends_on", [])
        try:
            spec = parse_spec({k: v for k, v in task.items() if k != "depends_on"})
        except SubmissionRefused as exc:
            raise TemplateError(f"{where}, task {task_name}: {exc.message}") from None
        if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
            raise TemplateError(f"{where}, task {task_name}: depends_on must be a list of task names")
        if len(set(deps)) != len(deps):
            raise TemplateError(f"{where}, task {task_name}: depends_on names a task twice")
        for dep in deps:
            if dep not in raw_tasks:
                raise TemplateError(f"{where}, task {task_name}: depends on unknown task {dep!r}")
            if dep == task_name:
                raise TemplateError(f"{where}, task {task_name}: depends on itself")
        for placeholder in placeholders(spec.idempotency_key or ""):
            if "." in placeholder:
                # Filled only at dispatch: every run would share the key's unfilled text.
                raise TemplateError(
                    f"{where}, task {task_name}: idempotency_key cannot use {{{placeholder}}}: "
                    "the key must be known when the run is submitted (use parameters)"
                )
        for placeholder in placeholders([spec.payload, spec.idempotency_key or ""]):
            head, dot, _ = placeholder.partition(".")
            if placeholder.startswith("@"):
                raise TemplateError(f"{where}, task {task_name}: {{{placeholder}}} is reserved")
            if dot and head not in deps:
                raise TemplateError(
                    f"{where}, task {task_name}: {{{placeholder}}} refers to {head!r}, which is not one of its dependencies"
                )
            if not dot and head not in params and head not in defaults:
                raise TemplateError(
                    f"{where}, task {task_name}: parameter {{{head}}} is not declared in params or defaults"
                )
        parsed[task_name] = (dataclasses.replace(spec, depends_on=tuple(deps)), deps)
    ordered = _dependencies_first(where, {n: deps for n, (_, deps) in parsed.items()})
    return Template(
        name=name,
        description=str(body.get("description", "")),
        params=tuple(params),
        defaults={k: str(v) for k, v in defaults.items()},
        tasks=tuple(TemplateTask(n, parsed[n][0]) for n in ordered),
    )


def _dependencies_first(where: str, graph: Mapping[str, list[str]]) -> list[str]:
    ordered: list[str] = []
    state: dict[str, str] = {}

    def visit(node: str, path: tuple[str, ...]) -> None:
        if state.get(node) == "done":
            return
        if state.get(node) == "visiting":
            raise TemplateError(f"{where}: dependency cycle {' -> '.join((*path, node))}")
        state[node] = "visiting"
        for dep in graph[node]:
            visit(dep, (*path, node))
        state[node] = "done"
        ordered.append(node)

    for node in graph:
        visit(node, ())
    return ordered
