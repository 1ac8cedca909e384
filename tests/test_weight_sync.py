"""Weight sync (runtime/weight_sync.py): a packet round-trips bitwise in the sent dtype with
its version, ties travel once, LoRA sends adapters only and the worker's merge is peft's, an
engine that loaded a packet generates what a fresh engine on those weights generates, and a
packet in Ray's object store reaches a worker as read-only shared memory."""

from __future__ import annotations

import copy

import pytest
import torch

from rlscale.rlvr.config import LoraSettings
from rlscale.rlvr.model import build_tiny_model
from rlscale.rlvr.rollout.engine import ContinuousBatchingEngine
from rlscale.rlvr.rollout.types import EngineSampling, GenerationRequest
from rlscale.runtime.weight_sync import (
    SyncClock,
    WeightLoad,
    WeightPacker,
    adapter_tensors,
    pack_weights,
    unpack_weights,
)

PROMPTS = ["1+2=", "347+85=", "19*9=", "x", "12+5="]


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes, so equality is bitwise (NaN and -0.0 included)."""
    return tensor.contiguous().view(torch.uint8)


@pytest.fixture(scope="module")
def tiny():
    model, tokenizer = build_tiny_model("tiny", seed=3)
    return model.eval(), tokenizer


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_round_trip_is_bitwise_in_the_sent_dtype_and_carries_the_version(tiny, dtype):
    model, _ = tiny
    state = dict(model.state_dict())
    state["step_counter"] = torch.arange(5)  # an integer buffer travels as it is
    packet = pack_weights(state, version=7, dtype=dtype, bucket_bytes=64 << 10)
    assert packet.version == 7 and packet.dtype == dtype
    assert len(packet.buckets) > 2  # small buckets: the tensors spread over several
    assert all(b.dtype.name == "uint8" and b.ndim == 1 for b in packet.buckets)
    out = unpack_weights(packet)
    assert list(out) == list(state)
    for name, tensor in state.items():
        sent = tensor.to(getattr(torch, dtype)) if tensor.is_floating_point() else tensor
        assert out[name].dtype == sent.dtype and out[name].shape == sent.shape, name
        assert torch.equal(bits(out[name]), bits(sent)), name


def test_tied_weights_are_sent_once_and_come_back_tied(tiny):
    model, _ = tiny
    state = model.state_dict()
    embed, head = "model.embed_tokens.weight", "lm_head.weight"
    assert state[embed].data_ptr() == state[head].data_ptr()  # the tiny model ties them
    packet = pack_weights(state, version=1)
    slots = {slot.name: slot for slot in packet.manifest}
    assert slots[head].alias_of == embed and slots[embed].alias_of is None
    unique = {t.data_ptr(): t.numel() * t.element_size() for t in state.values()}
    assert packet.nbytes < sum(unique.values()) + 64 * len(state)  # each tensor once
    out = unpack_weights(packet)
    assert out[head] is out[embed]


def test_a_packer_reuses_its_buckets_and_packs_the_new_values(tiny):
    model, _ = tiny
    packer = WeightPacker("bfloat16")
    first = packer.pack(model.state_dict(), 1)
    pointers = [b.ctypes.data for b in first.buckets]
    changed = copy.deepcopy(model)
    with torch.no_grad():
        for p in changed.parameters():
            p.add_(1)
    changed = changed.state_dict()
    second = packer.pack(changed, 2)
    assert [b.ctypes.data for b in second.buckets] == pointers
    out = unpack_weights(second)
    name = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(out[name], changed[name].to(torch.bfloat16))


def _lora_model(seed: int):
    from rlscale.rlvr.lora import apply_lora

    pytest.importorskip("peft")
    base, _ = build_tiny_model("tiny", seed=3)
    model = apply_lora(base, LoraSettings(r=4, alpha=8.0, target_modules=["q_proj", "v_proj"]))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # B = 0 at the start: give the adapters something to say
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)
    return model


def test_lora_sync_sends_only_the_adapters_and_the_worker_merges_as_peft_does(tiny):
    from rlscale.rlvr.fleet import InferenceWorker
    from rlscale.rlvr.lora import merged_copy

    plain, tokenizer = tiny
    worker = InferenceWorker.__new__(InferenceWorker)  # its engine only: no Ray, no disk
    worker.engine, worker._lora = _engine(copy.deepcopy(plain), tokenizer), None
    scale = 8.0 / 4
    for version, seed in ((1, 0), (2, 1)):  # the second merge starts from W0 again
        learner = _lora_model(seed)
        packet = WeightPacker("bfloat16", lora_scale=scale).pack(learner.state_dict(), version)
        names = [slot.name for slot in packet.manifest]
        assert names == list(adapter_tensors(learner.state_dict())) and names
        assert all("lora_" in n for n in names) and packet.lora_scale == scale
        assert packet.dtype is None  # adapters travel in the learner's dtype
        assert worker.load_weights(packet, version=-1).version == version
        assert worker.engine.version == version
        assert len(worker._lora.base) == 2 * plain.config.num_hidden_layers  # q_proj, v_proj
        reference = merged_copy(learner).state_dict()
        for name, weight in worker.engine.model.state_dict().items():
            assert torch.equal(weight, reference[name]), name


def _engine(model, tokenizer, seed=0):
    return ContinuousBatchingEngine(model, EngineSampling(temperature=1.0), slots=3,
                                    eos_token_id=tokenizer.eos_token_id,
                                    pad_token_id=tokenizer.pad_token_id, seed=seed)


def _generate(engine, tokenizer) -> list[tuple[list[int], list[float]]]:
    for i, prompt in enumerate(PROMPTS):
        ids = tuple(tokenizer(prompt, add_special_tokens=False)["input_ids"])
        engine.add_request(GenerationRequest(i, ids, 8))
    done = sorted(engine.run(), key=lambda c: c.request_id)
    return [(c.token_ids, c.logprobs) for c in done]


@pytest.mark.parametrize("mapped", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_an_engine_that_loaded_a_packet_samples_like_a_fresh_engine(dtype, mapped):
    old, tokenizer = build_tiny_model("tiny", seed=3)
    new, _ = build_tiny_model("tiny", seed=4)
    engine_dtype = getattr(torch, dtype)
    engine = _engine(old.to(engine_dtype).eval(), tokenizer)
    _generate(engine, tokenizer)  # it has served the old weights (cache, fused weights)
    engine.generator.manual_seed(0)
    packet = pack_weights(new.state_dict(), 5, dtype)
    for bucket in packet.buckets if mapped else ():
        bucket.flags.writeable = False  # read-only, as from the object store: mapped
    engine.load_weights(packet, version=5)
    loaded = _generate(engine, tokenizer)
    fresh = _generate(_engine(copy.deepcopy(new).to(engine_dtype).eval(), tokenizer),
                      tokenizer)
    assert loaded == fresh
    assert engine.version == 5


def test_an_engine_maps_a_read_only_packet_and_never_writes_into_it():
    """A packet from the object store (read-only) becomes the engine's weights without a copy;
    the next load, even a private dict, re-points them instead of writing into the packet."""
    model, tokenizer = build_tiny_model("tiny", seed=3)
    engine = _engine(model.eval(), tokenizer)
    new, _ = build_tiny_model("tiny", seed=4)
    packet = pack_weights(new.state_dict(), 1)
    for bucket in packet.buckets:
        bucket.flags.writeable = False  # as Ray hands it over
    before = [bucket.copy() for bucket in packet.buckets]
    engine.load_weights(packet, version=1)
    embed = engine.model.get_input_embeddings().weight
    assert any(b.ctypes.data <= embed.data_ptr() < b.ctypes.data + b.nbytes
               for b in packet.buckets)  # a view of the packet, not a copy
    assert engine.model.lm_head.weight is embed  # still tied
    other, _ = build_tiny_model("tiny", seed=5)
    engine.load_weights(other.state_dict(), version=2)
    assert all((b == a).all() for b, a in zip(packet.buckets, before, strict=True))
    for name, weight in engine.model.state_dict().items():
        assert torch.equal(weight, other.state_dict()[name]), name


def test_the_sync_clock_times_publish_to_first_serving():
    clock = SyncClock()
    clock.on_publish(1, called_at=100.0, pack_s=0.2)
    clock.on_load(WeightLoad(1, load_s=0.1, served_at=100.5))
    clock.on_load(WeightLoad(1, load_s=0.3, served_at=101.0))  # a second worker: not first
    window = clock.window()
    assert window == pytest.approx({"time/publish_s": 0.5, "time/weight_load_s": 0.2,
                                    "time/weight_pack_s": 0.2})
    assert clock.window() == {}
    clock.on_publish(2, called_at=200.0, pack_s=0.1)
    clock.forget(2)  # e.g. the weights a fleet starts with
    clock.on_load(WeightLoad(2, load_s=0.1, served_at=230.0))
    assert "time/publish_s" not in clock.window()


def test_a_packet_reaches_a_ray_worker_as_shared_memory_and_loads(tiny_model_dir):
    ray = pytest.importorskip("ray")
    from rlscale.rlvr.fleet import InferenceWorker, WorkerSpec
    from rlscale.rlvr.model import load_model
    from rlscale.runtime.fleet import RayWeightPublisher, ray_session

    class Probe(InferenceWorker):
        def load(self, packet) -> tuple[bool, WeightLoad, dict[str, torch.Tensor]]:
            loaded = self.load_weights(packet, version=-1)
            embed = self.engine.model.get_input_embeddings().weight.data_ptr()
            mapped = any(b.ctypes.data <= embed < b.ctypes.data + b.nbytes
                         for b in packet.buckets)
            return (packet.read_only and mapped, loaded,
                    {k: v.clone() for k, v in self.engine.model.state_dict().items()})

    new, _ = build_tiny_model("tiny", seed=9)
    publisher = RayWeightPublisher(WeightPacker("bfloat16"))
    spec = WorkerSpec(str(tiny_model_dir), "bfloat16", "native", EngineSampling(), 2, 1, True, 0)
    with ray_session(num_cpus=1):
        publisher.publish(new.state_dict(), 4)
        version, ref = publisher.latest()
        worker = ray.remote(num_cpus=0)(Probe).remote(spec)
        mapped, loaded, weights = ray.get(worker.load.remote(ref), timeout=120)
        ray.kill(worker)
    assert version == 4 and loaded.version == 4 and loaded.load_s > 0
    assert mapped  # the engine's weights are views of the object store's one copy
    reference, _ = load_model(tiny_model_dir, "bfloat16")
    reference.load_state_dict(new.state_dict())
    for name, weight in reference.state_dict().items():
        assert torch.equal(weights[name], weight), name
