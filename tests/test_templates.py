"""Workflow templates: validation at load, parameters, results of upstream tasks, `fredica run`."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from daemon import cli, config, templates
from daemon.config import ConfigError
from daemon.submission import SubmissionRefused
from tests import store_steps

PIPELINE = """
[templates.echo_chain]
description = "two echoes, the second quoting the first"
params = ["word"]
defaults = { suffix = "!" }

[templates.echo_chain.tasks.first]
type = "ECHO"
payload = { word = "{word}{suffix}", literal = "{{not a param}}" }
max_retries = 2
priority = 4

[templates.echo_chain.tasks.second]
type = "ECHO"
depends_on = ["first"]
payload = { quoted = "{first.echo.word}", sentence = "first said {first.echo.word} as {first.task_id}" }
"""


def parse(text: str) -> dict[str, templates.Template]:
    return templates.parse_all(tomllib.loads(text)["templates"])


def test_instantiate_fills_params_and_orders_dependencies_first() -> None:
    template = parse(PIPELINE)["echo_chain"]
    first, second = template.instantiate({"word": "hi"})
    assert first.key == "first" and first.payload == {"word": "hi!", "literal": "{not a param}"}
    assert first.max_retries == 2 and first.priority == 4
    assert second.depends_on == ("first",)
    assert second.payload["quoted"] == "{@0-first.echo.word}"  # by position; the name for people
    assert templates.as_written(second.payload)["quoted"] == "{first.echo.word}"
    assert template.instantiate({"word": "x", "suffix": "?"})[0].payload["word"] == "x?"


def test_a_param_value_with_braces_stays_literal() -> None:
    first, second = parse(PIPELINE)["echo_chain"].instantiate({"word": "{evil}"})
    assert first.payload["word"] == "{evil}!"
    # Only a task whose payload still names an upstream result is resolved at dispatch.
    assert not first.payload_refs and second.payload_refs


def test_a_param_value_cannot_name_an_upstream_result() -> None:
    template = parse(PIPELINE + '\n[templates.echo_chain.tasks.third]\ntype = "ECHO"\ndepends_on = ["first"]\n'
                     'payload = { title = "{word}", quoted = "{first.echo.word}" }\n')["echo_chain"]
    third = template.instantiate({"word": "{@0.echo.secret}"})[2]
    resolved = templates.resolve_results(third.payload, ["t0"], {"t0": {"echo": {"word": "w", "secret": "TOKEN"}}})
    assert resolved == {"title": "{@0.echo.secret}", "quoted": "w"}


def test_dependencies_keep_their_positions_when_two_are_one_task(tmp_path: Path) -> None:
    # Two template tasks with one idempotency key are one task: the dependent's "{b.out}" must
    # still name the second of its dependencies.
    from daemon.store import db, tasks

    text = (
        '[templates.t.tasks.a]\ntype = "ECHO"\nidempotency_key = "same"\n'
        '[templates.t.tasks.b]\ntype = "ECHO"\nidempotency_key = "same"\n'
        '[templates.t.tasks.c]\ntype = "ECHO"\ndepends_on = ["a", "b"]\npayload = { x = "{b.echo}" }\n'
    )
    specs = parse(text)["t"].instantiate({})
    conn = db.open_database(tmp_path / "fredica.db")
    a, b, c = tasks.submit(conn, specs, now=1.0).tasks
    assert a.id == b.id and not b.created
    stored = tasks.get(conn, c.id)
    assert stored.depends_on == (a.id, a.id) and stored.payload == {"x": "{@1-b.echo}"}
    assert templates.resolve_results(stored.payload, stored.depends_on, {a.id: {"echo": 7}}) == {"x": 7}
    unmet = conn.execute("SELECT unmet_deps FROM task WHERE id = ?", (c.id,)).fetchone()[0]
    assert unmet == 1  # one task to wait for, however often it is named
    conn.close()


def test_missing_and_unknown_params_are_refused() -> None:
    template = parse(PIPELINE)["echo_chain"]
    with pytest.raises(templates.TemplateError, match="needs --set word=VALUE"):
        template.instantiate({})
    with pytest.raises(templates.TemplateError, match="has no parameter colour"):
        template.instantiate({"word": "a", "colour": "red"})


def test_resolve_results_at_dispatch() -> None:
    payload = {"whole": "{@0.n}", "text": "n={@0-up.n}, {{braces}}", "nested": ["{@1.a.b}"]}
    resolved = templates.resolve_results(payload, ["t0", "t1"], {"t0": {"n": 3}, "t1": {"a": {"b": "deep"}}})
    assert resolved == {"whole": 3, "text": "n=3, {braces}", "nested": ["deep"]}
    with pytest.raises(SubmissionRefused, match="has no field 'missing'"):
        templates.resolve_results({"x": "{@0.missing}"}, ["t0"], {"t0": {}})
    plain = {"x": "{{left alone}}", "y": "{name}"}
    assert templates.resolve_results(plain, [], {}) == plain  # nothing to fill: untouched


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[templates.t.tasks.a]\ntype = "ECHO"\ndepends_on = ["nope"]\n', "depends on unknown task 'nope'"),
        ('[templates.t.tasks.a]\ntype = "ECHO"\ndepends_on = ["a"]\n', "depends on itself"),
        ('[templates.t.tasks.a]\ntype = "ECHO"\ndepends_on = ["b"]\n[templates.t.tasks.b]\ntype = "ECHO"\n'
         'depends_on = ["a"]\n', "dependency cycle"),
        ('[templates.t.tasks.a]\ntype = "ECHO"\npayload = { x = "{undeclared}" }\n', "parameter {undeclared} is not declared"),
        ('[templates.t.tasks.a]\ntype = "ECHO"\n[templates.t.tasks.b]\ntype = "ECHO"\npayload = { x = "{a.out}" }\n',
         "not one of its dependencies"),
        ('[templates.t.tasks.a]\ntype = "ECHO"\nprioirty = 3\n', "unknown key(s) prioirty"),
        ('[templates.t.tasks.a]\ntype = "ECHO"\npriority = "high"\n', "priority must be an integer"),
        ("[templates.t]\nparams = []\n", "template t has no tasks"),
        ('[templates.t.tasks.a]\ntype = "ECHO"\n[templates.t.tasks.b]\ntype = "ECHO"\ndepends_on = ["a"]\n'
         'idempotency_key = "k-{a.out}"\n', "idempotency_key cannot use {a.out}"),
        ('[templates.t.tasks.a]\ntype = "ECHO"\n[templates.t.tasks.b]\ntype = "ECHO"\ndepends_on = ["a", "a"]\n',
         "depends_on names a task twice"),
    ],
)
def test_invalid_templates_are_refused_at_load(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        config.load(path, env={"HOME": str(tmp_path)})
    assert message in caught.value.message


def test_unknown_task_types_stop_the_daemon(daemons) -> None:
    d = daemons()
    d.config.write_text(d.config.read_text() + '\n[templates.t.tasks.a]\ntype = "NO_SUCH_TYPE"\n')
    d.start(wait=False)
    assert d.process.wait(30) == 1
    assert "template t, task a: no executor for type NO_SUCH_TYPE" in d.output.read_text()


def test_fredica_run_end_to_end(daemons) -> None:
    d = daemons()
    d.config.write_text(d.config.read_text() + PIPELINE)
    d.start()
    runner = CliRunner()
    result = runner.invoke(
        cli.main, ["run", "echo_chain", "--set", "word=hello", "--material", "m7", "--config", str(d.config)]
    )
    assert result.exit_code == 0, result.output
    run_id = result.stdout.strip()
    run = d.data("show", id=run_id)["object"]
    assert run["template"] == "echo_chain" and run["material_id"] == "m7"
    first_id, second_id = (t["id"] for t in run["tasks"])
    second = d.wait_task(second_id, "completed")
    assert second["result"]["echo"] == {
        "quoted": "hello!",
        "sentence": f"first said hello! as {first_id}",
    }
    missing = runner.invoke(cli.main, ["run", "echo_chain", "--config", str(d.config)])
    assert missing.exit_code == 1 and "--set word=VALUE" in missing.stderr
    unknown = runner.invoke(cli.main, ["run", "nope", "--config", str(d.config)])
    assert unknown.exit_code == 1 and "unknown template 'nope'" in unknown.stderr


def test_a_recreated_template_task_still_reads_its_dependencys_result(tmp_path: Path) -> None:
    # A transcode interrupted by a crash, recreated from the restart log: the copy still names
    # its download's result, and is still a template's task that dispatch fills in.
    from daemon import recovery, retry
    from daemon.store import db, restarts, task_reads, tasks

    text = (
        '[templates.t.tasks.download]\ntype = "ECHO"\n'
        '[templates.t.tasks.transcode]\ntype = "ECHO"\ndepends_on = ["download"]\n'
        'payload = { input = "{download.echo.output}" }\n'
    )
    conn = db.open_database(tmp_path / "fredica.db")
    download, transcode = tasks.submit(conn, parse(text)["t"].instantiate({}), now=1.0).tasks
    tasks.start(conn, store_steps.claim_next(conn, 2.0).id, now=2.0)
    tasks.complete(conn, download.id, {"echo": {"output": "/media/a.mkv"}}, now=3.0)
    tasks.start(conn, store_steps.claim_next(conn, 4.0).id, now=4.0)
    recovery.recover(conn, now=5.0)  # the daemon died while the transcode ran
    (entry,) = restarts.list_entries(conn)
    (result,) = retry.recreate_entries(conn, [str(entry.id)], now=6.0)
    copy_id = result.extra["new_id"]
    copy = tasks.get(conn, copy_id)
    assert copy.payload_refs and copy.depends_on == (download.id,)
    upstream = task_reads.results_of(conn, copy.depends_on)
    assert templates.resolve_results(copy.payload, copy.depends_on, upstream) == {"input": "/media/a.mkv"}
    conn.close()
