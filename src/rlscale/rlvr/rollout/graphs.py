"""The decode step at static shapes, per batch bucket: on CUDA one graph per bucket,
captured once and replayed at every token step; elsewhere the same step run eagerly.

On a GPU a small model's decode step is bound by kernel launches, not by arithmetic: on an
H200 the 0.5 B Qwen2 shape's step took 13.4 ms for ~2 ms of GPU work (~800 launches,
docs/performance.md). A replayed graph launches all of a step's kernels at once. It needs
shapes and addresses that stay put, which `decoder.static_decode_step` provides over a
`KVCache` that is never reallocated (its capacity is the prompt plus the token budget) and
compacted in place (`KVCache.compact_rows`). The running rows are padded up to a bucket
(a power of two, at most the cache's rows); the rows past the running ones compute garbage
that nobody reads.

torch.cuda graphs directly rather than `torch.compile(mode="reduce-overhead")`: the step has
no Python decision per token for a compiler to guard, and a capture costs a few eager steps
per bucket where inductor compiles the step for minutes (benchmarks/compile_decode.py).
"""

from __future__ import annotations

import torch

from .decoder import DecoderWeights, static_decode_step
from .kv_cache import KVCache

WARMUP_STEPS = 2  # eager runs on a side stream before a capture (lazy library init)


def bucket_of(rows: int, most: int) -> int:
    """The smallest power of two >= `rows`, capped at `most` (the cache's rows)."""
    return min(1 << max(rows - 1, 0).bit_length(), most)


class BucketedDecodeStep:
    """A step (cache, tokens [n], positions [n]) -> next-token logits [n, V] float32, over
    one cache, that runs `static_decode_step` on n's bucket: a CUDA graph replayed on a
    CUDA cache, an eager call elsewhere (the same shapes and arithmetic, which is how the
    tests check the bucketing on a CPU)."""

    def __init__(self, weights: DecoderWeights, cache: KVCache) -> None:
        if cache.start != 0:
            raise ValueError("a static step's cache window must start at column 0")
        device, rows = cache.keys.device, cache.keys.shape[1]
        self.weights, self.cache = weights, cache
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = torch.zeros(rows, dtype=torch.long, device=device)
        self.column = torch.full((1,), cache.end, dtype=torch.long, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.captures = device.type == "cuda"

    def __call__(self, cache: KVCache, tokens: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
        if cache is not self.cache:
            raise ValueError("a static step serves the cache it was built on")
        if cache.end >= cache.capacity:
            raise ValueError(f"the cache is full ({cache.capacity} columns)")
        count = tokens.shape[0]
        bucket = bucket_of(count, self.tokens.shape[0])
        self.tokens[:count].copy_(tokens)
        self.positions[:count].copy_(positions)
        cache.end += 1
        if not self.captures:
            with torch.autocast(cache.keys.device.type, enabled=False):  # weights cast already
                return static_decode_step(*self._arguments(bucket))[:count]
        if bucket not in self.graphs:
            self._capture(bucket)
        self.graphs[bucket].replay()
        return self.logits[bucket][:count]

    def _arguments(self, bucket: int) -> tuple:
        return (self.weights, self.cache, self.tokens[:bucket], self.positions[:bucket],
                self.column)

    def _capture(self, bucket: int) -> None:
        args = self._arguments(bucket)
        column = self.column.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.autocast("cuda", enabled=False):
            for _ in range(WARMUP_STEPS):  # each writes the column the replay writes again
                static_decode_step(*args)
                self.column.copy_(column)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.autocast("cuda", enabled=False):
            self.logits[bucket] = static_decode_step(*args)  # recorded, not run
        self.graphs[bucket] = graph
