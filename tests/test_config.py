"""Settings: the documented example equals the built-in defaults; bad files give one clear error."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from daemon import config, queues
from daemon.config import ConfigError, Settings

REPO = Path(__file__).resolve().parent.parent
ENV = {"HOME": "/home/someone"}


def test_the_example_config_is_exactly_the_defaults() -> None:
    loaded = config.load(REPO / "config.example.toml", env=ENV)
    defaults = Settings.defaults(ENV)
    # Templates have no default (there are none built in); the example carries one to copy.
    # Nor queues beyond `default`: the example carries one.
    ignored = {"source", "templates", "queues"}
    assert {k: v for k, v in vars(loaded).items() if k not in ignored} == {
        k: v for k, v in vars(defaults).items() if k not in ignored
    }
    assert set(loaded.templates) == {"download_and_transcode"}
    assert loaded.queues == {
        "media": queues.QueueConfig("media", 1, ("TRANSCODE_MP4",)),
        "web": queues.QueueConfig("web", 200, ("HTTP_REQUEST",), processes=2, loop_block_limit=10.0),
    }
    assert list(loaded.all_queues) == ["default", "media", "web"]
    assert loaded.all_queues["default"].workers == loaded.max_workers == 4
    assert defaults.all_queues == {"default": queues.QueueConfig("default", 4)}


def test_the_example_documents_every_key() -> None:
    text = (REPO / "config.example.toml").read_text()
    for key in [*config.DAEMON_KEYS, *config.RETRY_KEYS, *queues.QUEUE_KEYS]:
        assert f"{key} =" in text, key


def test_default_paths_follow_xdg_and_systemd() -> None:
    xdg = Settings.defaults({"HOME": "/h", "XDG_STATE_HOME": "/s", "XDG_RUNTIME_DIR": "/r"})
    assert xdg.database == Path("/s/fredica/fredica.db")
    assert xdg.socket == Path("/r/fredica/control.sock")
    assert xdg.log_dir == Path("/s/fredica/logs")
    systemd = Settings.defaults({"STATE_DIRECTORY": "/var/lib/fredica", "RUNTIME_DIRECTORY": "/run/fredica"})
    assert systemd.database == Path("/var/lib/fredica/fredica.db")
    assert systemd.socket == Path("/run/fredica/control.sock")
    bare = Settings.defaults({"HOME": "/h"})
    assert bare.database == Path("/h/.local/state/fredica/fredica.db")


def test_lookup_order(tmp_path: Path) -> None:
    explicit, from_env = tmp_path / "a.toml", tmp_path / "b.toml"
    assert config.config_path(explicit, {"FREDICA_CONFIG": str(from_env)}) == explicit
    assert config.config_path(None, {"FREDICA_CONFIG": str(from_env)}) == from_env
    home = tmp_path / "home"
    user_config = home / ".config" / "fredica" / "config.toml"
    user_config.parent.mkdir(parents=True)
    user_config.write_text("")
    assert config.config_path(None, {"HOME": str(home)}) == user_config


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[daemon]\nmax_wokers = 3\n", "unknown key 'max_wokers'"),
        ("[daemon]\nmax_workers = true\n", "max_workers must be an integer"),
        ("[daemon]\ncancel_grace = -1\n", "cancel_grace must be 0 or more"),
        ("[daemon]\nstart_method = 'fork'\n", 'start_method must be "forkserver" or "spawn"'),
        ("[daemon]\nsynchronous = 'off'\n", 'synchronous must be "normal" or "full"'),
        ("[retry]\nbackoff_base = nan\n", "backoff_base must be a finite number"),
        ("[daemon]\nwarm_spare = 1\n", "warm_spare must be true or false"),
        ("[daemon]\nnotify = 'no'\n", "notify must be true or false"),
        ("[daemon]\ntasks_per_process = 0\n", "tasks_per_process must be between 1 and 1000000"),
        ("[daemon]\ntasks_per_process = true\n", "tasks_per_process must be an integer"),
        ("[daemon]\nidle_poll_interval = 3000000\n", "idle_poll_interval must be greater than 0 and at most 3600"),
        ("[daemon]\npoll_interval = 0\n", "poll_interval must be greater than 0 and at most 3600"),
        ("[daemon]\ndatabase = ''\n", "database must not be empty"),
        ("[daemon]\nsocket = '$FREDICA_NO_SUCH_VARIABLE/c.sock'\n", "uses $FREDICA_NO_SUCH_VARIABLE, which is not set"),
        ('[daemon]\nlog_dir = "/a\\u0000b"\n', "log_dir must not contain a NUL character"),
        ("daemon = 3\n", "[daemon] must be a table"),
        ("[nope]\n", "unknown section(s): nope"),
        ("x = [\n", "is not valid TOML"),
        ("queues = 3\n", "[queues] must be a table of queues"),
        ("[queues.media]\ntypes = ['A']\n", "[queues.media] needs workers = N"),
        ("[queues.media]\nworkers = 0\n", "[queues.media] workers must be between 1 and 100000, not 0"),
        ("[queues.media]\nworkers = true\n", "[queues.media] workers must be an integer, not True"),
        ("[queues.media]\nworkers = 1\nprefetch = 65\n", "[queues.media] prefetch must be an integer from 0 to 64, not 65"),
        ("[queues.media]\nworkers = 1\nprefetch = -1\n", "[queues.media] prefetch must be an integer from 0 to 64, not -1"),
        ("[queues.media]\nworkers = 1\nprefetch = 1.5\n", "[queues.media] prefetch must be an integer from 0 to 64, not 1.5"),
        ("[queues.default]\nprefetch = true\n", "[queues.default] prefetch must be an integer from 0 to 64, not True"),
        ("[queues.media]\nworkers = 1\nprefetched = 2\n", "[queues.media] unknown key(s) 'prefetched'"),
        ("[queues.media]\nworkers = 1\ntypes = 'A'\n", "[queues.media] types must be a list of task types"),
        ("[queues.a]\nworkers = 1\ntypes = ['T']\n[queues.b]\nworkers = 1\ntypes = ['T']\n",
         "task type T is routed to two queues: a and b"),
        ('[queues."bad name"]\nworkers = 1\n', "bad queue name 'bad name'"),
        ("[queues.default]\nworkers = 3\n", "[queues.default] takes no workers: set [daemon] max_workers"),
        ("[queues.default]\ntypes = ['A']\n", "[queues.default] takes no types"),
        ("[queues.web]\nworkers = 9\nprocesses = 0\n", "[queues.web] processes must be an integer from 1 to 64, not 0"),
        ("[queues.web]\nworkers = 9\nloop_block_limit = 'long'\n",
         "[queues.web] loop_block_limit must be a number of seconds from 0.1 to 3600, not 'long'"),
        ("[queues.default]\nloop_block_limit = 0\n",
         "[queues.default] loop_block_limit must be a number of seconds from 0.1 to 3600, not 0"),
        ("[templates.t.tasks.a]\ntype = 'ECHO'\nqueue = 'nowhere'\n",
         "template t, task a: unknown queue 'nowhere'; configured: default"),
    ],
)
def test_bad_files_are_refused_with_a_clear_message(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        config.load(path, env=ENV)
    assert message in caught.value.message and str(path) in caught.value.message
    assert "\n" not in caught.value.message


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        config.load(tmp_path / "absent.toml", env=ENV)


def test_paths_expand_variables_and_are_relative_to_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "etc" / "fredica.toml"
    path.parent.mkdir()
    path.write_text('[daemon]\ndatabase = "$STATE_DIRECTORY/f.db"\nsocket = "${RUN}/c.sock"\nlog_dir = "logs"\n')
    env = {**ENV, "STATE_DIRECTORY": "/var/lib/fredica:/var/lib/other", "RUN": "/run/x"}
    settings = config.load(path, env=env)
    assert settings.database == Path("/var/lib/fredica/f.db")  # the first of systemd's directories
    assert settings.socket == Path("/run/x/c.sock")
    # Not relative to the directory the daemon or a command runs in: the same for both.
    assert settings.log_dir == tmp_path / "etc" / "logs"


def test_a_relative_path_needs_a_config_file_to_be_relative_to() -> None:
    with pytest.raises(ConfigError, match="database must be an absolute path"):
        config.from_mapping({"daemon": {"database": "f.db"}}, env=ENV)


def test_queues_are_parsed_with_default_first_and_sized_by_max_workers(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        "[daemon]\nmax_workers = 3\n[queues.default]\nprefetch = 1\n"
        "[queues.media]\nworkers = 2\ntypes = ['TRANSCODE_MP4', 'DOWNLOAD']\n[queues.bulk]\nworkers = 5\nprefetch = 4\n"
        "[templates.t.tasks.a]\ntype = 'ECHO'\nqueue = 'bulk'\n"
    )
    settings = config.load(path, env=ENV)
    assert settings.all_queues == {
        "default": queues.QueueConfig("default", 3, prefetch=1),
        "media": queues.QueueConfig("media", 2, ("TRANSCODE_MP4", "DOWNLOAD")),
        "bulk": queues.QueueConfig("bulk", 5, prefetch=4),
    }
    assert queues.routing(settings.all_queues) == {"TRANSCODE_MP4": "media", "DOWNLOAD": "media"}
    assert settings.templates["t"].tasks[0].spec.queue == "bulk"


def test_a_queue_type_without_an_executor_is_refused() -> None:
    configs = queues.with_default({"media": queues.QueueConfig("media", 1, ("TRANSCODE_MP4", "NOPE"))}, 2)
    with pytest.raises(queues.QueueError, match=r"^\[queues.media\] types: no executor for type NOPE$"):
        queues.check_task_types(configs, {"TRANSCODE_MP4", "SHELL"})
    queues.check_task_types(configs, {"TRANSCODE_MP4", "NOPE"})  # known: accepted


def test_a_postgresql_url_as_database_stays_a_url_and_names_the_supervisor() -> None:
    # Taken as a path, it started an SQLite queue in a directory named "postgresql:".
    for url in ("postgresql://localhost/fredica", "postgres://u@h/db"):
        settings = config.from_mapping({"daemon": {"database": url}}, env=ENV)
        assert settings.database == url
        assert settings.name == socket.gethostname() and settings.lease_timeout == 30.0
        assert settings.token_file == config.Settings.defaults(ENV).database.parent / "http-token"
    named = config.from_mapping({"daemon": {"database": "postgresql:///q", "name": "gpu-1", "lease_timeout": 4,
                                            "heartbeat_interval": 1}}, env=ENV)
    assert (named.name, named.lease_timeout, named.heartbeat_interval) == ("gpu-1", 4.0, 1.0)
    assert isinstance(config.from_mapping({"daemon": {"database": "q.db"}}, env=ENV, source=Path("/c/x.toml")).database,
                      Path)


def test_a_heartbeat_no_shorter_than_the_lease_and_a_bad_name_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"^\[daemon\] heartbeat_interval \(30\) must be less than lease_timeout \(30\)$"):
        config.from_mapping({"daemon": {"heartbeat_interval": 30}}, env=ENV)
    with pytest.raises(ConfigError, match=r"heartbeat_interval \(5\) must be less than lease_timeout \(2\)"):
        config.from_mapping({"daemon": {"lease_timeout": 2}}, env=ENV)
    for name in ("", " gpu", "a\nb", 3):
        with pytest.raises(ConfigError, match=r"^\[daemon\] name must be"):
            config.from_mapping({"daemon": {"name": name}}, env=ENV)


def test_notify_is_a_switch_on_by_default() -> None:
    assert Settings.defaults(ENV).notify is True
    assert config.from_mapping({"daemon": {"notify": False}}, env=ENV).notify is False
