"""The collect inside the training loop against `generate` alone, on the run's own model in
the same process: where a GRPO step's sampling time goes beyond the sampler's.

    .venv/bin/python benchmarks/collect_gap.py --model small --steps 3
    python benchmarks/collect_gap.py --model 0.5b --device cuda --steps 3 --profile

Runs `--steps` steps of the real loop in this process (configs/rlvr/quickstart.yaml's task,
`--prompts` x `--group` completions of `--tokens` new tokens, a random model of `--model`:
a preset, `0.5b` the Qwen2-0.5B shape of benchmarks/memory.py, or a model folder). Every
`generate` call a collect makes is recorded with its arguments; after the step the same calls
run again alone, timed and synchronised. Per step: the collect (`time/collect_s`), the
sampler's time inside it (`time/generate_s`), the same `generate` calls alone, and the gap.
On CUDA also the host synchronisations per token step inside the collect's `generate`
(`torch.cuda.set_sync_debug_mode`), and with `--profile` a profiler table of one collect.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from decode_step import syncs_during  # benchmarks/decode_step.py, beside this file
from sampler_step import synchronize  # benchmarks/sampler_step.py

from rlscale.config import load_config
from rlscale.rlvr import rollout_source
from rlscale.rlvr.config import RLVRConfig
from rlscale.rlvr.loop import RLVRRun
from rlscale.rlvr.model import build_tiny_model, save_model
from rlscale.runtime.device import machine_summary

REPO = Path(__file__).resolve().parents[1]


def model_folder(name: str, cache: Path) -> Path:
    if name in ("tiny", "small", "medium"):
        folder = cache / f"preset_{name}"
        if not (folder / "config.json").is_file():
            save_model(*build_tiny_model(name, seed=0), folder)
        return folder
    if name == "0.5b":
        import memory  # benchmarks/memory.py, beside this file

        return memory.build_model(cache / "qwen2_0.5b_shape")
    return Path(name)


class Recorder:
    """Wraps rollout_source.generate: every call's arguments, and the seconds it took."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple, dict]] = []
        self.inner = rollout_source.generate

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.inner(*args, **kwargs)


def alone(run: RLVRRun, recorder: Recorder, device: torch.device) -> float:
    """Seconds of the recorded `generate` calls again, alone, in the run's compute context."""
    synchronize(device)
    t0 = time.perf_counter()
    with run.rollouts.compute:
        for args, kwargs in list(recorder.calls):
            recorder.inner(*args, **{**kwargs, "generator": torch.Generator().manual_seed(0)})
    synchronize(device)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path("runs/memory"))
    parser.add_argument("--out", type=Path, default=Path("runs/collect_gap"))
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("overrides", nargs="*", help="more config overrides (key=value)")
    args = parser.parse_args()
    cfg = load_config(RLVRConfig, REPO / "configs" / "rlvr" / "quickstart.yaml", [
        f"model.path={model_folder(args.model, args.cache)}", f"run_dir={args.out}",
        f"train.steps={args.steps}", f"rollout.prompts_per_step={args.prompts}",
        f"rollout.group_size={args.group}", f"rollout.max_new_tokens={args.tokens}",
        "eval.every=0", "checkpoint.every=0", f"train.threads={args.threads}",
        "progress=false", "tensorboard=false", f"device={args.device}", *args.overrides])
    run = RLVRRun(cfg, overwrite=True)
    device = next(run.model.parameters()).device
    print(machine_summary() if device.type == "cpu" else torch.cuda.get_device_name(0))
    print(f"model {args.model}; {args.prompts} x {args.group} completions of {args.tokens} "
          f"tokens; compute {run.compute_dtype}")
    recorder = Recorder()
    rollout_source.generate = recorder
    print("| step | collect s | generate in the collect s | generate alone s | collect / "
          "alone | syncs per token step |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for step in range(args.steps):
        recorder.calls.clear()
        profile = args.profile and step == args.steps - 1 and device.type == "cuda"
        if step == args.steps - 1 and device.type == "cuda":
            syncs = syncs_during(lambda: run.rollouts.next_batch(run.step, run.learner.version))
            per_token = f"{syncs / max(args.tokens * len(recorder.calls), 1):.2f}"
            recorder.calls.clear()
        else:
            per_token = "-"
        if profile:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as profiler

            with profiler(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                record = run.train_step()
        else:
            record = run.train_step()
        run.finish(record, undone=False)
        metrics = record.metrics
        seconds = alone(run, recorder, device)
        print(f"| {step + 1} | {metrics['time/collect_s']:.2f} | "
              f"{metrics['time/generate_s']:.2f} | {seconds:.2f} | "
              f"{metrics['time/collect_s'] / seconds:.2f}x | {per_token} |", flush=True)
    if args.profile and device.type == "cuda":
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=30))
    rollout_source.generate = recorder.inner


if __name__ == "__main__":
    main()
