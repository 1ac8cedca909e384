"""What goes into an inference engine and what comes out, whatever the engine.

The project's own continuous-batching engine (`engine.py`) and vLLM (`vllm_engine.py`)
implement `InferenceEngine`; the fleet's workers drive either one the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class EngineSampling:
    """Sampling settings shared by every request of one engine (as in the trainer's loss)."""

    temperature: float = 1.0   # <= 0: greedy
    top_p: float = 1.0
    ignore_eos: bool = False   # run every request to its max_new_tokens (benchmarks)


@dataclass(frozen=True)
class GenerationRequest:
    request_id: int                # unique within a run
    prompt_ids: tuple[int, ...]
    max_new_tokens: int


@dataclass
class Completion:
    """One finished request: its tokens, mu's log-prob of each and the version that drew it."""

    request_id: int
    prompt_ids: tuple[int, ...]
    token_ids: list[int]           # EOS included when emitted
    logprobs: list[float]          # log mu(token) under the distribution actually sampled from
    versions: list[int]            # policy version of the weights that drew each token
    finish_reason: str             # "stop" (EOS) or "length"
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass
class PartialCompletion:
    """A running request: the tokens drawn so far, each with mu's log-prob and version."""

    request: GenerationRequest
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def append(self, token: int, logprob: float, version: int) -> None:
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        self.versions.append(version)

    def finish(self, reason: str) -> Completion:
        return Completion(self.request.request_id, self.request.prompt_ids, self.token_ids,
                          self.logprobs, self.versions, reason)


class InferenceEngine(Protocol):
    version: int

    def add_request(self, request: GenerationRequest) -> None:
        """Queue a request; it starts as soon as a slot is free."""

    def step(self) -> list[Completion]:
        """One decode step of every active request (refilling free slots first); returns
        the requests that finished in it."""

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """New weights, callable between any two steps; later tokens carry `version`."""

    def has_unfinished(self) -> bool:
        """True while any request is queued or running."""

    def abort_all(self) -> list[int]:
        """Drop every queued and running request; returns their ids."""
