"""The typed config of `rlscale zero train`, read top to bottom.

Defaults suit tic-tac-toe on a laptop; `configs/zero/*.yaml` override them per game and
explain their choices in comments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic

from ..config import (
    COMPUTE_DTYPE_HELP,
    DEVICE_HELP,
    MAX_LR,
    ComputeDtypeName,
    ConfigError,
    Device,
    LoggingConfig,
    NonFiniteGuardConfig,
    StrictModel,
    set_dotted,
)


class GameConfig(StrictModel):
    name: str = "tictactoe"  # registry name for rlscale.zero.games.make_game
    kwargs: dict[str, Any] = {}  # e.g. {"size": 9} for Go


class NetworkConfig(StrictModel):
    blocks: int = pydantic.Field(2, ge=0)  # residual blocks
    channels: int = pydantic.Field(32, ge=1)
    value_hidden: int = pydantic.Field(32, ge=1)  # width of the value head's hidden layer
    # 1x1-conv planes into the value head (AlphaZero: 1; more let the value see more features)
    value_channels: int = pydantic.Field(1, ge=1)
    # Warm start: a saved model folder (model.json), checkpoint or run directory whose weights
    # the run starts from instead of a random initialisation (a fresh optimizer and replay).
    # Same game and channels; blocks and value_channels may be larger (grown as by a stage).
    # A model without the auxiliary heads below may start a network with them (fresh heads).
    init_from: str | None = None
    # Global pooling (KataGo, Wu 2019): in every third residual block from the second (2, 5,
    # 8, ...), a quarter of the first convolution's channels are pooled over the whole board
    # (mean and max) and a linear layer turns them into per-channel biases of the rest, so
    # every point sees a board-wide summary (who is ahead, where the fights are) at once.
    # Needs blocks >= 2 and channels >= 4.
    global_pooling: bool = False
    # KataGo's auxiliary target, for games that know the final owner of each point (Go): a
    # 1x1 convolution from the tower, tanh per point, predicting who owns each point at the
    # end (+1 the player to move, -1 the opponent, 0 neither). Learnt from played-out games
    # only (a resigned game has no final position); loss weight train.ownership_weight.
    ownership_head: bool = False
    # KataGo's auxiliary target, Go only: a linear output on the value head's hidden layer
    # predicting the final score (area difference minus komi, the player to move's view)
    # divided by the board's points. Learnt from played-out games only; loss weight
    # train.score_weight.
    score_head: bool = False


class MCTSConfig(StrictModel):
    simulations: int = pydantic.Field(64, ge=1)  # per move (the "full" search, see selfplay)
    # PUCT: a = argmax Q + c * P * sqrt(N_parent) / (1 + N_child). With c_puct_base set,
    # c grows with the parent's visits as in AlphaZero: c + log((1 + N + base) / base).
    c_puct: float = 1.25
    c_puct_base: float | None = None
    # First-play urgency: an unvisited child is valued at the parent's mean value minus this
    # reduction (Leela/KataGo). 0 is neutral; a positive value focuses a small budget on the
    # moves the prior likes instead of trying every move once.
    fpu_reduction: float = 0.0
    # Dirichlet noise on the root prior, self-play only. alpha None -> 10 / (legal moves at
    # the root), the AlphaZero rule of thumb (0.3 chess, 0.03 Go) applied per position.
    dirichlet_alpha: float | None = None
    dirichlet_fraction: float = pydantic.Field(0.25, ge=0.0, le=1.0)
    # Leaves selected per tree per network call; pending leaves count as `virtual_loss`
    # losses so the next selection goes elsewhere. 1 = plain sequential MCTS.
    leaves_per_call: int = pydantic.Field(1, ge=1)
    virtual_loss: float = 1.0
    reuse_tree: bool = True  # keep the chosen child's subtree for the next move
    # MCTS-Solver: propagate proven wins/losses up from finished games; a proven win is
    # played at once, a proven loss avoided. Sharpens endgame tactics at a small budget.
    propagate_proofs: bool = False
    # Gumbel root search (Danihelka et al. 2022): Gumbel top-k sampling of `gumbel_considered`
    # root actions, sequential halving over the budget, completed-Q improved policy as the
    # training target. Strong with few simulations; replaces Dirichlet noise.
    gumbel: bool = False
    gumbel_considered: int = pydantic.Field(16, ge=1)
    gumbel_c_visit: float = 50.0
    gumbel_c_scale: float = 1.0


class SelfPlayConfig(StrictModel):
    concurrent_games: int = pydantic.Field(128, ge=1)  # trees searched by one network call
    games_per_iteration: int = pydantic.Field(128, ge=1)  # finished games between updates
    # Exploration in the opening: for this many plies PUCT samples moves from the visit counts
    # (tau=1; later the most visited) and Gumbel search adds its Gumbel noise (later none).
    temperature_moves: int = 4
    # Random openings (diversity): this share of games starts with 1..random_opening_plies
    # uniformly random moves (drawn per game), played before the search takes over and not
    # recorded as samples. Without it a sharp network's self-play can collapse onto a few
    # lines (e.g. every game of an iteration the same draw), and its value net never sees
    # the positions a different opponent steers into.
    random_opening_share: float = pydantic.Field(0.0, ge=0.0, le=1.0)
    random_opening_plies: int = pydantic.Field(0, ge=0)
    # Playout-cap randomisation (KataGo): with probability full_search_prob a move gets the full
    # `mcts.simulations` and becomes a training sample; otherwise it gets fast_simulations, no
    # noise, and is not recorded. None disables it (every move is a full, recorded search).
    fast_simulations: int | None = None
    full_search_prob: float = pydantic.Field(1.0, gt=0.0, le=1.0)
    # Resignation: the player to move resigns when the root value is below the threshold.
    # A share of games is played out regardless to measure false resignations (logged).
    resign_threshold: float | None = None
    resign_playout_share: float = pydantic.Field(0.2, ge=0.0, le=1.0)
    resign_min_moves: int = 4  # never resign before this ply
    # Threshold tuning (AlphaGo Zero: 0.05). When set, after every iteration the threshold
    # becomes the most aggressive one (a grid from -1 to 0 in steps of 0.01) at which at most
    # this share of the would-be resignations in the newest `resign_tune_window` played-out
    # games were false (the resigner won or drew), judged on at least `resign_tune_min_games`
    # would-be resignations; with less evidence the threshold stays. resign_threshold is the
    # starting value (required). See zero/resign.py.
    resign_false_positive_target: float | None = pydantic.Field(None, gt=0.0, lt=1.0)
    resign_tune_window: int = pydantic.Field(500, ge=1)
    resign_tune_min_games: int = pydantic.Field(10, ge=1)

    @pydantic.model_validator(mode="after")
    def _check_resign_tuning(self) -> SelfPlayConfig:
        if self.resign_false_positive_target is not None:
            if self.resign_threshold is None:
                raise ValueError("resign_false_positive_target needs resign_threshold (the "
                                 "starting value), e.g. -0.9")
            if self.resign_playout_share == 0:
                raise ValueError("resign_false_positive_target needs resign_playout_share > 0 "
                                 "(the played-out games are what it measures)")
        return self


class ReplayConfig(StrictModel):
    capacity: int = pydantic.Field(20_000, ge=1)  # the window: FIFO of the last N samples
    # A short window early (old samples come from a much weaker net): the window grows from
    # window_start by window_growth new slots per sample added, up to capacity. A run resumed
    # without its replay counts the samples it had added towards that growth, and learns only
    # once the refill holds window_start samples (never on one iteration's games alone).
    window_start: int | None = None
    window_growth: float = pydantic.Field(0.5, ge=0.0)
    augment: bool = True  # a random board symmetry per sampled position


class TrainConfig(StrictModel):
    seed: int = 0
    iterations: int = pydantic.Field(50, ge=1)  # self-play + learning rounds
    max_minutes: float | None = None  # stop early (after a whole iteration) past this time
    threads: int = pydantic.Field(1, ge=1)  # torch CPU threads
    batch_size: int = pydantic.Field(256, ge=1)
    # Learner steps per iteration = new samples * sample_reuse / batch_size: how many times an
    # average sample is trained on while it is in the window.
    sample_reuse: float = pydantic.Field(4.0, gt=0.0)
    # No updates until the window holds this many samples. A run resumed without its replay
    # (--resume-from an exported state) also waits for replay.window_start refilled samples.
    min_replay: int = 512
    optimizer: Literal["sgd", "adamw"] = "adamw"
    lr: float = pydantic.Field(2e-3, gt=0.0, le=MAX_LR)
    # Step schedule: {iteration: lr} switches to lr from that iteration on, e.g. {90: 5e-4}.
    lr_steps: dict[int, Annotated[float, pydantic.Field(gt=0.0, le=MAX_LR)]] = {}
    momentum: float = 0.9  # sgd only
    weight_decay: float = 1e-4  # sgd: the L2 term; adamw: decoupled decay
    # Value target = (1 - m) * z + m * root search value (z is the game outcome).
    value_target_mix: float = pydantic.Field(0.0, ge=0.0, le=1.0)
    # Weight of the ownership loss (network.ownership_head): the per-point cross-entropy
    # between the final owner and the head, averaged over the board's points and over the
    # played-out samples of a batch. 1.5 is KataGo's (1.5 / board area per point, summed).
    ownership_weight: float = pydantic.Field(1.5, ge=0.0)
    # Weight of the score loss (network.score_head): the squared error of the final score
    # divided by the board's points, averaged over the played-out samples. Untuned; the
    # scaled score's spread is about that of the value target.
    score_weight: float = pydantic.Field(1.0, ge=0.0)


class RuntimeConfig(StrictModel):
    """Where self-play runs (the RLVR config's `runtime` section is the same idea).

    actors 0: one `Actor` in the learner's process; self-play and learning take turns, and a
    resumed run continues exactly. actors M > 0: M self-play actors on Ray (an embedded local
    cluster, or the one at `address`), each playing `selfplay.concurrent_games` games with
    batched search and taking the newest weights between moves, while the learner trains on
    `selfplay.games_per_iteration` finished games per iteration (zero/actors.py).

    Threads: actors x actor_threads + train.threads must not exceed the machine's cores
    (OpenMP threads of several processes on the same cores spin-wait on each other and run
    5-10x slower). An embedded cluster refuses a run that would with multi-threaded
    processes; with single-threaded ones it warns (they only take turns on the cores).
    """

    actors: int = pydantic.Field(0, ge=0)  # self-play actors (Ray actors); 0: in-process
    address: str | None = None  # a Ray cluster to join (host:port or ray://...); None: embedded
    connect_timeout_s: float = pydantic.Field(30.0, gt=0)  # the wait for `address` to answer
    actor_threads: int = pydantic.Field(1, ge=1)  # torch threads per actor
    # Moves per actor call last about this long: how often weights reach an actor and games
    # reach the learner.
    call_budget_s: float = pydantic.Field(0.25, gt=0.0)
    # Actors pause while this many finished games wait for the learner (None: one iteration's
    # worth, games_per_iteration), so self-play runs at most about an iteration ahead.
    max_queued_games: int | None = pydantic.Field(None, ge=1)
    max_actor_restarts: int = pydantic.Field(10, ge=0)  # per actor, in a row (a crash loop)


def thread_check(actors: int, actor_threads: int, learner_threads: int,
                 cores: int) -> tuple[str, str] | None:
    """('error' | 'warning', message) when a fleet on `cores` cores would oversubscribe them."""
    total = actors * actor_threads + learner_threads
    if total <= cores:
        return None
    what = (f"runtime.actors x runtime.actor_threads + train.threads = {actors} x "
            f"{actor_threads} + {learner_threads} = {total} threads on {cores} cores")
    if actor_threads > 1 or learner_threads > 1:
        return "error", f"{what}: multi-threaded processes would spin-wait on each other"
    return "warning", f"{what}: the processes take turns on the cores"


class CheckpointConfig(StrictModel):
    every: int = pydantic.Field(10, ge=1)  # iterations between checkpoints
    keep: int = pydantic.Field(2, ge=1)
    # Every N iterations also the network alone (model.json and weights, no optimiser or
    # replay) in networks/step_NNNNNN/, never pruned: what `rlscale zero elo-curve` rates
    # over a run longer than `keep` checkpoints. 0 = none.
    networks_every: int = pydantic.Field(0, ge=0)


# Fields a `--resume` may change without --allow-config-change: speed, logging, the stopping
# rule (train.iterations may only grow; the loop checks that).
RESUME_FREE_FIELDS = ("name", "out", "device", "compute_dtype", "train.iterations", "train.max_minutes",
                      "train.threads", "runtime.address", "runtime.connect_timeout_s",
                      "runtime.actor_threads",
                      "runtime.call_budget_s", "runtime.max_actor_restarts", "checkpoint.*",
                      "health.*", "logging.*")


def _first_error(err: pydantic.ValidationError) -> str:
    """'where: message' of a validation error's first complaint, for one-line errors."""
    first = err.errors()[0]
    return ".".join(str(x) for x in first["loc"]) + ": " + first["msg"]


# Sections a stage may not change: they define what the run is (and the trackers of `logging`
# are opened once per run). The network may grow (see network.grow_network: the bigger net
# starts as the same function).
_FIXED_IN_A_RUN = ("name", "out", "game", "network", "stages", "logging")
_GROWABLE = ("network.blocks", "network.value_channels")


class ZeroConfig(StrictModel):
    name: str = "tictactoe"  # run name: the run directory defaults to runs/zero/<name>
    out: str | None = None  # run directory (overrides the default)
    # The learner, its batches and in-process self-play's network calls; fleet actors on a
    # GPU machine share its GPU (zero/actors.py). Speed only: a resume may change it.
    device: Device = pydantic.Field("auto", description=DEVICE_HELP)
    # Self-play's network calls (in-process and in every actor, each probing at its own
    # thread count); the learner keeps fp32. Speed only: a resume may change it.
    compute_dtype: ComputeDtypeName = pydantic.Field(
        "auto", description=f"self-play's network evaluations: {COMPUTE_DTYPE_HELP}")
    game: GameConfig = GameConfig()
    network: NetworkConfig = NetworkConfig()
    mcts: MCTSConfig = MCTSConfig()
    # Search settings for play and evaluation (arena, move, play, gtp) that differ from the
    # self-play ones in `mcts`, e.g. {gumbel: false, c_puct: 2.5}: a budget of hundreds of
    # simulations wants another search than the 32 of self-play. Saved with the model.
    play_mcts: dict[str, Any] = {}
    selfplay: SelfPlayConfig = SelfPlayConfig()
    replay: ReplayConfig = ReplayConfig()
    train: TrainConfig = TrainConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    health: NonFiniteGuardConfig = NonFiniteGuardConfig()
    logging: LoggingConfig = LoggingConfig()  # W&B / trackio beside TensorBoard
    # Stages: {iteration: {dotted.key: value}} changes settings from that iteration on, e.g.
    # {116: {train.lr: 5e-4, train.value_target_mix: 0.5, replay.capacity: 300000}}. At a
    # stage's first iteration the loop checkpoints and resumes itself with the new settings,
    # exactly as a stopped run resumed with an edited config would. Later stages apply on top
    # of earlier ones. The game and the stopping rule cannot change; the network can only grow
    # (network.blocks, network.value_channels), starting as the same function with a fresh
    # optimizer state.
    stages: dict[int, dict[str, Any]] = {}

    @pydantic.model_validator(mode="after")
    def _check_stages(self) -> ZeroConfig:
        for start in sorted(self.stages):
            if start < 2:
                raise ValueError(f"stages.{start}: a stage starts at iteration 2 or later")
            for key in self.stages[start]:
                if key in _GROWABLE:
                    continue
                if key.split(".")[0] in _FIXED_IN_A_RUN or key == "train.iterations":
                    raise ValueError(f"stages.{start}.{key}: cannot change during a run")
            try:
                before, after = self.at_iteration(start - 1), self.at_iteration(start)
            except pydantic.ValidationError as err:
                raise ValueError(f"stages.{start}: {_first_error(err)}") from None
            for key in _GROWABLE:
                field = key.split(".")[1]
                if getattr(after.network, field) < getattr(before.network, field):
                    raise ValueError(f"stages.{start}.{key}: a network can only grow")
        return self

    def stage_start(self, iteration: int) -> int:
        """The first iteration of the stage `iteration` belongs to (1 before any stage)."""
        return max([s for s in self.stages if s <= iteration], default=1)

    def at_iteration(self, iteration: int) -> ZeroConfig:
        """The settings in force at `iteration` (1-based): the base config with every stage
        that has started applied in order."""
        data = self.model_dump()
        data["stages"] = {}  # the result is one stage's settings
        for start in sorted(s for s in self.stages if s <= iteration):
            for key, value in self.stages[start].items():
                try:
                    set_dotted(data, key, value)
                except ConfigError as err:
                    raise ValueError(f"stages.{start}: {err}") from None
        return ZeroConfig.model_validate(data)

    @pydantic.model_validator(mode="after")
    def _check_network_options(self) -> ZeroConfig:
        from .games import defines_ownership  # the registry, loaded on demand

        net = self.network
        if net.global_pooling and (net.blocks < 2 or net.channels < 4):
            raise ValueError(f"network.global_pooling needs blocks >= 2 and channels >= 4 "
                             f"(got {net.blocks} blocks of {net.channels} channels)")
        for head in ("ownership_head", "score_head"):
            if getattr(net, head) and not defines_ownership(self.game.name):
                raise ValueError(f"network.{head}: game {self.game.name!r} has no final "
                                 "ownership of points (only go has)")
        return self

    @pydantic.model_validator(mode="after")
    def _check_play_mcts(self) -> ZeroConfig:
        try:
            MCTSConfig(**{**self.mcts.model_dump(), **self.play_mcts})
        except pydantic.ValidationError as err:
            raise ValueError(f"play_mcts.{_first_error(err)}") from None
        return self

    def run_dir(self) -> Path:
        return Path(self.out) if self.out else Path("runs") / "zero" / self.name
