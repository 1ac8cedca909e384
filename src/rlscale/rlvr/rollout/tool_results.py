"""Which parked requests an engine resumes: the tool calls that came back (both engines,
rollout/engine.py and rollout/vllm_engine.py)."""

from __future__ import annotations

from collections.abc import Collection

from .types import ToolTurns


def returned_calls(tools: ToolTurns, parked: Collection[int],
                   busy: bool) -> list[tuple[int, list[int]]]:
    """The calls that came back, in request order, for an engine whose `parked` requests
    wait on them. Reproducible tools: every parked request's call (waiting for the slowest),
    so where a request resumes, and so the batch each token is drawn in, follows from the
    tokens and not from how long a call took. Else those back now, waiting briefly for one
    when the engine has nothing else to run (`busy` False) rather than spin."""
    if not tools.reproducible:
        return sorted(tools.results(timeout=0.0 if busy else 0.005))
    back: dict[int, list[int]] = {}
    while not set(parked) <= back.keys():
        back.update(tools.results(timeout=0.05))
    return sorted(back.items())
