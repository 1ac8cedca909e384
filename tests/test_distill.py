"""`rlscale sft` through the shared per-token loss: `loss: sft` is the Hugging Face `labels`
loss, `loss: dft` weighs each token by its detached probability."""

import json

import pytest
import torch

from rlscale.config import ConfigError, load_config
from rlscale.rlvr import imitation
from rlscale.rlvr.config import SFTConfig
from rlscale.rlvr.distill import (
    build_demonstrations,
    collate,
    demonstration_weight,
    sft,
    target_logprobs,
)
from rlscale.rlvr.model import build_tiny_model

torch.set_num_threads(1)


def test_sft_loss_equals_the_hugging_face_labels_loss():
    cfg = load_config(SFTConfig, None, ["init_preset=tiny", "data.examples=32",
                                        "data.wrong_share=0.4"])
    model, tokenizer = build_tiny_model("tiny", seed=0)
    ids, attention, labels = collate(build_demonstrations(cfg, tokenizer), tokenizer.pad_token_id)
    params = list(model.parameters())
    reference = model(input_ids=ids, attention_mask=attention, labels=labels).loss
    reference_grads = torch.autograd.grad(reference, params)
    logp, mask = target_logprobs(model, ids, attention, labels)
    assert int(mask.sum()) == int((labels != -100).sum())
    loss, metrics = imitation.demonstration_loss(logp, mask, weight=demonstration_weight(cfg))
    grads = torch.autograd.grad(loss, params)
    assert abs(loss.item() - reference.item()) < 1e-6
    assert metrics["nll"] == pytest.approx(reference.item(), abs=1e-6)
    for ours, theirs in zip(grads, reference_grads, strict=True):
        assert torch.allclose(ours, theirs, atol=1e-7, rtol=1e-5)


def test_loss_keys_choose_the_weight():
    assert demonstration_weight(load_config(SFTConfig, None, ["init_preset=tiny"])) == "one"
    dft = load_config(SFTConfig, None, ["init_preset=tiny", "loss=dft"])
    assert demonstration_weight(dft) == "token"
    sequence = load_config(SFTConfig, None, ["init_preset=tiny", "loss=dft",
                                             "dft_weight=sequence"])
    assert demonstration_weight(sequence) == "sequence"
    with pytest.raises(ConfigError, match="'loss'"):
        load_config(SFTConfig, None, ["init_preset=tiny", "loss=rl"])


def test_dft_run_logs_its_weight_and_the_nll(tmp_path):
    cfg = load_config(SFTConfig, None, [
        "init_preset=tiny", f"out={tmp_path / 'run' / 'model'}", f"run_dir={tmp_path / 'run'}",
        "loss=dft", "data.examples=64", "steps=3", "batch_size=16", "warmup_steps=0",
        "progress=false", "tensorboard=false"])
    sft(cfg)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for row in rows:
        assert 0 < row["sft/weight_mean"] < 1
        assert row["sft/loss"] < row["sft/nll"]  # each token's -log p scaled by its p < 1
    assert "loss: dft" in (tmp_path / "run" / "config.yaml").read_text()


def test_save_every_keeps_the_model_along_the_way(tmp_path):
    cfg = load_config(SFTConfig, None, [
        "init_preset=tiny", f"out={tmp_path / 'run' / 'model'}", f"run_dir={tmp_path / 'run'}",
        "data.examples=32", "steps=4", "batch_size=8", "warmup_steps=0", "save_every=2",
        "progress=false", "tensorboard=false"])
    out = sft(cfg)
    saved = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert saved == ["step_000002"]  # step 4 is the final model, `out`
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "config.json").is_file()
    assert (out / "config.json").is_file()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["sft/target_tokens"] > 0 and r["sft/prompt_tokens"] > 0 for r in rows)


def test_packed_demonstrations_give_the_padded_loss_and_gradients():
    """sft pack=true: the same token log-probs (so loss and gradients) as the padded forward."""
    import random

    import torch

    from rlscale.rlvr import imitation
    from rlscale.rlvr.distill import collate, packed_target_logprobs, target_logprobs
    from rlscale.rlvr.model import build_tiny_model

    model, _ = build_tiny_model("tiny", seed=0)
    rng = random.Random(0)
    pairs = [([rng.randrange(4, 90) for _ in range(rng.randint(3, 12))],
              [rng.randrange(4, 90) for _ in range(rng.randint(1, 60))]) for _ in range(16)]
    grads = []
    for packed in (True, False):
        model.zero_grad()
        if packed:
            logp, mask = packed_target_logprobs(model, pairs, 0, torch.device("cpu"))
        else:
            logp, mask = target_logprobs(model, *collate(pairs, 0))
        loss, _ = imitation.demonstration_loss(logp, mask, weight="one")
        loss.backward()
        grads.append((float(loss), int(mask.sum()),
                      torch.cat([p.grad.flatten() for p in model.parameters()])))
    (packed_loss, packed_n, packed_grad), (padded_loss, padded_n, padded_grad) = grads
    assert packed_n == padded_n == sum(len(c) for _, c in pairs)
    assert abs(packed_loss - padded_loss) < 1e-5
    assert torch.allclose(packed_grad, padded_grad, atol=1e-5, rtol=1e-4)


def test_a_stopped_sft_resumes_exactly(tmp_path, monkeypatch):
    """`rlscale sft --resume` (issue 56): a run stopped at step 7 continues from its step-4
    checkpoint and ends with the losses and weights of a run never stopped."""
    from safetensors.torch import load_file

    from rlscale.rlvr import distill

    def config(name: str, *extra: str) -> SFTConfig:
        return load_config(SFTConfig, None, [
            "init_preset=tiny", f"out={tmp_path / name / 'model'}", f"run_dir={tmp_path / name}",
            "data.examples=64", "steps=10", "batch_size=8", "warmup_steps=2",
            "checkpoint.every=4", "progress=false", "tensorboard=false", *extra])

    def losses(name: str) -> list[float]:
        rows = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [json.loads(row)["sft/loss"] for row in rows]

    sft(config("unbroken"))
    real, calls = imitation.demonstration_loss, [0]

    def stop_at_step_7(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 7:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(distill.imitation, "demonstration_loss", stop_at_step_7)
    with pytest.raises(KeyboardInterrupt):
        sft(config("stopped"))
    monkeypatch.setattr(distill.imitation, "demonstration_loss", real)
    assert [p.name for p in (tmp_path / "stopped" / "checkpoints").iterdir()] == ["step_000004"]
    with pytest.raises(ValueError, match="lr"):
        sft(config("stopped", "lr=0.1"), resume=True)  # the math changed: refused
    sft(config("stopped"), resume=True)
    assert losses("stopped") == losses("unbroken") and len(losses("stopped")) == 10
    ours = load_file(tmp_path / "stopped" / "model" / "model.safetensors")
    theirs = load_file(tmp_path / "unbroken" / "model" / "model.safetensors")
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert "nothing to do" in _finished_message(config("stopped"))


def _finished_message(cfg: SFTConfig) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        sft(cfg, resume=True)
    return out.getvalue()
