"""A learner process's place in its group: which rows of a minibatch it computes, and the
few collectives that make N processes compute what one computes.

The math never changes with the number of processes: every aggregation of the loss
divides by the *whole* minibatch's counts (batch.MicroBatch carries them), each rank
differentiates its own rows' share of that one loss, and FSDP2 sums the gradients over the
ranks (rlvr/sharding.py). What a rank must agree on with the others: the same number of
forwards (each forward of a sharded model is a collective: a rank with fewer rows runs
padding forwards that count for nothing) and, for whole-batch quantities (pi_old, the
reference, token entropies for the top-entropy mask), every rank's rows put together.

`RankGroup()` is the single process: every operation is the identity, with no collective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class RankGroup:
    """This process's rank among `size` learner processes (`group`: their torch.distributed
    process group; None: the default one)."""

    rank: int = 0
    size: int = 1
    group: Any = None

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def share(self, index: torch.Tensor, lengths: torch.Tensor) -> tuple[int, int]:
        """`[start, end)`: this rank's contiguous share of the rows `index` (in order),
        balanced by prompt + completion tokens; a rank may get no rows."""
        if not self.distributed:
            return 0, len(index)
        sizes = lengths[index].double()
        before = sizes.cumsum(0) - sizes  # tokens ahead of each row
        total = float(sizes.sum())
        bounds = [0] + [int((before < total * r / self.size).sum())
                        for r in range(1, self.size)] + [len(index)]
        return bounds[self.rank], bounds[self.rank + 1]

    def padded(self, chunks: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """`chunks` followed by None up to the most any rank has: every rank runs the same
        number of forwards (a None is a padding forward)."""
        if not self.distributed:
            return list(chunks)
        most = torch.tensor([len(chunks)])
        torch.distributed.all_reduce(most, torch.distributed.ReduceOp.MAX, group=self.group)
        return list(chunks) + [None] * (int(most) - len(chunks))

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` summed over the ranks, in place."""
        if self.distributed:
            torch.distributed.all_reduce(tensor, group=self.group)
        return tensor

    def gather_rows(self, values: torch.Tensor, rows: torch.Tensor,
                    shape: tuple[int, ...]) -> torch.Tensor:
        """A `shape` tensor whose `rows` hold `values`, with every rank's rows filled in
        (each row is computed by exactly one rank, so a sum of zero-padded copies puts them
        together exactly)."""
        out = torch.zeros(shape, dtype=values.dtype, device=values.device)
        out[rows] = values
        return self.sum(out)

    def gather_objects(self, item: Any) -> list[Any]:
        """Every rank's `item`, in rank order."""
        if not self.distributed:
            return [item]
        items: list[Any] = [None] * self.size
        torch.distributed.all_gather_object(items, item, group=self.group)
        return items
