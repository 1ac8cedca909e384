"""The shared AdamW: fused where torch has the kernel, the same update as the loop."""

import torch

from rlscale.runtime.optim import adamw, fused_supported


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in ((64, 32), (32,), (7,))]


def test_cpu_parameters_get_the_fused_kernel():
    optimizer = adamw(_params(), lr=1e-3, weight_decay=0.1)
    assert optimizer.param_groups[0]["fused"] is True


def test_the_fused_step_matches_the_loop_to_float_rounding():
    fused, looped = _params(), _params()
    opt_fused = adamw(fused, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99))
    opt_loop = torch.optim.AdamW(looped, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.99),
                                 foreach=False)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        grads = [torch.randn(p.shape, generator=g) for p in fused]
        for a, b, grad in zip(fused, looped, grads, strict=True):
            a.grad, b.grad = grad.clone(), grad.clone()
        opt_fused.step()
        opt_loop.step()
    moved = max((a - p).abs().max().item() for a, p in zip(fused, _params(), strict=True))
    assert moved > 1e-3  # the steps did move the weights
    for a, b in zip(fused, looped, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_integer_parameters_fall_back_and_mixed_float_dtypes_stay_fused():
    assert not fused_supported([torch.zeros(3, dtype=torch.long)])
    assert fused_supported([torch.zeros(3), torch.zeros(2, dtype=torch.bfloat16)])
