"""Which device a run computes on, and what it used of it."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import atomic_write_text
from .cpu_load import CrowdWatch


class DeviceError(ValueError):
    """The configured device is not there (one-line message)."""


def resolve_device(name: str) -> torch.device:
    """`auto`: a CUDA GPU when torch sees one, else the CPU; `cuda` without one is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise DeviceError("device: cuda, but torch sees no CUDA GPU (torch.cuda.is_available() "
                          f"is False; torch {torch.__version__}); use device: cpu or auto")
    if name not in ("cpu", "cuda"):
        raise DeviceError(f"unknown device '{name}' (known: auto, cpu, cuda)")
    return torch.device(name)


def peak_memory_gib(device: torch.device) -> dict[str, float]:
    """The process's peak resident memory so far (the kernel's high-water mark: it never
    falls), and on CUDA the peak allocated since the last call (reset here)."""
    # ru_maxrss is in KiB on Linux, in bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    out = {"memory/peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
           * scale / 2**30}
    if device.type == "cuda":
        out["memory/cuda_peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
        torch.cuda.reset_peak_memory_stats(device)
    return out


# bf16 must beat fp32 by this factor on the probe: a near tie goes to fp32 (never slower
# than fp32 is the promise of `auto`).
BF16_MIN_SPEEDUP = 1.15
# The matmul probe's (M, K, N), for a run that gives no workload of its own (or one too big
# to time in a moment): a tiny-to-medium language model's projections over a batch of
# tokens, its MLP, and a 64-channel 3x3 convolution of the Zero networks as im2col (256
# positions of 7x7 boards). Large models are matmul-bound, so these shapes speak for them.
PROBE_SHAPES = ((2048, 256, 256), (2048, 512, 1536), (12544, 576, 64))
PROBE_SECONDS = 0.06  # per shape and precision, after one warm-up call
WORKLOAD_SECONDS = 0.1  # per precision and round, after one warm-up pass
WORKLOAD_ROUNDS = 2  # fp32, bf16, fp32, bf16: the best round of each (noise only slows)


@dataclass(frozen=True)
class Workload:
    """A moment of a run's own compute, e.g. its model's forward and backward on a batch of
    its shape: what `auto` times under fp32 and under bf16 autocast. A matmul probe alone
    misleads on small models: on an AMX machine bf16 matmuls ran 2.3x faster than fp32 while
    the 0.8 M reasoning model's GRPO step ran 1.7x slower in bf16 (casts, small kernels, the
    backward). `key` names what the timing depends on besides the machine (the model's
    parameter shapes and the pass's batch); `run` is one pass, called inside the precision's
    context; it must leave the model as it found it."""

    key: str
    run: Callable[[], None]


MATMUL_UNIT = "matmul GFLOP/s"
WORKLOAD_UNIT = "workload passes/s"


@dataclass(frozen=True)
class PrecisionProbe:
    """fp32 and bf16 throughput on one device and thread count (`unit`: matmul GFLOP/s, or
    passes/s of a run's workload), measured once per machine, torch version, thread count
    and workload (then read from a cache file)."""

    float32_rate: float
    bfloat16_rate: float
    threads: int
    unit: str = MATMUL_UNIT
    cached: bool = False
    crowd: float | None = None  # mean runnable tasks while timing (runtime/cpu_load.py)
    crowded: bool = False       # other tasks wanted the cores: the timing is not trusted

    @property
    def speedup(self) -> float:
        return self.bfloat16_rate / max(self.float32_rate, 1e-12)

    @property
    def choice(self) -> str:
        """bfloat16 where it beat fp32 by BF16_MIN_SPEEDUP on uncrowded cores."""
        trusted = not self.crowded
        return "bfloat16" if trusted and self.speedup >= BF16_MIN_SPEEDUP else "float32"

    def metrics(self) -> dict[str, float]:
        return {"precision/float32_rate": self.float32_rate,
                "precision/bfloat16_rate": self.bfloat16_rate,
                "precision/bfloat16_speedup": self.speedup,
                "precision/probed_workload": float(self.unit != MATMUL_UNIT),
                "precision/probe_crowded": float(self.crowded)}


@dataclass(frozen=True)
class ComputeDtype:
    """The dtype a run computes in, and for `auto` the probe that chose it (or why none
    was needed)."""

    name: str                     # float32 | bfloat16
    probe: PrecisionProbe | None  # None when the config named the dtype, or `reason` decided
    reason: str = ""              # `auto` decided without a probe: why

    def metrics(self) -> dict[str, float]:
        chosen = {"precision/bfloat16": float(self.name == "bfloat16")}
        return chosen if self.probe is None else {**chosen, **self.probe.metrics()}

    def describe(self) -> str:
        """One sentence: the dtype, and for `auto` why the probe picked it."""
        if self.reason:
            return f"compute dtype: {self.name} (auto): {self.reason}"
        if self.probe is None:
            return f"compute dtype: {self.name}"
        p = self.probe
        what = "the model's own passes" if p.unit == WORKLOAD_UNIT else "a matmul probe"
        if p.crowded:
            return (f"compute dtype: {self.name} (auto): the cores were crowded while {what} "
                    f"ran ({p.crowd:.1f} tasks wanted {os.cpu_count()} cores; bf16 "
                    f"measured {_speedup_text(p.speedup)}x), so float32 and the timing is "
                    "not cached")
        verdict = ("at least" if p.choice == "bfloat16" else "under") + \
            f" the {BF16_MIN_SPEEDUP}x that auto asks of bfloat16"
        return (f"compute dtype: {self.name} (auto): bf16 ran {_speedup_text(p.speedup)}x as "
                f"fast as fp32 on {what}, {verdict} ({p.bfloat16_rate:.3g} vs "
                f"{p.float32_rate:.3g} {p.unit} at {p.threads} threads"
                f"{', cached' if p.cached else ''})")


def _speedup_text(speedup: float) -> str:
    """`speedup` to two decimals, or more where two would round it onto the other side of
    BF16_MIN_SPEEDUP (1.148 shown as 1.15 beside a 1.15 bar reads as a wrong choice)."""
    for digits in (2, 3, 4, 6):
        text = f"{speedup:.{digits}f}"
        if (float(text) >= BF16_MIN_SPEEDUP) == (speedup >= BF16_MIN_SPEEDUP):
            return text
    return text


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_matmul_gflops(dtype: torch.dtype, device: torch.device,
                          shapes=PROBE_SHAPES, seconds: float = PROBE_SECONDS) -> float:
    """Matmul GFLOP/s of `dtype` on `device` over `shapes`, at the current thread count."""
    flops, elapsed = 0.0, 0.0
    # Its own generator: whether the probe runs (or a cached result is used) must not move
    # the global RNG, or a resumed run would draw other numbers than the straight one.
    generator = torch.Generator(device=device).manual_seed(0)
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device, generator=generator).to(dtype)
        b = torch.randn(k, n, device=device, generator=generator).to(dtype)
        torch.matmul(a, b)  # warm-up: kernel selection, first-touch allocation
        calls, t0 = 0, time.perf_counter()
        while True:
            torch.matmul(a, b)
            calls += 1
            _synchronize(device)
            if time.perf_counter() - t0 >= seconds:
                break
        elapsed += time.perf_counter() - t0
        flops += 2.0 * m * k * n * calls
    return flops / elapsed / 1e9


def measure_workload_rates(workload: Workload, device: torch.device,
                           seconds: float = WORKLOAD_SECONDS,
                           rounds: int = WORKLOAD_ROUNDS) -> tuple[float, float]:
    """(fp32, bf16) passes/s of `workload` on `device`: one warm-up pass in each, then
    `rounds` alternating rounds of at least `seconds` each; the best round of each counts."""
    names = ("float32", "bfloat16")

    def one_pass(name: str) -> None:
        with compute_context(device, name):
            workload.run()
        _synchronize(device)

    for name in names:
        one_pass(name)
    best = dict.fromkeys(names, 0.0)
    for _ in range(rounds):
        for name in names:
            passes, t0 = 0, time.perf_counter()
            while True:
                one_pass(name)
                passes += 1
                if time.perf_counter() - t0 >= seconds:
                    break
            best[name] = max(best[name], passes / (time.perf_counter() - t0))
    return best["float32"], best["bfloat16"]


def read_cpuinfo() -> str | None:
    """/proc/cpuinfo's text; None where there is none (not Linux)."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


def cpuinfo_field(cpuinfo: str, *names: str) -> str | None:
    """The value (after the colon, unstripped) of the first line of `cpuinfo` that starts
    with one of `names`; None without one."""
    return next((line.split(":", 1)[1] for line in cpuinfo.splitlines()
                 if line.startswith(names)), None)


def _machine_key(device: torch.device) -> str:
    """What the probe's answer depends on: the processor, the torch build, the threads."""
    info = None if device.type == "cuda" else read_cpuinfo()
    if device.type == "cuda":
        hardware = torch.cuda.get_device_name(device)
    elif info is None:
        hardware = platform.processor() or platform.machine()
    else:
        model = (cpuinfo_field(info, "model name") or "").strip()
        flags = cpuinfo_field(info, "flags") or ""
        hardware = f"{model} {hashlib.sha1(flags.encode()).hexdigest()[:12]}"
    return f"{device.type}|{hardware}|torch {torch.__version__}|threads {torch.get_num_threads()}"


def cache_dir() -> Path:
    """`RLSCALE_CACHE_DIR`, else `$XDG_CACHE_HOME/rlscale`, else `~/.cache/rlscale`."""
    if os.environ.get("RLSCALE_CACHE_DIR"):
        return Path(os.environ["RLSCALE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rlscale"


def _measure(device: torch.device, workload: Workload | None) -> PrecisionProbe:
    """Both rates, timed while a `CrowdWatch` counts the tasks that want the cores (on a
    GPU the host's crowd does not decide)."""
    threads = torch.get_num_threads()
    with CrowdWatch() as watch:
        if workload is None:
            rates = (measure_matmul_gflops(torch.float32, device),
                     measure_matmul_gflops(torch.bfloat16, device))
        else:
            rates = measure_workload_rates(workload, device)
    unit = MATMUL_UNIT if workload is None else WORKLOAD_UNIT
    return PrecisionProbe(*rates, threads, unit, crowd=watch.mean,
                          crowded=device.type == "cpu" and watch.crowded)


def precision_probe(device: torch.device, workload: Workload | None = None) -> PrecisionProbe:
    """The probe for this machine (and `workload`, else the matmul probe): from the cache
    file when this machine, torch version, thread count and workload were measured before,
    else measured now (a fraction of a second) and saved, unless the cores were crowded
    while it was timed (then it chooses float32 and the next run measures again). An
    unreadable or unwritable cache only costs a new measurement."""
    key = _machine_key(device) + ("" if workload is None else f"|{workload.key}")
    path = cache_dir() / "precision_probe.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict):
        known = {}
    entry = known.get(key)
    if isinstance(entry, dict):
        try:
            return PrecisionProbe(float(entry["float32_rate"]), float(entry["bfloat16_rate"]),
                                  int(entry["threads"]), str(entry["unit"]), cached=True)
        except (KeyError, TypeError, ValueError):
            pass
    probe = _measure(device, workload)
    if probe.crowded:
        return probe
    known[key] = {"float32_rate": probe.float32_rate, "bfloat16_rate": probe.bfloat16_rate,
                  "threads": probe.threads, "unit": probe.unit}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(known, indent=1, sort_keys=True))
    except OSError:
        pass
    return probe


def bf16_instructions_in(cpuinfo: str) -> bool | None:
    """Whether the CPU that `cpuinfo` (/proc/cpuinfo's text) describes computes bf16 in
    hardware (x86: avx512_bf16 or amx_bf16; Arm: bf16); None where it lists no flags."""
    flags = set((cpuinfo_field(cpuinfo, "flags", "Features") or "").split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"}) if flags else None


def cpu_has_bf16_instructions() -> bool | None:
    """`bf16_instructions_in` this machine's /proc/cpuinfo; None where there is none."""
    info = read_cpuinfo()
    return None if info is None else bf16_instructions_in(info)


NO_BF16_INSTRUCTIONS = ("this CPU has no bf16 instructions (avx512_bf16, amx_bf16), so bf16 "
                        "would be emulated; not probed")


def resolve_compute_dtype(name: str, device: torch.device,
                          workload: Workload | None = None) -> ComputeDtype:
    """`auto`: bfloat16 where, on this device at the current thread count, it runs
    `workload` (the run's own model; else a matmul probe) at least BF16_MIN_SPEEDUP x faster
    than float32, else float32. CPU flags do not decide it: an AVX-512 BF16 CPU without AMX
    multiplies bf16 ~2x slower than fp32, another ~4x faster (MACHINE_NOTES.md), and even
    where bf16 matmuls are faster a small model can run slower in it. But a CPU without bf16
    instructions is float32 unprobed: there bf16 is emulated, ~10x slower, and a probe
    timed while other processes crowd the cores once measured it 1.39x faster (the update
    then took 105 s a step). A probe timed on crowded cores (more runnable tasks than cores)
    chooses float32 and is not cached. A named dtype is taken as it is."""
    if name != "auto":
        return ComputeDtype(name, None)
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return ComputeDtype("float32", None)
    if device.type == "cpu" and cpu_has_bf16_instructions() is False:
        return ComputeDtype("float32", None, NO_BF16_INSTRUCTIONS)
    probe = precision_probe(device, workload)
    return ComputeDtype(probe.choice, probe)


def machine_summary() -> str:
    """The machine a measurement ran on, in one line: processor, its vector and matrix
    extensions (what decides the speed of each precision), cores, torch, GPU if any."""
    model, flags = platform.processor() or platform.machine(), []
    info = read_cpuinfo()
    if info is not None:
        model = (cpuinfo_field(info, "model name") or model).strip()
        flags = (cpuinfo_field(info, "flags") or "").split()
    wanted = [f for f in flags if f.startswith(("avx2", "avx512", "amx"))]
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return (f"{model}, flags {' '.join(wanted) or 'none of avx2/avx512/amx'}, "
            f"{os.cpu_count()} cores, torch {torch.__version__}{gpu}")


def parameter_signature(module: torch.nn.Module) -> str:
    """A short digest of a module's class and parameter names and shapes: two models with
    the same signature compute the same shapes (a key for cached timings)."""
    shapes = ";".join(f"{n}:{tuple(p.shape)}" for n, p in module.named_parameters())
    digest = hashlib.sha1(shapes.encode()).hexdigest()[:16]
    return f"{type(module).__name__} {digest}"


def compute_context(device: torch.device, compute_dtype: str):
    """bf16 autocast (fp32 weights, bf16 matmuls) for `bfloat16`; nothing for `float32`."""
    if compute_dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)
