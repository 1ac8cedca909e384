"""FSDP2 for the policy: its weights, gradients and optimiser state sharded over the learner
processes, and the two ways its state leaves them (one full state dict on rank 0 for the
engines and the HF folder; the optimiser sharded, by torch.distributed.checkpoint).

The trainer's forward runs the decoder and then the output layer on the positions that
predict completion tokens only (logprobs.layout_logits). Under FSDP2 a module's parameters
are gathered in *its* forward and their gradients reduce-scattered after its backward, so
that pass must be one module's forward: `CompletionLogits` wraps it, and is the root that
owns what the decoder layers do not (embeddings, final norm, the output layer, tied or not).

Gradients are *summed* over ranks (not averaged, FSDP2's default): each rank's loss is its
rows' share of the one minibatch loss, normalised by the whole minibatch's counts. Gloo has
no pre-multiplied sum, so the sum is forced (`set_force_sum_reduction_for_comms`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import ConfigError
from .logprobs import plain_output_layer

OPTIMIZER_DIR = "optimizer"  # a checkpoint's sharded optimiser state (torch.distributed.checkpoint)
CRITIC_OPTIMIZER_DIR = "critic_optimizer"  # PPO's critic's, beside it


class CompletionLogits(nn.Module):
    """A causal LM's decoder and output layer as one forward: `[N, V]` logits at
    `logit_index` of the decoder's output (logprobs.layout_logits's fast path)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        if not plain_output_layer(model):
            raise ConfigError(f"train.learner_processes > 1 needs a model whose logits are its "
                              f"output embedding of the last hidden state; "
                              f"{type(model).__name__} scales or caps them")
        self.model = model
        self.config = model.config

    def forward(self, logit_index: tuple[torch.Tensor, torch.Tensor],
                inputs: dict[str, Any]) -> torch.Tensor:
        hidden = self.model.get_decoder()(**inputs).last_hidden_state
        return self.model.get_output_embeddings()(hidden[logit_index])

    def completion_logits(self, logit_index, inputs: dict[str, Any]) -> torch.Tensor:
        return self(logit_index, inputs)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None:
        raise ConfigError(f"train.learner_processes > 1: {type(model).__name__}'s decoder has "
                          "no `layers` list to shard")
    return list(layers)


def shard_policy(model: nn.Module, device_type: str) -> CompletionLogits:
    """`model` sharded in place over every learner process (one FSDP2 unit per decoder
    layer, the rest in the root), gradients summed over ranks; returns the root to run."""
    return _shard(CompletionLogits(model), decoder_layers(model), device_type)


def shard_value_model(model: nn.Module, device_type: str) -> nn.Module:
    """PPO's value model (rlvr/critic.ValueModel: a decoder `trunk` and a scalar head)
    sharded in place as the policy is: one unit per decoder layer, the embeddings, final norm
    and head in the root (its forward is one), gradients summed over ranks."""
    layers = getattr(model.trunk, "layers", None)
    if layers is None:
        raise ConfigError(f"train.learner_processes > 1: the critic's decoder "
                          f"({type(model.trunk).__name__}) has no `layers` list to shard")
    return _shard(model, list(layers), device_type)


def _shard(root: nn.Module, layers: list[nn.Module], device_type: str) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh(device_type, (torch.distributed.get_world_size(),))
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(root, mesh=mesh)
    for module in root.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    return root


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on rank 0's CPU (a collective: every rank calls it;
    the others get {}); tied weights under each of their names, as `state_dict()` has them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                 cpu_offload=True))


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Every rank loads the whole `state` into its shards (each keeps its own part)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))


def save_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path,
                   name: str = OPTIMIZER_DIR) -> None:
    """The optimiser state by parameter name, each rank writing its shard into
    `folder/name` (a collective); loadable at any number of processes."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    dcp.save({"optimizer": get_optimizer_state_dict(model, optimizer)},
             checkpoint_id=str(Path(folder) / name))


def load_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path,
                   name: str = OPTIMIZER_DIR) -> None:
    """The state `save_optimizer` wrote, resharded to this group's processes (one process,
    without a process group, included)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}  # allocates the targets
    dcp.load(state, checkpoint_id=str(Path(folder) / name))
    set_optimizer_state_dict(model, optimizer, state["optimizer"])


def load_torch_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer,
                               saved: dict[str, Any]) -> None:
    """A single process's `optimizer.state_dict()` (parameters by position) loaded into a
    sharded optimiser over the same trainable parameters: resume from 1 process to N."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    names = [name for name, p in model.named_parameters() if p.requires_grad]
    by_name = {"state": {names[i]: s for i, s in saved["state"].items()},
               "param_groups": [{**g, "params": [names[i] for i in g["params"]]}
                                for g in saved["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, by_name,
                             options=StateDictOptions(full_state_dict=True))
