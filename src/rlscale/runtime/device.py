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
from dataclasses import dataclass
from pathlib import Path

import torch


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


# bf16 must beat fp32 by this factor on the probe: autocast adds casts that the raw matmul
# does not pay, so a near tie goes to fp32 (never slower than fp32 is the promise of `auto`).
BF16_MIN_SPEEDUP = 1.15
# (M, K, N) of the matmuls that dominate this project's models: a tiny-to-medium language
# model's projections over a batch of tokens, its MLP, and a 64-channel 3x3 convolution of
# the Zero networks as im2col (256 positions of 7x7 boards).
PROBE_SHAPES = ((2048, 256, 256), (2048, 512, 1536), (12544, 576, 64))
PROBE_SECONDS = 0.06  # per shape and precision, after one warm-up call


@dataclass(frozen=True)
class PrecisionProbe:
    """Matmul throughput of fp32 and bf16 on one device and thread count, measured once per
    machine, torch version and thread count (then read from a cache file)."""

    float32_gflops: float
    bfloat16_gflops: float
    threads: int
    cached: bool = False

    @property
    def choice(self) -> str:
        faster = self.bfloat16_gflops >= BF16_MIN_SPEEDUP * self.float32_gflops
        return "bfloat16" if faster else "float32"

    def metrics(self) -> dict[str, float]:
        return {"precision/float32_gflops": self.float32_gflops,
                "precision/bfloat16_gflops": self.bfloat16_gflops,
                "precision/bfloat16_speedup": self.bfloat16_gflops / max(self.float32_gflops, 1e-9)}


@dataclass(frozen=True)
class ComputeDtype:
    """The dtype a run computes in, and for `auto` the probe that chose it."""

    name: str                     # float32 | bfloat16
    probe: PrecisionProbe | None  # None when the config named the dtype

    def metrics(self) -> dict[str, float]:
        chosen = {"precision/bfloat16": float(self.name == "bfloat16")}
        return chosen if self.probe is None else {**chosen, **self.probe.metrics()}

    def describe(self) -> str:
        if self.probe is None:
            return f"compute dtype: {self.name}"
        p = self.probe
        return (f"compute dtype: {self.name} (auto: matmul probe bf16 {p.bfloat16_gflops:.0f} vs "
                f"fp32 {p.float32_gflops:.0f} GFLOP/s at {p.threads} threads"
                f"{', cached' if p.cached else ''})")


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
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if time.perf_counter() - t0 >= seconds:
                break
        elapsed += time.perf_counter() - t0
        flops += 2.0 * m * k * n * calls
    return flops / elapsed / 1e9


def _machine_key(device: torch.device) -> str:
    """What the probe's answer depends on: the processor, the torch build, the threads."""
    if device.type == "cuda":
        hardware = torch.cuda.get_device_name(device)
    else:
        hardware = platform.processor() or platform.machine()
        try:
            info = Path("/proc/cpuinfo").read_text()
            model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                          if line.startswith("model name")), "")
            flags = next((line.split(":", 1)[1] for line in info.splitlines()
                          if line.startswith("flags")), "")
            hardware = f"{model} {hashlib.sha1(flags.encode()).hexdigest()[:12]}"
        except OSError:
            pass
    return f"{device.type}|{hardware}|torch {torch.__version__}|threads {torch.get_num_threads()}"


def cache_dir() -> Path:
    """`RLSCALE_CACHE_DIR`, else `$XDG_CACHE_HOME/rlscale`, else `~/.cache/rlscale`."""
    if os.environ.get("RLSCALE_CACHE_DIR"):
        return Path(os.environ["RLSCALE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "rlscale"


def precision_probe(device: torch.device) -> PrecisionProbe:
    """The probe for this machine: from the cache file when this machine, torch version and
    thread count were measured before, else measured now (a fraction of a second) and saved.
    An unreadable or unwritable cache only costs a new measurement."""
    key = _machine_key(device)
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
            return PrecisionProbe(float(entry["float32_gflops"]), float(entry["bfloat16_gflops"]),
                                  int(entry["threads"]), cached=True)
        except (KeyError, TypeError, ValueError):
            pass
    probe = PrecisionProbe(measure_matmul_gflops(torch.float32, device),
                           measure_matmul_gflops(torch.bfloat16, device),
                           torch.get_num_threads())
    known[key] = {"float32_gflops": probe.float32_gflops,
                  "bfloat16_gflops": probe.bfloat16_gflops, "threads": probe.threads}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass
    return probe


def resolve_compute_dtype(name: str, device: torch.device) -> ComputeDtype:
    """`auto`: bfloat16 where a matmul probe on this device, at the current thread count,
    measures it at least BF16_MIN_SPEEDUP x faster than float32, else float32. CPU flags do
    not decide it: an AVX-512 BF16 CPU without AMX multiplies bf16 ~2x slower than fp32,
    another ~4x faster (MACHINE_NOTES.md). A named dtype is taken as it is."""
    if name != "auto":
        return ComputeDtype(name, None)
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return ComputeDtype("float32", None)
    probe = precision_probe(device)
    return ComputeDtype(probe.choice, probe)


def compute_context(device: torch.device, compute_dtype: str):
    """bf16 autocast (fp32 weights, bf16 matmuls) for `bfloat16`; nothing for `float32`."""
    if compute_dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)
