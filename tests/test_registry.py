"""The executor registry: config references, entry points, and clear errors for bad references."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest

from daemon.errors import FredicaError
from executors import registry
from executors.registry import ExecutorConfigError, Registry
from tests import sample_executors


def source_of(reg: Registry, task_type: str) -> str:
    """Where `task_type`'s executor was registered from (only tests ask: the daemon needs its
    ref and kind, `Registry.ref` and `runs_in_event_loop`)."""
    return reg._registrations[task_type].source


def fake_entry_points(monkeypatch: pytest.MonkeyPatch, *specs: tuple[str, str]) -> list[str]:
    """Make `importlib.metadata.entry_points(group=...)` return `specs` as (name, value)."""
    groups: list[str] = []

    def entry_points(**kwargs: Any) -> list[importlib.metadata.EntryPoint]:
        groups.append(kwargs["group"])
        return [importlib.metadata.EntryPoint(name, value, kwargs["group"]) for name, value in specs]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    return groups


def test_config_references_map_types_to_classes_and_refs() -> None:
    reg = Registry.from_config(
        {"ECHO": "tests.sample_executors:Echo", "COUNT": " tests.sample_executors : Counter "},
        entry_points=False,
        builtins=False,
    )
    assert list(reg) == ["COUNT", "ECHO"] and len(reg) == 2 and "ECHO" in reg
    assert reg.ref("ECHO") == "tests.sample_executors:Echo"
    assert reg.ref("COUNT") == "tests.sample_executors:Counter"
    echo = reg.get("ECHO")
    assert isinstance(echo, sample_executors.Echo)
    assert reg.get("ECHO") is echo  # one cached instance per type
    assert reg.get("COUNT").pausable is True
    assert reg.get("UNKNOWN") is None
    with pytest.raises(KeyError):
        reg.ref("UNKNOWN")


def test_the_child_can_load_what_the_registry_accepted() -> None:
    reg = Registry.from_config({"ECHO": "tests.sample_executors:Echo"}, entry_points=False, builtins=False)
    assert registry.load_class(reg.ref("ECHO")) is sample_executors.Echo


def test_entry_points_are_read_from_the_fredica_group(monkeypatch: pytest.MonkeyPatch) -> None:
    groups = fake_entry_points(
        monkeypatch,
        ("ECHO", "tests.sample_executors:Echo"),
        ("FLOOD", "tests.sample_executors:Flood [fast]"),
    )
    reg = Registry.from_config({})
    assert groups == ["fredica.executors"]
    assert reg.ref("ECHO") == "tests.sample_executors:Echo"
    assert reg.ref("FLOOD") == "tests.sample_executors:Flood"  # extras are not part of the reference
    assert source_of(reg, "ECHO") == "entry point"


def test_the_config_overrides_entry_points_without_importing_them(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_entry_points(monkeypatch, ("ECHO", "broken_plugin_that_does_not_exist:Echo"))
    reg = Registry.from_config({"ECHO": "tests.sample_executors:Echo"})
    assert reg.ref("ECHO") == "tests.sample_executors:Echo"
    assert source_of(reg, "ECHO") == "config"


def test_two_entry_points_for_one_type_are_refused_unless_the_config_chooses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_entry_points(
        monkeypatch, ("ECHO", "tests.sample_executors:Echo"), ("ECHO", "other_plugin:Echo"),
        ("ECHO", "tests.sample_executors:Echo"),  # the same one twice is no conflict
    )
    with pytest.raises(ExecutorConfigError, match=r"ECHO: registered by several entry points .*other_plugin:Echo"):
        Registry.from_config({})
    assert Registry.from_config({"ECHO": "tests.sample_executors:Echo"}).ref("ECHO") == "tests.sample_executors:Echo"


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("tests.sample_executors", 'must look like "package.module:Class"'),
        ("tests.sample_executors:", 'must look like "package.module:Class"'),
        (":Echo", 'must look like "package.module:Class"'),
        ("a:b:c", 'must look like "package.module:Class"'),
        ("tests.no_such_module:Echo", "cannot import module 'tests.no_such_module' (ModuleNotFoundError"),
        ("tests.sample_executors:Missing", "module 'tests.sample_executors' has no attribute 'Missing'"),
        ("tests.sample_executors:NotAnExecutor", "is not a subclass of executors.base.TaskExecutor"),
        ("tests.sample_executors:write_atomically", "is not a subclass of executors.base.TaskExecutor"),
        ("tests.sample_executors:Counter", "declares task_type = 'COUNT', not 'ECHO'"),
        ("executors.base:TaskExecutor", "declares task_type = None, not 'ECHO'"),
    ],
)
def test_bad_references_give_clear_errors(ref: str, message: str) -> None:
    with pytest.raises(ExecutorConfigError) as info:
        Registry.from_config({"ECHO": ref}, entry_points=False, builtins=False)
    assert isinstance(info.value, FredicaError)
    assert info.value.message.startswith("ECHO (config): ")
    assert message in info.value.message


def test_a_module_that_fails_to_import_is_reported_with_its_error(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "exploding_executor.py").write_text("raise RuntimeError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ExecutorConfigError, match=r"cannot import module 'exploding_executor' \(RuntimeError: no GPU here\)"):
        Registry.from_config({"GPU": "exploding_executor:Gpu"}, entry_points=False, builtins=False)


def test_a_bad_entry_point_names_its_source(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_entry_points(monkeypatch, ("ECHO", "tests.sample_executors:Missing"))
    with pytest.raises(ExecutorConfigError, match=r"^ECHO \(entry point\): .*has no attribute 'Missing'"):
        Registry.from_config({})


def test_a_constructor_that_fails_is_a_config_error(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "picky_executor.py").write_text(
        "from executors.base import TaskExecutor\n"
        "class Picky(TaskExecutor):\n"
        "    task_type = 'PICKY'\n"
        "    def __init__(self):\n"
        "        raise OSError('no config file')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    # When the registry is built, that is when the daemon starts: not at the first task of the type.
    with pytest.raises(ExecutorConfigError, match=r"PICKY \(config\): cannot create picky_executor:Picky\(\) \(OSError: no config file\)"):
        Registry.from_config({"PICKY": "picky_executor:Picky"}, entry_points=False, builtins=False)


def test_the_built_in_executors_are_registered_and_can_be_overridden() -> None:
    reg = Registry.from_config({}, entry_points=False)
    assert {"SHELL", "DOWNLOAD", "TRANSCODE_MP4"} <= set(reg)
    assert source_of(reg, "SHELL") == "built-in"
    assert reg.get("TRANSCODE_MP4").pausable
    overridden = Registry.from_config({"SHELL": "tests.test_shell:QuickKillShell"}, entry_points=False)
    assert overridden.ref("SHELL") == "tests.test_shell:QuickKillShell"
