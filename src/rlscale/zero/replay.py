"""The replay window: a FIFO of the last N self-play positions, sampled with symmetries.

Each sample is (planes, search policy mu, outcome z, root value, policy_version): z and the
root value are from the view of the player to move in that position; policy_version is the
version of the weights whose search produced mu, so the learner can measure staleness.

With KataGo's auxiliary targets on (a network with an ownership or score head, Go only) each
sample also carries its game's final position: the owner of every point and the score, from
the view of the player to move, and whether they are known (not in a resigned game). A board
symmetry moves the ownership plane with the input planes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .games.base import Game


@dataclass(frozen=True)
class Samples:
    """A batch of positions (what the actor emits and what the learner consumes)."""

    planes: np.ndarray  # [n, *plane_shape] float32
    policy: np.ndarray  # [n, A] float32, the search's distribution mu
    outcome: np.ndarray  # [n] float32, z in {-1, 0, 1} from the view of the player to move
    root_value: np.ndarray  # [n] float32, the search's value of the position (same view)
    policy_version: np.ndarray  # [n] int64
    # The final position's targets (FINAL_FIELDS; all None unless the actor records them):
    ownership: np.ndarray | None = None  # [n, H, W] int8: +1 the player to move owns the point
    score: np.ndarray | None = None  # [n] float32: final area difference - komi, same view
    final_known: np.ndarray | None = None  # [n] bool: False in a resigned game

    def __len__(self) -> int:
        return len(self.outcome)

    def fields(self) -> tuple[str, ...]:
        """The names of the fields it holds."""
        return _FIELDS + (FINAL_FIELDS if self.final_known is not None else ())

    def rows(self, index: np.ndarray | slice) -> Samples:
        return Samples(**{f: getattr(self, f)[index] for f in self.fields()})

    @staticmethod
    def concat(parts: list[Samples]) -> Samples:
        return Samples(**{f: np.concatenate([getattr(p, f) for p in parts])
                          for f in parts[0].fields()})

    @staticmethod
    def empty(plane_shape: tuple[int, ...], num_actions: int) -> Samples:
        return Samples(np.zeros((0, *plane_shape), np.float32),
                       np.zeros((0, num_actions), np.float32), np.zeros(0, np.float32),
                       np.zeros(0, np.float32), np.zeros(0, np.int64))


_FIELDS = ("planes", "policy", "outcome", "root_value", "policy_version")
FINAL_FIELDS = ("ownership", "score", "final_known")


class ReplayWindow:
    """Ring buffer of `capacity` samples; sampling draws from the newest `window()` of them.

    With `window_start` set, the window starts short and grows by `window_growth` slots per
    added sample (up to capacity): early samples come from a nearly random network and
    should leave the window quickly, later ones stay useful for longer (as in KataGo).

    With `final_targets` it keeps the final-position fields too (a sample added without them
    counts as from a resigned game); without, it drops them.

    `earlier`: samples the run added before a resume that did not carry them over (a training
    state exported without its replay). They are gone, but they count towards the window's
    growth, so a refilled window is as long as the run's was (once it holds that many), not a
    young run's; `refilling()` says the window is still shorter than `window_start`.
    """

    def __init__(
        self,
        capacity: int,
        plane_shape: tuple[int, ...],
        num_actions: int,
        window_start: int | None = None,
        window_growth: float = 0.5,
        final_targets: bool = False,
    ) -> None:
        self.capacity = capacity
        self.window_start = window_start
        self.window_growth = window_growth
        self.planes = np.zeros((capacity, *plane_shape), np.float32)
        self.policy = np.zeros((capacity, num_actions), np.float32)
        self.outcome = np.zeros(capacity, np.float32)
        self.root_value = np.zeros(capacity, np.float32)
        self.policy_version = np.zeros(capacity, np.int64)
        self.fields = _FIELDS
        if final_targets:
            self.fields = _FIELDS + FINAL_FIELDS
            self.ownership = np.zeros((capacity, *plane_shape[1:]), np.int8)
            self.score = np.zeros(capacity, np.float32)
            self.final_known = np.zeros(capacity, bool)
        self.total_added = 0  # ever; the next write goes to total_added % capacity
        self.earlier = 0  # added before a resume that lost them: growth only, no samples

    def __len__(self) -> int:
        return min(self.total_added, self.capacity)

    def window(self) -> int:
        """How many of the newest samples are eligible for sampling now."""
        size = len(self)
        if self.window_start is None:
            return size
        added = self.earlier + self.total_added
        grown = self.window_start + self.window_growth * max(0, added - self.window_start)
        return min(size, int(grown))

    def refilling(self) -> bool:
        """True while a window that lost its samples to a resume (earlier > 0) holds fewer than
        the run's starting window (window_start, or none when unset)."""
        return self.earlier > 0 and len(self) < min(self.window_start or 0, self.capacity)

    def add(self, samples: Samples) -> None:
        n = len(samples)
        if n == 0:
            return
        if n > self.capacity:  # only the newest fit
            samples = samples.rows(slice(-self.capacity, None))
            self.total_added += n - self.capacity
            n = self.capacity
        idx = (self.total_added + np.arange(n)) % self.capacity
        for f in self.fields:
            value = getattr(samples, f)
            getattr(self, f)[idx] = 0 if value is None else value
        self.total_added += n

    def newest_indices(self, count: int) -> np.ndarray:
        return (self.total_added - 1 - np.arange(count)) % self.capacity

    def sample(
        self, batch_size: int, rng: np.random.Generator, game: Game | None = None
    ) -> Samples:
        """Uniform over the window; with `game`, each position gets one of its symmetries at
        random (planes, policy and the ownership plane transformed together)."""
        window = self.window()
        if window == 0:
            raise ValueError("cannot sample from an empty replay window")
        idx = self.newest_indices(window)[rng.integers(window, size=batch_size)]
        batch = {f: getattr(self, f)[idx] for f in self.fields}  # fancy indexing: copies
        if game is not None:
            planes, policy = batch["planes"], batch["policy"]
            ownership = batch.get("ownership")
            for i in range(batch_size):
                # the ownership plane rides along as one more input plane
                board = planes[i] if ownership is None else np.concatenate(
                    [planes[i], ownership[i][None]])
                variants = game.symmetries(board, policy[i])
                board, policy[i] = variants[rng.integers(len(variants))]
                if ownership is None:
                    planes[i] = board
                else:
                    planes[i], ownership[i] = board[:-1], board[-1]
        return Samples(**batch)

    # -- persistence --------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Save the samples in age order (oldest first) to an .npz file."""
        order = self.newest_indices(len(self))[::-1]
        np.savez_compressed(
            path,
            total_added=np.int64(self.total_added),
            earlier=np.int64(self.earlier),
            **{f: getattr(self, f)[order] for f in self.fields},
        )

    def load(self, path: str | Path) -> None:
        with np.load(path) as data:
            total_added = int(data["total_added"])
            self.earlier = int(data["earlier"]) if "earlier" in data else 0
            stored = Samples(**{f: data[f] for f in _FIELDS + FINAL_FIELDS if f in data})
        self.total_added = total_added - len(stored)
        self.add(stored)
        assert self.total_added == total_added
