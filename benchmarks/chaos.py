"""Chaos soak: fleet runs under repeated SIGKILLs, checked against undisturbed runs.

    .venv/bin/python benchmarks/chaos.py [--only rlvr zero] [--out runs/chaos]
        [--worker-every 60] [--trainer-every 600] [--rlvr-steps 1500] [--zero-iterations 24]
        [--seed 0]

Two soaks, each a real `rlscale ... train` process on an embedded Ray cluster:
- rlvr: configs/rlvr/async.yaml (in-flight updates, 2 inference workers, k = 1) on the
  quickstart's SFT base (`rlscale quickstart` makes runs/quickstart/base);
- zero: configs/zero/connect4.yaml with 2 self-play actors.
While a soak runs, a random worker (an inference worker or a self-play actor, found among
the trainer's descendants) is SIGKILLed every ~`--worker-every` s and the trainer itself
every ~`--trainer-every` s, then resumed with `--resume`. Afterwards it checks, from the
run's own metrics and /proc:
- every step (iteration) logged exactly once;
- the ledger balances at every step: RLVR admitted = trained + dropped + discarded on
  resume + in flight, trained = step x P; Zero delivered = taken + queued, games = step x
  games per iteration;
- the staleness bound held (RLVR: no trained token more than k versions old);
- no process of any incarnation is alive after the end (by PID);
- the final model's score is within noise of an undisturbed run of the same config
  (RLVR held-out pass@1; Zero perfect-play agreement on Connect Four positions), the noise
  being two standard errors of the difference of the two evaluations.
Prints a markdown table and writes `results.json` to --out. The defaults take ~30 minutes
of soak per loop plus the undisturbed runs on a 2-core machine; tests/faults/test_chaos.py
runs a short version on tiny models.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from processes import alive, descendants  # noqa: E402  (the tests' /proc helpers)

SIGKILLED = -signal.SIGKILL


@dataclass(frozen=True)
class Soak:
    """One loop's soak: the train command (without --resume), where it writes, which
    processes are its workers, and how to score its final model."""

    loop: str                   # "rlvr" | "zero"
    train: list[str]            # rlscale arguments
    run_dir: Path
    worker_title: str           # the Ray worker's process title, e.g. ray::InferenceWorker
    score: list[str]            # rlscale arguments printing the final model's figure (--json)
    score_name: str             # what the figure is (a share in [0, 1])
    per_step: int               # groups (RLVR) or games (Zero) one step consumes
    max_staleness: int | None = None


@dataclass
class SoakResult:
    loop: str
    wall_s: float
    steps: int
    worker_kills: int = 0
    trainer_kills: int = 0
    processes_seen: int = 0
    processes_left: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    score: float = math.nan
    score_se: float = math.nan


def rlscale(*args: str) -> list[str]:
    return [sys.executable, "-m", "rlscale.cli", *map(str, args)]


def read_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def workers_of(pid: int, title: str) -> list[int]:
    """The live descendants of `pid` whose process title starts with `title`."""
    found = []
    for child in descendants(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if cmdline.decode(errors="replace").startswith(title) and alive(child):
            found.append(child)
    return sorted(found)


def jittered(rng: random.Random, every: float) -> float:
    return every * rng.uniform(0.7, 1.3)


def run_soak(soak: Soak, *, worker_every: float, trainer_every: float, seed: int,
             log: Path, timeout_s: float = 4 * 3600) -> SoakResult:
    """Train `soak` to the end under kills; returns what happened (not yet checked)."""
    rng = random.Random(seed)
    result = SoakResult(soak.loop, 0.0, 0)
    family: set[int] = set()
    start = time.monotonic()
    resume: list[str] = []
    with log.open("a") as out:
        while True:
            proc = subprocess.Popen(rlscale(*soak.train, *resume), stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1"})
            born = time.monotonic()
            steps_at_birth = len(read_rows(soak.run_dir))
            next_worker_kill = born + jittered(rng, worker_every)
            trainer_kill = born + jittered(rng, trainer_every)
            killed_trainer = False
            while proc.poll() is None:
                if time.monotonic() - start > timeout_s:
                    proc.kill()
                    raise TimeoutError(f"{soak.loop} soak ran past {timeout_s:.0f} s")
                family |= descendants(proc.pid) | {proc.pid}
                now = time.monotonic()
                if now >= trainer_kill and len(read_rows(soak.run_dir)) <= steps_at_birth:
                    trainer_kill = now + 5.0  # not before it has made progress: a slow
                elif now >= trainer_kill:     # machine must not keep it at its start forever
                    os.kill(proc.pid, signal.SIGKILL)
                    killed_trainer = True
                    result.trainer_kills += 1
                    print(f"[{soak.loop}] {now - start:6.0f} s: SIGKILL trainer {proc.pid} "
                          f"(step {len(read_rows(soak.run_dir))})", flush=True)
                    proc.wait()
                    break
                if now >= next_worker_kill:
                    victims = workers_of(proc.pid, soak.worker_title)
                    if victims:  # none while the trainer starts or after its last step
                        victim = rng.choice(victims)
                        os.kill(victim, signal.SIGKILL)
                        result.worker_kills += 1
                        print(f"[{soak.loop}] {now - start:6.0f} s: SIGKILL worker {victim}",
                              flush=True)
                    next_worker_kill = now + jittered(rng, worker_every)
                time.sleep(0.25)
            if not killed_trainer:
                if proc.returncode != 0:
                    raise RuntimeError(f"{soak.loop} trainer exited {proc.returncode}; "
                                       f"see {log}")
                break
            resume = ["--resume"]
    result.wall_s = time.monotonic() - start
    result.processes_seen = len(family)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(alive(p) for p in family):
        time.sleep(0.5)
    result.processes_left = sorted(p for p in family if alive(p))
    return result


def ledger_problems(soak: Soak, rows: list[dict]) -> list[str]:
    """Every way the run's metrics break the soak's invariants (empty: none)."""
    problems = []
    steps = [r["step"] for r in rows]
    if steps != list(range(1, len(steps) + 1)):
        problems.append(f"steps not logged exactly once in order: {steps[:5]}..{steps[-5:]}")
    for r in rows:
        if soak.loop == "rlvr":
            parts = sum(r[f"fleet/ledger_{k}"] for k in (
                "trained", "dropped_stale", "dropped_uniform", "discarded_on_resume",
                "in_flight"))
            if r["fleet/ledger_admitted"] != parts:
                problems.append(f"step {r['step']}: admitted {r['fleet/ledger_admitted']} != "
                                f"trained + dropped + discarded + in flight {parts}")
            if r["fleet/ledger_trained"] != r["step"] * soak.per_step:
                problems.append(f"step {r['step']}: {r['fleet/ledger_trained']} groups "
                                f"trained, want {r['step'] * soak.per_step}")
            if r["staleness/lag_max"] > soak.max_staleness:
                problems.append(f"step {r['step']}: lag {r['staleness/lag_max']} > k")
        else:
            if r["fleet/games_delivered"] != r["fleet/games_taken"] + r["fleet/queued_games"]:
                problems.append(f"iteration {r['step']}: delivered {r['fleet/games_delivered']}"
                                f" != taken + queued")
            if r["fleet/duplicate_games"]:
                problems.append(f"iteration {r['step']}: a game delivered twice")
            if r["counters/games"] != r["step"] * soak.per_step:
                problems.append(f"iteration {r['step']}: {r['counters/games']} games, want "
                                f"{r['step'] * soak.per_step}")
    return problems


def score(soak: Soak) -> tuple[float, float]:
    """The final model's figure (a share) and its standard error."""
    proc = subprocess.run(rlscale(*soak.score), capture_output=True, text=True, check=True)
    if soak.loop == "rlvr":  # one JSON line: pass@1 over n prompts
        found = json.loads(proc.stdout.strip().splitlines()[-1])
        p, n = float(found["pass@1"]), int(found["n"])
    else:  # one JSON object: per benchmark file, positions and agreed
        files = json.loads(proc.stdout)["files"]
        n = sum(f["positions"] for f in files)
        p = sum(f["agreed"] for f in files) / n
    return p, math.sqrt(max(p * (1 - p), 1e-12) / n)


def undisturbed(soak: Soak, log: Path) -> SoakResult:
    """The same config trained without a kill (reused when its final model exists)."""
    final = soak.run_dir / "final"
    start = time.monotonic()
    if not final.exists():
        with log.open("a") as out:
            subprocess.run(rlscale(*soak.train, "--overwrite"), stdout=out,
                           stderr=subprocess.STDOUT, check=True)
    result = SoakResult(soak.loop, time.monotonic() - start, len(read_rows(soak.run_dir)))
    result.problems = ledger_problems(soak, read_rows(soak.run_dir))
    result.score, result.score_se = score(soak)
    return result


def chaos(soak: Soak, baseline: Soak, *, worker_every: float, trainer_every: float,
          seed: int, out: Path) -> dict:
    """The soak and its undisturbed twin, checked; the row of the table."""
    out.mkdir(parents=True, exist_ok=True)
    calm = undisturbed(baseline, out / f"{soak.loop}_undisturbed.log")
    saved = out / f"{soak.loop}_soak.json"  # kept before scoring: a failed score loses nothing
    if saved.exists() and (soak.run_dir / "final").exists():
        hit = SoakResult(**json.loads(saved.read_text()))
    elif (soak.run_dir / "final").exists():
        raise SystemExit(f"error: {soak.run_dir} holds a finished run; pick another --out")
    else:
        hit = run_soak(soak, worker_every=worker_every, trainer_every=trainer_every, seed=seed,
                       log=out / f"{soak.loop}_chaos.log")
        saved.write_text(json.dumps(asdict(hit), indent=1))
    rows = read_rows(soak.run_dir)
    hit.steps = len(rows)
    hit.problems = ledger_problems(soak, rows)
    if hit.processes_left:
        hit.problems.append(f"processes left after the end: {hit.processes_left}")
    hit.score, hit.score_se = score(soak)
    diff = hit.score - calm.score
    noise = 2 * math.hypot(hit.score_se, calm.score_se)
    if abs(diff) > noise:
        hit.problems.append(f"final {soak.score_name} {hit.score:.3f} vs undisturbed "
                            f"{calm.score:.3f}: outside 2 SE ({noise:.3f})")
    last = rows[-1] if rows else {}
    restarts = last.get("fleet/worker_restarts", last.get("fleet/actor_restarts", 0))
    return {"loop": soak.loop, "chaos": asdict(hit), "undisturbed": asdict(calm),
            "difference": diff, "noise_2se": noise, "restarts_logged_last_incarnation":
            restarts, "ok": not hit.problems and not calm.problems}


def rlvr_soaks(base: Path, out: Path, steps: int) -> tuple[Soak, Soak]:
    def soak(name: str) -> Soak:
        run_dir = out / name
        return Soak(
            "rlvr", ["rlvr", "train", str(REPO / "configs/rlvr/async.yaml"),
                     f"model.path={base}", f"run_dir={run_dir}", f"train.steps={steps}",
                     "checkpoint.every=25", "checkpoint.keep=2", "eval.every=0",
                     "progress=false", "tensorboard=false"],
            run_dir, "ray::InferenceWorker",
            ["rlvr", "eval", "--model", str(run_dir / "final"), "--task", "arithmetic",
             "--prompts", "500", "--samples", "4", "--k", "1", "--json"],
            "held-out pass@1", per_step=32, max_staleness=1)
    return soak("rlvr_chaos"), soak("rlvr_undisturbed")


def zero_soaks(out: Path, iterations: int, data_dir: Path) -> tuple[Soak, Soak]:
    def soak(name: str) -> Soak:
        run_dir = out / name
        return Soak(
            "zero", ["zero", "train", str(REPO / "configs/zero/connect4.yaml"),
                     f"out={run_dir}", f"train.iterations={iterations}", "train.threads=1",
                     "runtime.actors=2", "checkpoint.every=2", "--no-progress"],
            run_dir, "ray::SelfPlayWorker",
            ["zero", "solver-agreement", "--model", str(run_dir), "--simulations", "32",
             "--limit", "300", "--data-dir", str(data_dir), "--json"],
            "perfect-play agreement", per_step=256)
    return soak("zero_chaos"), soak("zero_undisturbed")


def table(rows: list[dict]) -> str:
    lines = ["| loop | steps | soak wall (s) | worker kills | trainer kills | processes seen "
             "/ left | ledger | final (chaos) | final (undisturbed) | difference (2 SE) | "
             "verdict |", "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: "
             "| --- |"]
    for r in rows:
        c, u = r["chaos"], r["undisturbed"]
        ledger = "balanced every step" if not [
            p for p in c["problems"] if "!=" in p or "want" in p] else "BROKEN"
        lines.append(
            f"| {r['loop']} | {c['steps']} | {c['wall_s']:.0f} | {c['worker_kills']} | "
            f"{c['trainer_kills']} | {c['processes_seen']} / {len(c['processes_left'])} | "
            f"{ledger} | {c['score']:.3f} | {u['score']:.3f} | {r['difference']:+.3f} "
            f"({r['noise_2se']:.3f}) | {'ok' if r['ok'] else 'FAILED'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=["rlvr", "zero"], default=["rlvr", "zero"])
    parser.add_argument("--out", type=Path, default=Path("runs/chaos"))
    parser.add_argument("--base", type=Path, default=Path("runs/quickstart/base"))
    parser.add_argument("--worker-every", type=float, default=60.0)
    parser.add_argument("--trainer-every", type=float, default=600.0)
    parser.add_argument("--rlvr-steps", type=int, default=1500)
    parser.add_argument("--zero-iterations", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", type=Path, default=REPO.parent / "shared" / "data" / "connect4",
                        help="solver-labelled Connect Four positions (the Zero soak's score)")
    args = parser.parse_args()
    if "rlvr" in args.only and not (args.base / "config.json").is_file():
        sys.exit(f"error: no base model at {args.base} (run `rlscale quickstart` first)")
    results = []
    for loop in args.only:
        soak, baseline = (rlvr_soaks(args.base.resolve(), args.out.resolve(), args.rlvr_steps)
                          if loop == "rlvr" else
                          zero_soaks(args.out.resolve(), args.zero_iterations, args.data_dir))
        results.append(chaos(soak, baseline, worker_every=args.worker_every,
                             trainer_every=args.trainer_every, seed=args.seed, out=args.out))
        for problem in results[-1]["chaos"]["problems"]:
            print(f"[{loop}] problem: {problem}", flush=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results))
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    sys.exit(0 if all(r["ok"] for r in results) else 1)


if __name__ == "__main__":
    main()
