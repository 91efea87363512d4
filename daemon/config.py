"""Typed settings from TOML, validated once. The built-in defaults live here and nowhere else.

Lookup order for the file: `--config`, `$FREDICA_CONFIG`, `~/.config/fredica/config.toml`,
`/etc/fredica/config.toml`; with none of them the defaults apply. Paths default to the user's XDG
directories, or to `$STATE_DIRECTORY` / `$RUNTIME_DIRECTORY` when systemd sets them.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import socket
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from daemon import durations, queues
from daemon.store import backend
from daemon.errors import ConfigError, FredicaError  # noqa: F401 (ConfigError re-exported: this module's errors live in the catalogue)

if TYPE_CHECKING:  # imported only by a config that has templates: `fredica status` reads most configs
    from daemon import templates



def _state_dir(env: Mapping[str, str]) -> Path:
    if env.get("STATE_DIRECTORY"):
        # systemd may pass several colon-separated directories; the first is ours.
        return Path(env["STATE_DIRECTORY"].split(":")[0])
    base = env.get("XDG_STATE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".local" / "state")
    return Path(base) / "fredica"


def _runtime_dir(env: Mapping[str, str]) -> Path:
    if env.get("RUNTIME_DIRECTORY"):
        return Path(env["RUNTIME_DIRECTORY"].split(":")[0])
    if env.get("XDG_RUNTIME_DIR"):
        return Path(env["XDG_RUNTIME_DIR"]) / "fredica"
    return _state_dir(env) / "run"


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything the daemon reads from its config file."""

    database: Path | str  # a SQLite file, or a PostgreSQL URL (str: SPEC §16)
    socket: Path
    log_dir: Path
    max_workers: int = 4
    poll_interval: float = 1.0
    idle_poll_interval: float = 5.0
    cancel_grace: float = 10.0
    shutdown_grace: float = 30.0
    request_timeout: float = 5.0
    start_method: str = "forkserver"
    synchronous: str = "normal"
    progress_interval: float = 0.5
    heartbeat_interval: float = 5.0
    # SPEC §16, on PostgreSQL: this supervisor's name among those sharing the queue, and how long
    # its lease (renewed every heartbeat_interval) stays valid without a renewal.
    name: str = dataclasses.field(default_factory=socket.gethostname)
    lease_timeout: float = 30.0
    warm_spare: bool = True
    tasks_per_process: int = 1
    idle_process_timeout: float = 60.0
    max_result_bytes: int = 1024 * 1024
    max_task_log_bytes: int = 64 * 1024 * 1024
    # Seconds a finished run is kept before the hourly pass removes it (0: kept for ever). A month
    # lets people look back at what ran while the database and tasks/*.log stay bounded.
    keep_finished: float = 30 * 86400.0
    # PostgreSQL (SPEC §16): supervisors wake each other with LISTEN/NOTIFY; off behind a pooler
    # that passes no LISTEN (PgBouncer in transaction mode), where they only poll.
    notify: bool = True
    # PostgreSQL: seconds a round trip may wait for the server's answer before the session is
    # given up as lost (a frozen host, a network dropping packets), and ridden out as an outage.
    database_answer_timeout: float = 60.0
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    executors: Mapping[str, str] = dataclasses.field(default_factory=dict)
    templates: Mapping[str, templates.Template] = dataclasses.field(default_factory=dict)
    # The [queues.NAME] tables (`default` only with its event-loop settings); `all_queues` has every queue.
    queues: Mapping[str, queues.QueueConfig] = dataclasses.field(default_factory=dict)
    # [http] (SPEC §17): "host:port" to serve the API, page and metrics on; None keeps it off.
    http_listen: tuple[str, int] | None = None
    http_token_file: Path | None = None  # None: `http-token` beside the database
    source: Path | None = None

    @classmethod
    def defaults(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        state = _state_dir(env)
        return cls(
            database=state / "fredica.db",
            socket=_runtime_dir(env) / "control.sock",
            log_dir=state / "logs",
        )

    @property
    def all_queues(self) -> dict[str, queues.QueueConfig]:
        """Every queue, `default` first (with max_workers workers)."""
        return queues.with_default(self.queues, self.max_workers)

    def task_log(self, task_id: str) -> Path:
        return self.log_dir / "tasks" / f"{task_id}.log"

    @property
    def daemon_log(self) -> Path:
        return self.log_dir / "daemon.log"

    @property
    def token_file(self) -> Path:
        """Where the HTTP API's bearer token is kept (SPEC §17)."""
        if self.http_token_file is not None:
            return self.http_token_file
        assert isinstance(self.database, Path)  # a URL's default is set by `from_mapping`
        return self.database.parent / "http-token"


def _is_duration(text: str) -> bool:
    try:
        durations.parse(text)
    except durations.BadDuration:
        return False
    return True


# key → (type check, extra check, message for the check)
_POSITIVE = (lambda v: v > 0, "must be greater than 0")
# The loop's fallback sleep: poll(2) takes no more than ~24 days, and an hour is already plenty.
_POLL = (lambda v: 0 < v <= 3600, "must be greater than 0 and at most 3600 (seconds)")
_NON_NEGATIVE = (lambda v: v >= 0, "must be 0 or more")
DAEMON_KEYS: dict[str, tuple[type | tuple[type, ...], tuple[Any, str] | None]] = {
    "database": (str, None),
    "socket": (str, None),
    "log_dir": (str, None),
    "max_workers": (int, (lambda v: 1 <= v <= 1024, "must be between 1 and 1024")),
    "poll_interval": ((int, float), _POLL),
    "idle_poll_interval": ((int, float), _POLL),
    "cancel_grace": ((int, float), _NON_NEGATIVE),
    "shutdown_grace": ((int, float), _NON_NEGATIVE),
    "request_timeout": ((int, float), _POSITIVE),
    "start_method": (str, (lambda v: v in ("forkserver", "spawn"), 'must be "forkserver" or "spawn"')),
    "synchronous": (str, (lambda v: v.lower() in ("normal", "full"), 'must be "normal" or "full"')),
    "progress_interval": ((int, float), _NON_NEGATIVE),
    "heartbeat_interval": ((int, float), _POSITIVE),
    "name": (str, (lambda v: 0 < len(v) <= 200 and v.isprintable() and v.strip() == v,
                   "must be 1 to 200 printable characters, without spaces around them")),
    "lease_timeout": ((int, float), _POSITIVE),
    "warm_spare": (bool, None),
    "tasks_per_process": (int, (lambda v: 1 <= v <= 1_000_000, "must be between 1 and 1000000")),
    "idle_process_timeout": ((int, float), _POSITIVE),
    # A result is for other tasks to read, not a way to move data: 16 MiB keeps its message far
    # below the status channel's hard limit.
    "max_result_bytes": (int, (lambda v: 1 <= v <= 16 * 1024 * 1024, "must be between 1 and 16777216")),
    "max_task_log_bytes": (int, (lambda v: v >= 64 * 1024, "must be at least 65536")),
    "keep_finished": (str, (lambda v: _is_duration(v), 'must be a duration like "30d", "12h" or "0" (keep everything)')),
    "notify": (bool, None),
    "database_answer_timeout": ((int, float), _POSITIVE),
}
RETRY_KEYS = {
    "backoff_base": ((int, float), _NON_NEGATIVE),
    "backoff_max": ((int, float), _NON_NEGATIVE),
}
SECTIONS = {"daemon", "retry", "executors", "templates", "queues", "http"}
HTTP_KEYS = {"listen": (str, None), "token_file": (str, None)}


def parse_listen(text: str) -> tuple[str, int]:
    """("host", port) from "host:port" ("[::1]:8765" for IPv6); ConfigError naming the value."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f'[http] listen must look like "127.0.0.1:8765", not {text!r}')
    return host, int(port)


def _http_values(table: Any, env: Mapping[str, str], source: Path | None) -> dict[str, Any]:
    if not isinstance(table, Mapping):
        raise ConfigError("[http] must be a table")
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in HTTP_KEYS:
            raise ConfigError(f"[http] unknown key {key!r}")
        _check("http", key, value, HTTP_KEYS[key])
    if "listen" in table:
        values["http_listen"] = parse_listen(table["listen"])
    if "token_file" in table:
        values["http_token_file"] = _path("token_file", table["token_file"], env, source, section="http")
    return values


def _check(section: str, key: str, value: Any, spec: tuple[Any, Any]) -> Any:
    kind, extra = spec
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        noun = {int: "an integer", str: "a string", bool: "true or false"}.get(kind, "a number")  # type: ignore[call-overload]
        raise ConfigError(f"[{section}] {key} must be {noun}, not {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"[{section}] {key} must be a finite number")
    if extra is not None and not extra[0](value):
        raise ConfigError(f"[{section}] {key} {extra[1]}, not {value!r}")
    return float(value) if kind == (int, float) else value


_VARIABLE = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _path(key: str, text: str, env: Mapping[str, str], source: Path | None, section: str = "daemon") -> Path:
    """A path from the config: $VARIABLES and ~ expanded; a relative one is relative to the config
    file (never to whatever directory the daemon or a CLI command happens to run in)."""
    if not text.strip():
        raise ConfigError(f"[{section}] {key} must not be empty")

    def value_of(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if not env.get(name):
            raise ConfigError(f"[{section}] {key} uses ${name}, which is not set here")
        return env[name].split(":")[0] if name.endswith("_DIRECTORY") else env[name]  # systemd may list several

    path = Path(_VARIABLE.sub(value_of, text)).expanduser()
    if "\0" in str(path):
        raise ConfigError(f"[{section}] {key} must not contain a NUL character")
    if not path.is_absolute():
        if source is None:
            raise ConfigError(f"[{section}] {key} must be an absolute path, not {text!r}")
        path = source.resolve().parent / path
    return path


def from_mapping(data: Mapping[str, Any], *, env: Mapping[str, str] | None = None, source: Path | None = None) -> Settings:
    """Settings from parsed TOML; unknown sections or keys and bad values raise ConfigError."""
    base = Settings.defaults(env)
    unknown = sorted(set(data) - SECTIONS)
    if unknown:
        raise ConfigError(f"unknown section(s): {', '.join(unknown)}")
    values: dict[str, Any] = {}
    for section, keys in (("daemon", DAEMON_KEYS), ("retry", RETRY_KEYS)):
        table = data.get(section, {})
        if not isinstance(table, Mapping):
            raise ConfigError(f"[{section}] must be a table")
        for key, value in table.items():
            if key not in keys:
                raise ConfigError(f"[{section}] unknown key {key!r}")
            values[key] = _check(section, key, value, keys[key])
    heartbeat = values.get("heartbeat_interval", base.heartbeat_interval)
    lease = values.get("lease_timeout", base.lease_timeout)
    if heartbeat >= lease:
        # A lease renewed less often than it lasts expires while its supervisor is alive.
        raise ConfigError(f"[daemon] heartbeat_interval ({heartbeat:g}) must be less than lease_timeout ({lease:g})")
    for key in ("database", "socket", "log_dir"):
        # A PostgreSQL URL stays a URL (as a path it would name a directory "postgresql:").
        if key in values and not (key == "database" and backend.is_postgres(values[key])):
            values[key] = _path(key, values[key], os.environ if env is None else env, source)
    values.update(_http_values(data.get("http", {}), os.environ if env is None else env, source))
    if backend.is_postgres(values.get("database", "")) and "http_token_file" not in values:
        values["http_token_file"] = Path(base.database).parent / "http-token"  # the state directory
    if "keep_finished" in values:
        values["keep_finished"] = durations.parse(values["keep_finished"])
    if values.get("synchronous"):
        values["synchronous"] = values["synchronous"].lower()
    executors = data.get("executors", {})
    if not isinstance(executors, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and ":" in v for k, v in executors.items()
    ):
        raise ConfigError('[executors] entries must look like TYPE = "package.module:Class"')
    raw_templates = data.get("templates", {})
    if not isinstance(raw_templates, Mapping):
        raise ConfigError("[templates] must be a table of templates")
    parsed: dict[str, templates.Template] = {}
    if raw_templates:
        from daemon import templates  # ~4 ms of import that a config without templates does not need

        try:
            # Structure, parameters and dependencies now; task types once the executors are loaded.
            parsed = templates.parse_all(raw_templates)
        except templates.TemplateError as exc:
            raise ConfigError(f"[templates] {exc.message}") from None
    try:
        parsed_queues = queues.parse(data.get("queues", {}))
    except queues.QueueError as exc:
        raise ConfigError(exc.message) from None
    for template in parsed.values():
        for task in template.tasks:
            if task.spec.queue is not None and task.spec.queue not in {queues.DEFAULT, *parsed_queues}:
                raise ConfigError(
                    f"[templates] template {template.name}, task {task.name}: unknown queue {task.spec.queue!r}; "
                    f"configured: {', '.join([queues.DEFAULT, *parsed_queues])}"
                )
    return dataclasses.replace(
        base, **values, executors=dict(executors), templates=parsed, queues=parsed_queues, source=source
    )


SYSTEM_CONFIG = Path("/etc/fredica/config.toml")


def config_path(explicit: str | Path | None = None, env: Mapping[str, str] | None = None) -> Path | None:
    """The config file to read, by the lookup order above; None means built-in defaults."""
    env = os.environ if env is None else env
    if explicit:
        return Path(explicit)
    if env.get("FREDICA_CONFIG"):
        return Path(env["FREDICA_CONFIG"])
    home = Path(env.get("HOME", "~")).expanduser()
    for candidate in (home / ".config" / "fredica" / "config.toml", SYSTEM_CONFIG):
        if candidate.is_file():
            return candidate
    return None


# The directories systemd/fredica.service gives the daemon (StateDirectory=, RuntimeDirectory=), which
# a shell does not have.
SYSTEM_SERVICE_ENV = {"STATE_DIRECTORY": "/var/lib/fredica", "RUNTIME_DIRECTORY": "/run/fredica"}


def load_for_client(explicit: str | Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """The settings a CLI command finds the daemon (and its logs) by, from a shell, which lacks
    the directories systemd gives the daemon:

    - a config may name them ($STATE_DIRECTORY, $RUNTIME_DIRECTORY, as config.example.toml
      does): where unset they are the user service's (the XDG defaults), or the system
      service's for the system config;
    - with no daemon socket where the config (or its absence) puts it, the system service's
      directories are used if its socket is there: `sudo -u fredica fredica status` finds it,
      and a daemon run by hand on the same config is still found first.
    """
    env = os.environ if env is None else env
    path = config_path(explicit, env)
    system_config = path is not None and Path(path).resolve() == SYSTEM_CONFIG.resolve()
    as_by_hand = {"STATE_DIRECTORY": str(_state_dir(env)), "RUNTIME_DIRECTORY": str(_runtime_dir(env)), **env}
    settings = load(path, as_by_hand) if path is not None else Settings.defaults(env)
    if (path is None or system_config) and not os.path.exists(settings.socket):
        as_service = {**SYSTEM_SERVICE_ENV, **env}
        system = load(path, as_service) if path is not None else Settings.defaults(as_service)
        if os.path.exists(system.socket):  # False, not an error, where we may not look
            return system
    return settings


def load(explicit: str | Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the config; raises ConfigError with one clear line."""
    path = config_path(explicit, env)
    if path is None:
        return Settings.defaults(env)
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from None
    try:
        return from_mapping(data, env=env, source=path)
    except ConfigError as exc:
        raise ConfigError(f"config {path}: {exc.message}") from None
