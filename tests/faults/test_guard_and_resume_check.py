"""One error guard for every command, and one resume-config check for both loops."""

import json

import pytest
import typer
from faults_helpers import invoke, one_line_error, zero_config

from rlscale.config import StrictModel
from rlscale.runtime import rundir
from rlscale.runtime.errors import first_line, guarded, run_guarded
from rlscale.runtime.fleet import FleetError, FleetUnavailable
from rlscale.runtime.health import NonFiniteError


def _raise(exc: BaseException):
    raise exc


@pytest.mark.parametrize(("exc", "status"), [
    (ValueError("bad flag\nmore detail"), 2),
    (FileNotFoundError("no such file"), 2),
    (FileExistsError("already there"), 2),
    (NotADirectoryError("not a folder"), 2),
    (FleetUnavailable("ray is not installed"), 2),  # a fleet that cannot start: usage
    (NonFiniteError("loss is nan"), 1),
    (FleetError("an actor died past its restarts"), 1),
])
def test_the_guard_turns_an_error_into_one_line_and_its_status(exc, status, capsys, monkeypatch):
    monkeypatch.delenv("RLSCALE_DEBUG", raising=False)
    with pytest.raises(typer.Exit) as stopped:
        run_guarded(_raise, exc)
    assert stopped.value.exit_code == status
    assert capsys.readouterr().err == f"error: {str(exc).splitlines()[0]}\n"


def test_the_guard_passes_results_through_and_lets_other_errors_and_debug_through(monkeypatch):
    assert run_guarded(lambda a, b=0: a + b, 1, b=2) == 3
    with pytest.raises(KeyError):
        run_guarded(_raise, KeyError("a bug keeps its traceback"))
    monkeypatch.setenv("RLSCALE_DEBUG", "1")
    with pytest.raises(ValueError, match="bad flag"):
        run_guarded(_raise, ValueError("bad flag"))


def test_guarded_keeps_the_signature_typer_reads():
    def command(seed: int = typer.Option(0, "--seed")) -> int:
        return seed

    wrapped = guarded(command)
    assert wrapped.__wrapped__ is command and wrapped(seed=3) == 3
    assert first_line(ValueError("")) == "ValueError"


class _Train(StrictModel):
    steps: int = 4
    lr: float = 0.1
    threads: int = 1


class _Config(StrictModel):
    train: _Train = _Train()


def _record(run_dir, **train):
    (run_dir / "config.yaml").write_text(json.dumps({"train": train}))  # YAML reads JSON


def test_the_resume_check_refuses_a_short_plan_and_math_changes_and_records_the_rest(tmp_path):
    def check(config, done=2, allow=False):
        return rundir.check_resume_config(tmp_path, config, done=done, length_key="train.steps",
                                          free_fields=("train.threads", "train.steps"),
                                          allow_change=allow)

    assert check(_Config()) == []  # nothing recorded: nothing to compare
    _record(tmp_path, steps=2)  # a field added since (lr, threads) compares as its default
    with pytest.raises(rundir.RunDirError, match=r"has done 3 steps; train.steps=2 is below"):
        check(_Config(train=_Train(steps=2)), done=3)
    with pytest.raises(rundir.RunDirError, match="train.lr 0.1 -> 0.5.*--allow-config-change"):
        check(_Config(train=_Train(lr=0.5)))
    assert not (tmp_path / rundir.CHANGES_NAME).exists()
    changes = check(_Config(train=_Train(threads=2)))
    assert {c.key for c in changes} == {"train.steps", "train.threads"}
    check(_Config(train=_Train(lr=0.5)), done=3, allow=True)
    rows = [json.loads(x) for x in (tmp_path / rundir.CHANGES_NAME).read_text().splitlines()]
    assert [r["step"] for r in rows] == [3, 4]
    assert rows[1]["changes"]["train.lr"] == {"old": 0.1, "new": 0.5, "free": False}


def test_zero_resume_runs_the_same_check(tmp_path):
    out = tmp_path / "run"
    cfg = zero_config(tmp_path, out, train={"iterations": 2})
    assert invoke("zero", "train", cfg, "--no-progress").exit_code == 0
    one_line_error(invoke("zero", "train", cfg, "train.iterations=1", "--resume",
                          "--no-progress"), "has done 2 iterations", "train.iterations=1")
    one_line_error(invoke("zero", "train", cfg, "train.lr=0.5", "--resume", "--no-progress"),
                   "train.lr", "--allow-config-change")
