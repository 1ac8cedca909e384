"""Self-play actors on the fleet runtime (embedded Ray): a SIGKILLed actor is restarted and
every finished game is counted exactly once; a fleet run checkpoints and resumes; the thread
budget is checked; no process is left behind."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("ray", reason="the fleet tests need Ray (pip install 'rlscale[ray]')")

from processes import alive, descendants  # noqa: E402
from rlscale.config import ConfigError, load_config  # noqa: E402
from rlscale.runtime.fleet import ray_session  # noqa: E402
from rlscale.runtime.versions import QueueClosed, VersionedQueue  # noqa: E402
from rlscale.zero.config import ZeroConfig, thread_check  # noqa: E402
from rlscale.zero.loop import ZeroRun, train  # noqa: E402

GAMES, SLOTS = 12, 8


def _config(out: Path, *extra: str) -> ZeroConfig:
    return load_config(ZeroConfig, None, [
        f"out={out}", "network.blocks=1", "network.channels=8", "mcts.simulations=8",
        f"selfplay.concurrent_games={SLOTS}", f"selfplay.games_per_iteration={GAMES}",
        "train.min_replay=32", "train.batch_size=32", "runtime.call_budget_s=0.05", *extra])


@pytest.fixture(scope="module")
def ray_cluster():
    """One embedded cluster for the module (Ray starts in ~4 s); every process it started
    is gone after the shutdown."""
    before = descendants(os.getpid())
    with ray_session(num_cpus=2) as ray:
        yield ray
        started = descendants(os.getpid()) - before
    deadline = time.time() + 20
    while time.time() < deadline and any(alive(p) for p in started):
        time.sleep(0.2)
    left = [p for p in started if alive(p)]
    assert not left, f"processes left behind: {left}"


def test_a_killed_actor_is_restarted_and_every_game_is_counted_once(ray_cluster, tmp_path):
    run = ZeroRun(_config(tmp_path / "run", "runtime.actors=2"))
    run.start_actors()
    fleet = run.source
    acc = fleet.accounting
    try:
        run.iterate()
        while acc.reports[0] == 0:  # it holds games in flight, as reported
            run.iterate()
        os.kill(fleet.worker_pids()[0], signal.SIGKILL)  # mid-game: 8 games in flight on it
        deadline = time.time() + 60
        # A death shows at the actor's next call; iterate until its successor delivered.
        while len(acc.first_games[0]) < 2 or not any(
                a == 0 and seq >= acc.first_games[0][1] for a, seq in list(acc.delivered)):
            assert time.time() < deadline, "the restarted actor delivered no game"
            run.iterate()
        restarted_at = acc.first_games[0][1]
        run.iterate()
    finally:
        run.close()
    assert acc.actor_restarts == 1 and acc.games_redone == SLOTS
    assert acc.first_games == [[0, restarted_at], [0]]
    # the games actor 0 finished before the kill, and those of its successor, all counted
    assert any(a == 0 and seq < restarted_at for a, seq in acc.delivered)
    assert acc.duplicates == 0
    # every finished game was delivered once, and is either trained on or still queued
    assert len(acc.taken) == len(set(acc.taken)) == run.counters.games
    assert set(acc.taken) <= set(acc.delivered)
    assert len(acc.delivered) == len(acc.taken) + len(fleet.queue)
    # the learner's counters are the sums over the distinct games it took
    assert run.counters.games == run.counters.iteration * GAMES
    assert run.counters.samples == sum(acc.delivered[g] for g in acc.taken)
    assert run.replay.total_added == run.counters.samples


def test_a_fleet_run_checkpoints_and_resumes(ray_cluster, tmp_path):
    out = tmp_path / "run"
    args = ("runtime.actors=1", "checkpoint.every=1")
    train(_config(out, "train.iterations=2", *args), progress=False)
    resumed = train(_config(out, "train.iterations=3", *args), resume=True, progress=False)
    assert resumed.counters.iteration == 3 and resumed.counters.games == 3 * GAMES
    assert (resumed.final_dir / "model.json").is_file()
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["counters/games"] for r in rows] == [GAMES, 2 * GAMES, 3 * GAMES]
    assert rows[-1]["staleness/lag_max"] >= rows[-1]["staleness/lag_mean"] >= 0
    assert rows[-1]["fleet/actor_restarts"] == 0
    states = [torch.load(out / "checkpoints" / f"step_00000{i}" / "trainer.pt",
                         weights_only=False) for i in (2, 3)]
    # the queued games at the checkpoint are discarded by the resumed run, and counted
    assert rows[-1]["fleet/discarded_on_resume"] == states[0]["fleet"]["queued"]
    # game ids go on across the resume: the new actor starts after every id seen
    assert states[1]["fleet"]["next_game"][0] >= states[0]["fleet"]["next_game"][0] + GAMES
    assert not (out / "checkpoints" / "step_000003" / "actor.pkl").exists()


def test_the_thread_budget_is_checked(tmp_path):
    assert thread_check(1, 1, 1, cores=2) is None
    assert thread_check(2, 1, 1, cores=2)[0] == "warning"  # single threads take turns
    level, message = thread_check(2, 2, 1, cores=4)
    assert level == "error" and "2 x 2 + 1 = 5 threads on 4 cores" in message
    cores = os.cpu_count() or 1
    cfg = _config(tmp_path / "run", "runtime.actors=1", f"runtime.actor_threads={cores}",
                  "train.threads=2")
    with pytest.raises(ConfigError, match="spin-wait"):
        train(cfg, progress=False)  # refused before Ray or the run directory
    assert not (tmp_path / "run").exists()


def test_the_versioned_queue_hands_over_oldest_first_and_fails_loudly():
    queue: VersionedQueue[str] = VersionedQueue()
    queue.put("a", 0)
    threading.Timer(0.05, lambda: queue.put("b", 1)).start()
    assert queue.take(2, timeout=10) == [(0, "a"), (1, "b")]
    with pytest.raises(TimeoutError):
        queue.take(1, timeout=0.01)
    threading.Timer(0.05, lambda: queue.fail("an actor died 11 times")).start()
    with pytest.raises(QueueClosed, match="11 times"):
        queue.take(1, timeout=10)
