"""Policy versions: weight publishing and pulling, and staleness accounting.

Both loops share the same shape: a learner publishes weights with a monotonically
increasing version; actors pull the latest between units of work and stamp every sample
with the version that produced it, so the learner can measure how stale its data is.
"""

from __future__ import annotations

import collections
import copy
import threading
from collections.abc import Iterable
from typing import Any


class WeightStore:
    """In-process weight store. A Ray actor with the same methods serves a cluster."""

    def __init__(self, state_dict: dict[str, Any] | None = None, version: int = 0) -> None:
        self._lock = threading.Lock()
        self._version = version
        self._state = copy.deepcopy(state_dict) if state_dict is not None else None

    @property
    def version(self) -> int:
        return self._version

    def publish(self, state_dict: dict[str, Any]) -> int:
        snapshot = {k: v.detach().clone() if hasattr(v, "detach") else copy.deepcopy(v)
                    for k, v in state_dict.items()}
        with self._lock:
            self._version += 1
            self._state = snapshot
            return self._version

    def latest(self) -> tuple[int, dict[str, Any] | None]:
        with self._lock:
            return self._version, self._state


def staleness(current_version: int, sample_versions: Iterable[int]) -> dict[str, float]:
    """Version-lag summary of a batch: how many publishes behind each sample was."""
    lags = [current_version - v for v in sample_versions]
    if not lags:
        return {}
    hist = collections.Counter(lags)
    out = {
        "staleness/lag_mean": sum(lags) / len(lags),
        "staleness/lag_max": float(max(lags)),
    }
    for lag in sorted(hist)[:4]:
        out[f"staleness/share_lag_{lag}"] = hist[lag] / len(lags)
    return out
