"""The fleet simulator against cases with a known answer, and its command."""

import json

import pytest
from typer.testing import CliRunner

from rlscale.cli import app
from rlscale.simulator import (
    FleetConfig,
    InferenceFleet,
    Mode,
    ResponseLengths,
    Trainer,
    Workload,
    simulate,
    split_by_version,
)


def fleet(*, workers=2, slots=8, sigma=0.8, steps=6, prompts=8, group=4, median=60,
          weight_load_s=0.3, seed=0) -> FleetConfig:
    return FleetConfig(
        seed=seed,
        workload=Workload(steps=steps, prompts_per_step=prompts, group_size=group,
                          prompt_tokens=10, response=ResponseLengths(
                              median=median, sigma=sigma, min=5, max=600, growth=1.5)),
        inference=InferenceFleet(workers=workers, slots=slots, decode_base_s=0.01,
                                 decode_per_slot_s=0.002, prefill_base_s=0.02,
                                 prefill_per_token_s=0.001, weight_load_s=weight_load_s),
        trainer=Trainer(devices=2, step_base_s=0.5, step_per_token_s=0.002))


SYNC = Mode(mode="sync")


def test_sync_one_slot_fixed_lengths_is_steps_times_generation_plus_training():
    cfg = fleet(workers=1, slots=1, sigma=0.0, steps=4, prompts=3, group=2, median=50)
    cfg.workload.response.growth = 1.0
    sequences, length, prompt = 3 * 2, 50, 10
    inf, tr = cfg.inference, cfg.trainer
    generation = sequences * (inf.prefill_base_s + inf.prefill_per_token_s * prompt
                              + length * (inf.decode_base_s + inf.decode_per_slot_s))
    training = (tr.step_base_s + tr.step_per_token_s * sequences * (prompt + length)) / tr.devices
    result = simulate(cfg, SYNC)
    # the weights published by the last step are never loaded before the run ends
    assert result.wall_s == pytest.approx(4 * (generation + training) + 3 * inf.weight_load_s)
    assert result.trained_tokens == 4 * sequences * length
    assert result.staleness_hist == {0: result.trained_tokens}


def test_continuous_beats_static_on_long_tails_and_ties_on_fixed_lengths():
    for mode in ("sync", "async"):
        k = 0 if mode == "sync" else 1
        tailed = fleet(sigma=1.0, prompts=16)
        static = simulate(tailed, Mode(mode=mode, max_staleness=k, batching="static"))
        cont = simulate(tailed, Mode(mode=mode, max_staleness=k, batching="continuous"))
        assert cont.wall_s < 0.95 * static.wall_s, mode
        assert cont.inference_utilisation > static.inference_utilisation

    fixed = fleet(sigma=0.0, prompts=16)
    static = simulate(fixed, Mode(mode="sync", batching="static"))
    cont = simulate(fixed, Mode(mode="sync", batching="continuous"))
    assert cont.wall_s == pytest.approx(static.wall_s)


@pytest.mark.parametrize("mode", ["async", "inflight"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_no_trained_token_lags_more_than_k(mode, k):
    for batching in ("static", "continuous"):
        result = simulate(fleet(sigma=1.0), Mode(mode=mode, max_staleness=k, batching=batching))
        assert result.staleness_max <= k
        assert max(step.lag_max for step in result.timeline) <= k
        assert len(result.timeline) == 6


def test_async_with_k0_is_sync():
    cfg = fleet(sigma=1.0)
    for batching in ("static", "continuous"):
        sync = simulate(cfg, Mode(mode="sync", batching=batching))
        async0 = simulate(cfg, Mode(mode="async", max_staleness=0, batching=batching))
        assert async0.to_dict() | {"mode": sync.mode} == sync.to_dict()


def test_async_overlaps_generation_with_training():
    cfg = fleet(sigma=1.0)
    sync = simulate(cfg, SYNC)
    async1 = simulate(cfg, Mode(mode="async", max_staleness=1))
    assert async1.wall_s < sync.wall_s
    assert 0 < async1.staleness_mean <= 1


@pytest.mark.parametrize("k", [1, 4])
def test_inflight_keeps_slots_busier_than_async(k):
    # slow weights publishing (a long trainer step) and long tails: async engines drain
    cfg = fleet(sigma=1.0, workers=2, slots=8, prompts=12)
    inflight = simulate(cfg, Mode(mode="inflight", max_staleness=k))
    async_k = simulate(cfg, Mode(mode="async", max_staleness=k))
    assert inflight.inference_utilisation > async_k.inference_utilisation


def test_seeds_reproduce():
    a = simulate(fleet(sigma=1.0, seed=3), Mode(mode="inflight", max_staleness=2))
    b = simulate(fleet(sigma=1.0, seed=3), Mode(mode="inflight", max_staleness=2))
    c = simulate(fleet(sigma=1.0, seed=4), Mode(mode="inflight", max_staleness=2))
    assert a == b
    assert a.wall_s != c.wall_s


def test_split_by_version_counts_each_decode_step_once():
    switches = [(0, 0), (10, 1), (25, 3)]
    assert list(split_by_version(switches, 5, 30)) == [(0, 5), (1, 15), (3, 5)]
    assert list(split_by_version(switches, 12, 20)) == [(1, 8)]
    assert list(split_by_version(switches, 25, 26)) == [(3, 1)]
    assert list(split_by_version([(0, 0)], 3, 3)) == []


def test_sync_mode_refuses_staleness():
    with pytest.raises(ValueError, match="max_staleness"):
        Mode(mode="sync", max_staleness=1)


def test_cli_simulates_here_yaml_as_json(tmp_path):
    result = CliRunner().invoke(app, ["fleet", "simulate", "configs/fleet/here.yaml",
                                      "workload.steps=20", "--json", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    modes = [r["mode"] for r in data["results"]]
    assert modes[0] == "sync static" and "inflight k=4 continuous" in modes
    assert data["results"][0]["speedup_vs_sync"] == pytest.approx(1.0)
    assert all(len(r["timeline"]) == 20 for r in data["results"])
    for name in ("fleet_throughput.png", "fleet_staleness.png", "fleet_timeline.png",
                 "fleet_results.json"):
        assert (tmp_path / name).is_file()


def test_cli_bad_key_is_one_line_error():
    result = CliRunner().invoke(app, ["fleet", "simulate", "configs/fleet/here.yaml",
                                      "inference.slotz=4"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "inference.slotz" in lines[0]
