"""Messages that say what the user wrote and refuse what names nothing (issue 14 point 10)."""

from __future__ import annotations

import json

from click.testing import CliRunner, Result

from daemon import cli
from tests.daemon_harness import Daemon

# A run whose second task takes a field of the first one's result.
TEMPLATE = """
[templates.pipe]
description = "two echoes"
params = ["x"]
[templates.pipe.tasks.first]
type = "ECHO"
payload = { v = "{x}" }
[templates.pipe.tasks.second]
type = "ECHO"
depends_on = ["first"]
payload = { got = "{first.echo.v}", text = "v={first.echo.v}, {{literal}}" }
"""


def fredica(d: Daemon, *args: str) -> Result:
    return CliRunner().invoke(cli.main, [*args, "--config", str(d.config)], catch_exceptions=False)


def test_show_of_a_template_task_names_its_dependency_as_the_template_does(daemons) -> None:
    d: Daemon = daemons(extra_toml=TEMPLATE)
    d.start()
    assert fredica(d, "queue", "pause", "default").exit_code == 0  # the run waits, as submitted
    run_id = d.data("run", template="pipe", params={"x": "7"})["run_id"]
    first, second = (task["id"] for task in d.data("show", id=run_id)["object"]["tasks"])
    shown = fredica(d, "show", second[:8])
    assert shown.exit_code == 0, shown.output
    [payload] = [line for line in shown.stdout.splitlines() if line.startswith("payload:")]
    assert json.loads(payload.partition(":")[2]) == {"got": "{first.echo.v}", "text": "v={first.echo.v}, {{literal}}"}
    # And the stored form still does its work at dispatch.
    assert fredica(d, "queue", "resume", "default").exit_code == 0
    done = d.wait_task(second, "completed")
    assert done["result"]["echo"] == {"got": "7", "text": "v=7, {literal}"}
