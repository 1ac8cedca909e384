"""A continuous-batching inference engine for any Hugging Face causal LM.

A fixed number of slots; each `step()` first fills free slots from the request queue (one
batched prefill of the new prompts, spliced into the running KV cache), then advances every
active request by one token in one batched forward. A request that finishes frees its slot
for the next step, so a long-tailed mix of lengths keeps the batch full instead of waiting
for its longest member (static batching).

Written by hand because the engines that do this (vLLM, SGLang, transformers'
`generate_batch`) either need a GPU, are 5-20x slower than plain `generate` on this CPU
(MACHINE_NOTES), or do not expose the two things RL needs: the log-prob of every token under
the distribution actually sampled from, and new weights between any two decode steps with
the policy version of every token recorded.

The cache (`kv_cache.KVCache`, preallocated): every row is right-aligned, its newest token
at the last column, padding (masked) on the left. A refilled row overwrites its slot's
columns; columns that no row uses any more are cut off the left. Positions are per row, so
padding never shifts RoPE. Decode steps are the sampler's (`decoder.decode_step` on the
Llama family, else the model's forward); the fused weights are rebuilt at `load_weights`.

Tool calls (`tools`, a `ToolTurns`): a row whose tokens close a call is parked: it leaves
its slot (the next step refills it from the queue) with a copy of its keys and values, while
the call runs elsewhere. When the result is back it is appended to the row's tokens (masked
out of the loss) and the row joins the front of the queue; it resumes by feeding only what
its saved cache lacks (the last drawn token, the result). New weights while it waits
(`recompute_cache_on_update`) drop the saved cache: its whole context is prefilled again
with the weights of then. Its later tokens carry the version they were drawn under. A row
that reaches `max_new_tokens` inside a result ends there ("length").
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from ...runtime.weight_sync import WeightPacket, unpack_weights
from .decoder import decode_dtype
from .kv_cache import KVCache
from .sampler import cached_forward, left_padded, shared_prefills, step_function
from .sampling import sample_next
from .tool_results import returned_calls
from .types import Completion, EngineSampling, GenerationRequest, PartialCompletion, ToolTurns


class _Row(PartialCompletion):
    """A running request in a batch row; its last token is drawn but not yet fed."""

    started: float = 0.0           # time.monotonic() of its first prefill
    parked_at: float = 0.0         # of its current tool call
    # While parked: the keys and values of its fed tokens ([layers, kv_heads, n, head_dim]
    # each), so that it resumes by feeding only what came after them; None: re-prefill.
    saved: tuple[torch.Tensor, torch.Tensor] | None = None

    def fed(self) -> list[int]:
        """The tokens whose keys and values are in the cache: prompt + all but the last."""
        return list(self.request.prompt_ids) + self.token_ids[:-1]

    def context(self) -> list[int]:
        """Everything a resumed row feeds in its prefill: prompt, tokens, the tool's result."""
        return list(self.request.prompt_ids) + self.token_ids


@dataclass
class EngineStats:
    decode_steps: int = 0
    prefills: int = 0
    generated_tokens: int = 0
    active_row_steps: int = 0      # sum over decode steps of the rows that held a request
    slot_steps: int = 0            # sum over decode steps of the slot count
    tool_calls: int = 0            # rows parked on a tool call
    resumes: int = 0               # rows back from a tool call, prefilled again
    parked_s: float = 0.0          # sum over requests of the time spent waiting on tools
    request_s: float = 0.0         # sum over finished requests of first prefill to finish

    @property
    def slot_utilisation(self) -> float:
        return self.active_row_steps / self.slot_steps if self.slot_steps else 0.0


class ContinuousBatchingEngine:
    def __init__(self, model, sampling: EngineSampling, *, slots: int, eos_token_id: int,
                 pad_token_id: int, seed: int = 0, version: int = 0,
                 recompute_cache_on_update: bool = True,
                 tools: ToolTurns | None = None) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.model = model.eval()
        self.sampling, self.slots = sampling, slots
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id
        self.version = version
        # After new weights, rebuild the cache with them (one prefill of the running rows) so
        # every later token is drawn from exactly the new policy; off, the rows keep the keys
        # and values the old weights computed (cheaper, and what most in-flight systems do).
        self.recompute_cache_on_update = recompute_cache_on_update
        self.device = next(model.parameters()).device
        self.generator = torch.Generator().manual_seed(seed)
        # New requests, and rows back from a tool call (at the front: admitted earlier).
        self.waiting: collections.deque[GenerationRequest | _Row] = collections.deque()
        self.rows: list[_Row | None] = []          # one per batch row; None = a free slot
        self.tools = tools
        self.parked: dict[int, _Row] = {}          # request id -> a row waiting on its call
        self.cache: KVCache | None = None
        self.positions: torch.Tensor | None = None  # [rows] position of the next fed token
        self.cache_dtype, self._decode = step_function(self.model)
        self.stats = EngineStats()
        self._mapped: set[int] = set()  # ids of weights that are views of a shared packet

    # -- the interface -------------------------------------------------------------------
    def add_request(self, request: GenerationRequest) -> None:
        if request.max_new_tokens < 1:
            raise ValueError(f"request {request.request_id}: max_new_tokens must be >= 1")
        if not request.prompt_ids:
            raise ValueError(f"request {request.request_id}: empty prompt")
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting) or bool(self.parked) or any(r is not None for r in self.rows)

    @property
    def num_running(self) -> int:
        return sum(r is not None for r in self.rows)

    def abort_all(self) -> list[int]:
        ids = [_request_of(r).request_id for r in self.waiting] + [
            r.request.request_id for r in self.rows if r is not None] + list(self.parked)
        self.waiting.clear()
        self.parked.clear()  # a result that still comes back is ignored
        self._reset_batch()
        return ids

    @torch.no_grad()
    def load_weights(self, state_dict: dict[str, Any] | WeightPacket, version: int) -> None:
        """New weights into the model's own tensors (no new state dict), then fused again. A
        packet read-only in Ray's object store is mapped, not copied: each CPU tensor of the
        engine's dtype becomes a view of the node's one shared copy (nothing writes to an
        engine's weights; the next version re-points them and the old copy is freed once no
        worker maps it). Anything else is copied in, cast where dtypes differ. A partial
        dict (LoRA's merged layers) updates those tensors only; a tied weight goes once."""
        mapped = isinstance(state_dict, WeightPacket) and state_dict.read_only
        if isinstance(state_dict, WeightPacket):
            state_dict = unpack_weights(state_dict)
        targets = self.model.state_dict(keep_vars=True)
        loaded: set[int] = set()
        for name, tensor in state_dict.items():
            target = targets.get(name)
            if target is None:
                raise KeyError(f"load_weights: the engine's model has no tensor '{name}'")
            if target.shape != tensor.shape:
                raise ValueError(f"load_weights: '{name}' is {tuple(tensor.shape)}, the "
                                 f"engine's is {tuple(target.shape)}")
            if id(target) not in loaded:
                loaded.add(id(target))
                self._load_tensor(target, tensor, mapped)
        self.cache_dtype, self._decode = step_function(self.model)  # fuse the new weights
        self.version = version
        if self.recompute_cache_on_update:
            for row in self.parked.values():  # their saved keys and values are the old weights'
                row.saved = None
            if self.num_running:
                self._rebuild_cache()

    def _load_tensor(self, target: torch.Tensor, tensor: torch.Tensor, mapped: bool) -> None:
        """Map `tensor` (shared, read-only) or copy it into `target`; never write into a
        tensor still mapped from an older packet (other workers may read it)."""
        if mapped and target.device.type == "cpu" and target.dtype == tensor.dtype:
            target.data = tensor
            self._mapped.add(id(target))
        elif id(target) in self._mapped:
            target.data = tensor.to(target.device, target.dtype, copy=True)
            self._mapped.discard(id(target))
        else:
            target.copy_(tensor)

    @torch.no_grad()
    def step(self) -> list[Completion]:
        finished = self._resume_parked()
        finished += self._refill()
        if not self.num_running:
            return finished
        pending = torch.tensor([r.token_ids[-1] if r is not None else self.pad_token_id
                                for r in self.rows], device=self.device)
        logits = self._decode(self.cache, pending, self.positions)
        self.positions = self.positions + 1
        live = self.num_running
        self.stats.decode_steps += 1
        self.stats.active_row_steps += live
        self.stats.slot_steps += self.slots
        finished += self._append(range(len(self.rows)), logits)
        return finished

    def run(self) -> list[Completion]:
        """Step until every queued request has finished (offline use, benchmarks)."""
        done: list[Completion] = []
        while self.has_unfinished():
            done += self.step()
        return done

    # -- sampling and bookkeeping ---------------------------------------------------------
    def _append(self, row_indices, logits: torch.Tensor) -> list[Completion]:
        """Draw one token for each listed row from its logits; retire rows that finish."""
        rows = list(row_indices)
        tokens, logprobs = sample_next(logits, self.sampling.temperature, self.sampling.top_p,
                                       self.generator)
        finished = []
        for i, token, logprob in zip(rows, tokens.tolist(), logprobs.tolist(), strict=True):
            row = self.rows[i]
            if row is None:
                continue
            row.append(token, logprob, self.version)
            self.stats.generated_tokens += 1
            stop = token == self.eos_token_id and not self.sampling.ignore_eos
            if stop or len(row.token_ids) >= row.request.max_new_tokens:
                finished.append(self._finish(row, "stop" if stop else "length"))
                self.rows[i] = None
            elif self.tools is not None:
                call = self.tools.call_in(row.token_ids, row.tool_calls)
                if call is not None:  # parked: the slot is free for the next refill
                    self.tools.start(row.request.request_id, call)
                    row.parked_at = time.monotonic()
                    row.saved = self.cache.row_state(i)
                    self.parked[row.request.request_id] = row
                    self.rows[i] = None
                    self.stats.tool_calls += 1
        return finished

    def _finish(self, row: _Row, reason: str) -> Completion:
        self.stats.request_s += time.monotonic() - row.started
        return row.finish(reason)

    def _resume_parked(self) -> list[Completion]:
        """Rows whose calls came back (`returned_calls`): the result appended, to the front
        of the queue (or finished, when the result reaches the length cap)."""
        if not self.parked:
            return []
        idle = not self.waiting and not any(r is not None for r in self.rows)
        finished = []
        for request_id, result in returned_calls(self.tools, self.parked, busy=not idle):
            row = self.parked.pop(request_id, None)
            if row is None:
                continue  # aborted meanwhile
            self.stats.parked_s += time.monotonic() - row.parked_at
            room = row.request.max_new_tokens - len(row.token_ids)
            row.insert_tool_result(result[:room], self.version)
            if len(row.token_ids) >= row.request.max_new_tokens:
                finished.append(self._finish(row, "length"))
            else:
                self.waiting.appendleft(row)
                self.stats.resumes += 1
        return finished

    def _refill(self) -> list[Completion]:
        """Prefill queued prompts into free slots; compact the batch when nothing waits."""
        free = [i for i, r in enumerate(self.rows) if r is None]
        free += list(range(len(self.rows), self.slots))
        take = min(len(free), len(self.waiting))
        if take == 0:
            if free and self.rows and any(r is None for r in self.rows):
                self._compact()
            return []
        entries = [self.waiting.popleft() for _ in range(take)]
        rows = [e if isinstance(e, _Row) else self._new_row(e) for e in entries]
        # New requests and rows whose cache must be rebuilt: a prefill of their context (a
        # new request's is its prompt); rows back from a tool call with their cache: only
        # the tokens after it (the last drawn one, the result).
        fresh = [row for row in rows if row.saved is None]
        resumed = [row for row in rows if row.saved is not None]
        slots, logits = free[:take], []
        for group, slots_of in ((fresh, slots[:len(fresh)]), (resumed, slots[len(fresh):])):
            if not group:
                continue
            if group is fresh:
                new_cache, new_attention, group_logits = self._prefill(
                    [row.context() for row in group])
            else:
                new_cache, new_attention, group_logits = self._extend(group)
            self._splice(slots_of, new_cache, new_attention)
            for slot, row in zip(slots_of, group, strict=True):
                self.rows[slot] = row
                self.positions[slot] = len(row.context())
                row.saved = None
            logits.append(group_logits)
        self.stats.prefills += take
        finished = self._append(slots, torch.cat(logits))
        if not self.waiting and any(r is None for r in self.rows):
            self._compact()
        return finished

    @staticmethod
    def _new_row(request: GenerationRequest) -> _Row:
        row = _Row(request)
        row.started = time.monotonic()
        return row

    # -- the cache ------------------------------------------------------------------------
    def _prefill(self, sequences: list[list[int]]):
        """One left-padded forward over the distinct `sequences` (a group's G requests
        admitted together share one): every sequence's cache, mask and last logits."""
        first, repeats = shared_prefills(sequences)
        distinct = [sequences[i] for i in first.tolist()]
        ids, attention, positions = left_padded(distinct, self.pad_token_id, self.device)
        logits, cache = cached_forward(self.model, None, input_ids=ids, attention_mask=attention,
                                       position_ids=positions)
        if len(distinct) < len(sequences):
            repeats = repeats.to(self.device)
            cache.batch_select_indices(repeats)  # each repeat's row a copy of its prompt's
            attention, logits = attention[repeats], logits[repeats]
        return cache, attention, logits

    def _extend(self, rows: list[_Row]):
        """One forward of the tokens each row has not fed yet, over its saved keys and
        values: their cache (saved and new columns, padding masked), mask and last logits."""
        pasts = [row.saved for row in rows]
        fed = [keys.shape[2] for keys, _ in pasts]
        new = [row.context()[n:] for row, n in zip(rows, fed, strict=True)]
        past_width, new_width = max(fed), max(len(t) for t in new)
        keys0, _ = pasts[0]
        layers, heads, _, dim = keys0.shape
        dtype = decode_dtype(self.model)
        past_keys = keys0.new_zeros((layers, len(rows), heads, past_width, dim), dtype=dtype)
        past_values = torch.zeros_like(past_keys)
        ids = torch.full((len(rows), new_width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(rows), past_width + new_width), dtype=torch.long)
        positions = torch.zeros((len(rows), new_width), dtype=torch.long)
        for i, ((keys, values), n, tokens) in enumerate(zip(pasts, fed, new, strict=True)):
            past_keys[:, i, :, past_width - n:] = keys.to(dtype)
            past_values[:, i, :, past_width - n:] = values.to(dtype)
            ids[i, new_width - len(tokens):] = torch.tensor(tokens)
            attention[i, past_width - n:past_width] = 1
            attention[i, past_width + new_width - len(tokens):] = 1
            positions[i, new_width - len(tokens):] = torch.arange(n, n + len(tokens))
        past = DynamicCache()
        for layer in range(layers):
            past.update(past_keys[layer], past_values[layer], layer)
        attention = attention.to(self.device)
        logits, cache = cached_forward(self.model, past, input_ids=ids.to(self.device),
                                       attention_mask=attention,
                                       position_ids=positions.to(self.device))
        return cache, attention, logits

    def _splice(self, slots: list[int], new_cache, new_attention: torch.Tensor) -> None:
        """Write prefilled rows into `slots` of the running batch (growing it as needed)."""
        if self.cache is None:  # an empty batch: the free slots are 0..n-1, take it whole
            self.cache = self._new_cache(new_cache, new_attention)
            self.rows = [None] * len(slots)
            self.positions = torch.zeros(len(slots), dtype=torch.long, device=self.device)
            return
        grow = max(slots) + 1 - len(self.rows)
        if grow > 0:
            self.rows += [None] * grow
            self.positions = F.pad(self.positions, (0, grow))
            self.cache.add_rows(grow)
        self.cache.write_rows(torch.tensor(slots, device=self.device), new_cache, new_attention)
        self.cache.trim_left()

    def _new_cache(self, hf_cache, attention: torch.Tensor) -> KVCache:
        # Room for 64 decode steps; the cache doubles its buffer when the window reaches it.
        return KVCache.from_prefill(hf_cache, attention, attention.shape[1] + 64,
                                    self.cache_dtype)

    def _compact(self) -> None:
        """Drop free rows from the batch (nothing waits to take them)."""
        keep = [i for i, r in enumerate(self.rows) if r is not None]
        if not keep:
            self._reset_batch()
            return
        index = torch.tensor(keep, device=self.device)
        self.rows = [self.rows[i] for i in keep]
        self.positions = self.positions[index]
        self.cache.keep_rows(index)
        self.cache.trim_left()

    def _rebuild_cache(self) -> None:
        """Recompute the running rows' keys and values with the current weights."""
        self._compact()
        rows = [r for r in self.rows if r is not None]
        cache, attention, _ = self._prefill([r.fed() for r in rows])
        self.cache = self._new_cache(cache, attention)
        self.positions = torch.tensor([len(r.fed()) for r in rows], device=self.device)

    def _reset_batch(self) -> None:
        self.rows, self.cache, self.positions = [], None, None


def _request_of(entry: GenerationRequest | _Row) -> GenerationRequest:
    return entry.request if isinstance(entry, _Row) else entry



def generate_with_tools(model, prompt_ids: list[list[int]], sampling: EngineSampling,
                        max_new_tokens: int, tools: ToolTurns, *, eos_token_id: int,
                        pad_token_id: int, seed: int, policy_version: int = 0
                        ) -> tuple[list[Completion], EngineStats]:
    """Every prompt's completion, with tool calls, in prompt order: one engine with a slot
    per prompt, so a row waiting on a call never holds up the others (the sync loop's and
    evaluation's generation when tools are on)."""
    engine = ContinuousBatchingEngine(
        model, sampling, slots=len(prompt_ids), eos_token_id=eos_token_id,
        pad_token_id=pad_token_id, seed=seed, version=policy_version, tools=tools)
    for i, prompt in enumerate(prompt_ids):
        engine.add_request(GenerationRequest(i, tuple(prompt), max_new_tokens))
    done = {c.request_id: c for c in engine.run()}
    return [done[i] for i in range(len(prompt_ids))], engine.stats
