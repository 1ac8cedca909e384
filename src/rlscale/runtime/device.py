"""Which device a run computes on, and what it used of it."""

from __future__ import annotations

import resource
import sys

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
