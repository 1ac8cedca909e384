"""W&B and trackio beside TensorBoard: files in the run directory, the metrics.jsonl names and
steps, the resolved config, no network, no process left behind, one-line errors."""

import json
import math
import os
import socket
import sqlite3
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from typer.testing import CliRunner

from rlscale.cli import app
from rlscale.config import LoggingConfig
from rlscale.runtime.metrics import MetricsLogger
from rlscale.runtime.trackers import (
    TrackerNotInstalledError,
    open_trackers,
    wandb_has_credentials,
)

pytest.importorskip("wandb")
pytest.importorskip("trackio")

REPO = Path(__file__).resolve().parents[1]
CONFIG = {"run_dir": "somewhere", "train": {"lr": 0.001, "steps": 2}}
ROWS = [  # what a loop logs; only the finite numeric scalars reach TensorBoard and trackers
    {"reward/mean": 0.25, "policy/entropy": 1.5, "count": 3, "flag": True, "note": "text",
     "bad": math.nan},
    {"reward/mean": 0.5, "policy/entropy": 1.25, "count": 4, "flag": False, "note": "text",
     "bad": math.inf},
]
SCALARS = {"reward/mean", "policy/entropy", "count"}


@pytest.fixture
def home(tmp_path, monkeypatch):
    """No credentials, no network, and wandb's own cache/config in tmp_path: the home
    directory (a fresh one here) must stay empty, and no host may be looked up."""
    home = tmp_path / "home"
    home.mkdir()
    for var in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_DIR",
                "WANDB_BASE_URL", "TRACKIO_DIR", "TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NETRC", str(home / ".netrc"))  # absent: wandb has no credentials
    for var, folder in (("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"),
                        ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / folder))
    monkeypatch.setenv("WANDB_SILENT", "true")
    # With an HF token, trackio asks the Hub who the user is: the tracker must prevent that.
    monkeypatch.setenv("HF_TOKEN", "hf_notarealtoken")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)  # as for a user
    reached, getaddrinfo = [], socket.getaddrinfo

    def local_only(host, *args, **kwargs):
        if host not in (None, "localhost", "127.0.0.1", "::1"):
            reached.append(host)  # recorded: the libraries swallow a raised error
            raise OSError(f"no network in tests ({host})")
        return getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", local_only)
    yield home
    assert reached == [], f"a tracker tried to reach {reached}"


def descendants() -> set[int]:
    """Live processes below this one (zombies excluded)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def wandb_records(run_folder: Path) -> list:
    """The records of an offline run's `.wandb` file (wandb's LevelDB-style log of
    protobuf records: a 7-byte header, then 32 KiB blocks of checksum|length|type|data)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_folder.glob("run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, chunks, records = 32768, 7, [], []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a record header
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if kind == 0:
            break
        chunks.append(data[pos + 7:pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(chunks))
            records.append(record)
            chunks = []
    return records


def wandb_history(run_folder: Path) -> dict[int, dict]:
    history = {}
    for r in wandb_records(run_folder):
        if r.WhichOneof("record_type") == "history":
            items = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                     for i in r.history.item}
            history[r.history.step.num] = {k: v for k, v in items.items()
                                           if not k.startswith("_")}
    return history


def wandb_config(run_folder: Path) -> dict:
    """The config given at init (in the run record) with any later updates."""
    config = {}
    for r in wandb_records(run_folder):
        kind = r.WhichOneof("record_type")
        if kind in ("run", "config"):
            for item in (r.run.config if kind == "run" else r.config).update:
                config[item.key] = json.loads(item.value_json)
    return config


def trackio_rows(run_dir: Path, project: str = "rlscale") -> tuple[list, list]:
    db = sqlite3.connect(run_dir / "trackio" / f"{project}.db")
    try:
        metrics = [(run, run_id, step, json.loads(m)) for run, run_id, step, m in db.execute(
            "SELECT run_name, run_id, step, metrics FROM metrics ORDER BY id")]
        configs = [(run, json.loads(c)) for run, c in db.execute(
            "SELECT run_name, config FROM configs")]
    finally:
        db.close()
    return metrics, configs


def log_rows(run_dir: Path, logging: LoggingConfig, resume_step: int | None = None,
             rows: list[dict] = ROWS, first_step: int = 1) -> None:
    logger = MetricsLogger(run_dir, tensorboard=False, resume_step=resume_step,
                           trackers=open_trackers(logging, run_dir, CONFIG, resume_step))
    try:
        for step, row in enumerate(rows, start=first_step):
            logger.log(step, row)
    finally:
        logger.close()


def test_wandb_writes_an_offline_run_in_the_run_dir(tmp_path, home):
    before = descendants()
    run_dir = tmp_path / "run"
    log_rows(run_dir, LoggingConfig(wandb=True))
    (folder,) = (run_dir / "wandb").glob("offline-run-*")  # what `wandb sync` takes
    assert wandb_history(folder) == {
        1: {"reward/mean": 0.25, "policy/entropy": 1.5, "count": 3},
        2: {"reward/mean": 0.5, "policy/entropy": 1.25, "count": 4}}
    config = wandb_config(folder)
    assert config["train"] == CONFIG["train"] and config["run_dir"] == "somewhere"
    run_id = (run_dir / "wandb" / "rlscale-run-id").read_text().strip()
    assert run_id in folder.name

    # A resumed run continues the same W&B run: a second offline folder with the same id.
    log_rows(run_dir, LoggingConfig(wandb=True), resume_step=2, rows=ROWS[:1], first_step=3)
    folders = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and all(run_id in f.name for f in folders)
    assert set(wandb_history(folders[1])) == {3}

    assert descendants() <= before  # wandb-core is gone
    assert not any(home.iterdir())


def test_wandb_is_online_only_with_credentials(home, monkeypatch):
    import wandb
    from wandb.sdk import wandb_setup

    try:
        assert not wandb_has_credentials()  # so the runs below are offline
        monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
        assert wandb_has_credentials()
        monkeypatch.delenv("WANDB_API_KEY")
        host = urlparse(wandb_setup.singleton().settings.base_url).hostname
        netrc = home / ".netrc"
        netrc.write_text(f"machine {host}\n  login user\n  password {'k' * 40}\n")
        netrc.chmod(0o600)
        assert wandb_has_credentials()  # `wandb login` wrote this
    finally:
        wandb.teardown()  # forget the settings read under this test's environment


def test_trackio_writes_its_database_in_the_run_dir(tmp_path, home):
    before = descendants()
    first, second = tmp_path / "first", tmp_path / "second"
    log_rows(first, LoggingConfig(trackio=True))
    log_rows(first, LoggingConfig(trackio=True), resume_step=2, rows=ROWS[:1], first_step=3)
    # Another run in the same process (trackio was imported for the first) writes its own.
    log_rows(second, LoggingConfig(trackio=True, project="other", run_name="named"))

    metrics, configs = trackio_rows(first)
    assert [(run, step, m) for run, _, step, m in metrics] == [
        ("first", 1, {"reward/mean": 0.25, "policy/entropy": 1.5, "count": 3}),
        ("first", 2, {"reward/mean": 0.5, "policy/entropy": 1.25, "count": 4}),
        ("first", 3, {"reward/mean": 0.25, "policy/entropy": 1.5, "count": 3})]
    assert len({run_id for _, run_id, _, _ in metrics}) == 1  # the resume continued the run
    assert configs[0][1]["train"] == CONFIG["train"]
    metrics, _ = trackio_rows(second, project="other")
    assert [(run, step) for run, _, step, _ in metrics] == [("named", 1), ("named", 2)]
    assert sorted(p.name for p in (second / "trackio").iterdir() if p.suffix == ".db") == [
        "other.db"]

    assert descendants() <= before
    assert not any(home.iterdir())
    assert "TRACKIO_DIR" not in os.environ


@pytest.mark.parametrize("package", ["wandb", "trackio"])
def test_a_missing_tracker_package_is_a_one_line_error(tmp_path, monkeypatch, package):
    monkeypatch.setitem(sys.modules, package, None)  # `import <package>` now fails
    expected = (f"logging.{package} is true but the {package} package is not installed "
                f"(pip install 'rlscale[{package}]')")
    with pytest.raises(TrackerNotInstalledError) as err:
        open_trackers(LoggingConfig(**{package: True}), tmp_path / "run", CONFIG)
    assert str(err.value) == expected
    assert not (tmp_path / "run").exists()

    # On the command line: one line, exit status 2, before any work.
    config = tmp_path / "sft.yaml"
    config.write_text(yaml.safe_dump({"init_preset": "tiny", "run_dir": str(tmp_path / "sft"),
                                      "out": str(tmp_path / "sft" / "model")}))
    result = CliRunner().invoke(app, ["sft", str(config), f"logging.{package}=true"])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {expected}"
    assert not (tmp_path / "sft").exists()
    result = CliRunner().invoke(app, ["zero", "train", str(REPO / "configs/zero/tictactoe.yaml"),
                                      f"logging.{package}=true", "--out", str(tmp_path / "z")])
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {expected}"
    assert not (tmp_path / "z").exists()


def test_rlvr_train_with_both_trackers(tmp_path, home, tiny_model_dir):
    before = descendants()
    run_dir = tmp_path / "run"
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "run_dir": str(run_dir),
        "model": {"path": str(tiny_model_dir)},
        "task": {"name": "arithmetic", "options": {"add_digits": 1}},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 4},
        "train": {"steps": 2, "seed": 1, "threads": 1},
        "checkpoint": {"every": 0},
        "tensorboard": False,
        "progress": False,
    }))
    result = CliRunner().invoke(app, ["rlvr", "train", str(config), "logging.wandb=true",
                                      "logging.trackio=true"])
    assert result.exit_code == 0, result.output

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    expected = {row["step"]: {k: v for k, v in row.items() if k != "step" and v is not None
                              and isinstance(v, int | float) and not isinstance(v, bool)}
                for row in rows}
    assert sorted(expected) == [1, 2] and "reward/mean" in expected[1]

    (folder,) = (run_dir / "wandb").glob("offline-run-*")
    history = wandb_history(folder)
    assert {step: set(v) for step, v in history.items()} == {
        step: set(v) for step, v in expected.items()}
    assert history[2]["reward/mean"] == pytest.approx(expected[2]["reward/mean"])
    assert wandb_config(folder)["model"]["path"] == str(tiny_model_dir)

    metrics, configs = trackio_rows(run_dir)
    assert {step: set(m) for _, _, step, m in metrics} == {
        step: set(v) for step, v in expected.items()}
    assert configs[0][1]["logging"]["trackio"] is True

    assert descendants() <= before  # no wandb-core, no verifier worker
    assert not any(home.iterdir())


def test_zero_train_and_resume_with_both_trackers(tmp_path, home):
    from rlscale.config import load_config
    from rlscale.zero.config import ZeroConfig
    from rlscale.zero.loop import train

    run_dir = tmp_path / "zero"

    def tiny(iterations: int) -> ZeroConfig:
        return load_config(ZeroConfig, None, [
            f"out={run_dir}", f"train.iterations={iterations}", "network.blocks=1",
            "network.channels=8", "mcts.simulations=4", "selfplay.concurrent_games=4",
            "selfplay.games_per_iteration=4", "train.min_replay=16", "train.batch_size=16",
            "checkpoint.every=1", "logging.wandb=true", "logging.trackio=true"])

    before = descendants()
    train(tiny(2), progress=False)
    train(tiny(3), resume=True, progress=False)  # wandb/ and trackio/ are the run's own

    metrics, configs = trackio_rows(run_dir)
    assert [(run, step) for run, _, step, _ in metrics] == [("zero", 1), ("zero", 2), ("zero", 3)]
    assert len({run_id for _, run_id, _, _ in metrics}) == 1
    assert "credit/value_loss" in metrics[-1][3]
    assert configs[0][1]["game"]["name"] == "tictactoe"
    folders = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert [sorted(wandb_history(f)) for f in folders] == [[1, 2], [3]]
    assert descendants() <= before
    assert not any(home.iterdir())
