"""`fredica completion bash|zsh|fish`: a script the shell runs, answering with fredica's own words."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from daemon import cli

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_each_shell_gets_a_script_naming_the_completion_variable(shell: str) -> None:
    result = CliRunner().invoke(cli.main, ["completion", shell])
    assert result.exit_code == 0, result.output
    assert "_FREDICA_COMPLETE" in result.output and "fredica" in result.output


def test_an_unknown_shell_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli.main, ["completion", "tcsh"])
    assert result.exit_code == 2 and "'tcsh' is not one of 'bash', 'zsh', 'fish'" in result.output


def test_the_completion_protocol_answers_with_commands_and_choices() -> None:
    # What the bash script asks: the words so far, and the index of the one being completed.
    def complete(words: str, index: int) -> list[str]:
        env = {**os.environ, "_FREDICA_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(index),
               "PYTHONPATH": str(REPO)}
        done = subprocess.run([sys.executable, "-m", "daemon"], env=env, capture_output=True, text=True, timeout=60)
        return [line.split(",", 1)[1] for line in done.stdout.splitlines() if "," in line]

    assert {"submit", "status"} <= set(complete("fredica s", 1))
    assert complete("fredica completion f", 2) == ["fish"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_sources_the_script_without_an_error() -> None:
    script = CliRunner().invoke(cli.main, ["completion", "bash"]).output
    done = subprocess.run(["bash", "-c", script + "\ncomplete -p fredica"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "fredica" in done.stdout
