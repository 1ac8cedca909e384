"""Every RLVR path on a BPE vocabulary with a chat template (issue 50, item 4), part two: the
asynchronous fleets (the native engine; vLLM where it is installed), GRPO with LoRA, and a
run killed mid-checkpoint that resumes exactly. Part one: tests/test_bpe_paths.py."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bpe_model import QUIET, TASK, build_bpe_model
from bpe_model import rl_config as bpe_rl_config
from processes import alive, descendants
from rlscale.config import build_config
from rlscale.rlvr.config import RLVRConfig, SFTConfig
from rlscale.rlvr.distill import sft
from rlscale.rlvr.loop import RLVRRun, train
from rlscale.rlvr.model import PromptFormatter, load_model
from rlscale.rlvr.tasks import Example
from rlscale.runtime.metrics import read_metrics

# Keys whose values depend on the clock or the machine, not on the run's math.
UNTIMED = ("time/", "throughput/", "memory/")


@pytest.fixture(scope="module")
def taught_dir(tmp_path_factory) -> Path:
    """A BPE model after 150 SFT steps (~4 s): it answers through its template, some answers
    right, and ends its turn with <|im_end|>, so rewards differ within a group."""
    root = tmp_path_factory.mktemp("bpe")
    return sft(build_config(SFTConfig, {
        "model": {"path": str(build_bpe_model(root / "base")), "chat_template": True},
        "out": str(root / "sft" / "model"), "run_dir": str(root / "sft"), "task": TASK,
        "data": {"examples": 2000}, "steps": 150, "batch_size": 32, "lr": 1e-2,
        "warmup_steps": 10, **QUIET}))


def rl_config(model_dir: Path, run_dir: Path, **sections):
    """bpe_model's config with 3 steps on one thread (the fleet and resume runs)."""
    train = {"steps": 3, "threads": 1, **sections.pop("train", {})}
    return bpe_rl_config(model_dir, run_dir, train=train, **sections)


def chat_ids(tokenizer) -> torch.Tensor:
    prompt = PromptFormatter(tokenizer, True)(Example("What is 3 + 4?", 7))
    return torch.tensor([tokenizer(prompt + "3 + 4 = 7", add_special_tokens=False)["input_ids"]])


# -- the asynchronous fleets ---------------------------------------------------------------------
@contextlib.contextmanager
def watched_processes():
    """Every process below this one while the block runs (Ray's among them), and none of
    those started in the block still alive a while after it."""
    earlier, seen, stop = descendants(os.getpid()), set(), threading.Event()

    def watch():
        while not stop.wait(0.2):
            seen.update(descendants(os.getpid()))

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(timeout=5)
    deadline = time.time() + 10  # Ray's processes exit asynchronously after shutdown
    while time.time() < deadline and any(alive(p) for p in seen - earlier):
        time.sleep(0.2)
    left = [p for p in seen - earlier if alive(p)]
    assert not left, f"processes left behind: {left}"


NO_VLLM = "vLLM is not installed here (it lives in a venv of its own: make install-vllm)"


@pytest.mark.parametrize("engine", ["native", pytest.param("vllm", marks=pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason=NO_VLLM))])
def test_an_async_fleet_trains_a_bpe_chat_model(taught_dir, tmp_path, engine, monkeypatch):
    """runtime.mode async: the inference worker (a Ray actor) continues chat-template prompts
    and stops at <|im_end|>; the trainer trains on what it sends; Ray's processes and the
    worker's are gone after the run."""
    pytest.importorskip("ray", reason="the fleet tests need Ray (pip install 'rlscale[ray]')")
    from rlscale.rlvr.fleet import FleetRollouts

    batches, real = [], FleetRollouts.next_batch

    def next_batch(self, *args):  # the batches the trainer took, kept to look at
        group, stats = real(self, *args)
        batches.append(group.rollout)
        return group, stats

    monkeypatch.setattr(FleetRollouts, "next_batch", next_batch)
    run_dir = tmp_path / "run"
    cfg = rl_config(taught_dir, run_dir, rollout={"engine": engine, "slots": 8,
                                                   "vllm_enforce_eager": True},
                    runtime={"mode": "async", "inference_workers": 1, "max_staleness": 1})
    with watched_processes() as seen:
        final = train(cfg)
    assert seen, "the fleet started no process"
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert row["staleness/lag_max"] <= 1 and row["fleet/ledger_trained"] == row["step"] * 4
    assert sum(r["reward/mean"] for r in rows) > 0  # the taught model answers some right
    tokenizer = load_model(final)[1]
    turn = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert len(batches) == 3
    for r in batches:
        assert all(list(prompt[-len(turn):]) == turn for prompt in r.prompt_ids)
        stopped = [i for i, why in enumerate(r.finish_reasons) if why == "stop"]
        assert len(stopped) > len(r.finish_reasons) / 2  # at <|im_end|>, its last token
        assert all(r.completion_ids[i, r.lengths[i] - 1] == tokenizer.eos_token_id
                   for i in stopped)
    assert tokenizer.chat_template == load_model(taught_dir)[1].chat_template


# -- LoRA ----------------------------------------------------------------------------------------
def test_grpo_with_lora_trains_only_the_adapters_and_merges(taught_dir, tmp_path):
    pytest.importorskip("peft")
    from peft import PeftModel

    run_dir = tmp_path / "run"
    run = RLVRRun(rl_config(taught_dir, run_dir, model={"lora": {"r": 4}},
                            loss={"kl_coef": 0.05}, train={"steps": 2, "lr": 1e-2},
                            checkpoint={"every": 2}))
    frozen = {n: p.detach().clone() for n, p in run.model.named_parameters()
              if not p.requires_grad}
    trainable = [n for n, p in run.model.named_parameters() if p.requires_grad]
    assert frozen and trainable and all("lora_" in n for n in trainable)
    final = run.train()
    after = dict(run.model.named_parameters())
    assert all(torch.equal(after[n], p) for n, p in frozen.items())
    assert any(after[n].abs().max() > 0 for n in trainable if "lora_B" in n)
    # checkpoints hold the adapters alone; the final model is merged, with the tokenizer
    checkpoint = run_dir / "checkpoints" / "step_000002"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert not (checkpoint / "model.safetensors").exists()
    assert not (final / "adapter_config.json").exists()
    merged, tokenizer = load_model(final)
    base, base_tokenizer = load_model(taught_dir)
    assert tokenizer.get_vocab() == base_tokenizer.get_vocab()
    assert tokenizer.chat_template == base_tokenizer.chat_template
    adapted = PeftModel.from_pretrained(load_model(taught_dir)[0], checkpoint).eval()
    ids = chat_ids(tokenizer)
    with torch.no_grad():
        logits = [m.eval()(input_ids=ids).logits for m in (merged, adapted, base)]
    assert torch.allclose(logits[0], logits[1], atol=1e-5)
    assert (logits[0] - logits[2]).abs().max() > 1e-3  # it trained


# -- kill and resume -----------------------------------------------------------------------------
def test_a_run_killed_mid_checkpoint_resumes_exactly(taught_dir, tmp_path):
    """SIGKILL inside the step-4 checkpoint's write (RLSCALE_FAULT): the resumed run goes on
    from step 2 and ends with the metrics and the weights of a run never killed."""
    def config(name: str) -> RLVRConfig:
        return rl_config(taught_dir, tmp_path / name, train={"steps": 6, "seed": 3},
                         loss={"kl_coef": 0.01}, checkpoint={"every": 2, "keep": 3},
                         eval={"every": 3, "prompts": 8})

    train(config("unbroken"))
    path = tmp_path / "killed.yaml"
    path.write_text(json.dumps(config("killed").model_dump(mode="json")))  # JSON is YAML
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RLSCALE_FAULT": "checkpoint-write@2"}
    killed = subprocess.run([sys.executable, "-m", "rlscale.cli", "rlvr", "train", str(path)],
                            env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert len(read_metrics(tmp_path / "killed")) == 4
    assert list((tmp_path / "killed" / "checkpoints").glob(".tmp-*")), "no torn checkpoint"
    train(config("killed"), resume=True)
    assert not list((tmp_path / "killed").glob("**/.tmp-*"))
    ours, theirs = read_metrics(tmp_path / "killed"), read_metrics(tmp_path / "unbroken")
    assert [r["step"] for r in ours] == list(range(1, 7))
    assert ["eval/pass@1" in r for r in ours] == [False, False, True] * 2
    for a, b in zip(ours, theirs, strict=True):
        assert set(a) == set(b), a["step"]
        for key in b:
            if not key.startswith(UNTIMED):
                assert a[key] == b[key], (a["step"], key)
    assert all(math.isfinite(r["loss/loss"]) for r in ours)
    mine, reference = (load_file(tmp_path / name / "final" / "model.safetensors")
                       for name in ("killed", "unbroken"))
    assert all(torch.equal(mine[k], reference[k]) for k in reference)
