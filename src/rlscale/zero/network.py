"""The residual policy-value network of AlphaZero, and its on-disk format.

    planes [B, P, H, W] -> stem (conv3x3, BN, ReLU) -> `blocks` residual blocks of `channels`
        -> policy head: conv1x1 (2) -> BN -> ReLU -> linear -> logits [B, num_actions]
        -> value head:  conv1x1 (1) -> BN -> ReLU -> linear (hidden) -> ReLU -> linear -> tanh

KataGo's options (Wu 2019), each off by default (a network without them is the one above):
global pooling in every third block from the second (`GlobalPoolingBlock`); an ownership head
(conv1x1 from the tower, tanh per point: who owns each point at the end of the game); a score
head (linear on the value head's hidden layer: the final score / the board's points). The
heads are auxiliary targets for training (`outputs`); the search's `evaluate` ignores them.

A saved network is a folder with `model.safetensors` (the weights) and `model.json` (the
game, its keyword arguments such as the Go board size, and the architecture), so a model can
be loaded with no code beyond this file and refuses to load for the wrong game.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from ..runtime.device import Workload, compute_context, parameter_signature
from ..runtime.health import first_non_finite_parameter

if TYPE_CHECKING:
    from .config import NetworkConfig
    from .games.base import Game

WEIGHTS_FILE = "model.safetensors"
META_FILE = "model.json"
FORMAT_VERSION = 1


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(x + y)


class GlobalPoolingBlock(nn.Module):
    """A residual block with KataGo's global pooling bias: `pooled` of the first convolution's
    output channels are pooled over the board (mean and max) and a linear layer turns them
    into a bias for each of the other channels, so every point sees a board-wide summary.
    The block ends like `ResidualBlock` (conv2, bn2, skip), so it grows the same way."""

    def __init__(self, channels: int, pooled: int) -> None:
        super().__init__()
        self.regular = channels - pooled
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn_pool = nn.BatchNorm2d(pooled)
        self.pool_bias = nn.Linear(2 * pooled, self.regular)
        self.bn1 = nn.BatchNorm2d(self.regular)
        self.conv2 = nn.Conv2d(self.regular, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(x)
        regular, pooled = y[:, : self.regular], F.relu(self.bn_pool(y[:, self.regular :]))
        summary = torch.cat([pooled.mean((2, 3)), pooled.amax((2, 3))], dim=1)
        y = F.relu(self.bn1(regular + self.pool_bias(summary)[:, :, None, None]))
        y = self.bn2(self.conv2(y))
        return F.relu(x + y)


def is_pooling_block(index: int) -> bool:
    """Whether residual block `index` (0-based) pools globally: the 2nd, 5th, 8th, ..."""
    return index % 3 == 1


@dataclass(frozen=True)
class NetOutput:
    """Every head's output for a batch (what the learner trains)."""

    logits: torch.Tensor  # [B, A] policy logits
    value: torch.Tensor  # [B] in [-1, 1], the player to move's view
    # [B, H, W] with an ownership head: tanh of it is the predicted final owner of each point
    # (+1 the player to move), sigmoid(2 x it) the probability that they own it
    ownership_logits: torch.Tensor | None = None
    score: torch.Tensor | None = None  # [B] with a score head: final score / board points


# The optional parts of a network, in `arch` (and model.json) only when present.
OPTIONS = ("global_pooling", "ownership_head", "score_head")


class PolicyValueNet(nn.Module):
    def __init__(
        self,
        plane_shape: tuple[int, int, int],
        num_actions: int,
        blocks: int = 5,
        channels: int = 64,
        value_hidden: int = 64,
        value_channels: int = 1,
        global_pooling: bool = False,
        ownership_head: bool = False,
        score_head: bool = False,
    ) -> None:
        super().__init__()
        planes, height, width = plane_shape
        self.plane_shape = tuple(plane_shape)
        # The matmul dtype of `evaluate` (a run's resolved compute_dtype): bfloat16 = autocast
        # over the fp32 weights. Training's forward is unaffected.
        self.compute_dtype = "float32"
        self.num_actions = num_actions
        self.arch = {"blocks": blocks, "channels": channels, "value_hidden": value_hidden,
                     "value_channels": value_channels}
        # Options only when on: a network without them describes (and compares) itself as
        # before they existed.
        self.arch.update({name: True for name, on in zip(
            OPTIONS, (global_pooling, ownership_head, score_head), strict=True) if on})
        self.stem = nn.Sequential(
            nn.Conv2d(planes, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
        )
        self.tower = nn.Sequential(*[
            GlobalPoolingBlock(channels, channels // 4)
            if global_pooling and is_pooling_block(i) else ResidualBlock(channels)
            for i in range(blocks)
        ])
        self.policy_head = nn.Sequential(
            nn.Conv2d(channels, 2, 1, bias=False),
            nn.BatchNorm2d(2),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(2 * height * width, num_actions),
        )
        self.value_head = nn.Sequential(
            nn.Conv2d(channels, value_channels, 1, bias=False),
            nn.BatchNorm2d(value_channels),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(value_channels * height * width, value_hidden),
            nn.ReLU(),
            nn.Linear(value_hidden, 1),
        )
        self.ownership_head = nn.Conv2d(channels, 1, 1) if ownership_head else None
        self.score_head = nn.Linear(value_hidden, 1) if score_head else None

    def forward(self, planes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(policy logits [B, A], value [B] in [-1, 1] from the view of the player to move)."""
        x = self.tower(self.stem(planes))
        return self.policy_head(x), torch.tanh(self.value_head(x)).squeeze(-1)

    def outputs(self, planes: torch.Tensor) -> NetOutput:
        """Every head's output; policy and value as `forward` computes them."""
        x = self.tower(self.stem(planes))
        hidden = self.value_head[:-1](x)  # the value head up to its last layer
        value = torch.tanh(self.value_head[-1](hidden)).squeeze(-1)
        ownership = None if self.ownership_head is None else self.ownership_head(x).squeeze(1)
        score = None if self.score_head is None else self.score_head(hidden).squeeze(-1)
        return NetOutput(self.policy_head(x), value, ownership, score)

    @torch.inference_mode()
    def evaluate(self, planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The search's evaluator: (priors [B, A] float32, values [B] float32).

        Priors are a softmax over all actions; the search masks illegal ones and renormalises.
        The network is put in eval mode (BatchNorm running statistics) for the call. On a
        GPU the planes go there and the results come back; on the CPU `.to` and `.cpu()` are
        no-ops (no copies).
        """
        was_training = self.training
        self.eval()
        x = torch.from_numpy(np.ascontiguousarray(planes, dtype=np.float32))
        with compute_context(self.device, self.compute_dtype):
            logits, values = self(x.to(self.device))
        if was_training:
            self.train()
        priors = torch.softmax(logits.float(), dim=-1)
        values = values.float()
        return priors.cpu().numpy(), values.cpu().numpy()

    @property
    def device(self) -> torch.device:
        """Where the weights live (the stem's first convolution stands for all of them)."""
        return self.stem[0].weight.device

    @property
    def learns_final_position(self) -> bool:
        """Whether it has a head for the game's final position (ownership or score)."""
        return "ownership_head" in self.arch or "score_head" in self.arch

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def network_for(game: Game, cfg: NetworkConfig, compute_dtype: str = "float32") -> PolicyValueNet:
    """A freshly initialised network for `game` with the sizes of a config's `network`,
    evaluating in `compute_dtype` (a resolved one: float32 or bfloat16)."""
    net = PolicyValueNet(game.plane_shape, game.num_actions, cfg.blocks, cfg.channels,
                         cfg.value_hidden, cfg.value_channels, cfg.global_pooling,
                         cfg.ownership_head, cfg.score_head)
    net.compute_dtype = compute_dtype
    return net


def precision_workload(net: PolicyValueNet, batch: int) -> Workload:
    """What `compute_dtype: auto` times for self-play: the network's forward (what
    `evaluate` runs) on `batch` positions, the leaves of one batched search call. The
    learner trains in fp32 whatever is chosen."""
    generator = torch.Generator(device=net.device).manual_seed(0)
    planes = torch.rand((batch, *net.plane_shape), generator=generator, device=net.device)

    def run() -> None:
        was_training = net.training
        net.eval()  # BatchNorm's running statistics, untouched
        with torch.inference_mode():
            net(planes)
        net.train(was_training)

    return Workload(f"zero {parameter_signature(net)} batch {batch}", run)


def selfplay_batch(concurrent_games: int, leaves_per_call: int) -> int:
    """Positions in one self-play network call (at most; finished games leave it smaller)."""
    return concurrent_games * leaves_per_call


def grow_network(net: PolicyValueNet, blocks: int, value_channels: int, *,
                 ownership_head: bool | None = None,
                 score_head: bool | None = None) -> PolicyValueNet:
    """A bigger network that computes exactly the same function as `net` (Net2Net-style), to
    go on training with more capacity without starting over.

    New residual blocks go after the old ones with their last BatchNorm's scale and shift at
    zero, so each starts as the identity (its input is already non-negative, after a ReLU).
    New value-head planes get zero weights in the layer they feed. Both train from there:
    the zeroed parameters still receive gradients. `ownership_head`, `score_head`: add (True)
    or drop (False) an auxiliary head (None: as `net`); an added head starts fresh and changes
    neither policy nor value."""
    arch = net.arch
    if blocks < arch["blocks"] or value_channels < arch["value_channels"]:
        raise ValueError(
            f"a network can only grow: {arch['blocks']} -> {blocks} blocks, "
            f"{arch['value_channels']} -> {value_channels} value planes"
        )
    grown = PolicyValueNet(
        net.plane_shape, net.num_actions, blocks, arch["channels"], arch["value_hidden"],
        value_channels, "global_pooling" in arch,
        "ownership_head" in arch if ownership_head is None else ownership_head,
        "score_head" in arch if score_head is None else score_head,
    )
    old, new = net.state_dict(), grown.state_dict()
    with torch.no_grad():
        for key, value in old.items():
            if key in new and not key.startswith(
                    ("value_head.0.", "value_head.1.", "value_head.4.")):
                new[key].copy_(value)
        for i in range(arch["blocks"], blocks):
            new[f"tower.{i}.bn2.weight"].zero_()
            new[f"tower.{i}.bn2.bias"].zero_()
        c = arch["value_channels"]
        new["value_head.0.weight"][:c] = old["value_head.0.weight"]
        for name in ("weight", "bias", "running_mean", "running_var"):
            new[f"value_head.1.{name}"][:c] = old[f"value_head.1.{name}"]
        new["value_head.1.num_batches_tracked"].copy_(old["value_head.1.num_batches_tracked"])
        cells = old["value_head.4.weight"].shape[1] // c
        new["value_head.4.weight"].zero_()
        new["value_head.4.weight"][:, : c * cells] = old["value_head.4.weight"]
        new["value_head.4.bias"].copy_(old["value_head.4.bias"])
    grown.load_state_dict(new)
    grown.to(net.device).train(net.training)
    return grown


@dataclass
class ModelMeta:
    """What `model.json` holds: enough to rebuild the network and to refuse a wrong game."""

    game: str
    game_kwargs: dict[str, Any]
    plane_shape: list[int]
    num_actions: int
    blocks: int
    channels: int
    value_hidden: int = 64
    value_channels: int = 1  # 1x1 conv planes feeding the value head's hidden layer
    # KataGo's options (network.OPTIONS), written only when on
    global_pooling: bool = False
    ownership_head: bool = False
    score_head: bool = False
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. the search settings used

    def describe_game(self) -> str:
        return describe_game(self.game, self.game_kwargs)


def describe_game(name: str, kwargs: dict[str, Any]) -> str:
    args = ", ".join(f"{k}={v}" for k, v in sorted(kwargs.items()))
    return f"{name}({args})" if args else name


def save_network(
    net: PolicyValueNet,
    path: str | Path,
    game: str,
    game_kwargs: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Write `model.safetensors` + `model.json` into the folder `path` (created if needed)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta = ModelMeta(
        game=game,
        game_kwargs=dict(game_kwargs or {}),
        plane_shape=list(net.plane_shape),
        num_actions=net.num_actions,
        blocks=net.arch["blocks"],
        channels=net.arch["channels"],
        value_hidden=net.arch["value_hidden"],
        value_channels=net.arch["value_channels"],
        **{name: True for name in OPTIONS if name in net.arch},
        extra=dict(extra or {}),
    )
    tensors = {k: v.detach().cpu().contiguous() for k, v in net.state_dict().items()}
    save_file(tensors, str(path / WEIGHTS_FILE))
    written = {k: v for k, v in asdict(meta).items() if k not in OPTIONS or v}
    (path / META_FILE).write_text(json.dumps(written, indent=2) + "\n")


def read_meta(path: str | Path) -> ModelMeta:
    meta_path = Path(path) / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"no {META_FILE} in {path}: not a saved rlscale Zero network")
    return ModelMeta(**json.loads(meta_path.read_text()))


def load_network(
    path: str | Path,
    game: str | None = None,
    game_kwargs: dict[str, Any] | None = None,
    device: str | torch.device = "cpu",
) -> tuple[PolicyValueNet, ModelMeta]:
    """Rebuild a saved network on `device` (the weights are saved as CPU tensors, so a model
    trained on a GPU loads anywhere). If `game` is given, the checkpoint must be for that game
    and those keyword arguments (e.g. Go size); otherwise a one-line ValueError names both."""
    meta = read_meta(path)
    if game is not None:
        wanted = describe_game(game, dict(game_kwargs or {}))
        if wanted != meta.describe_game():
            raise ValueError(
                f"checkpoint {path} is for {meta.describe_game()}, not for {wanted}"
            )
    net = PolicyValueNet(
        tuple(meta.plane_shape), meta.num_actions, meta.blocks, meta.channels, meta.value_hidden,
        meta.value_channels, meta.global_pooling, meta.ownership_head, meta.score_head,
    )
    net.load_state_dict(load_file(str(Path(path) / WEIGHTS_FILE)))
    # A damaged or diverged network would otherwise search with NaN priors and values and
    # play (badly) without a word.
    bad = first_non_finite_parameter(net)
    if bad is not None:
        raise ValueError(f"the network in {path} holds NaN/inf weights in {bad}")
    net.to(device).eval()
    return net, meta
