"""A preallocated key/value cache whose live part is a window of columns.

Keys and values of every layer live in one buffer `[layers, rows, kv_heads, capacity,
head_dim]`; the columns in use are `[start, end)`. Every row is right-aligned: its newest
token sits at column `end - 1` and its padding (masked by the additive `bias`, -inf where a
row does not attend) on the left. A decode step writes column `end` for all rows at once, so
appending costs one column write instead of the concatenation a growing cache pays per layer
per token; trimming padding that no row attends any more moves `start`; a longer prompt moves
it left. The buffer is reallocated (doubled) only when the window reaches an edge.

The static sampler uses it with `start = 0` (one batch, no refills); the continuous-batching
engine uses the whole window: refilled rows are spliced in, finished rows compacted out.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, *, layers: int, rows: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (layers, rows, kv_heads, max(capacity, 1), head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.bias = torch.full((rows, 1, 1, shape[3]), float("-inf"), dtype=dtype,
                               device=device)
        self.start = self.end = 0

    @classmethod
    def from_prefill(cls, hf_cache, attention: torch.Tensor, capacity: int,
                     dtype: torch.dtype | None = None) -> KVCache:
        """A cache holding a prefill's `DynamicCache` ([B, Hk, P, d] per layer) and its
        padding mask `attention` [B, P], with room for `capacity` columns in all."""
        first = hf_cache.layers[0].keys
        cache = cls(layers=len(hf_cache.layers), rows=first.shape[0], kv_heads=first.shape[1],
                    head_dim=first.shape[3], capacity=max(capacity, attention.shape[1]),
                    dtype=dtype or first.dtype, device=first.device)
        cache.write_rows(torch.arange(first.shape[0], device=first.device), hf_cache, attention)
        return cache

    # -- shape -----------------------------------------------------------------------------
    @property
    def width(self) -> int:
        return self.end - self.start

    @property
    def capacity(self) -> int:
        return self.keys.shape[3]

    def attention_mask(self) -> torch.Tensor:
        """[rows, width] long: 1 where a row attends (the model forward's mask)."""
        return (self.bias[:, 0, 0, self.start:self.end] == 0).long()

    def layer_window(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.keys[layer, :, :, self.start:self.end],
                self.values[layer, :, :, self.start:self.end])

    # -- columns ---------------------------------------------------------------------------
    def reserve_right(self, columns: int) -> None:
        """Make room for `columns` more columns after `end`."""
        if self.end + columns > self.capacity:
            self._reallocate(left=0, right=columns)

    def append_column(self) -> int:
        """Open column `end` for every row (attended from now on); returns its index. The
        caller writes the keys and values of that column."""
        self.reserve_right(1)
        column = self.end
        self.bias[:, 0, 0, column] = 0.0
        self.end += 1
        return column

    def pad_left(self, columns: int) -> None:
        """Widen the window by `columns` masked columns on the left."""
        if columns > self.start:
            self._reallocate(left=columns, right=0)
        self.start -= columns
        self.bias[:, 0, 0, self.start:self.start + columns] = float("-inf")

    def trim_left(self) -> None:
        """Drop the left columns that no row attends any more."""
        used = self.attention_mask().any(0).nonzero()
        self.start += int(used[0]) if len(used) else self.width

    def _reallocate(self, left: int, right: int) -> None:
        """A new buffer with at least `left` free columns before the window and `right`
        after it (twice the width for later growth), the window copied in."""
        width = self.width
        capacity = 2 * (width + left + right) + 16
        start = left + (capacity - width - left - right) // 2
        layers, rows, heads, _, dim = self.keys.shape
        keys = self.keys.new_zeros((layers, rows, heads, capacity, dim))
        values = torch.zeros_like(keys)
        bias = self.bias.new_full((rows, 1, 1, capacity), float("-inf"))
        keys[:, :, :, start:start + width] = self.keys[:, :, :, self.start:self.end]
        values[:, :, :, start:start + width] = self.values[:, :, :, self.start:self.end]
        bias[..., start:start + width] = self.bias[..., self.start:self.end]
        self.keys, self.values, self.bias = keys, values, bias
        self.start, self.end = start, start + width

    # -- rows ------------------------------------------------------------------------------
    def row_state(self, row: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the keys and values `row` attends to, in order: [layers, kv_heads, n,
        head_dim] each (a parked request's, to resume from)."""
        used = (self.bias[row, 0, 0, self.start:self.end] == 0).nonzero().squeeze(-1)
        columns = used + self.start
        return (self.keys[:, row][:, :, columns].clone(),
                self.values[:, row][:, :, columns].clone())

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only `rows`, in that order (finished rows leave the batch)."""
        self.keys, self.values = self.keys[:, rows], self.values[:, rows]
        self.bias = self.bias[rows]

    def compact_rows(self, rows: torch.Tensor) -> None:
        """Move `rows` to the front, in that order, in place: the buffers keep their size
        and addresses (a captured CUDA graph reads them); the rows after attend nothing."""
        count = rows.shape[0]
        self.keys[:, :count] = self.keys[:, rows]
        self.values[:, :count] = self.values[:, rows]
        self.bias[:count] = self.bias[rows]
        self.bias[count:] = float("-inf")

    def add_rows(self, count: int) -> None:
        """`count` more rows at the end, attending nothing."""
        layers, _, heads, capacity, dim = self.keys.shape
        extra = self.keys.new_zeros((layers, count, heads, capacity, dim))
        self.keys = torch.cat([self.keys, extra], 1)
        self.values = torch.cat([self.values, torch.zeros_like(extra)], 1)
        self.bias = torch.cat([self.bias, self.bias.new_full((count, 1, 1, capacity),
                                                             float("-inf"))], 0)

    def write_rows(self, rows: torch.Tensor, hf_cache, attention: torch.Tensor) -> None:
        """Put a prefill of len(rows) sequences (its `DynamicCache` and mask [n, P]) into
        `rows`, right-aligned at `end`; the window widens to P if it is narrower."""
        new_width = attention.shape[1]
        if new_width > self.width:
            if self.end == self.start == 0:
                self.reserve_right(new_width)
                self.end = new_width
            else:
                self.pad_left(new_width - self.width)
        first = self.end - new_width
        self.bias[rows, 0, 0, self.start:self.end] = float("-inf")
        self.bias[rows, 0, 0, first:self.end] = torch.where(
            attention.bool(), 0.0, float("-inf")).to(self.bias.dtype)
        for i, layer in enumerate(hf_cache.layers):
            self.keys[i, rows, :, self.start:self.end] = 0
            self.values[i, rows, :, self.start:self.end] = 0
            self.keys[i, rows, :, first:self.end] = layer.keys.to(self.keys.dtype)
            self.values[i, rows, :, first:self.end] = layer.values.to(self.values.dtype)
