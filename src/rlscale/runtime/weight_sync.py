"""Weight sync: what a learner sends its inference workers for each policy version.

The shape is the field's (verl, slime, NeMo-RL), for the same reasons:
- the engine's dtype, converted once on the learner: a bf16 engine beside an fp32 learner
  gets half the bytes, and no worker converts the same tensors again;
- a few large flat buckets per dtype and a manifest of (name, shape, offset): the receiver
  views each tensor out of its bucket (no copy, no per-tensor pickling), and the sender
  moves a handful of large buffers instead of hundreds of small ones;
- a tensor that aliases another (a tied embedding: `lm_head.weight` is
  `model.embed_tokens.weight`) is sent once and comes back as the same tensor;
- only what changed: with LoRA the base weights never change, so the adapters alone travel
  and each worker merges them into base weights it keeps (`LoraMerger`);
- the version inside the packet, so a worker always knows which policy it serves.

On a CPU node a packet is ONE object-store copy per version: `ray.put` of numpy uint8
buckets, which Ray hands every worker on the node as zero-copy, read-only views of the same
shared memory (torch tensors would be pickled, i.e. copied into each worker). The native
engine maps them as its weights (`ContinuousBatchingEngine.load_weights`): one copy of the
weights per node, whatever the number of workers, and nothing writes into it.

On GPUs the same buckets are meant to travel by a collective (an NCCL broadcast from learner
rank 0 into preallocated buckets on each engine, as verl and slime do); planned, not built
here: the CPU path is what runs today, and a GPU learner's tensors are cast on the device and
copied to the host bucket by bucket.
"""

from __future__ import annotations

import collections
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from .versions import alias_key

ALIGN = 64                        # bytes: every tensor starts on a cache line in its bucket
DEFAULT_BUCKET_BYTES = 256 << 20  # a few buckets for a 0.5 B model, one for a tiny one
# peft's names: base_model.model.<module>.lora_A.<adapter>.weight (and lora_B)
_LORA_NAME = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<factor>[AB])"
                        r"(?:\.[^.]+)?\.weight$")


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor of a packet lives: `nbytes` at `offset` in bucket `bucket`, or, for
    an alias, the name of the tensor it shares memory with (sent under that name only)."""

    name: str
    dtype: str                   # a torch dtype's name: "bfloat16", "float32", "int64"
    shape: tuple[int, ...]
    bucket: int = -1
    offset: int = 0
    alias_of: str | None = None


@dataclass(frozen=True)
class WeightPacket:
    """One policy version as a worker receives it. `lora_scale` set: the tensors are LoRA
    adapters (peft's names) to merge as W0 + scale * B @ A, not weights to load."""

    version: int
    dtype: str | None                # the floating tensors' dtype as sent (None: as the learner's)
    buckets: tuple[np.ndarray, ...]  # flat uint8 buffers
    manifest: tuple[TensorSlot, ...]
    lora_scale: float | None = None

    @property
    def nbytes(self) -> int:
        return sum(int(b.nbytes) for b in self.buckets)

    @property
    def read_only(self) -> bool:
        """Mapped from Ray's object store (immutable, shared by the node's workers), not a
        packer's buffers that its next `pack` overwrites."""
        return all(not b.flags.writeable for b in self.buckets)


@dataclass(frozen=True)
class WeightLoad:
    """A worker's account of taking a version: how long the load took (merge, map or copy,
    fuse again) and the wall clock when it was done, i.e. when it began serving it."""

    version: int
    load_s: float
    served_at: float  # time.time(), comparable with the learner's on the same node


def adapter_tensors(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The LoRA adapters of a peft model's state dict (empty for a plain model): with LoRA
    the base weights never change, so these are all a worker needs each version."""
    return {name: t for name, t in state_dict.items() if "lora_" in name}


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def plan_buckets(tensors: Mapping[str, torch.Tensor], dtype: torch.dtype | None,
                 bucket_bytes: int) -> tuple[tuple[TensorSlot, ...], list[int]]:
    """The manifest and each bucket's size: tensors in order, grouped by sent dtype, a new
    bucket when the next tensor would overflow `bucket_bytes` (a larger tensor gets its
    own); aliases point at the first name of their memory."""
    slots: list[TensorSlot] = []
    sizes: list[int] = []
    open_bucket: dict[torch.dtype, int] = {}  # the bucket each dtype is filling
    first_name: dict[tuple, str] = {}
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"weight sync: '{name}' is a {type(tensor).__name__}, not a tensor")
        # Floating tensors travel in the engine's dtype; integer buffers as they are.
        sent = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        shape = tuple(tensor.shape)
        key = alias_key(tensor)
        if key in first_name:
            slots.append(TensorSlot(name, str(sent).removeprefix("torch."), shape,
                                    alias_of=first_name[key]))
            continue
        first_name[key] = name
        nbytes = tensor.numel() * sent.itemsize
        bucket = open_bucket.get(sent)
        if bucket is None or (sizes[bucket] + nbytes > bucket_bytes and sizes[bucket] > 0):
            bucket = open_bucket[sent] = len(sizes)
            sizes.append(0)
        offset = sizes[bucket]
        sizes[bucket] = -(-(offset + nbytes) // ALIGN) * ALIGN
        slots.append(TensorSlot(name, str(sent).removeprefix("torch."), shape, bucket, offset))
    return tuple(slots), sizes


def _view(bucket: torch.Tensor, slot: TensorSlot) -> torch.Tensor:
    dtype, count = _dtype(slot.dtype), int(np.prod(slot.shape, dtype=np.int64))
    return bucket[slot.offset:slot.offset + count * dtype.itemsize].view(dtype).view(slot.shape)


@dataclass
class WeightPacker:
    """Packs a state dict into a `WeightPacket`, reusing its host buckets from one version
    to the next (fresh pages cost more to fault in than the copy into them). So a packet is
    good until the next `pack`: `ray.put` it (a copy into the object store) before that.
    LoRA adapters travel in the learner's dtype: they are small, and the worker merges them
    in fp32 and rounds once."""

    dtype: str | None = None            # the engine's (rollout.dtype); None: as they come
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    lora_scale: float | None = None     # LoRA's alpha / r: a model with adapters sends them only
    # torch threads for the copies (None: as set). They are memory-bound and one per tensor:
    # on a busy node each op's thread barrier costs more than a second thread saves (the
    # 0.5 B pack here: 0.5 s on 1 thread, 2.6 s on 2 beside the fleet's workers).
    threads: int | None = 1
    _buckets: list[torch.Tensor] = field(default_factory=list, repr=False)

    def pack(self, state_dict: Mapping[str, torch.Tensor], version: int) -> WeightPacket:
        before = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            return self._pack(state_dict, version)
        finally:
            torch.set_num_threads(before)

    @torch.no_grad()
    def _pack(self, state_dict: Mapping[str, torch.Tensor], version: int) -> WeightPacket:
        adapters = adapter_tensors(state_dict)
        if adapters and self.lora_scale is None:
            raise ValueError("weight sync: the state dict holds LoRA adapters but no "
                             "lora_scale was given (model.lora's alpha / r)")
        tensors = adapters or state_dict
        sent = None if adapters else self.dtype
        dtype = _dtype(sent) if sent else None
        manifest, sizes = plan_buckets(tensors, dtype, self.bucket_bytes)
        if [b.numel() for b in self._buckets] != sizes:
            self._buckets = [torch.empty(size, dtype=torch.uint8) for size in sizes]
        for slot in manifest:
            if slot.alias_of is None:
                source = tensors[slot.name].detach()
                target = _view(self._buckets[slot.bucket], slot)
                if source.device.type != "cpu":  # cast where the tensor is: half the transfer
                    source = source.to(target.dtype)
                target.copy_(source)
        return WeightPacket(version, sent, tuple(b.numpy() for b in self._buckets),
                            manifest, self.lora_scale if adapters else None)


def pack_weights(state_dict: Mapping[str, torch.Tensor], version: int, dtype: str | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, *,
                 lora_scale: float | None = None) -> WeightPacket:
    """One version's weights as a packet, in fresh buckets (`WeightPacker` to reuse them)."""
    return WeightPacker(dtype, bucket_bytes, lora_scale, threads=None).pack(state_dict, version)


def unpack_weights(packet: WeightPacket) -> dict[str, torch.Tensor]:
    """{name: tensor}, each a view into the packet's buckets (never write into them); an
    alias is the very tensor of the name it aliases, so ties survive the trip."""
    with warnings.catch_warnings():  # Ray's zero-copy arrays are read-only; so are these views
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        buckets = [torch.from_numpy(b) for b in packet.buckets]
    out: dict[str, torch.Tensor] = {}
    for slot in packet.manifest:
        out[slot.name] = out[slot.alias_of] if slot.alias_of else _view(buckets[slot.bucket], slot)
    return out


def lora_factors(adapters: Mapping[str, torch.Tensor]
                 ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{the adapted weight's name in the plain model: (A [r, in], B [out, r])} from peft's
    adapter names (`...q_proj.lora_A.default.weight` -> `...q_proj.weight`)."""
    factors: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in adapters.items():
        match = _LORA_NAME.match(name)
        if match is None:
            raise ValueError(f"weight sync: cannot merge LoRA tensor '{name}' (linear "
                             "adapters lora_A / lora_B only)")
        pair = factors.setdefault(f"{match['module']}.weight", {})
        if match["factor"] in pair:
            raise ValueError(f"weight sync: two LoRA adapters on '{match['module']}'")
        pair[match["factor"]] = tensor
    missing = [name for name, pair in factors.items() if len(pair) != 2]
    if missing:
        raise ValueError(f"weight sync: '{missing[0]}' has lora_A or lora_B, not both")
    return {name: (pair["A"], pair["B"]) for name, pair in factors.items()}


def merge_lora(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
               scale: float) -> torch.Tensor:
    """W0 + scale * B @ A, computed in fp32 and returned in W0's dtype (peft's merge on a
    CPU, whatever the dtype)."""
    a, b = a.to(base.device, torch.float32), b.to(base.device, torch.float32)
    return (base.float() + scale * (b @ a)).to(base.dtype)


class LoraMerger:
    """A worker's LoRA side: the base weight W0 of every adapted layer, kept from the first
    version it merges (W0 never changes; the engine's own parameters hold W0 + scale B A
    after a merge, so W0 cannot be read back from them), and each version's merged weights."""

    def __init__(self) -> None:
        self.base: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def merged(self, parameters: Mapping[str, torch.Tensor],
               adapters: Mapping[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
        out = {}
        for name, (a, b) in lora_factors(adapters).items():
            if name not in self.base:
                if name not in parameters:
                    raise KeyError(f"weight sync: LoRA adapts '{name}', which the engine's "
                                   "model does not have")
                self.base[name] = parameters[name].detach().clone()
            out[name] = merge_lora(self.base[name], a, b, scale)
        return out


class SyncClock:
    """Per version: when the learner called publish and how long packing took; when the
    first worker served it. `window()` hands back what happened since it was last called:
    `time/publish_s` (learner's call -> the first worker serving, mean over the versions
    first served in the window), `time/weight_load_s` (a worker's load, mean over loads) and
    `time/weight_pack_s` (the learner's own share, pack and put: on its critical path)."""

    def __init__(self, keep: int = 64) -> None:
        self.keep = keep  # versions remembered, and figures kept between windows
        self.published_at: dict[int, float] = {}
        self.served: set[int] = set()
        self._publish_s, self._load_s, self._pack_s = (
            collections.deque(maxlen=keep) for _ in range(3))

    def on_publish(self, version: int, called_at: float, pack_s: float) -> None:
        self.published_at[version] = called_at
        self._pack_s.append(pack_s)
        for old in sorted(self.published_at)[:-self.keep]:
            del self.published_at[old]
            self.served.discard(old)

    def forget(self, version: int) -> None:
        """Leave `version` out of `time/publish_s` (the weights a fleet starts with: their
        path to serving is the workers' start-up, not a sync)."""
        self.published_at.pop(version, None)

    def on_load(self, load: WeightLoad) -> None:
        self._load_s.append(load.load_s)
        called_at = self.published_at.get(load.version)
        if called_at is not None and load.version not in self.served:
            self.served.add(load.version)
            self._publish_s.append(max(load.served_at - called_at, 0.0))

    def window(self) -> dict[str, float]:
        out = {}
        for key, values in (("time/publish_s", self._publish_s),
                            ("time/weight_load_s", self._load_s),
                            ("time/weight_pack_s", self._pack_s)):
            if values:
                out[key] = sum(values) / len(values)
            values.clear()
        return out
