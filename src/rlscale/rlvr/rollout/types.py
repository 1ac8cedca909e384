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
    # 1 on tokens a tool wrote (a call's result, inserted into the context: never sampled, so
    # out of the loss); empty: none.
    tool_mask: list[int] = field(default_factory=list)
    tool_calls: int = 0            # calls it made (each result is a run of tool_mask 1s)

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass
class PartialCompletion:
    """A running request: the tokens drawn so far, each with mu's log-prob and version."""

    request: GenerationRequest
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    tool_mask: list[int] = field(default_factory=list)
    tool_calls: int = 0

    def append(self, token: int, logprob: float, version: int) -> None:
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        self.versions.append(version)
        self.tool_mask.append(0)

    def insert_tool_result(self, token_ids: list[int], version: int) -> None:
        """A tool's result, written into the context after the call: no log-prob of the
        policy's (they were not sampled), masked out of the loss."""
        self.token_ids += token_ids
        self.logprobs += [0.0] * len(token_ids)
        self.versions += [version] * len(token_ids)
        self.tool_mask += [1] * len(token_ids)
        self.tool_calls += 1

    def finish(self, reason: str) -> Completion:
        return Completion(self.request.request_id, self.request.prompt_ids, self.token_ids,
                          self.logprobs, self.versions, reason,
                          tool_mask=self.tool_mask if any(self.tool_mask) else [],
                          tool_calls=self.tool_calls)


class ToolTurns(Protocol):
    """What an engine needs to let requests call tools between decode steps
    (rlvr/tool_turns.py). A request whose generated tokens just closed a call is parked: its
    slot goes to other requests while the call runs; its result is inserted and the request
    resumes. `reproducible`: the engine waits for every call in flight before its next
    decode step (rollout/tool_results.py)."""

    reproducible: bool

    def call_in(self, token_ids: list[int], calls_made: int) -> Any | None:
        """The call (opaque to the engine) when `token_ids` (generated so far, results
        included) just closed one the request may still make (it made `calls_made`); else
        None."""

    def start(self, request_id: int, call: Any) -> None:
        """Run the call in the background."""

    def results(self, timeout: float) -> list[tuple[int, list[int]]]:
        """(request id, the result's token ids) of the calls that finished, waiting up to
        `timeout` seconds for the first."""


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
