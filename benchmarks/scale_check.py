"""The scale-out layouts on this machine, one short run each, in one table: the learner
group (FSDP2; NCCL on GPUs, gloo on CPU) against one process, an inference worker placed
beside it, and the weight-sync time a version.

    python benchmarks/scale_check.py                 # CPU: 1 vs 2 learner processes (gloo)
    python benchmarks/scale_check.py --device cuda   # a lent GPU machine (gpu_check.sh runs it)

Layouts, each `rlscale rlvr train` on a fresh tiny model for `--steps` steps:
- `1 learner`: one process, sync (the baseline every other row is compared with);
- `N learners`: train.learner_processes N, sync (with 2+ GPUs: one GPU each, NCCL; with
  fewer: on the CPU, gloo);
- `N learners + 1 engine`: runtime.mode async, one inference worker, placed on a GPU where
  there is one (`placement.inference.gpus`), the learner ranks as above.
Per row: seconds a step and an update, `time/publish_s` (learner -> worker serving the new
weights), and the final weights' largest relative difference from the 1-learner run (sync
rows only: the async one samples differently by design).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml


def config(run_dir: Path, model: Path, steps: int, overrides: dict) -> dict:
    """The run's config: a short GRPO run whose advantages are not all zero from the first
    step (a length penalty), with `overrides` (`key` or `section.key`) on top."""
    cfg = {"run_dir": str(run_dir), "model": {"path": str(model)},
           "task": {"name": "arithmetic", "options": {"add_digits": 2}}, "objective": "grpo",
           "loss": {"kl_coef": 0.01, "length_penalty_per_token": 0.05},
           "rollout": {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 8},
           "train": {"steps": steps, "lr": 1e-3, "minibatches": 2, "seed": 0},
           "checkpoint": {"every": 0}, "tensorboard": False, "progress": False}
    for key, value in overrides.items():
        section, _, name = key.rpartition(".")
        (cfg.setdefault(section, {}) if section else cfg)[name] = value
    return cfg


def run(name: str, out: Path, model: Path, steps: int, overrides: dict,
        torchrun: int = 0) -> dict:
    """One run's figures; `torchrun`: that many processes started by torchrun (else the
    learner group, if any, is Ray's)."""
    path = out / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config(out / name, model, steps, overrides)))
    launch = ([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={torchrun}"]
              if torchrun else [sys.executable])
    t0 = time.perf_counter()
    done = subprocess.run([*launch, "-m", "rlscale.cli", "rlvr", "train", str(path),
                           "--overwrite"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    (out / f"{name}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        return {"name": name, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    later = rows[1:] or rows  # the first step pays for start-up

    def mean(key: str) -> float | None:
        values = [r[key] for r in later if key in r]
        return sum(values) / len(values) if values else None

    return {"name": name, "wall_s": wall, "step_s": mean("time/step_s"),
            "update_s": mean("time/update_s"), "publish_s": mean("time/publish_s")}


def weight_gap(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    x, y = load_file(a / "final" / "model.safetensors"), load_file(b / "final" / "model.safetensors")
    return max(float((x[k] - y[k]).norm() / y[k].norm().clamp(min=1e-12)) for k in x.keys() & y.keys())


def layouts(device: str, processes: int) -> dict[str, dict]:
    """The rows' config overrides: with a GPU for every learner rank the group runs on
    them (NCCL), else on the CPU (gloo); the engine takes a GPU of its own where one is left,
    else shares the one there is."""
    gpus = torch.cuda.device_count() if device == "cuda" else 0
    on_gpus = gpus >= processes
    single = {"device": "cuda"} if gpus else {"device": "cpu"}
    group = {"device": "cuda" if on_gpus else "cpu", "train.learner_processes": processes}
    if on_gpus:
        group["placement.learner"] = {"gpus": 1}
    engine = {**group, "runtime.mode": "async", "runtime.inference_workers": 1}
    if gpus:
        engine["placement.inference"] = {"gpus": 1 if gpus > processes or not on_gpus else 0.5}
    return {"1 learner": single,
            f"{processes} learners ({group['device']})": group,
            f"{processes} learners + 1 engine": engine}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--launcher", choices=("ray", "torchrun"), default=None,
                        help="who starts the learner ranks (default: Ray where it imports; "
                        "the engine row needs Ray)")
    args = parser.parse_args()
    has_ray = importlib.util.find_spec("ray") is not None
    launcher = args.launcher or ("ray" if has_ray else "torchrun")
    out = args.out or Path(tempfile.mkdtemp(prefix="scale_check_"))
    out.mkdir(parents=True, exist_ok=True)
    from rlscale.rlvr.model import init_model

    model = init_model("tiny", out / "model", overwrite=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = []
    for index, (label, overrides) in enumerate(layouts(args.device, args.processes).items()):
        if "runtime.mode" in overrides and not has_ray:
            results.append({"label": label, "error": "skipped: the fleets need Ray"})
            continue
        by_torchrun = launcher == "torchrun" and "train.learner_processes" in overrides
        if by_torchrun:
            label += " [torchrun]"
        results.append({**run(f"layout{index}", out, model, args.steps, overrides,
                              torchrun=args.processes if by_torchrun else 0), "label": label})
    print(f"{'layout':32} {'wall s':>7} {'step s':>7} {'update s':>9} {'publish s':>10} "
          f"{'weights vs 1':>13}")
    base = out / results[0]["name"]
    for row in results:
        if "error" in row:
            print(f"{row['label']:32} error: {row['error']}")
            continue
        gap = weight_gap(out / row["name"], base) if "engine" not in row["label"] else None

        def cell(v, width, fmt=".3f"):
            return f"{v:>{width}{fmt}}" if v is not None else f"{'-':>{width}}"

        print(f"{row['label']:32} {cell(row['wall_s'], 7, '.1f')} {cell(row['step_s'], 7)} "
              f"{cell(row['update_s'], 9)} {cell(row['publish_s'], 10)} "
              f"{cell(gap, 13, '.1e')}")


if __name__ == "__main__":
    main()
