"""What the non-finite guard costs per step on a 0.5 B-parameter shape, by mode.

    python benchmarks/guard_cost.py            # Qwen2-0.5B's shape (494 M parameters)
    python benchmarks/guard_cost.py --layers 4 # a quicker, smaller shape

`health.nonfinite_guard: snapshot` copies the weights, buffers and AdamW's two moments before
every step (runtime/health.py `StepUndo.save`) so a non-finite step can be undone; `check`
copies nothing and reads the weights once after the step (`parameters_finite`); `off` does
neither. The step itself is not run here (on this CPU one 0.5 B GRPO step takes tens of
minutes, docs/performance.md): the table gives each mode's own time per step and the memory
the snapshot holds, with the update time measured in docs/performance.md beside it for scale.
The optimiser state is created by one AdamW step on zero gradients, as after a first update.
"""

from __future__ import annotations

import argparse
import resource
import time

import torch
from memory import QWEN2_0_5B  # benchmarks/memory.py: the same 0.5 B shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlscale.runtime.health import StepUndo, parameters_finite

    shape = {**QWEN2_0_5B, "num_hidden_layers": args.layers}
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**shape))
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    undo = StepUndo(model, optimizer)
    undo.save()  # the first save allocates its buffers
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    def best(fn) -> float:
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times)

    snapshot_s = best(undo.save)
    restore_s = best(undo.restore)
    check_s = best(lambda: parameters_finite(model.parameters()))
    snapshot_gib = sum(t.numel() * t.element_size() for t in undo._saved) / 2**30
    print(f"model: Qwen2-0.5B shape with {args.layers} layers, {params / 1e6:.0f} M parameters, "
          f"fp32, AdamW; {args.threads} threads; peak RSS {rss_before:.2f} GiB")
    print("| nonfinite_guard | per step | on a bad step | memory held |")
    print("| --- | ---: | ---: | ---: |")
    print(f"| snapshot | {snapshot_s:.3f} s (copy) + {check_s:.3f} s (test) | "
          f"+{restore_s:.3f} s (restore) | {snapshot_gib:.2f} GiB |")
    print(f"| check | {check_s:.3f} s (test) | stops the run | 0 |")
    print("| off | 0 | - | 0 |")


if __name__ == "__main__":
    main()
