"""`compute_dtype: auto` decides by measuring: the run's own model in both precisions (a
matmul probe for a model too big to time in a moment), cached per machine, torch version,
threads and model shape, for both loops (the timings stubbed: tests check the decision)."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from rlscale.runtime import cpu_load
from rlscale.runtime import device as dev


def load_while_timing(monkeypatch, tmp_path, runnable: int, cores: int = 2) -> None:
    """The probe's crowd watch reads a /proc/loadavg that says `runnable` tasks want the
    `cores` cores."""
    loadavg = tmp_path / f"loadavg{runnable}"
    loadavg.write_text(f"0.50 0.40 0.30 {runnable}/250 4242\n")
    monkeypatch.setattr(dev, "CrowdWatch", functools.partial(
        cpu_load.CrowdWatch, cores=cores, path=loadavg))


@pytest.fixture
def probe_cache(tmp_path, monkeypatch):
    """The probe's cache in tmp_path, on a CPU taken to have bf16 instructions and timed on
    quiet cores (so the stubbed timings decide, whatever this machine has and runs)."""
    monkeypatch.setenv("RLSCALE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(dev, "cpu_has_bf16_instructions", lambda: True)
    load_while_timing(monkeypatch, tmp_path, runnable=1)
    return tmp_path / "cache" / "precision_probe.json"


def stub_rates(monkeypatch, fp32: float, bf16: float) -> list[torch.dtype]:
    calls: list[torch.dtype] = []

    def fake(dtype, device, *args, **kwargs):
        calls.append(dtype)
        return {torch.float32: fp32, torch.bfloat16: bf16}[dtype]

    monkeypatch.setattr(dev, "measure_matmul_gflops", fake)
    return calls


def stub_workload_rates(monkeypatch, fp32: float, bf16: float) -> list[str]:
    """Stands in for timing a workload; records the keys of the workloads it was asked for."""
    keys: list[str] = []

    def fake(workload, device, *args, **kwargs):
        keys.append(workload.key)
        return fp32, bf16

    monkeypatch.setattr(dev, "measure_workload_rates", fake)
    return keys


@pytest.mark.parametrize(("fp32", "bf16", "chosen"), [
    (171.0, 765.0, "bfloat16"),   # the AMD EPYC of MACHINE_NOTES: bf16 ~4x faster
    (200.0, 81.0, "float32"),     # the Intel Xeon with avx512_bf16, no AMX: ~2x slower
    (50.0, 0.3, "float32"),       # AVX2 only: bf16 emulated
    (100.0, 105.0, "float32"),    # a near tie goes to fp32 (autocast's casts cost extra)
])
def test_auto_follows_the_probe_not_the_flags(probe_cache, monkeypatch, fp32, bf16, chosen):
    stub_rates(monkeypatch, fp32, bf16)
    resolved = dev.resolve_compute_dtype("auto", torch.device("cpu"))
    assert resolved.name == chosen
    m = resolved.metrics()
    assert m["precision/float32_rate"] == fp32 and m["precision/bfloat16_rate"] == bf16
    assert m["precision/probed_workload"] == 0.0
    assert m["precision/bfloat16"] == float(chosen == "bfloat16")
    assert chosen in resolved.describe()


def test_a_cpu_without_bf16_instructions_is_float32_unprobed(probe_cache, monkeypatch):
    calls = stub_rates(monkeypatch, 50.0, 70.0)  # a crowded timing that would say bf16
    monkeypatch.setattr(dev, "cpu_has_bf16_instructions", lambda: False)
    resolved = dev.resolve_compute_dtype("auto", torch.device("cpu"))
    assert resolved.name == "float32" and resolved.probe is None and calls == []
    assert "no bf16 instructions" in resolved.describe()
    monkeypatch.setattr(dev, "cpu_has_bf16_instructions", lambda: None)  # unknown: probed
    assert dev.resolve_compute_dtype("auto", torch.device("cpu")).name == "bfloat16"


@pytest.mark.parametrize(("cpuinfo", "native"), [
    ("model name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma f16c\n", False),
    ("flags\t\t: avx2 avx512f avx512_bf16 avx512_vnni\n", True),
    ("flags\t\t: avx2 avx512f amx_bf16 amx_tile\n", True),
    ("Features\t: fp asimd bf16 i8mm\n", True),
    ("Features\t: fp asimd\n", False),
    ("processor\t: 0\n", None),
])
def test_bf16_instructions_are_read_from_the_cpu_flags(cpuinfo, native):
    assert dev.bf16_instructions_in(cpuinfo) is native


def test_a_named_dtype_is_not_probed(probe_cache, monkeypatch):
    calls = stub_rates(monkeypatch, 100.0, 400.0)
    for name in ("float32", "bfloat16"):
        resolved = dev.resolve_compute_dtype(name, torch.device("cpu"))
        assert resolved.name == name and resolved.probe is None
    assert calls == []


def test_the_probe_is_cached_per_machine_torch_version_and_threads(probe_cache, monkeypatch):
    calls = stub_rates(monkeypatch, 100.0, 400.0)
    first = dev.precision_probe(torch.device("cpu"))
    assert not first.cached and len(calls) == 2
    again = dev.precision_probe(torch.device("cpu"))
    assert again.cached and again.choice == first.choice and len(calls) == 2
    entry = next(iter(json.loads(probe_cache.read_text()).values()))
    assert entry["float32_rate"] == 100.0
    # Another torch build measures again (its kernels may differ).
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    dev.precision_probe(torch.device("cpu"))
    assert len(calls) == 4
    assert len(json.loads(probe_cache.read_text())) == 2


def test_a_probe_timed_on_crowded_cores_chooses_float32_and_is_not_kept(
        probe_cache, monkeypatch, tmp_path):
    """bf16 measured 4x faster, but 4 tasks wanted the 2 cores (5 running, one of them the
    sampler): float32, said why, not cached; on quiet cores the next run measures again."""
    calls = stub_rates(monkeypatch, 100.0, 400.0)
    load_while_timing(monkeypatch, tmp_path, runnable=5)
    resolved = dev.resolve_compute_dtype("auto", torch.device("cpu"))
    assert resolved.name == "float32" and resolved.probe.crowded
    assert resolved.metrics()["precision/probe_crowded"] == 1.0
    assert "crowded" in resolved.describe() and "not cached" in resolved.describe()
    assert not probe_cache.exists()
    load_while_timing(monkeypatch, tmp_path, runnable=3)  # our 2 threads and the sampler
    again = dev.resolve_compute_dtype("auto", torch.device("cpu"))
    assert again.name == "bfloat16" and not again.probe.crowded and len(calls) == 4
    assert dev.precision_probe(torch.device("cpu")).cached


@pytest.mark.parametrize(("text", "runnable"), [
    ("0.50 0.40 0.30 3/250 4242\n", 3), ("0.0 0.0 0.0 12/900 1", 12), ("", None),
    ("not a loadavg", None)])
def test_the_runnable_task_count_is_read_from_loadavg(text, runnable):
    assert cpu_load.runnable_tasks(text) == runnable


def test_the_cores_are_crowded_when_more_tasks_want_them_than_there_are(tmp_path):
    assert not cpu_load.crowded(2.0, cores=2)  # a 2-thread timing alone
    assert cpu_load.crowded(3.0, cores=2) and not cpu_load.crowded(3.0, cores=4)
    assert not cpu_load.crowded(None, cores=2)  # no /proc/loadavg: unknown, trusted
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("1.0 1.0 1.0 6/100 7\n")
    with cpu_load.CrowdWatch(cores=2, path=loadavg) as watch:
        torch.ones(64, 64) @ torch.ones(64, 64)
    assert watch.mean == 5 and watch.crowded and len(watch.samples) >= 2  # less the sampler
    with cpu_load.CrowdWatch(cores=2, path=tmp_path / "missing") as missing:
        pass
    assert missing.mean is None and not missing.crowded


def test_an_unusable_cache_only_costs_a_measurement(tmp_path, monkeypatch):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("RLSCALE_CACHE_DIR", str(blocker))
    calls = stub_rates(monkeypatch, 100.0, 400.0)
    assert dev.precision_probe(torch.device("cpu")).choice == "bfloat16"
    assert dev.precision_probe(torch.device("cpu")).choice == "bfloat16"
    assert len(calls) == 4  # measured each time, no error
    corrupt = tmp_path / "c2"
    corrupt.mkdir()
    (corrupt / "precision_probe.json").write_text("{not json")
    monkeypatch.setenv("RLSCALE_CACHE_DIR", str(corrupt))
    assert dev.precision_probe(torch.device("cpu")).float32_rate == 100.0


def test_the_real_probe_is_short_and_positive():
    fp32 = dev.measure_matmul_gflops(torch.float32, torch.device("cpu"), seconds=0.01)
    bf16 = dev.measure_matmul_gflops(torch.bfloat16, torch.device("cpu"), seconds=0.01)
    assert fp32 > 0 and bf16 > 0


def test_zero_selfplay_evaluates_in_the_resolved_dtype(probe_cache, monkeypatch):
    from rlscale.zero.config import ZeroConfig
    from rlscale.zero.loop import ZeroRun

    matmul = stub_rates(monkeypatch, 1.0, 1000.0)  # would say bf16: not asked
    keys = stub_workload_rates(monkeypatch, 10.0, 40.0)
    run = ZeroRun(ZeroConfig.model_validate({"name": "t", "out": "unused", "device": "cpu"}))
    assert run.precision.name == "bfloat16"
    assert run.source.actor.net.compute_dtype == "bfloat16"
    assert next(run.learner.net.parameters()).dtype == torch.float32  # fp32 master weights
    planes = run.game.planes(run.game.initial_state())[None]
    priors, values = run.source.actor.net.evaluate(planes)
    assert priors.dtype.name == "float32" and abs(float(priors.sum()) - 1) < 1e-3
    run.source.actor.net.compute_dtype = "float32"
    fp32_priors, _ = run.source.actor.net.evaluate(planes)
    assert abs(priors - fp32_priors).max() < 0.05  # the same function, rounded

    assert matmul == [] and len(keys) == 1 and keys[0].startswith("zero PolicyValueNet")
    assert run.precision.metrics()["precision/probed_workload"] == 1.0

    stub_workload_rates(monkeypatch, 20.0, 8.1)
    monkeypatch.setenv("RLSCALE_CACHE_DIR", str(probe_cache.parent.parent / "other"))
    run = ZeroRun(ZeroConfig.model_validate({"name": "t", "out": "unused", "device": "cpu"}))
    assert run.source.actor.net.compute_dtype == "float32"


def test_the_probe_leaves_the_global_rng_alone():
    """A run that measures and a resumed one that reads the cache must draw the same numbers."""
    import torch

    from rlscale.runtime.device import measure_matmul_gflops

    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    measure_matmul_gflops(torch.float32, torch.device("cpu"), shapes=((8, 8, 8),), seconds=0.01)
    assert torch.equal(torch.rand(3), expected)


def test_a_workload_decides_over_the_matmul_probe_and_is_cached_by_its_key(probe_cache,
                                                                          monkeypatch):
    """Where bf16 matmuls are faster, a small model may still run slower in bf16 (measured:
    2.3x faster matmuls, a 1.7x slower GRPO step on the 0.8 M reasoning model): the model's
    own passes decide."""
    matmul = stub_rates(monkeypatch, 100.0, 400.0)
    keys = stub_workload_rates(monkeypatch, 8.0, 6.0)
    small = dev.Workload("lm small", lambda: None)
    resolved = dev.resolve_compute_dtype("auto", torch.device("cpu"), small)
    assert resolved.name == "float32" and matmul == [] and keys == ["lm small"]
    assert "the model's own passes" in resolved.describe()
    assert dev.resolve_compute_dtype("auto", torch.device("cpu"), small).probe.cached
    assert keys == ["lm small"]  # read from the cache
    stub_workload_rates(monkeypatch, 8.0, 12.0)
    other = dev.resolve_compute_dtype("auto", torch.device("cpu"), dev.Workload("lm big", print))
    assert other.name == "bfloat16" and not other.probe.cached
    # No workload (a model too big to time): the matmul probe, cached apart from both.
    assert dev.resolve_compute_dtype("auto", torch.device("cpu")).name == "bfloat16"
    assert len(matmul) == 2 and len(json.loads(probe_cache.read_text())) == 3


def test_the_language_model_workload_is_short_and_leaves_the_model_alone():
    from rlscale.rlvr import model as lm

    model, _ = lm.build_tiny_model("tiny", seed=0)
    model.train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    workload = lm.precision_workload(model)
    assert workload is not None and workload.key.startswith("lm2 LlamaForCausalLM")
    assert workload.key == lm.precision_workload(lm.build_tiny_model("tiny", seed=1)[0]).key
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    fp32, bf16 = dev.measure_workload_rates(workload, torch.device("cpu"), seconds=0.01,
                                            rounds=1)
    assert torch.equal(torch.rand(2), expected)  # the global RNG did not move
    assert fp32 > 0 and bf16 > 0
    assert model.training and all(p.grad is None for p in model.parameters())
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_a_model_too_big_to_time_falls_back_to_the_matmul_probe(monkeypatch):
    from rlscale.rlvr import model as lm

    model, _ = lm.build_tiny_model("tiny", seed=0)
    monkeypatch.setattr(lm, "WORKLOAD_MAX_GFLOP", 0.1)
    assert lm.precision_workload(model) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA GPU")
def test_the_language_model_workload_runs_on_cuda():
    """A model on the GPU: its ids are drawn on the CPU and moved (a CUDA generator once
    failed `auto` on the first GPU run), and both passes run there."""
    from rlscale.rlvr import model as lm

    model = lm.build_tiny_model("tiny", seed=0)[0].to("cuda")
    workload = lm.precision_workload(model)
    assert workload is not None
    fp32, bf16 = dev.measure_workload_rates(workload, torch.device("cuda"), seconds=0.01,
                                            rounds=1)
    assert fp32 > 0 and bf16 > 0
