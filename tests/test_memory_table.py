"""benchmarks/memory.py's computed learner memory: the parameter counts against models built
on the meta device, the sharded parts at 1/N, the guard and reference terms, and the
activation, logits and decode-copy terms recounted on small real models (no measurement)."""

from __future__ import annotations

import importlib.util
import math
import sys
import weakref
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from transformers import Qwen2ForCausalLM

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("benchmarks_memory",
                                               REPO / "benchmarks" / "memory.py")
memory = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = memory  # dataclasses look their module up while the file runs
_spec.loader.exec_module(memory)

SMALL = dict(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True)
MICRO = memory.MicroBatch(sequences=4, tokens=512, prompt=128)


def _meta_model(config):
    with torch.device("meta"):
        return Qwen2ForCausalLM(config)


@pytest.mark.parametrize("shape,billions", [("tiny", 0.1345), ("0.5b", 0.4940),
                                            ("1.5b", 1.5437), ("7b", 7.6156)])
def test_parameter_count_matches_the_model_built_from_the_config(shape, billions):
    config = memory.qwen2_config(shape)
    model = _meta_model(config)
    assert memory.parameter_count(config) == sum(p.numel() for p in model.parameters())
    assert memory.parameter_count(config) / 1e9 == pytest.approx(billions, abs=1e-4)


def test_layer_and_root_shapes_are_the_models_own():
    config = memory.qwen2_config("0.5b")
    named = {n: tuple(p.shape) for n, p in _meta_model(config).named_parameters()}
    layer = {n.removeprefix("model.layers.0."): s for n, s in named.items()
             if n.startswith("model.layers.0.")}
    assert layer == memory.layer_shapes(config)
    root = {n: s for n, s in named.items() if not n.startswith("model.layers.")}
    assert root == memory.root_shapes(config)  # tied: no lm_head.weight of its own
    assert "lm_head.weight" in memory.root_shapes(memory.qwen2_config("7b"))


def test_shards_are_dim0_chunks_padded_to_equal_size():
    assert memory.shard_numel((8, 3), 4) == 6
    assert memory.shard_numel((5, 3), 2) == 9      # ceil(5 / 2) rows of 3
    assert memory.shard_numel((7,), 8) == 1


@pytest.mark.parametrize("n", [2, 4, 8])
def test_sharded_state_scales_as_one_over_n(n):
    config = memory.qwen2_config("1.5b")
    one = memory.per_process_bytes(config, memory.Learner(1), MICRO)
    many = memory.per_process_bytes(config, memory.Learner(n), MICRO)
    for part in memory.STATE:
        assert many[part] == pytest.approx(one[part] / n, rel=1e-4)  # padding only
    assert many["activations"] == one["activations"]  # each rank runs a whole micro-batch
    assert one["gather"] == 0 < many["gather"]
    assert one["decode"] > 0 == many["decode"]        # the driver's, not a rank's


def test_guard_and_reference_bytes_per_parameter():
    config = memory.qwen2_config("0.5b")
    params = memory.parameter_count(config)
    parts = {guard: memory.per_process_bytes(config, memory.Learner(1, guard, ref), MICRO)
             for guard, ref in (("snapshot", True), ("check", False), ("off", False))}
    assert parts["snapshot"]["snapshot"] == 12 * params
    assert parts["check"]["snapshot"] == parts["off"]["snapshot"] == 0
    assert parts["snapshot"]["reference"] == 4 * params
    assert parts["check"]["reference"] == 0
    assert (parts["check"]["weights"], parts["check"]["grads"], parts["check"]["adamw"]) == (
        4 * params, 4 * params, 8 * params)
    assert parts["snapshot"]["total"] - parts["check"]["total"] == pytest.approx(16 * params)
    with pytest.raises(ValueError, match="guard"):
        memory.per_process_bytes(config, memory.Learner(1, "sometimes"), MICRO)


def test_total_is_the_state_plus_the_largest_phase():
    config = memory.qwen2_config("0.5b")
    learner = memory.Learner(1, "check", False)
    parts = memory.per_process_bytes(config, learner, MICRO)
    phases = memory.update_phases(config, learner, MICRO)
    state = sum(parts[k] for k in memory.STATE)
    assert parts["update_total"] == state + max(phases.values())
    assert parts["peak_at"] == max(phases, key=phases.get)
    tiny_micro = memory.MicroBatch(1, 16, 8)  # few logits: the tied embedding's gradients win
    assert memory.per_process_bytes(config, learner, tiny_micro)["peak_at"] == \
        "embedding backward"
    vd = 4 * config.vocab_size * config.hidden_size
    assert memory.embedding_grad_bytes(config, 1) == 3 * vd
    untied = memory.qwen2_config({**memory.SHAPES["0.5b"], "tie_word_embeddings": False})
    assert memory.embedding_grad_bytes(untied, 1) == vd
    assert memory.embedding_grad_bytes(untied, 2) == 2 * vd


def _saved_bytes(config, micro, checkpointing=False) -> int:
    """Bytes autograd keeps for the backward in the trainer's packed forward (parameters
    excluded), counted by storage."""
    from rlscale.rlvr.logprobs import completion_logprobs
    from rlscale.rlvr.model import enable_activation_checkpointing

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).train()
    if checkpointing:
        enable_activation_checkpointing(model)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def keep(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        completion_logprobs(model, memory.random_batch(micro, 1, config.vocab_size),
                            with_entropy=True, pack=True)
    return sum(saved.values())


@pytest.mark.parametrize("checkpointing", [False, True])
def test_activation_count_per_layer(checkpointing):
    micro = memory.MicroBatch(2, 24, 4)
    per_layer = []
    for layers in (2, 3):
        config = memory.qwen2_config({**SMALL, "num_hidden_layers": layers})
        per_layer.append(_saved_bytes(config, micro, checkpointing))
    config = memory.qwen2_config(SMALL)
    one_layer = per_layer[1] - per_layer[0]
    expected = (4 * config.hidden_size * micro.all_tokens if checkpointing
                else 4 * memory.saved_floats_per_token_layer(config) * micro.all_tokens)
    assert one_layer == expected


class LiveBytes(TorchDispatchMode):
    """The peak of the bytes held by tensors created inside the mode, by storage; views of
    the storages in `existing` (the parameters: `aten.t` of a weight) are not new."""

    def __init__(self, existing: set[int]) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.held = set(existing)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.held:
                storage = t.untyped_storage()
                key, size = storage.data_ptr(), storage.nbytes()
                self.held.add(key)
                self.live += size
                weakref.finalize(storage, self._free, key, size)
        self.peak = max(self.peak, self.live)
        return out

    def _free(self, key: int, size: int) -> None:
        self.live -= size
        self.held.discard(key)


def test_forward_peak_is_activations_plus_the_logits_copies():
    """A large vocabulary on small layers: the forward's peak is what it keeps plus
    LOGITS_PEAK_COPIES copies of [completion tokens x vocab]."""
    from rlscale.rlvr.logprobs import completion_logprobs

    config = memory.qwen2_config({**SMALL, "vocab_size": 8192})
    micro = memory.MicroBatch(2, 24, 4)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).train()
    batch = memory.random_batch(micro, 1, config.vocab_size)
    tracker = LiveBytes({p.untyped_storage().data_ptr() for p in model.parameters()})
    with tracker:
        logp, _ = completion_logprobs(model, batch, with_entropy=True, pack=True)
    expected = memory.update_phases(config, memory.Learner(1), micro)["forward"]
    assert tracker.peak == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_copy_is_what_the_sampler_builds(dtype):
    from rlscale.rlvr.rollout.decoder import DecoderWeights

    for tied in (True, False):
        config = memory.qwen2_config({**SMALL, "tie_word_embeddings": tied})
        model = Qwen2ForCausalLM(config)
        weights = DecoderWeights.from_model(model, getattr(torch, dtype))
        own = {p.untyped_storage().data_ptr() for p in model.parameters()}
        tensors = [weights.embed, weights.lm_head.weight, weights.final_norm.weight]
        for layer in weights.layers:
            tensors += [layer.qkv.weight, layer.qkv.bias, layer.out.weight, layer.gate_up.weight,
                        layer.down.weight, layer.attn_norm.weight, layer.mlp_norm.weight]
        copies = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                  for t in tensors if t is not None}
        new = sum(size for ptr, size in copies.items() if ptr not in own)
        assert new == memory.decode_copy_bytes(config, dtype)


def test_the_table_prints_every_shape_and_process_count():
    rows = memory.table(MICRO, checkpointing=False, compute_dtype="float32")
    body = [r for r in rows[2:]]
    assert len(body) == len(memory.TABLE_SHAPES) * len(memory.PROCESSES)
    assert all(r.count("|") == rows[0].count("|") for r in rows)
    line = memory.seven_b_line(MICRO, "float32")
    assert line.startswith("7 B full fine-tune at 8 learner processes:")
    assert math.isfinite(memory.activation_factor(memory.qwen2_config("7b")))
