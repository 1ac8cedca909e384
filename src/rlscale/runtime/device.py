"""Which device a run computes on, and what it used of it."""

from __future__ import annotations

import contextlib
import functools
import resource
import sys
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


@functools.cache
def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16 or AMX): then a bf16 matmul
    runs several times faster than an fp32 one (on this project's machine about 4x)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_compute_dtype(name: str, device: torch.device) -> str:
    """`auto`: bfloat16 where the device computes it natively (a CUDA GPU with bf16, a CPU
    with AVX-512 BF16 or AMX), else float32."""
    if name != "auto":
        return name
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    return "bfloat16" if cpu_has_fast_bf16() else "float32"


def compute_context(device: torch.device, compute_dtype: str):
    """bf16 autocast (fp32 weights, bf16 matmuls) for `bfloat16`; nothing for `float32`."""
    if compute_dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)
