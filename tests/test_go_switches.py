"""go_switches: the arm without playout caps costs the recipe's self-play simulations, and
the analysis keeps a switch only when the recipe beats the arm without it."""

from __future__ import annotations

from rlscale.config import load_config
from rlscale.experiments import go_switches as gs
from rlscale.experiments.setup import ZERO_CONFIGS
from rlscale.experiments.verdict import experiment_verdict
from rlscale.zero.config import ZeroConfig


def test_the_uncapped_arm_spends_the_recipes_simulations():
    recipe = load_config(ZeroConfig, ZERO_CONFIGS / gs.CONFIG, ["train.iterations=48"])
    # go9_grow: 32 simulations in full on 25% of the moves, 8 on the rest: 14 a move
    assert (recipe.mcts.simulations, recipe.selfplay.fast_simulations,
            recipe.selfplay.full_search_prob) == (32, 8, 0.25)
    assert gs.uncapped_iterations(recipe) == 21       # 48 x 14 / 32
    uncapped = next(a for a in gs.arms("full") if a.label == "no_playout_caps")
    cfg = load_config(ZeroConfig, ZERO_CONFIGS / gs.CONFIG, list(uncapped.overrides))
    assert (cfg.train.iterations, cfg.selfplay.full_search_prob) == (21, 1.0)
    others = [a for a in gs.arms("full") if a.label != "no_playout_caps"]
    assert all("train.iterations=48" in a.overrides for a in others)
    assert [a.label for a in others] == ["recipe", "no_ownership", "no_global_pooling"]


def _numbers(scores: dict[str, list[float]]) -> dict:
    figures = {"games": 6144, "simulations": 1e6, "learner_steps": 900, "minutes": 14.0}
    match = lambda s: {"wins": round(40 * s), "draws": 0, "losses": 40 - round(40 * s),  # noqa: E731
                       "score": s}
    return {"seeds": [0, 1, 2, 3], "games": 40, "simulations": 32,
            "runs": {label: [figures] * 4 for label in ("recipe", *gs.SWITCHES)},
            "matches": {label: [match(s) for s in values] for label, values in scores.items()}}


def test_a_switch_is_kept_only_when_the_recipe_beats_the_arm_without_it():
    all_pay = {label: [0.7, 0.75, 0.8, 0.72] for label in gs.SWITCHES}
    analysis = gs.analyse(_numbers(all_pay))
    assert [e.verdict for e in analysis.effects] == ["supports"] * 3
    assert experiment_verdict(analysis.effects) == "supports"
    one_costs = {**all_pay, "no_global_pooling": [0.2, 0.3, 0.25, 0.3]}
    analysis = gs.analyse(_numbers(one_costs))
    assert [e.verdict for e in analysis.effects] == ["supports", "contradicts", "supports"]
    assert experiment_verdict(analysis.effects) == "contradicts"
    level = {**all_pay, "no_ownership": [0.5, 0.55, 0.45, 0.5]}
    assert experiment_verdict(gs.analyse(_numbers(level)).effects) == "inconclusive"
    # W / D / L summed over the seeds: 28 + 30 + 32 + 29 wins of 160
    assert "119 / 0 / 41" in str(gs.analyse(_numbers(all_pay)).table.rows)


def test_a_kept_match_names_its_settings_and_both_networks(tmp_path):
    """A match saved for a rerun is reused only for the same arm, seed, settings and
    networks: a retrained network gets another file."""
    from pathlib import Path

    from rlscale.experiments.setup import TrainedZeroArm, ZeroArm

    def trained(label: str, weights: bytes) -> TrainedZeroArm:
        final = tmp_path / label / "final"
        final.mkdir(parents=True, exist_ok=True)
        (final / "model.safetensors").write_bytes(weights)
        (final / "model.json").write_text("{}")
        return TrainedZeroArm(ZeroArm(label, gs.CONFIG, ()), 1, Path(tmp_path / label), final,
                              ())

    recipe, arm = trained("recipe", b"a"), trained("no_ownership", b"b")
    full = gs.SETTINGS["full"]
    name = gs.match_name((recipe, arm), full)
    assert name.startswith("no_ownership_s1_vs_recipe_100games_32sims_")
    assert name == gs.match_name((recipe, arm), full)
    assert name != gs.match_name((recipe, arm), gs.SETTINGS["quick"])
    retrained = trained("no_ownership", b"c")
    assert gs.match_name((recipe, retrained), full) != name
