"""How a micro-batch of (prompt, completion) sequences sits in the model's input.

The trainer needs log-probs of completion tokens only. A collected batch is stored as
left-padded prompts followed by right-padded completions (`PolicyBatch`), which is the
simplest record but wastes compute on padding: a micro-batch holding short sequences still
pays for the whole batch's longest prompt and completion. Two layouts of the same tokens:

- `padded_layout`: one sequence per row, cut to the micro-batch's own longest prompt and
  completion (the columns every row pads are dropped).
- `packed_layout`: several sequences per row (first-fit decreasing into rows as wide as the
  longest sequence, so attention costs what the padded layout's does), positions restarting
  at 0 for each; no attention mask, from which transformers builds a block-diagonal mask
  (`masking_utils.find_packed_sequence_indices`), so no token sees another sequence's.

Both give, for every active completion token `(i, j)` of the `[B, T]` completion grid, the
`(row, column)` of the logit that predicts it, so the model's output layer runs on those
positions alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Layout:
    input_ids: torch.Tensor              # [R, W]
    position_ids: torch.Tensor           # [R, W]
    attention_mask: torch.Tensor | None  # [R, W]; None: packed (positions mark sequences)
    token_index: tuple[torch.Tensor, torch.Tensor]  # active completion tokens (i, j) of [B, T]
    logit_index: tuple[torch.Tensor, torch.Tensor]  # (row, column) of the logit predicting each

    @property
    def tokens(self) -> int:
        return self.input_ids.numel()


def sequence_lengths(attention_mask: torch.Tensor, prompt_width: int,
                     completion_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """([B] prompt lengths, [B] completion lengths) of a left/right-padded batch."""
    return (attention_mask[:, :prompt_width].sum(1).long(),
            (completion_mask > 0).sum(1).long())


def padded_layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int,
                  completion_mask: torch.Tensor) -> Layout:
    """One sequence per row, without the columns that every row of this micro-batch pads."""
    prompt_len, completion_len = sequence_lengths(attention_mask, prompt_width, completion_mask)
    p, t = int(prompt_len.max()), max(int(completion_len.max()), 1)
    cols = slice(prompt_width - p, prompt_width + t)
    ids, attention = input_ids[:, cols], attention_mask[:, cols]
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    i, j = (completion_mask[:, :t] > 0).nonzero(as_tuple=True)
    return Layout(ids, positions, attention, (i, j), (i, p - 1 + j))


def first_fit_decreasing(lengths: list[int], width: int) -> list[list[int]]:
    """Bins (lists of indices) of total length <= `width`, longest items placed first."""
    rows: list[list[int]] = []
    free: list[int] = []
    for k in sorted(range(len(lengths)), key=lambda k: -lengths[k]):
        for r, room in enumerate(free):
            if lengths[k] <= room:
                rows[r].append(k)
                free[r] -= lengths[k]
                break
        else:
            rows.append([k])
            free.append(width - lengths[k])
    return rows


def packed_layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_width: int,
                  completion_mask: torch.Tensor, pad_token_id: int,
                  width: int | None = None) -> Layout:
    """Sequences packed into rows of `width` tokens (default: the longest sequence)."""
    prompt_len, completion_len = sequence_lengths(attention_mask, prompt_width, completion_mask)
    lengths = (prompt_len + completion_len).tolist()
    width = max(width or 0, max(lengths))
    rows = first_fit_decreasing(lengths, width)
    ids = torch.full((len(rows), width), pad_token_id, dtype=input_ids.dtype,
                     device=input_ids.device)
    positions = torch.zeros((len(rows), width), dtype=torch.long, device=input_ids.device)
    token_i, token_j, logit_r, logit_c = [], [], [], []
    for r, members in enumerate(rows):
        offset = 0
        for k in members:
            p, c = int(prompt_len[k]), int(completion_len[k])
            ids[r, offset: offset + p + c] = input_ids[k, prompt_width - p: prompt_width + c]
            positions[r, offset: offset + p + c] = torch.arange(p + c)
            token_i += [k] * c
            token_j += range(c)
            logit_r += [r] * c
            logit_c += range(offset + p - 1, offset + p - 1 + c)
            offset += p + c
        # The row's tail (padding) is a segment of its own: positions restart at 0.
        positions[r, offset:] = torch.arange(width - offset)

    def index(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=input_ids.device)

    return Layout(ids, positions, None, (index(token_i), index(token_j)),
                  (index(logit_r), index(logit_c)))
