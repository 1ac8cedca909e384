"""A new user's first commands (issue 56): the one-minute quickstart, `quickstart --out`
under the run-directory contract, and a command whose data is not in the repository saying
which flag to pass."""

import json

import pytest

from rlscale.config import load_config
from rlscale.rlvr import quickstart
from rlscale.rlvr.config import RLVRConfig, SFTConfig
from rlscale.runtime.rundir import RunDirError
from rlscale.zero.perfect_play import read_positions


def test_quickstart_out_never_writes_into_a_users_folder(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    with pytest.raises(RunDirError, match="thesis.tex") as refused:
        quickstart.check_out(mine)
    assert "\n" not in str(refused.value)
    assert (mine / "thesis.tex").read_text() == "years of work"
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="is a file"):
        quickstart.check_out(tmp_path / "file")
    assert quickstart.check_out(tmp_path / "new") == tmp_path / "new"
    ours = tmp_path / "ours"
    (ours / "base").mkdir(parents=True)  # a quickstart stopped after its SFT: continued
    assert quickstart.check_out(ours) == ours
    (ours / "grpo" / "checkpoints").mkdir(parents=True)
    with pytest.raises(FileExistsError, match="already holds a quickstart run"):
        quickstart.check_out(ours)


def test_the_tiny_budget_is_a_smaller_run_of_the_same_configs():
    recipe = quickstart.RECIPES["arithmetic"]
    full_sft = load_config(SFTConfig, quickstart.CONFIGS / recipe.sft_config, [])
    tiny_sft = load_config(SFTConfig, quickstart.CONFIGS / recipe.sft_config,
                           list(quickstart.TINY_SFT))
    full_rl = load_config(RLVRConfig, quickstart.CONFIGS / recipe.rl_config, [])
    tiny_rl = load_config(RLVRConfig, quickstart.CONFIGS / recipe.rl_config,
                          list(quickstart.TINY_RL))
    assert tiny_sft.steps * 4 <= full_sft.steps and tiny_rl.train.steps * 3 <= full_rl.train.steps
    # everything else is the recipe's own
    assert tiny_sft.task == full_sft.task and tiny_rl.loss == full_rl.loss
    assert tiny_rl.rollout == full_rl.rollout


@pytest.mark.slow
def test_quickstart_tiny_runs_end_to_end(tmp_path):
    result = quickstart.run_quickstart(tmp_path / "qs", "arithmetic", tiny=True)
    assert set(result) == {"before", "after"}
    for name in ("base", "sft", "grpo", "plots"):
        assert (tmp_path / "qs" / name).is_dir()
    assert (tmp_path / "qs" / "grpo" / "final" / "config.json").is_file()


@pytest.mark.slow
def test_quickstart_emergence_tiny_leaves_what_the_doc_names(tmp_path):
    """`rlscale quickstart emergence --tiny`: the base and the final model as HF folders, the
    run's config for `rlvr eval --config`, the by-length figures and line-use probe in
    summary.json, and completions of the same prompts at the start, middle and end."""
    out = tmp_path / "em"
    quickstart.run_quickstart(out, "emergence", tiny=True)
    for folder in ("base", "grpo/final"):
        assert (out / folder / "config.json").is_file()
    assert load_config(RLVRConfig, out / "grpo" / "config.yaml", []).rollout.curriculum == \
        "learnability"
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["by_terms"]) == {"base", "grpo"} and set(summary["line_use"]) == \
        {"base", "grpo"}
    completions = (out / "completions.md").read_text()
    assert "step 0 (base)" in completions and "step 20" in completions
    assert "(final)" in completions
    assert {p.name for p in (out / "plots").iterdir()} == {"training.png", "pass_by_terms.png"}


def test_missing_benchmark_positions_name_the_flag(tmp_path):
    with pytest.raises(FileNotFoundError, match="--data-dir") as missing:
        read_positions("Test_L1_R1", data_dir=tmp_path)
    assert "\n" not in str(missing.value)


def test_a_model_path_the_quickstart_writes_says_so():
    from rlscale.rlvr.model import ModelLoadError, load_model

    with pytest.raises(ModelLoadError, match="rlscale quickstart reasoning` writes it"):
        load_model("runs/reasoning/no-such-model-here")


# ----------------------------------------------------------------- signs of life (item 3)

def test_a_heartbeat_speaks_at_most_every_interval():
    import io

    from rlscale.runtime.metrics import Heartbeat

    now, out = [0.0], io.StringIO()
    beat = Heartbeat("match", every_s=10, stream=out, clock=lambda: now[0]).beat
    for t in (1, 9, 10.5, 12, 25, 26):
        now[0] = t
        beat(f"at {t}")
    assert out.getvalue().splitlines() == ["match: at 10.5 (0:00:10)", "match: at 25 (0:00:25)"]
    silent = io.StringIO()
    Heartbeat("x", every_s=0, enabled=False, stream=silent).beat("never")
    assert silent.getvalue() == ""


def test_a_match_reports_every_round_of_moves():
    from rlscale.zero.agents import RandomAgent
    from rlscale.zero.games import make_game
    from rlscale.zero.matches import play_match

    calls = []
    play_match(make_game("tictactoe"), RandomAgent(0), RandomAgent(1), 4, seed=0,
               opening_plies=0, progress=lambda done, total, moves: calls.append((done, moves)))
    assert len(calls) >= 5 and calls[-1][0] == 4  # every round, not only finished games
    assert [m for _, m in calls] == sorted(m for _, m in calls) and calls[0][1] >= 4


def test_a_zero_iteration_shows_signs_of_life(tmp_path, monkeypatch, capsys):
    from rlscale.config import load_config
    from rlscale.zero.config import ZeroConfig
    from rlscale.zero.loop import train

    monkeypatch.setenv("RLSCALE_PROGRESS_EVERY_S", "0")
    path = tmp_path / "z.yaml"
    path.write_text(f"name: hb\nout: {tmp_path / 'run'}\n"
                    "network: {blocks: 0, channels: 4, value_hidden: 4}\nmcts: {simulations: 4}\n"
                    "selfplay: {concurrent_games: 4, games_per_iteration: 4}\n"
                    "replay: {capacity: 500}\n"
                    "train: {iterations: 1, batch_size: 16, min_replay: 1, sample_reuse: 1.0}\n")
    train(load_config(ZeroConfig, path, []), progress=True)
    err = capsys.readouterr().err
    assert "zero hb: iteration 1: self-play, " in err and "zero hb: iteration 1: learning, " in err
    train(load_config(ZeroConfig, path, ["train.iterations=2"]), resume=True, progress=False)
    assert "zero hb" not in capsys.readouterr().err
