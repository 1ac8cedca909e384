"""Fixed-seed runs whose metrics and weights must not change when the code is restructured.

    python benchmarks/bitexact.py --save before.json          # on the commit before
    python benchmarks/bitexact.py --against before.json       # on the commit after

Five RLVR runs (GRPO with KL; DAPO in bf16 with 2 minibatches x 2 epochs; top-rho entropy
tokens with TIS; GSPO with MIS; on-policy distillation) and three Zero runs (tic-tac-toe;
Connect Four with a self-play actor on Ray; 7x7 Go), each a few steps on a tiny model. Each
run is reduced to a fingerprint: every logged metric except clock readings (`time/`,
`throughput/`, memory, rates), and a SHA-256 of every final weight tensor. The table says,
per run, whether the metrics and the weights are identical to the saved ones.

The actor run is timed by two processes (which weights a game was played with depends on
when it finished), so it is compared on what the actor run fixes: counters and game counts;
the other seven are compared on everything.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

torch.set_num_threads(1)

CLOCK_WORDS = ("time/", "throughput/", "memory/", "_per_s", "seconds", "elapsed", "wall",
               "precision/", "gib", "lag", "staleness/", "fleet/", "speed/")
TIMED_RUNS = {"zero_connect4_actors"}


def _clean(row: dict) -> dict:
    return {k: v for k, v in row.items()
            if not any(w in k.lower() for w in CLOCK_WORDS)}


def _weights_sha(folder: Path) -> str:
    from safetensors.torch import load_file

    digest = hashlib.sha256()
    for file in sorted(folder.glob("*.safetensors")):
        tensors = load_file(file)
        for name in sorted(tensors):
            digest.update(name.encode())
            digest.update(tensors[name].reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def _metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [_clean(r) for r in rows]


TASK = {"name": "arithmetic", "options": {"add_digits": 1, "mul_share": 0.0}}
RLVR_RUNS = {
    "rlvr_grpo_kl": ["objective=grpo", "loss.kl_coef=0.05", "train.compute_dtype=float32"],
    "rlvr_dapo_bf16_2x2": ["objective=dapo", "train.compute_dtype=bfloat16",
                           "train.minibatches=2", "train.epochs=2"],
    "rlvr_top_rho_tis": ["objective=grpo", "loss.kl_coef=0", "loss.entropy_top_rho=0.3",
                         "loss.is_correction=tis", "train.compute_dtype=float32"],
    "rlvr_gspo_mis": ["objective=gspo", "loss.is_correction=mis", "train.minibatches=2",
                      "train.compute_dtype=float32"],
    "rlvr_opd": ["objective=opd", "loss.reward_weight=0.5", "train.compute_dtype=float32"],
}


def rlvr_run(name: str, extra: list[str], work: Path) -> dict:
    from rlscale.config import build_config, load_config
    from rlscale.rlvr.config import RLVRConfig, SFTConfig
    from rlscale.rlvr.distill import sft
    from rlscale.rlvr.loop import train
    from rlscale.rlvr.model import build_tiny_model, save_model

    student = work / "student"
    if not student.exists():  # an SFT base that solves some one-digit sums: rewards vary
        sft(build_config(SFTConfig, {
            "init_preset": "tiny", "out": str(student), "run_dir": str(work / "sft"),
            "task": TASK, "data": {"examples": 4000, "wrong_share": 0.5}, "steps": 200,
            "batch_size": 64, "lr": 3e-3, "warmup_steps": 20, "tensorboard": False,
            "progress": False}))
        teacher, tokenizer = build_tiny_model("tiny", seed=1)
        save_model(teacher, tokenizer, work / "teacher")
    run_dir = work / name
    teacher = [f"teacher.path={work / 'teacher'}"] if "objective=opd" in extra else []
    cfg = load_config(RLVRConfig, None, [
        f"model.path={student}", f"run_dir={run_dir}", "task.name=arithmetic",
        "task.options={add_digits: 1, mul_share: 0.0}", "rollout.prompts_per_step=8",
        "rollout.group_size=4", "rollout.max_new_tokens=8", "train.steps=3", "train.lr=1e-3",
        "eval.every=3", "eval.prompts=8", "checkpoint.every=0", "progress=false",
        "tensorboard=false", *teacher, *extra])
    final = train(cfg)
    return {"metrics": _metrics(run_dir), "weights": _weights_sha(final)}


ZERO_RUNS = {
    "zero_tictactoe": ("configs/zero/tictactoe.yaml", [
        "train.iterations=3", "selfplay.games_per_iteration=16", "selfplay.concurrent_games=8",
        "mcts.simulations=8", "train.min_replay=32", "train.batch_size=32"]),
    "zero_connect4_actors": ("configs/zero/connect4.yaml", [
        "train.iterations=2", "network.blocks=1", "network.channels=8", "mcts.simulations=8",
        "selfplay.games_per_iteration=8", "selfplay.concurrent_games=8", "train.min_replay=32",
        "train.batch_size=32", "runtime.actors=1", "runtime.call_budget_s=0.05"]),
    "zero_go7": ("configs/zero/go7.yaml", [
        "train.iterations=2", "network.blocks=1", "network.channels=8", "mcts.simulations=8",
        "mcts.gumbel_considered=4", "selfplay.games_per_iteration=8",
        "selfplay.concurrent_games=8", "train.min_replay=32", "train.batch_size=32"]),
}


def zero_run(name: str, config: str, extra: list[str], work: Path) -> dict:
    from rlscale.config import load_config
    from rlscale.zero.config import ZeroConfig
    from rlscale.zero.loop import train

    root = Path(__file__).resolve().parents[1]
    out = work / name
    cfg = load_config(ZeroConfig, str(root / config), [f"out={out}", "checkpoint.every=100", "train.threads=1",
                                                        *extra])
    result = train(cfg, progress=False)
    metrics = _metrics(out)
    if name in TIMED_RUNS:
        metrics = [{k: v for k, v in r.items() if k in ("counters/games", "step")}
                   for r in metrics]
        return {"metrics": metrics, "weights": "timed"}
    return {"metrics": metrics, "weights": _weights_sha(result.final_dir)}


def fingerprints(only: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bitexact_") as tmp:
        work = Path(tmp)
        for name, extra in RLVR_RUNS.items():
            if not only or name in only:
                out[name] = rlvr_run(name, extra, work)
        needs_ray = [n for n in ZERO_RUNS if n in TIMED_RUNS and (not only or n in only)]
        if needs_ray:
            from rlscale.runtime.fleet import ray_session
            session = ray_session(num_cpus=2)
        else:
            from contextlib import nullcontext
            session = nullcontext()
        with session:
            for name, (config, extra) in ZERO_RUNS.items():
                if not only or name in only:
                    out[name] = zero_run(name, config, extra, work)
    return out


def first_difference(a: list[dict], b: list[dict]) -> str:
    if len(a) != len(b):
        return f"{len(a)} vs {len(b)} rows"
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        for key in sorted(set(x) | set(y)):
            if x.get(key) != y.get(key):
                return f"row {i} {key}: {x.get(key)!r} vs {y.get(key)!r}"
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", type=Path, help="write the fingerprints to this JSON file")
    parser.add_argument("--against", type=Path, help="compare with fingerprints saved before")
    parser.add_argument("--only", nargs="*", default=[], help="run only these names")
    args = parser.parse_args()
    found = fingerprints(args.only)
    if args.save:
        args.save.write_text(json.dumps(found, indent=1, sort_keys=True))
    saved = json.loads(args.against.read_text()) if args.against else {}
    print(f"{'run':24} {'rows':>4} {'metrics':>9} {'weights':>9}  weights sha / first difference")
    failed = False
    for name, fp in found.items():
        row = f"{name:24} {len(fp['metrics']):>4}"
        if name in saved:
            diff = first_difference(saved[name]["metrics"], fp["metrics"])
            same_w = saved[name]["weights"] == fp["weights"]
            failed |= bool(diff) or not same_w
            row += f" {'same' if not diff else 'DIFFER':>9} {'same' if same_w else 'DIFFER':>9}"
            row += f"  {fp['weights']} {diff}"
        else:
            row += f" {'-':>9} {'-':>9}  {fp['weights']}"
        print(row, flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
