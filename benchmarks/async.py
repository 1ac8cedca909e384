"""Synchronous vs asynchronous vs in-flight RLVR on the quickstart task, same steps.

    .venv/bin/python benchmarks/async.py --base runs/quickstart/base [--out runs/bench_async]
                                         [--steps 150] [--only modes|correction]

Each run is a separate `rlscale rlvr train` process on this machine (the quickstart's GRPO
config; the fleet runs use configs/rlvr/async.yaml's workers and threads), then a held-out
`rlscale rlvr eval` (500 prompts x 4 samples, pass@1). Reported per run: training wall time
(first step to last, without process start), trainer idle share (waiting for rollouts),
inference idle share, generated tokens/s, final pass@1; and for the correction sweep the
two logged factors of pi_theta/mu (engine mismatch, staleness drift). Writes a markdown
table to stdout, `results.json` and the plots into --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "rlvr" / "quickstart.yaml"
ASYNC = REPO / "configs" / "rlvr" / "async.yaml"

MODES = {  # name: (config, overrides)
    "sync": (QUICKSTART, []),
    "async k=1": (ASYNC, ["runtime.mode=async", "runtime.max_staleness=1"]),
    "async k=4": (ASYNC, ["runtime.mode=async", "runtime.max_staleness=4"]),
    "inflight k=1": (ASYNC, ["runtime.mode=inflight", "runtime.max_staleness=1"]),
}
CORRECTION = {  # a bf16 engine beside the fp32 trainer: a real mismatch
    f"bf16 {c} k={k}": (ASYNC, ["runtime.mode=inflight", f"runtime.max_staleness={k}",
                                "rollout.dtype=bfloat16", f"loss.is_correction={c}"])
    for k in (0, 4) for c in ("none", "tis", "mis")
}


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summarise(run_dir: Path) -> dict[str, float]:
    rows = read_metrics(run_dir)
    rollout = yaml.safe_load((run_dir / "config.yaml").read_text())["rollout"]
    wall = sum(r["time/step_s"] for r in rows)
    tokens = sum(r["length/mean"] * rollout["prompts_per_step"] * rollout["group_size"]
                 for r in rows)
    fleet = "fleet/trainer_wait_s" in rows[-1]
    if fleet:
        trainer_idle = sum(r["fleet/trainer_wait_s"] for r in rows) / wall
        inference_idle = 1 - mean([r["fleet/inference_busy_share"] for r in rows])
    else:  # one process: the trainer waits while it samples, the sampler while it trains
        trainer_idle = sum(r["time/collect_s"] for r in rows) / wall
        inference_idle = 1 - trainer_idle
    out = {"steps": len(rows), "train_wall_s": wall, "trainer_idle": trainer_idle,
           "inference_idle": inference_idle, "tokens_per_s": tokens / wall,
           "final_reward": mean([r["reward/mean"] for r in rows[-10:]]),
           "lag_mean": mean([r.get("staleness/lag_mean", 0.0) for r in rows])}
    for key in ("behaviour/engine_kl", "behaviour/stale_kl", "behaviour/weight_mean"):
        values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
        if values:
            out[key] = mean(values)
    return out


def run(name: str, config: Path, overrides: list[str], base: Path, out: Path,
        steps: int) -> dict[str, float]:
    run_dir = out / name.replace(" ", "_").replace("=", "")
    cmd = [sys.executable, "-m", "rlscale.cli", "rlvr", "train", str(config),
           f"model.path={base}", f"run_dir={run_dir}", f"train.steps={steps}", "eval.every=0",
           "checkpoint.every=0", "progress=false", *overrides]
    timing = run_dir.parent / f"{run_dir.name}.process_s"
    if (run_dir / "final" / "config.json").is_file() and timing.is_file():
        print(f"[{name}] reusing {run_dir}", file=sys.stderr)
    else:
        t0 = time.perf_counter()
        subprocess.run(cmd + ["--overwrite"], check=True, stdout=subprocess.DEVNULL)
        timing.write_text(f"{time.perf_counter() - t0:.1f}")
        print(f"[{name}] trained in {timing.read_text()}s (process)", file=sys.stderr)
    evaluation = subprocess.run(
        [sys.executable, "-m", "rlscale.cli", "rlvr", "eval", "--model", str(run_dir / "final"),
         "--task", "arithmetic", "--prompts", "500", "--samples", "4", "--k", "1", "--json"],
        check=True, capture_output=True, text=True)
    result = summarise(run_dir)
    result["pass@1"] = json.loads(evaluation.stdout.strip().splitlines()[-1])["pass@1"]
    result["run_dir"] = str(run_dir)
    result["process_s"] = float(timing.read_text())
    return result


def plot(results: dict[str, dict], out: Path) -> None:
    import matplotlib.pyplot as plt

    from rlscale.runtime.figures import save_figure

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, result in results.items():
        rows = read_metrics(Path(result["run_dir"]))
        clock, t = [], 0.0
        for r in rows:
            t += r["time/step_s"]
            clock.append(t)
        ax.plot(clock, [r["reward/mean"] for r in rows], label=name, lw=1)
    ax.set_xlabel("training wall-clock (s)")
    ax.set_ylabel("reward/mean")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, default=Path("runs/quickstart/base"))
    parser.add_argument("--out", type=Path, default=Path("runs/bench_async"))
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--only", choices=["modes", "correction"], default=None)
    args = parser.parse_args()
    if not (args.base / "config.json").is_file():
        sys.exit(f"error: no base model at {args.base} (run `rlscale quickstart` first)")
    sweeps = {"modes": MODES, "correction": CORRECTION}
    if args.only:
        sweeps = {args.only: sweeps[args.only]}
    all_results = {}
    for sweep, runs in sweeps.items():
        results = {name: run(name, cfg, ov, args.base, args.out, args.steps)
                   for name, (cfg, ov) in runs.items()}
        all_results[sweep] = results
        plot(results, args.out / f"{sweep}_reward_vs_wall.png")
        sync_wall = results.get("sync", {}).get("train_wall_s")
        print(f"\n### {sweep} ({args.steps} steps)\n")
        print("| run | process (s) | train wall (s) | speed-up | trainer idle | inference idle | tokens/s | "
              "lag mean | engine KL | stale KL | pass@1 |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, r in results.items():
            speed = f"{sync_wall / r['train_wall_s']:.2f}x" if sync_wall else "-"
            kl = {k: (f"{r[k]:.2e}" if k in r else "-")
                  for k in ("behaviour/engine_kl", "behaviour/stale_kl")}
            print(f"| {name} | {r['process_s']:.0f} | {r['train_wall_s']:.0f} | {speed} | {r['trainer_idle']:.0%} | "
                  f"{r['inference_idle']:.0%} | {r['tokens_per_s']:,.0f} | {r['lag_mean']:.2f} | "
                  f"{kl['behaviour/engine_kl']} | {kl['behaviour/stale_kl']} | "
                  f"{r['pass@1']:.3f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(all_results, indent=1))


if __name__ == "__main__":
    main()
