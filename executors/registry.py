"""Which executor runs which task type: from the config's `[executors]` and the entry points.

An executor is named by a "module:Class" reference so the subprocess can import it by itself (the
supervisor never pickles executor classes or instances). Every reference is checked when the
registry is built, so a typo stops the daemon at startup with a clear message instead of failing
each task of that type later.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import sys
from typing import Iterator, Mapping

from daemon.errors import ExecutorConfigError  # noqa: F401 (re-exported: this module's errors live in the catalogue)
from executors.base import TaskExecutor

ENTRY_POINT_GROUP = "fredica.executors"



def normalise_ref(ref: str) -> str:
    """ "package.module:Class" without stray spaces; ExecutorConfigError if it is not of that shape."""
    module_name, sep, qualname = ref.partition(":")
    module_name, qualname = module_name.strip(), qualname.strip()
    if not sep or not module_name or not qualname or ":" in qualname:
        raise ExecutorConfigError(f'executor reference {ref!r} must look like "package.module:Class"')
    return f"{module_name}:{qualname}"


def load_class(ref: str) -> type[TaskExecutor]:
    """Import the TaskExecutor subclass named by "package.module:Class" (the class may be dotted)."""
    module_name, _, qualname = normalise_ref(ref).partition(":")
    try:
        # Looked up first: in an executor process the module is nearly always preloaded, and
        # import_module's machinery would cost a fresh fork a page fault per object it touches.
        module = sys.modules.get(module_name) or importlib.import_module(module_name)
    except Exception as exc:  # any error while importing user code is a bad reference
        raise ExecutorConfigError(
            f"executor reference {ref!r}: cannot import module {module_name!r} "
            f"({type(exc).__name__}: {exc})"
        ) from exc
    obj: object = module
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ExecutorConfigError(
                f"executor reference {ref!r}: module {module_name!r} has no attribute {qualname!r}"
            ) from None
    if not (isinstance(obj, type) and issubclass(obj, TaskExecutor)):
        raise ExecutorConfigError(
            f"executor reference {ref!r} is not a subclass of executors.base.TaskExecutor"
        )
    return obj


BUILTINS = {
    "SHELL": "executors.shell:ShellExecutor",
    "DOWNLOAD": "executors.download:DownloadExecutor",
    "TRANSCODE_MP4": "executors.transcode:TranscodeExecutor",
    "HTTP_REQUEST": "executors.http_request:HttpRequestExecutor",  # an event-loop executor
}


@dataclasses.dataclass(frozen=True)
class Registration:
    """One task type's executor: its class, the reference it was loaded from, and where that came from."""

    task_type: str
    ref: str
    cls: type[TaskExecutor]
    source: str  # "built-in", "config" or "entry point <distribution>"


class Registry:
    """Maps task types to executor classes; hands out one cached instance per type."""

    def __init__(self) -> None:
        self._registrations: dict[str, Registration] = {}
        self._instances: dict[str, TaskExecutor] = {}

    @classmethod
    def from_config(
        cls, config: Mapping[str, str] | None = None, *, entry_points: bool = True, builtins: bool = True
    ) -> Registry:
        """The registry for a daemon: the built-ins, then entry points, then `[executors]`; each
        later source overrides the earlier ones for the same task type."""
        config = dict(config or {})
        refs: dict[str, tuple[str, str]] = {
            task_type: (ref, "built-in")
            for task_type, ref in (BUILTINS if builtins else {}).items()
            if task_type not in config
        }
        if entry_points:
            for task_type, candidates in _entry_point_refs().items():
                if task_type in config:
                    continue
                if len(candidates) > 1:
                    # Two plugins claiming one type: picking either silently would be a surprise.
                    listed = " and ".join(f"{ref} ({source})" for ref, source in candidates)
                    raise ExecutorConfigError(
                        f"{task_type}: registered by several entry points ({listed}); "
                        f"choose one in the config's [executors]"
                    )
                refs[task_type] = candidates[0]
        for task_type, ref in config.items():
            refs[task_type] = (ref, "config")
        registry = cls()
        # Only the references that survived the override are imported: a config entry can replace a
        # broken plugin's executor without the plugin stopping the daemon.
        for task_type, (ref, source) in refs.items():
            registry.add(task_type, ref, source=source)
        return registry

    def add(self, task_type: str, ref: str, *, source: str = "config") -> Registration:
        """Register the executor named by `ref` for `task_type`; raises ExecutorConfigError if bad."""
        if not isinstance(task_type, str) or not task_type:
            raise ExecutorConfigError(f"executor task type {task_type!r} must be a non-empty string")
        if not isinstance(ref, str):
            raise ExecutorConfigError(f"executor reference for {task_type} must be a string, not {ref!r}")
        try:
            executor_cls = load_class(ref)
        except ExecutorConfigError as exc:
            raise ExecutorConfigError(f"{task_type} ({source}): {exc.message}") from exc.__cause__
        declared = getattr(executor_cls, "task_type", None)
        if declared != task_type:
            raise ExecutorConfigError(
                f"{task_type} ({source}): {ref} declares task_type = {declared!r}, not {task_type!r}"
            )
        registration = Registration(task_type, normalise_ref(ref), executor_cls, source)
        # Made now, once: a constructor that fails (a tool missing) stops the daemon at start with
        # one line, rather than crash every task of the type, or recovery's hooks, later.
        try:
            instance = executor_cls()
        except Exception as exc:
            raise ExecutorConfigError(
                f"{task_type} ({source}): cannot create {registration.ref}() ({type(exc).__name__}: {exc})"
            ) from exc
        self._registrations[task_type] = registration
        self._instances[task_type] = instance
        return registration

    def get(self, task_type: str) -> TaskExecutor | None:
        """The executor instance for `task_type`, or None if none is registered."""
        return self._instances.get(task_type)

    def registration(self, task_type: str) -> Registration:
        """`task_type`'s registration: its class, reference and source (KeyError if none)."""
        return self._registrations[task_type]

    def ref(self, task_type: str) -> str:
        """The "module:Class" reference the subprocess imports for `task_type` (KeyError if none)."""
        return self._registrations[task_type].ref

    def runs_in_event_loop(self, task_type: str) -> bool:
        """Whether `task_type`'s executor is an event-loop one (`async def execute`): its
        attempts go to an event-loop executor process (KeyError if none is registered)."""
        return self._registrations[task_type].cls.runs_in_event_loop()

    def __contains__(self, task_type: object) -> bool:
        return task_type in self._registrations

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._registrations))

    def __len__(self) -> int:
        return len(self._registrations)


def _entry_point_refs() -> dict[str, list[tuple[str, str]]]:
    """{task type: [(reference, source), ...]} from the installed distributions' entry points."""
    found: dict[str, list[tuple[str, str]]] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        # ep.value may carry " [extras]"; module and attr are the reference proper.
        ref = f"{ep.module}:{ep.attr}" if ep.attr else ep.value
        dist = getattr(ep, "dist", None)
        source = f"entry point of {dist.name}" if dist is not None else "entry point"
        candidates = found.setdefault(ep.name, [])
        # The same distribution seen twice on sys.path is not a conflict.
        if all(ref != known for known, _ in candidates):
            candidates.append((ref, source))
    return found
