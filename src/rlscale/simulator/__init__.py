"""A discrete-event model of an RL fleet: inference workers x slots feed one trainer.

Why a model: whether asynchronous training pays, and at what staleness, depends on the
shape of the workload (the long tail of response lengths, the inference:trainer split),
not on the model's weights. A few measured coefficients and a seeded event queue answer
"which mode wins, by how much" for a 64-GPU fleet in seconds on a laptop, and the same
equations calibrated on this machine can be checked against real runs.

The model (equations in docs/fleet_simulator.md):
- a worker decodes all its active sequences one token per decode step of
  `decode_base_s + decode_per_slot_s * active`; admitting a request first costs a prefill
  pause of `prefill_base_s + prefill_per_token_s * prompt_tokens`; taking new weights costs
  `weight_load_s`;
- a training step on a batch costs `(step_base_s + step_per_token_s * tokens) / devices`
  with `tokens` the batch's prompt + response tokens;
- response lengths are log-normal around a median that grows linearly over the run.

Time advances from event to event: between two events a worker's active count, hence its
decode step time, is constant, so a worker needs one event per completion or interruption,
not one per token.
"""

from __future__ import annotations

import bisect
import collections
import heapq
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np
import pydantic

from ..config import StrictModel

# ---------------------------------------------------------------------------------------
# Typed inputs


class ResponseLengths(StrictModel):
    median: float = pydantic.Field(gt=0, description="median response tokens at the first step")
    sigma: float = pydantic.Field(0.0, ge=0, description="log-normal sigma; 0 = fixed length")
    min: int = pydantic.Field(1, ge=1)
    max: int = pydantic.Field(ge=1)
    growth: float = pydantic.Field(1.0, gt=0, description="median at the last step / first")

    @pydantic.model_validator(mode="after")
    def _ordered(self) -> ResponseLengths:
        if self.max < self.min:
            raise ValueError(f"response.max ({self.max}) is below response.min ({self.min})")
        return self


class Workload(StrictModel):
    steps: int = pydantic.Field(ge=1, description="training steps simulated")
    prompts_per_step: int = pydantic.Field(ge=1)
    group_size: int = pydantic.Field(ge=1, description="completions per prompt (G)")
    prompt_tokens: int = pydantic.Field(ge=0)
    response: ResponseLengths


class InferenceFleet(StrictModel):
    workers: int = pydantic.Field(ge=1, description="inference engines")
    slots: int = pydantic.Field(ge=1, description="concurrent sequences per engine")
    decode_base_s: float = pydantic.Field(ge=0, description="a: decode step time at 0 slots")
    decode_per_slot_s: float = pydantic.Field(ge=0, description="b: added per active slot")
    prefill_base_s: float = pydantic.Field(0.0, ge=0, description="c: per admitted request")
    prefill_per_token_s: float = pydantic.Field(0.0, ge=0, description="d: per prompt token")
    weight_load_s: float = pydantic.Field(0.0, ge=0, description="pause to take new weights")

    @pydantic.model_validator(mode="after")
    def _decode_takes_time(self) -> InferenceFleet:
        if self.decode_base_s + self.decode_per_slot_s <= 0:
            raise ValueError("inference.decode_base_s + decode_per_slot_s must be positive")
        return self


class Trainer(StrictModel):
    devices: int = pydantic.Field(1, ge=1, description="the step time is divided over these")
    step_base_s: float = pydantic.Field(ge=0, description="e: fixed cost of a step")
    step_per_token_s: float = pydantic.Field(ge=0, description="f: per batch token, one device")


class Mode(StrictModel):
    mode: Literal["sync", "async", "inflight"]
    max_staleness: int = pydantic.Field(0, ge=0, description="k: most versions a token may lag")
    batching: Literal["static", "continuous"] = "continuous"

    @pydantic.model_validator(mode="after")
    def _sync_is_fresh(self) -> Mode:
        if self.mode == "sync" and self.max_staleness != 0:
            raise ValueError("sync mode trains only fresh tokens: max_staleness must be 0")
        return self

    @property
    def label(self) -> str:
        head = "sync" if self.mode == "sync" else f"{self.mode} k={self.max_staleness}"
        return f"{head} {self.batching}"


def default_modes() -> list[Mode]:
    return [Mode(mode=m, max_staleness=k, batching=b)
            for m, k in (("sync", 0), ("async", 1), ("async", 4))
            for b in ("static", "continuous")] + [
        Mode(mode="inflight", max_staleness=k) for k in (1, 4)]


class FleetConfig(StrictModel):
    name: str = "fleet"
    seed: int = 0
    workload: Workload
    inference: InferenceFleet
    trainer: Trainer
    modes: list[Mode] = pydantic.Field(default_factory=default_modes)


# ---------------------------------------------------------------------------------------
# Typed result


@dataclass(frozen=True)
class StepRecord:
    step: int
    train_start_s: float
    train_end_s: float
    response_tokens: int
    lag_mean: float
    lag_max: int
    dropped_groups: int  # cumulative, at the end of this step


@dataclass(frozen=True)
class SimResult:
    mode: str
    wall_s: float
    trained_tokens: int        # response tokens that reached the trainer
    generated_tokens: int      # every decoded token, dropped and unfinished ones included
    tokens_per_s: float        # trained response tokens per wall second
    inference_utilisation: float  # busy slot-seconds / (workers x slots x wall)
    trainer_utilisation: float    # share of the wall the trainer was stepping
    staleness_hist: dict[int, int]  # lag -> trained response tokens
    staleness_mean: float
    staleness_max: int
    dropped_share: float       # dropped groups / groups that reached the trainer
    timeline: tuple[StepRecord, ...] = field(repr=False)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["staleness_hist"] = {str(k): v for k, v in self.staleness_hist.items()}
        return out


# ---------------------------------------------------------------------------------------
# Pure pieces


def length_scale(target_step: int, steps: int, growth: float) -> float:
    """Median multiplier for a group meant for `target_step`: linear from 1 to `growth`."""
    return 1.0 + (growth - 1.0) * target_step / max(steps - 1, 1)


def response_lengths(z: np.ndarray, spec: ResponseLengths, scale: float) -> list[int]:
    """Log-normal lengths from standard normals `z`, clipped to [min, max]."""
    raw = spec.median * scale * np.exp(spec.sigma * z)
    return [int(x) for x in np.clip(np.rint(raw), spec.min, spec.max)]


def split_by_version(switches: list[tuple[int, int]], start: int, end: int
                     ) -> Iterator[tuple[int, int]]:
    """(version, tokens) of the decode steps [start, end) of a worker whose weights changed
    to `version` at decode step `tick` for each (tick, version) in `switches` (ascending)."""
    ticks = [t for t, _ in switches]
    i = max(bisect.bisect_right(ticks, start) - 1, 0)
    while start < end:
        stop = ticks[i + 1] if i + 1 < len(ticks) else end
        if min(stop, end) > start:
            yield switches[i][1], min(stop, end) - start
        start = max(start, stop)
        i += 1


def train_step_s(trainer: Trainer, tokens: int) -> float:
    return (trainer.step_base_s + trainer.step_per_token_s * tokens) / trainer.devices


def decode_step_s(fleet: InferenceFleet, active: int) -> float:
    return fleet.decode_base_s + fleet.decode_per_slot_s * active


# ---------------------------------------------------------------------------------------
# The event loop


@dataclass
class _Group:
    target: int                     # the training step it was issued for
    lengths: list[int]
    unfinished: int
    oldest_version: int = 1 << 60
    tokens_by_version: collections.Counter = field(default_factory=collections.Counter)


@dataclass
class _Worker:
    index: int
    version: int = 0
    tick: int = 0                   # decode steps done so far
    running: list = field(default_factory=list)  # heap of (finish tick, seq no, group, start)
    switches: list = field(default_factory=lambda: [(0, 0)])
    span_start: float = 0.0         # when decoding (re)started at `tick`
    span_active: int = 0
    ready_at: float = 0.0           # end of the last prefill / weight-load pause
    epoch: int = 0                  # bumped to cancel a scheduled wake
    wake_at: float | None = None


_WAKE, _TRAINED = 0, 1


class _Fleet:
    """State of one simulated run; `run()` drives the event queue to the last step."""

    def __init__(self, cfg: FleetConfig, mode: Mode) -> None:
        self.cfg, self.mode = cfg, mode
        self.k = mode.max_staleness
        self.workers = [_Worker(i) for i in range(cfg.inference.workers)]
        self.events: list = []
        self.order = 0
        self.now = 0.0
        # Common random numbers: group g draws the same normals in every mode, so modes
        # differ by scheduling, not by luck.
        self.rng = np.random.default_rng(cfg.seed)
        self.normals: list[np.ndarray] = []
        self.issued = 0
        self.dropped = 0
        self.pending: collections.deque = collections.deque()   # (group, length)
        self.ready: collections.deque = collections.deque()     # finished groups, in order
        self.batch: list[_Group] = []
        self.version = 0                # trainer's published version = steps done
        self.training = False
        self.train_started = 0.0
        self.train_busy_s = 0.0
        self.slot_seconds = 0.0
        self.generated = 0
        self.hist: collections.Counter = collections.Counter()
        self.timeline: list[StepRecord] = []

    # -- queue ---------------------------------------------------------------------------
    def schedule(self, at: float, kind: int, *payload) -> None:
        self.order += 1
        heapq.heappush(self.events, (at, self.order, kind, payload))

    def wake(self, w: _Worker, at: float, tick: int) -> None:
        w.epoch += 1
        w.wake_at = at
        self.schedule(at, _WAKE, w.index, w.epoch, tick)

    # -- dispatch ------------------------------------------------------------------------
    def _new_group(self) -> _Group:
        wl = self.cfg.workload
        g = self.issued
        while len(self.normals) <= g:
            self.normals.extend(self.rng.standard_normal((wl.prompts_per_step, wl.group_size)))
        target = (self.issued - self.dropped) // wl.prompts_per_step
        scale = length_scale(target, wl.steps, wl.response.growth)
        lengths = response_lengths(self.normals[g], wl.response, scale)
        self.issued += 1
        return _Group(target, lengths, len(lengths))

    def next_request(self, version: int):
        """The next sequence a worker holding `version` may start, or None.

        A request is admitted only while its group would be trained within k versions of
        the weights that generate it; the queue is FIFO, so a stale worker that cannot take
        the head drains, then takes new weights."""
        if not self.pending:
            live = self.issued - self.dropped
            target = live // self.cfg.workload.prompts_per_step
            if target >= self.cfg.workload.steps or target - version > self.k:
                return None
            group = self._new_group()
            self.pending.extend((group, n) for n in group.lengths)
        group, _ = self.pending[0]
        if group.target - version > self.k:
            return None
        return self.pending.popleft()

    # -- workers -------------------------------------------------------------------------
    def on_wake(self, w: _Worker, tick: int) -> None:
        fleet, wl = self.cfg.inference, self.cfg.workload
        w.wake_at = None
        if w.span_active:
            self.slot_seconds += w.span_active * max(self.now - w.span_start, 0.0)
            self.generated += w.span_active * (tick - w.tick)
        w.tick = tick
        while w.running and w.running[0][0] <= tick:
            _, _, group, start = heapq.heappop(w.running)
            self.finish_sequence(w, group, start, tick)
        pause = 0.0
        if w.version < self.version and (self.mode.mode == "inflight" or not w.running):
            pause += fleet.weight_load_s
            w.version = self.version
            w.switches.append((tick, w.version))
        if self.mode.batching == "continuous" or not w.running:
            while len(w.running) < fleet.slots:
                request = self.next_request(w.version)
                if request is None:
                    break
                group, length = request
                group.oldest_version = min(group.oldest_version, w.version)
                pause += fleet.prefill_base_s + fleet.prefill_per_token_s * wl.prompt_tokens
                self.order += 1
                heapq.heappush(w.running, (tick + length, self.order, group, tick))
        w.ready_at = w.span_start = self.now + pause
        w.span_active = len(w.running)
        if w.running:
            steps = w.running[0][0] - tick
            self.wake(w, w.span_start + steps * decode_step_s(fleet, w.span_active),
                      w.running[0][0])

    def finish_sequence(self, w: _Worker, group: _Group, start: int, end: int) -> None:
        for version, tokens in split_by_version(w.switches, start, end):
            group.tokens_by_version[version] += tokens
            group.oldest_version = min(group.oldest_version, version)
        group.unfinished -= 1
        if group.unfinished == 0:
            self.ready.append(group)
            self.try_train()

    def poke(self, w: _Worker) -> None:
        """Have `w` look at the world again at its next decode-step boundary."""
        if not w.running:
            if w.wake_at is None:
                self.wake(w, max(self.now, w.ready_at), w.tick)
            return
        if self.now <= w.span_start:
            at, tick = w.span_start, w.tick
        else:
            dt = decode_step_s(self.cfg.inference, w.span_active)
            steps = math.ceil((self.now - w.span_start) / dt - 1e-9)
            at, tick = w.span_start + steps * dt, w.tick + steps
        if tick < w.running[0][0] and (w.wake_at is None or at < w.wake_at):
            self.wake(w, at, tick)

    def poke_all(self, published: bool) -> None:
        for w in self.workers:
            if not w.running:
                self.poke(w)
            elif published and self.mode.mode == "inflight":
                self.poke(w)
            elif not published and self.mode.batching == "continuous":
                self.poke(w)  # a drop lowers the targets of groups not yet issued

    # -- trainer -------------------------------------------------------------------------
    def try_train(self) -> None:
        wl = self.cfg.workload
        if self.training or self.version >= wl.steps:
            return
        step, dropped_before = self.version, self.dropped
        while len(self.batch) < wl.prompts_per_step and self.ready:
            group = self.ready.popleft()
            if step - group.oldest_version > self.k:
                self.dropped += 1
                continue
            self.batch.append(group)
        if self.dropped != dropped_before:
            self.poke_all(published=False)
        if len(self.batch) < wl.prompts_per_step:
            return
        tokens = sum(sum(g.lengths) + wl.prompt_tokens * len(g.lengths) for g in self.batch)
        self.training = True
        self.train_started = self.now
        self.schedule(self.now + train_step_s(self.cfg.trainer, tokens), _TRAINED)

    def on_trained(self) -> None:
        step = self.version
        lags: collections.Counter = collections.Counter()
        for group in self.batch:
            for version, tokens in group.tokens_by_version.items():
                lags[step - version] += tokens
        self.hist.update(lags)
        total = sum(lags.values())
        self.timeline.append(StepRecord(
            step=step, train_start_s=self.train_started, train_end_s=self.now,
            response_tokens=total,
            lag_mean=sum(lag * n for lag, n in lags.items()) / max(total, 1),
            lag_max=max(lags, default=0), dropped_groups=self.dropped))
        self.train_busy_s += self.now - self.train_started
        self.batch = []
        self.training = False
        self.version += 1
        self.poke_all(published=True)
        self.try_train()

    # -- driver --------------------------------------------------------------------------
    def run(self) -> SimResult:
        for w in self.workers:
            self.wake(w, 0.0, 0)
        steps = self.cfg.workload.steps
        while self.version < steps:
            if not self.events:
                raise RuntimeError(f"fleet stalled at step {self.version} ({self.mode.label})")
            self.now, _, kind, payload = heapq.heappop(self.events)
            if kind == _TRAINED:
                self.on_trained()
                continue
            index, epoch, tick = payload
            w = self.workers[index]
            if epoch == w.epoch:
                self.on_wake(w, tick)
        return self.result()

    def result(self) -> SimResult:
        wall, fleet = self.now, self.cfg.inference
        open_spans = [w for w in self.workers if w.running and wall > w.span_start]
        slot_seconds = self.slot_seconds + sum(  # spans still open when training ended
            w.span_active * (wall - w.span_start) for w in open_spans)
        generated = self.generated + sum(w.span_active * int(
            (wall - w.span_start) / decode_step_s(fleet, w.span_active)) for w in open_spans)
        trained = sum(self.hist.values())
        reached = self.dropped + steps_groups(self.cfg)
        return SimResult(
            mode=self.mode.label, wall_s=wall, trained_tokens=trained,
            generated_tokens=generated, tokens_per_s=trained / wall if wall else 0.0,
            inference_utilisation=slot_seconds / (fleet.workers * fleet.slots * wall),
            trainer_utilisation=self.train_busy_s / wall,
            staleness_hist=dict(sorted(self.hist.items())),
            staleness_mean=sum(lag * n for lag, n in self.hist.items()) / max(trained, 1),
            staleness_max=max(self.hist, default=0),
            dropped_share=self.dropped / reached,
            timeline=tuple(self.timeline))


def steps_groups(cfg: FleetConfig) -> int:
    return cfg.workload.steps * cfg.workload.prompts_per_step


def simulate(cfg: FleetConfig, mode: Mode) -> SimResult:
    """Run the fleet in `mode` until the trainer has taken `workload.steps` steps."""
    return _Fleet(cfg, mode).run()


def compare(cfg: FleetConfig) -> list[SimResult]:
    """Every mode of `cfg.modes` on the same workload (the same random lengths)."""
    return [simulate(cfg, mode) for mode in cfg.modes]
