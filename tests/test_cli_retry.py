"""`fredica retry` and `fredica restarts recreate ID...`: what they send, the lines they print, the exit status."""

from __future__ import annotations

import json

from tests.test_cli import ID_A, ID_B, RUN, cfg, fake, fredica, isolated_env  # noqa: F401 (fixtures)

ID_C = "cccccccc-0000-4000-8000-000000000003"
DONE = {"id": ID_A, "ok": True, "message": f"retried {ID_A[:8]} as {ID_C[:8]}, with 2 tasks its failure cancelled"
        f" (run {RUN[:8]})", "new_id": ID_C, "created": True, "run_id": RUN, "copies": [ID_B, ID_B]}
REFUSED = {"id": "beef", "ok": False, "message": "no task has id beef"}


def test_retry_prints_a_line_per_id_and_exits_0_when_all_were_retried(fake, fredica):
    fake.handlers["retry"] = {"results": [DONE, dict(DONE, id=ID_B)]}
    result = fredica("retry", ID_A[:6], ID_B)
    assert (result.exit_code, result.stdout, result.stderr) == (0, f"{DONE['message']}\n" * 2, "")
    assert fake.requests == [("retry", {"ids": [ID_A[:6], ID_B]})]


def test_retry_says_each_refusal_on_stderr_and_exits_1(fake, fredica):
    not_failed = {"id": ID_B, "ok": False, "message": f"task {ID_B[:8]} is running: only a failed or cancelled"
                  " task can be retried"}
    fake.handlers["retry"] = {"results": [REFUSED, DONE, not_failed]}
    result = fredica("retry", "beef", ID_A, ID_B)
    assert result.exit_code == 1
    assert result.stdout == f"{DONE['message']}\n"
    assert result.stderr == f"error: {REFUSED['message']}\nerror: {not_failed['message']}\n"


def test_retry_json_gives_the_full_ids(fake, fredica):
    fake.handlers["retry"] = {"results": [DONE, REFUSED]}
    result = fredica("retry", "--json", ID_A, "beef")
    assert result.exit_code == 1 and json.loads(result.stdout) == [DONE, REFUSED]


def test_retry_needs_an_id(fake, fredica):
    result = fredica("retry")
    assert result.exit_code == 2 and fake.requests == []


def test_restarts_recreate_takes_several_entries(fake, fredica):
    line = f"recreated entry 4 (task {ID_A[:8]}) as {ID_C[:8]} (run {RUN[:8]})"
    fake.handlers["restarts_recreate"] = {"results": [
        {"id": "4", "ok": True, "message": line, "run_id": RUN},
        {"id": "5", "ok": False, "message": "restart-log entry 5 is already dismissed"},
    ]}
    result = fredica("restarts", "recreate", "4", "5")
    assert (result.exit_code, result.stdout) == (1, f"{line}\n")
    assert result.stderr == "error: restart-log entry 5 is already dismissed\n"
    assert fake.requests == [("restarts_recreate", {"ids": ["4", "5"]})]
    assert fredica("restarts", "recreate", "x").exit_code == 2  # entry ids are numbers
