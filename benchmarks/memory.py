"""Per-process memory of the RLVR learner: computed by component for the 0.5 B, 1.5 B and 7 B
shapes at 1, 2, 4 and 8 learner processes, and measured at one point on this machine.

    python benchmarks/memory.py                         # the tables (computed, seconds)
    python benchmarks/memory.py --measure --shape 0.5b  # + one step measured (~10 GiB, ~5 min)
    python benchmarks/memory.py --measure --shape 0.5b --allocator mmap
    python benchmarks/memory.py --measure --shape tiny --guard snapshot --reference
    python benchmarks/memory.py --loop --steps 2 --device cuda  # the whole GRPO loop (`loop`)

Why: a learner group of N processes (FSDP2 `fully_shard`, issue 51) pays for its
communication only where one process cannot hold the step; the table says where that is and
which component to cut first. Bytes per parameter, each divided by N under FSDP2 (dim-0
shards, padded to equal size: `shard_numel`): weights 4, gradients 4, AdamW's two moments 8
(fp32; trainer.py, runtime/optim.py); the guard `snapshot`, a copy of the weights and both
moments, 12 (runtime/health.py `StepUndo`; `check` and `off` copy nothing); the reference
model, 4, when `loss.kl_coef > 0` or `train.post_update_stats and train.reference_kl`
(rlvr/loop.py; with LoRA the adapters are disabled instead). Per process, not divided by N:
FSDP2's un-sharded working set (`gather_bytes`: an estimate for one unit per decoder layer,
not measured here), the activations the forward keeps (`activation_bytes`, counted), the
output layer's logits (`logits_peak_bytes`), the embedding's gradients at the backward's
end (`embedding_grad_bytes`), bf16 autocast's weight casts, and the sampler's fused decode
copy (`decode_copy_bytes`; in the driver process: with N = 1 the learner's own, during
sampling only). These peak in different phases of a step, so a total is the resident state
plus the largest phase (`update_phases`; sampling is one). Gradients count as resident in
the forward (from a minibatch's second micro-batch on). Not counted: the KV cache, the CPU
decoder's packed weights, the guard's one-time regrowth, and glibc's slack: its heap keeps
what smaller tensors free, 1.0-1.2 GiB at the 0.5 B point (`--allocator mmap` removes it).

`--measure` runs the project's trainer in a subprocess under `nice -n 10`: two warm-up steps
(the first creates AdamW's moments, the second the guard's full buffers), then the measured
step, whose peak resident memory (VmHWM, reset before it) minus the resident memory before
the model was built (the imports' baseline) is printed beside the computed value.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "rlvr" / "quickstart.yaml"
GIB = 2 ** 30
PROCESSES = (1, 2, 4, 8)
TABLE_SHAPES = ("0.5b", "1.5b", "7b")
QWEN2_0_5B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                  num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                  max_position_embeddings=32768, rope_theta=1_000_000.0,
                  tie_word_embeddings=True)
SHAPES = {  # Qwen2Config keyword arguments (Qwen2: q, k, v with biases, SiLU MLP)
    "tiny": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,  # SmolLM2-135M
                 num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,  # dims
                 tie_word_embeddings=True),
    "0.5b": QWEN2_0_5B,  # Qwen2.5-0.5B
    "1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,  # Qwen2.5-1.5B
                 num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                 tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,  # Qwen2.5-7B
               num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
               tie_word_embeddings=False),
}
STATE = ("weights", "grads", "adamw", "snapshot", "reference")  # resident between steps
VARIANTS = {"full": [], "lora": ["model.lora.r=16", "model.lora.alpha=32"]}
# fp32 values kept outside the layers per token and hidden unit (embedding out, final norm).
OUTSIDE_LAYERS_FLOATS_PER_TOKEN_HIDDEN = 3
# The entropy metric's log_softmax, exp, zeros_like, where and bool mask (a quarter) of one
# chunk of logits (token_math.py computes ENTROPY_CHUNK_ELEMENTS of them at a time).
ENTROPY_TEMPORARY_COPIES = 4 + 0.25


def logits_peak_bytes(logit_tokens: int, vocab: int) -> float:
    """At the forward's peak: the fp32 logits (kept by logsumexp) and one entropy chunk."""
    from rlscale.rlvr.token_math import ENTROPY_CHUNK_ELEMENTS
    logits = logit_tokens * vocab
    chunk = min(logits, max(1, ENTROPY_CHUNK_ELEMENTS // vocab) * vocab)
    return 4.0 * (logits + ENTROPY_TEMPORARY_COPIES * chunk)


@dataclass(frozen=True)
class MicroBatch:
    """The update's micro-batch: `sequences` of `tokens` positions, `prompt` of them prompt
    (no logits there: the output layer runs on completion positions only, logprobs.py)."""

    sequences: int
    tokens: int
    prompt: int

    @property
    def all_tokens(self) -> int:
        return self.sequences * self.tokens

    @property
    def logit_tokens(self) -> int:
        return self.sequences * (self.tokens - self.prompt)

    def describe(self) -> str:
        return (f"{self.sequences} x {self.tokens} tokens ({self.all_tokens} in the decoder, "
                f"{self.logit_tokens} completion tokens through the output layer)")


@dataclass(frozen=True)
class Learner:
    """`processes` FSDP2 ranks, the guard mode, a reference model or not, gradient
    checkpointing, the compute dtype (float32 | bfloat16): what the memory depends on."""

    processes: int = 1
    guard: str = "snapshot"
    reference: bool = True
    checkpointing: bool = False
    compute_dtype: str = "float32"


def qwen2_config(shape: str | dict):
    """A transformers Qwen2Config of a named shape (SHAPES) or of keyword arguments."""
    from transformers import Qwen2Config

    return Qwen2Config(**(SHAPES[shape] if isinstance(shape, str) else shape))


def _dims(config) -> tuple[int, int, int, int, int, int]:
    """(hidden, intermediate, heads, kv heads, head dim, vocabulary) of a config."""
    d, heads = config.hidden_size, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or d // heads
    return (d, config.intermediate_size, heads, config.num_key_value_heads, head_dim,
            config.vocab_size)


def layer_shapes(config) -> dict[str, tuple[int, ...]]:
    """One Qwen2 decoder layer's parameter shapes, by the model's own names."""
    d, inter, heads, kv, head_dim, _ = _dims(config)
    q, k = heads * head_dim, kv * head_dim
    return {"self_attn.q_proj.weight": (q, d), "self_attn.q_proj.bias": (q,),
            "self_attn.k_proj.weight": (k, d), "self_attn.k_proj.bias": (k,),
            "self_attn.v_proj.weight": (k, d), "self_attn.v_proj.bias": (k,),
            "self_attn.o_proj.weight": (d, q), "mlp.gate_proj.weight": (inter, d),
            "mlp.up_proj.weight": (inter, d), "mlp.down_proj.weight": (d, inter),
            "input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,)}


def root_shapes(config) -> dict[str, tuple[int, ...]]:
    """The parameters outside the decoder layers (FSDP2's root group): the embedding, the
    final norm and, when not tied to the embedding, the output layer."""
    d, *_, vocab = _dims(config)
    shapes = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (vocab, d)
    return shapes


def shard_numel(shape: tuple[int, ...], processes: int) -> int:
    """Elements of one rank's FSDP2 shard of a tensor: dim 0 chunked into `processes` equal
    pieces (the last ones padded), the other dims whole."""
    return math.ceil(shape[0] / processes) * math.prod(shape[1:])


def parameter_count(config, processes: int = 1) -> int:
    """Parameters of the model (processes 1), or of one rank's shard, padding included."""
    per_layer = sum(shard_numel(s, processes) for s in layer_shapes(config).values())
    root = sum(shard_numel(s, processes) for s in root_shapes(config).values())
    return per_layer * config.num_hidden_layers + root


def saved_floats_per_token_layer(config) -> int:
    """fp32 values one decoder layer keeps per token for the backward in the update's packed
    forward (logprobs.completion_logprobs, SDPA, transformers 5.25): counted with autograd's
    saved_tensors_hooks at several widths (tests/test_memory_table.py recounts it). 4 I: the
    MLP's gate, up, silu(gate) and their product; 8 D: the norms' inputs and outputs, q before
    and after the rotary, the attention output, o_proj's input; 2 kv: k and v; one per head:
    SDPA's log-sum-exp; 2 more per token."""
    d, inter, heads, kv, head_dim, _ = _dims(config)
    return 4 * inter + 8 * d + 2 * kv * head_dim + heads + 2


def activation_factor(config) -> float:
    """Activation bytes per (token x hidden x layer): the table's stated factor."""
    return 4 * saved_floats_per_token_layer(config) / config.hidden_size


def activation_bytes(config, micro: MicroBatch, checkpointing: bool) -> float:
    """What the forward keeps for the backward. With gradient checkpointing (non-reentrant,
    per decoder layer) each layer keeps only its input, one hidden vector per token (the
    backward recomputes one layer at a time: `update_phases`)."""
    layers, d = config.num_hidden_layers, config.hidden_size
    outside = 4 * OUTSIDE_LAYERS_FLOATS_PER_TOKEN_HIDDEN * d * micro.all_tokens
    if checkpointing:
        return 4 * d * micro.all_tokens * layers + outside
    return 4 * saved_floats_per_token_layer(config) * micro.all_tokens * layers + outside


def embedding_grad_bytes(config, processes: int) -> float:
    """The gradient of the embedding at the end of the backward. Tied: the output layer's
    [V, D] gradient waits in autograd's input buffer for the embedding's own (dense) one, and
    their sum is a third: 3 x V x D fp32 at once (traced). Untied, one process: the
    embedding's gradient, added in place; with FSDP2 the output layer's un-sharded gradient
    is still held until the root group's reduce-scatter: 2."""
    copies = 3 if config.tie_word_embeddings else (1 if processes == 1 else 2)
    return copies * 4.0 * config.vocab_size * config.hidden_size


def update_phases(config, learner: Learner, micro: MicroBatch) -> dict[str, float]:
    """The update's transient bytes at each of its peaks (traced op by op, counting live
    storages, on the 0.5 B shape with 2-4 layers, tied and untied: each phase that peaked
    within 0.1% of these): the forward's end (what it keeps,
    the logits and the entropy's copies), the output layer's backward (the logits' gradient
    and the output layer's [V, D] gradient), with gradient checkpointing the layers'
    backward (one layer recomputed; a tied or FSDP-held output gradient still waiting), and
    the embedding's backward. FSDP2's gathered parameters and the autocast copies are
    present in all of them."""
    kept = activation_bytes(config, micro, learner.checkpointing)
    logits = 4.0 * micro.logit_tokens * config.vocab_size
    output_grad = 4.0 * config.vocab_size * config.hidden_size
    held = output_grad if config.tie_word_embeddings or learner.processes > 1 else 0.0
    phases = {"forward": kept + logits_peak_bytes(micro.logit_tokens, config.vocab_size),
              "output backward": kept + logits + output_grad,
              "embedding backward": embedding_grad_bytes(config, learner.processes)}
    if learner.checkpointing:
        layer = 4.0 * saved_floats_per_token_layer(config) * micro.all_tokens
        phases["layers backward"] = kept + layer + held
    always = gather_bytes(config, learner) + autocast_copy_bytes(config, learner)
    return {name: always + value for name, value in phases.items()}


def decode_copy_bytes(config, compute_dtype: str) -> float:
    """The sampler's fused decode weights (rollout/decoder.py `DecoderWeights.from_model`):
    q|k|v and gate|up concatenated, always new; the rest `.to(dtype)`, in float32 the model's
    own tensors, in bfloat16 copies, the tied embedding twice (embedding and output layer)."""
    shapes = layer_shapes(config)
    fused = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj",
             "mlp.up_proj")
    if compute_dtype == "float32":
        per_layer = sum(math.prod(s) for name, s in shapes.items() if name.startswith(fused))
        return 4.0 * per_layer * config.num_hidden_layers
    d, *_, vocab = _dims(config)
    return 2.0 * (parameter_count(config) + (vocab * d if config.tie_word_embeddings else 0))


def gather_bytes(config, learner: Learner) -> float:
    """FSDP2's un-sharded working set on a rank (see the module docstring); 0 for one process
    (no FSDP: the parameters are whole already). With bfloat16 compute the gathered
    parameters are assumed bf16 (a MixedPrecisionPolicy), the gradients fp32."""
    n = learner.processes
    if n == 1:
        return 0.0
    param_bytes = 2 if learner.compute_dtype == "bfloat16" else 4
    layer = sum(shard_numel(s, n) * n for s in layer_shapes(config).values())
    root = sum(shard_numel(s, n) * n for s in root_shapes(config).values())
    return param_bytes * (root + 2 * layer) + 4.0 * layer


def autocast_copy_bytes(config, learner: Learner) -> float:
    """bfloat16 autocast on fp32 weights (one process): each matmul's bf16 weight cast is kept
    for the backward, one copy of every linear weight and of the output layer."""
    if learner.compute_dtype != "bfloat16" or learner.processes > 1:
        return 0.0
    linear = sum(math.prod(s) for name, s in layer_shapes(config).items() if "proj" in name)
    return 2.0 * (linear * config.num_hidden_layers + config.vocab_size * config.hidden_size)


def per_process_bytes(config, learner: Learner, micro: MicroBatch) -> dict[str, float]:
    """Bytes per learner process by component, and the peak (`total`): the resident state
    plus the largest of the update's phases (`update_phases`) and the sampler's decode copy
    (one process only: with N > 1 the decode copy is the driver's, not a rank's); `peak_at`
    names the phase."""
    if learner.guard not in ("snapshot", "check", "off"):
        raise ValueError(f"unknown guard mode {learner.guard!r}")
    shard = parameter_count(config, learner.processes)
    parts: dict = {
        "weights": 4.0 * shard, "grads": 4.0 * shard, "adamw": 8.0 * shard,
        "snapshot": 12.0 * shard if learner.guard == "snapshot" else 0.0,
        "reference": 4.0 * shard if learner.reference else 0.0,
        "gather": gather_bytes(config, learner),
        "autocast": autocast_copy_bytes(config, learner),
        "activations": activation_bytes(config, micro, learner.checkpointing),
        "logits": logits_peak_bytes(micro.logit_tokens, config.vocab_size),
        "embedding grads": embedding_grad_bytes(config, learner.processes),
        "decode": (decode_copy_bytes(config, learner.compute_dtype)
                   if learner.processes == 1 else 0.0),
    }
    state = sum(parts[k] for k in STATE)
    phases = update_phases(config, learner, micro)
    parts["update_peak_at"] = max(phases, key=phases.get)
    parts["update_total"] = state + phases[parts["update_peak_at"]]
    phases["sampling"] = parts["decode"]
    parts["peak_at"] = max(phases, key=phases.get)
    parts["total"] = state + phases[parts["peak_at"]]
    return parts


# -- the printed tables --------------------------------------------------------------------
COMBOS = (("snapshot", True), ("snapshot", False), ("check", True), ("check", False))
COLUMNS = ("weights", "grads", "adamw", "snapshot", "reference", "gather", "autocast",
           "activations", "logits", "embedding grads", "decode")


def cpu_flags() -> str:
    """The CPU's model and its AVX-512 and AMX flags, as `lscpu` reports them."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "lscpu unavailable"
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    flags = [f for f in fields.get("Flags", "").split() if f.startswith(("avx512", "amx"))]
    return (f"{fields.get('Model name', '?').strip()}, {os.cpu_count()} cores; "
            f"avx512/amx flags: {' '.join(flags) or 'none'}")


def header(micro: MicroBatch, compute_dtype: str) -> list[str]:
    """What the figures depend on: the machine, the versions, the micro-batch, the factors."""
    import torch
    import transformers

    lines = [f"machine: {cpu_flags()}",
             f"torch {torch.__version__}, transformers {transformers.__version__}",
             f"micro-batch: {micro.describe()}; compute dtype {compute_dtype}"
             + ("" if compute_dtype == "float32" else " (activations counted in fp32: a bound)"),
             "logits at the forward's peak: fp32 [completion tokens x vocab] and "
             f"{ENTROPY_TEMPORARY_COPIES} copies of one entropy chunk; activations: tokens x hidden x layers x a factor (bytes), "
             "counted on this forward; the backward's own temporaries are estimated by phase"]
    return lines + [f"{name}: {parameter_count(qwen2_config(name)) / 1e9:.3f} B parameters, "
                    f"activation factor {activation_factor(qwen2_config(name)):.1f}"
                    for name in TABLE_SHAPES]


def table(micro: MicroBatch, checkpointing: bool, compute_dtype: str) -> list[str]:
    """Shape x N rows: components (GiB) with guard `snapshot` and a reference, then each
    guard x reference combination's peak (not the row's sum) and where the last one peaks."""
    totals = [f"total {g}{' + ref' if r else ''}" for g, r in COMBOS]
    rows = [f"| shape | N | {' | '.join(COLUMNS)} | {' | '.join(totals)} | peak at |",
            "| --- | ---: |" + " ---: |" * (len(COLUMNS) + len(totals)) + " --- |"]
    for name in TABLE_SHAPES:
        config = qwen2_config(name)
        for n in PROCESSES:
            base = Learner(n, "snapshot", True, checkpointing, compute_dtype)
            parts = per_process_bytes(config, base, micro)
            combo = [per_process_bytes(config, replace(base, guard=g, reference=r), micro)
                     for g, r in COMBOS]
            cells = [f"{parts[c] / GIB:.2f}" for c in COLUMNS]
            cells += [f"**{c['total'] / GIB:.1f}**" for c in combo]
            cells.append(combo[-1]["peak_at"])
            rows.append(f"| {name} | {n} | {' | '.join(cells)} |")
    return rows


def seven_b_line(micro: MicroBatch, compute_dtype: str) -> str:
    """Issue 51's target: the 7 B full fine-tune per GPU at 8 processes, cheapest to default."""
    config = qwen2_config("7b")
    low = per_process_bytes(config, Learner(8, "check", False, True, compute_dtype), micro)
    high = per_process_bytes(config, Learner(8, "snapshot", True, False, compute_dtype), micro)
    return (f"7 B full fine-tune at 8 learner processes: {low['total'] / GIB:.1f} GiB per GPU "
            f"(guard check, no reference, gradient checkpointing) to {high['total'] / GIB:.1f} "
            f"GiB (the defaults: guard snapshot, a reference, no checkpointing), of which "
            f"{high['logits'] / GIB:.1f} GiB is the output layer's logits; micro-batch "
            f"{micro.describe()}, compute {compute_dtype}.")


# -- the measured point --------------------------------------------------------------------
# glibc: as every rlscale process runs. mmap: every allocation of 64 KiB or more its own
# mapping, returned when freed: the resident memory follows the tensors (slower steps).
ALLOCATORS = {"glibc": {}, "mmap": {"MALLOC_MMAP_THRESHOLD_": "65536"}}


def rss_kib(field: str = "VmRSS", text: str | None = None) -> int:
    """A KiB field of /proc/self/status (VmRSS, VmHWM: the peak) or of `text` (meminfo)."""
    text = Path("/proc/self/status").read_text() if text is None else text
    return int(re.search(rf"^{field}:\s+(\d+) kB", text, re.M).group(1))


def random_batch(micro: MicroBatch, micro_batches: int, vocab: int):
    """`micro_batches` micro-batches' worth of sequences with random tokens and advantages
    (not zero: the step must produce a gradient), every completion token in the loss."""
    import torch

    from rlscale.rlvr.batch import build_policy_batch

    g = torch.Generator().manual_seed(0)
    rows, width = micro.sequences * micro_batches, micro.tokens - micro.prompt
    prompts = torch.randint(4, vocab, (rows, micro.prompt), generator=g).tolist()
    completions = torch.randint(4, vocab, (rows, width), generator=g)
    return build_policy_batch(prompts, completions, torch.ones(rows, width),
                              torch.randn(rows, generator=g), torch.zeros(rows, width),
                              pad_token_id=0, policy_version=0)


def measure_child(spec: dict) -> dict:
    """One learner step of the project's own trainer (PolicyTrainer + StepLoss, as
    rlvr/loop.py builds them) on a randomly initialised model, in this process: resident
    memory before the model, after it, after two warm-up steps (AdamW's moments, then the
    guard's full buffers) and the peak of the measured third step, in KiB."""
    import torch
    from transformers import Qwen2ForCausalLM

    from rlscale.rlvr.config import RLVRConfig
    from rlscale.rlvr.step_loss import StepLoss
    from rlscale.rlvr.trainer import PolicyTrainer
    from rlscale.runtime.health import StepUndo, parameters_finite

    torch.set_num_threads(spec["threads"])
    micro = MicroBatch(**spec["micro"])
    config = qwen2_config(spec["shape"])
    cfg = RLVRConfig.model_validate({
        "model": {"path": "random"}, "loss": {"kl_coef": 0.04 if spec["reference"] else 0.0},
        "train": {"compute_dtype": "float32", "micro_batch_size": micro.sequences,
                  "pack": True}})
    rss = {"baseline": rss_kib()}
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    reference = Qwen2ForCausalLM(config).eval().requires_grad_(False) \
        if spec["reference"] else None
    rss["model"] = rss_kib()
    trainer = PolicyTrainer(model, reference, StepLoss(cfg.resolved_objective()), cfg.train,
                            temperature=1.0, compute_dtype="float32")
    undo = (StepUndo(model, trainer.optimizer, trainer.scheduler)
            if spec["guard"] == "snapshot" else None)
    batch = random_batch(micro, spec["micro_batches"], config.vocab_size)
    seconds = []
    for step in range(3):
        if step == 2:  # the measured step: its own high-water mark
            rss["warm"] = rss_kib()
            Path("/proc/self/clear_refs").write_text("5")
        t0 = time.perf_counter()
        if undo is not None:
            undo.save()
        trainer.step(batch)
        if spec["guard"] == "check":
            parameters_finite(model.parameters())
        seconds.append(time.perf_counter() - t0)
    rss["peak"] = rss_kib("VmHWM")
    return {"rss_kib": rss, "seconds": seconds,
            "parameters": sum(p.numel() for p in model.parameters())}


def measure(args: argparse.Namespace, micro: MicroBatch) -> None:
    """Run `measure_child` in a subprocess (niced) and print measured vs computed."""
    config = qwen2_config(args.shape)
    learner = Learner(1, args.guard, args.reference, False, "float32")
    computed = per_process_bytes(config, learner, micro)
    meminfo = Path("/proc/meminfo").read_text()
    in_use = (rss_kib("MemTotal", meminfo) - rss_kib("MemAvailable", meminfo)) / 2 ** 20
    if in_use + computed["update_total"] / GIB > args.max_used_gib:
        sys.exit(f"not measured: {in_use:.1f} GiB in use + {computed['update_total'] / GIB:.1f} "
                 f"GiB computed > --max-used-gib {args.max_used_gib}; try a smaller --shape")
    spec = {"shape": args.shape, "guard": args.guard, "reference": args.reference,
            "micro": asdict(micro), "micro_batches": 2, "threads": args.threads}
    cmd = ["nice", "-n", "10", sys.executable, str(Path(__file__).resolve()), "--child",
           json.dumps(spec)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), **ALLOCATORS[args.allocator]}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    if proc.returncode:
        sys.exit(f"error: the measured step failed (exit {proc.returncode}):\n"
                 f"{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    print_measurement(args, micro, computed, result)


def print_measurement(args, micro: MicroBatch, computed: dict, result: dict) -> None:
    """Resident memory at three points against the computed tensors at the same points."""
    rss = {k: v * 1024 for k, v in result["rss_kib"].items()}
    state = sum(computed[k] for k in STATE)
    ref = " + reference" if args.reference else ""
    print(f"\nmeasured: {args.shape} ({result['parameters'] / 1e6:.1f} M parameters), 1 process, "
          f"guard {args.guard}{ref}, fp32, 2 micro-batches of {micro.describe()}, "
          f"{args.threads} threads, allocator {args.allocator} {ALLOCATORS[args.allocator]}; "
          f"steps took {', '.join(f'{s:.1f}' for s in result['seconds'])} s")
    model_part = computed["weights"] + computed["reference"]
    rows = [("model(s) built", rss["model"] - rss["baseline"], model_part),
            ("after the warm-up steps (state)", rss["warm"] - rss["baseline"], state),
            ("peak of the measured step", rss["peak"] - rss["baseline"],
             computed["update_total"])]
    print("| point (minus the imports' baseline) | measured GiB | computed GiB | difference |\n"
          "| --- | ---: | ---: | ---: |")
    for what, measured, expected in rows:
        print(f"| {what} | {measured / GIB:.2f} | {expected / GIB:.2f} | "
              f"{100 * (measured - expected) / expected:+.1f}% |")
    print(f"baseline (torch, transformers, rlscale imported): {rss['baseline'] / GIB:.2f} GiB; "
          f"computed peak at the {computed['update_peak_at']}: state + "
          f"{(computed['update_total'] - state) / GIB:.2f} GiB")


# -- the whole loop (`--loop`): one GRPO step of the 0.5 B shape through `rlscale rlvr train`
def build_model(out: Path) -> Path:
    """The 0.5 B shape, randomly initialised, saved once with the character tokenizer."""
    if (out / "config.json").is_file():
        return out
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlscale.rlvr.model import build_char_tokenizer, save_model

    torch.manual_seed(0)
    tokenizer = build_char_tokenizer()
    config = Qwen2Config(**QWEN2_0_5B, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    save_model(Qwen2ForCausalLM(config), tokenizer, out)
    return out


def run_variant(name: str, model: Path, out: Path, args: argparse.Namespace) -> dict:
    """The real loop (configs/rlvr/quickstart.yaml) for `args.steps` steps of 8 prompts x 4
    completions x 128 new tokens, no KL term, in its own process; its metrics' peaks."""
    run_dir = out / name
    overrides = [f"model.path={model}", f"run_dir={run_dir}", f"train.steps={args.steps}",
                 "rollout.prompts_per_step=8", "rollout.group_size=4",
                 "rollout.max_new_tokens=128", "eval.every=0", "checkpoint.every=0",
                 f"train.micro_batch_tokens={args.micro_batch_tokens}",
                 f"train.threads={args.threads}", "progress=false", "tensorboard=false",
                 f"device={args.device}", *VARIANTS[name]]
    cmd = [sys.executable, "-m", "rlscale.cli", "rlvr", "train", str(CONFIG), *overrides,
           "--overwrite"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    wall = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"error: variant {name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    dtype = re.search(r"compute_dtype:\s*(\S+)", (run_dir / "config.yaml").read_text())[1]
    cuda_peaks = [r["memory/cuda_peak_gib"] for r in rows if "memory/cuda_peak_gib" in r]
    return {"variant": name, "peak_rss_gib": max(r["memory/peak_rss_gib"] for r in rows),
            "cuda_peak_gib": max(cuda_peaks) if cuda_peaks else None,
            "collect_s": [r["time/collect_s"] for r in rows],
            "train_s": [r["time/train_s"] for r in rows], "compute_dtype": dtype,
            "wall_s": wall}


def loop(args: argparse.Namespace) -> None:
    """Whole-run peaks (sampling included) beside the learner-only figures above."""
    out = args.out.resolve()
    model = build_model(out / "qwen2_0.5b_shape")
    results = [run_variant(name, model, out, args) for name in args.variants.split(",")]
    print("\n| variant | compute | peak RSS (GiB) | peak GPU (GiB) | sampling s (128 tokens x 32) "
          "| update s | run wall s (load, step, save) |\n"
          "| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        gpu = f"{r['cuda_peak_gib']:.2f}" if r["cuda_peak_gib"] is not None else "-"
        print(f"| {r['variant']} | {r['compute_dtype']} | {r['peak_rss_gib']:.2f} | {gpu} | "
              f"{min(r['collect_s']):.1f} | {min(r['train_s']):.1f} | {r['wall_s']:.0f} |")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"wrote {out / 'results.json'}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batch", default="4x512:128",
                        help="the table's micro-batch: SEQUENCESxTOKENS:PROMPT_TOKENS")
    parser.add_argument("--compute-dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--measure", action="store_true", help="also measure one learner step")
    parser.add_argument("--shape", default="0.5b", choices=tuple(SHAPES))
    parser.add_argument("--guard", default="check", choices=("snapshot", "check", "off"))
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--measure-micro-batch", default="4x64:8", help="as --micro-batch")
    parser.add_argument("--max-used-gib", type=float, default=20.0,
                        help="refuse to measure where in-use + computed memory exceeds this")
    parser.add_argument("--allocator", default="glibc", choices=tuple(ALLOCATORS),
                        help="the measured process's malloc settings (module docstring)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    loop_args = parser.add_argument_group("the whole loop (--loop; --steps implies it)")
    loop_args.add_argument("--loop", action="store_true")
    loop_args.add_argument("--out", type=Path, default=Path("runs/memory"))
    loop_args.add_argument("--variants", default="full,lora")
    loop_args.add_argument("--steps", type=int, default=None)
    loop_args.add_argument("--micro-batch-tokens", type=int, default=1024)
    loop_args.add_argument("--device", default="auto", help="auto | cpu | cuda (the run's device)")
    return parser.parse_args()


def parse_micro(text: str) -> MicroBatch:
    """`SEQUENCESxTOKENS:PROMPT_TOKENS`, e.g. 4x512:128."""
    sequences, tokens, prompt = (int(x) for x in re.split("[x:]", text.lower()))
    return MicroBatch(sequences, tokens, prompt)


def main() -> None:
    args = parse_args()
    if args.child:
        print(json.dumps(measure_child(json.loads(args.child))))
        return
    if args.loop or args.steps is not None:  # benchmarks/gpu_check.sh passes --steps
        args.steps = args.steps or 1
        loop(args)
        return
    micro = parse_micro(args.micro_batch)
    print("\n".join(header(micro, args.compute_dtype)))
    for checkpointing in (False, True):
        print(f"\nper-process GiB, gradient checkpointing {'on' if checkpointing else 'off'} "
              "(components: guard snapshot, reference on)")
        print("\n".join(table(micro, checkpointing, args.compute_dtype)))
    print("\n" + seven_b_line(micro, args.compute_dtype))
    if args.measure:
        measure(args, parse_micro(args.measure_micro_batch))


if __name__ == "__main__":
    main()
