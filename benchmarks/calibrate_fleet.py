"""Calibrate the fleet simulator on this machine and check it against real runs.

    .venv/bin/python benchmarks/calibrate_fleet.py [--runs runs/bench_async]

Needs the runs of `benchmarks/async.py` (sync and inflight k=1). Measures the speeds the
simulator takes as input -- decode-step time against active rows for the static sampler and
the continuous-batching engine (tiny model, the threads each mode uses), prefill per prompt,
and the trainer's step time against batch tokens as logged by each run -- feeds them to
`rlscale.simulator`, and prints predicted vs measured training wall time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import yaml

from rlscale.rlvr.model import load_model
from rlscale.rlvr.rollout.engine import ContinuousBatchingEngine
from rlscale.rlvr.rollout.sampler import SamplingParams, generate
from rlscale.rlvr.rollout.types import EngineSampling, GenerationRequest
from rlscale.simulator import (
    FleetConfig,
    InferenceFleet,
    Mode,
    ResponseLengths,
    Trainer,
    Workload,
    simulate,
)

PROMPT = "123+456="


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope), both clipped at 0."""
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return max(float(intercept), 0.0), max(float(slope), 0.0)


def engine_decode(model, tokenizer, rows: int, tokens: int = 16) -> float:
    engine = ContinuousBatchingEngine(model, EngineSampling(1.0, 1.0, ignore_eos=True),
                                      slots=rows, eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id)
    ids = tuple(tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    for i in range(rows):
        engine.add_request(GenerationRequest(i, ids, tokens))
    engine.step()  # the prefill step
    t0 = time.perf_counter()
    engine.run()
    return (time.perf_counter() - t0) / (tokens - 1)


def sampler_step(model, tokenizer, rows: int, tokens: int = 16) -> float:
    ids = [tokenizer(PROMPT, add_special_tokens=False)["input_ids"]] * rows
    t0 = time.perf_counter()
    generate(model, ids, SamplingParams(tokens), eos_token_id=-1,
             pad_token_id=tokenizer.pad_token_id)
    return (time.perf_counter() - t0) / tokens


def prefill_per_prompt(model, tokenizer, rows: int = 64) -> float:
    engine = ContinuousBatchingEngine(model, EngineSampling(), slots=rows,
                                      eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id)
    ids = [list(tokenizer(PROMPT, add_special_tokens=False)["input_ids"])] * rows
    t0 = time.perf_counter()
    with torch.no_grad():
        engine._prefill(ids)
    return (time.perf_counter() - t0) / rows


def decode_speeds(model, tokenizer, fn, threads: int) -> tuple[float, float]:
    torch.set_num_threads(threads)
    rows = [8, 32, 64, 128, 256]
    times = [min(fn(model, tokenizer, n) for _ in range(3)) for n in rows]
    return fit(rows, times)


def trainer_speeds(run_dir: Path) -> tuple[float, float, list[dict]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rollout = yaml.safe_load((run_dir / "config.yaml").read_text())["rollout"]
    batch = rollout["prompts_per_step"] * rollout["group_size"]
    # Lengths barely vary over a run, too little to fit a line through: the step is charged
    # per batch token (prompt + response, as the simulator counts) at the run's median rate.
    rates = [r["time/train_s"] / ((r["length/mean"] + len(PROMPT)) * batch) for r in rows[1:]]
    return 0.0, float(np.median(rates)), rows


def workload(rows: list[dict], cfg: dict) -> Workload:
    lengths = [r["length/mean"] for r in rows]
    first, last = np.mean(lengths[:10]), np.mean(lengths[-10:])
    return Workload(steps=len(rows), prompts_per_step=cfg["prompts_per_step"],
                    group_size=cfg["group_size"], prompt_tokens=len(PROMPT),
                    response=ResponseLengths(median=float(first), sigma=0.35, min=1,
                                             max=cfg["max_new_tokens"],
                                             growth=float(last / first)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("runs/bench_async"))
    parser.add_argument("--out", type=Path, default=Path("runs/bench_async/calibration.json"))
    args = parser.parse_args()
    sync_dir, fleet_dir = args.runs / "sync", args.runs / "inflight_k1"
    model, tokenizer = load_model(yaml.safe_load((sync_dir / "config.yaml").read_text())
                                  ["model"]["path"])
    model.eval()
    prefill = prefill_per_prompt(model, tokenizer)
    report = {}
    for name, run_dir, mode, decode_fn, threads in (
            ("sync", sync_dir, Mode(mode="sync", batching="static"), sampler_step, 2),
            ("inflight k=1", fleet_dir, Mode(mode="inflight", max_staleness=1), engine_decode,
             1)):
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        a, b = decode_speeds(model, tokenizer, decode_fn, threads)
        e, f, rows = trainer_speeds(run_dir)
        fleet = cfg["runtime"]["inference_workers"] if mode.mode != "sync" else 1
        slots = cfg["rollout"]["slots"] if mode.mode != "sync" else (
            cfg["rollout"]["prompts_per_step"] * cfg["rollout"]["group_size"])
        sim_cfg = FleetConfig(
            name=f"here-{name}", workload=workload(rows[1:], cfg["rollout"]),
            inference=InferenceFleet(workers=fleet, slots=slots, decode_base_s=a,
                                     decode_per_slot_s=b, prefill_base_s=prefill,
                                     weight_load_s=0.002),
            trainer=Trainer(step_base_s=e, step_per_token_s=f), modes=[mode])
        predicted = simulate(sim_cfg, mode).wall_s
        measured = sum(r["time/step_s"] for r in rows[1:])
        report[name] = {"decode_base_s": a, "decode_per_row_s": b, "prefill_s": prefill,
                        "train_base_s": e, "train_per_token_s": f,
                        "predicted_s": predicted, "measured_s": measured,
                        "error": predicted / measured - 1}
    print("| run | decode a (ms) | b (us/row) | train e (s) | f (us/token) | predicted (s) | "
          "measured (s) | error |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in report.items():
        print(f"| {name} | {1e3 * r['decode_base_s']:.2f} | {1e6 * r['decode_per_row_s']:.1f} | "
              f"{r['train_base_s']:.3f} | {1e6 * r['train_per_token_s']:.1f} | "
              f"{r['predicted_s']:.1f} | {r['measured_s']:.1f} | {r['error']:+.0%} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
