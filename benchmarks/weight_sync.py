"""Weight sync to local engine workers: today's path beside the packed one (runtime/weight_sync.py).

    .venv/bin/python benchmarks/weight_sync.py [--shape 0.5b|tiny] [--versions 3] [--workers 2]
        [--max-gib 8]

The learner holds the Qwen2-0.5B shape (hidden 896, 24 layers, 14 heads, 2 kv heads,
intermediate 4864, vocab 151936, tied embedding; randomly initialised from a `Qwen2Config`,
nothing downloaded) in fp32; each worker is a Ray actor on this machine, an
`rlvr.fleet.InferenceWorker` whose native engine holds the same shape in the engine's dtype.
One version is timed from the learner's call to every worker serving it (its weights
replaced and fused again), the calls to the workers concurrent:

- today: the old `cpu_snapshot` (the tied matrix copied twice) and one `ray.put` of the fp32
  state dict; each worker unpickles its own copy, `load_state_dict` casts it into the engine,
  which fuses again (the old `ContinuousBatchingEngine.load_weights`; a bf16 engine, as beside
  an fp32 learner);
- packed: `WeightPacker` in the engine's dtype (bf16, and fp32 for an fp32 engine) and one
  `ray.put` of its uint8 buckets; every worker maps the same shared memory, copies into its
  parameters in place and fuses again (`InferenceWorker.advance`, the fleet's own call).

Columns: bytes in the object store per version; the learner's share (snapshot or pack, and
the put: what its next step waits for); the slowest worker's load inside its call (today's
excludes unpickling, which the total has); learner's call -> every worker serving (median
over `--versions` after one warm-up version); today's total over the path's.

Memory: a path runs live (workers alive beside the learner) when its estimated peak fits
`--max-gib`. Otherwise it runs composed: the learner's side with no worker alive, then each
worker alone (dispatch -> serving), reported as learner + the slowest worker, so the machine
never holds both sides. Where even that does not fit (today's path at 0.5 B: the snapshot
and its pickle beside the learner's weights, ~13 GB), it runs composed on as many layers as
fit and its seconds and bytes are scaled to the whole shape by bytes ("scaled L/24"). On a
larger machine every path runs live. Each path's measured peak (the summed PSS of this
benchmark's processes) is printed under it. The header prints the load average: the machine
may be shared, and then every figure is pessimistic.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass

import torch

from rlscale.rlvr.fleet import InferenceWorker
from rlscale.rlvr.rollout.engine import ContinuousBatchingEngine
from rlscale.rlvr.rollout.sampler import step_function
from rlscale.rlvr.rollout.types import EngineSampling
from rlscale.runtime.fleet import RayWeightPublisher, import_ray, ray_session
from rlscale.runtime.weight_sync import DEFAULT_BUCKET_BYTES, WeightLoad, WeightPacker, plan_buckets

SHAPES = {
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, intermediate_size=4864, vocab_size=151936),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, vocab_size=1000),
}
PROCESS_GB, RAY_GB = 0.45, 0.3  # a Python process with torch (and Ray's own daemons)


@dataclass(frozen=True)
class SyncPath:
    name: str
    engine_dtype: str
    packed: bool


PATHS = (SyncPath("today: fp32 state dict", "bfloat16", False),
         SyncPath("packed bf16", "bfloat16", True),
         SyncPath("packed fp32", "float32", True))


@dataclass
class Result:
    path: SyncPath
    mode: str
    store_bytes: int
    learner_s: float
    load_s: float
    total_s: float


def build_model(shape: dict, dtype: str, seed: int | None):
    """The shape, randomly initialised (seed) or zeroed (None), built in `dtype` directly."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.initialization import no_init_weights

    config = Qwen2Config(**shape, tie_word_embeddings=True, max_position_embeddings=512)
    with no_init_weights():
        model = Qwen2ForCausalLM._from_config(config, dtype=getattr(torch, dtype))
    model.tie_weights()
    generator = torch.Generator().manual_seed(seed or 0)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_() if seed is None else p.normal_(0.0, 0.02, generator=generator)
    return model.eval()


def today_snapshot(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """runtime/versions.py `cpu_snapshot` as it was: every name its own copy, ties too."""
    return {name: t.detach().to("cpu", copy=True) for name, t in state.items()}


class BenchWorker(InferenceWorker):
    """An inference worker over a zeroed shape (no model folder, no tokenizer): each version
    overwrites its weights, so where they start does not matter."""

    def __init__(self, shape: dict, dtype: str, threads: int) -> None:
        torch.set_num_threads(threads)
        model = build_model(shape, dtype, seed=None)
        self.engine = ContinuousBatchingEngine(model, EngineSampling(temperature=0.0), slots=1,
                                               eos_token_id=0, pad_token_id=0)
        self.outstanding, self._lora = 0, None

    def ready(self) -> int:
        return os.getpid()

    def load_today(self, state_dict: dict[str, torch.Tensor], version: int) -> WeightLoad:
        """The engine's old `load_weights`: `load_state_dict`, then fuse again."""
        start = time.perf_counter()
        with torch.no_grad():
            self.engine.model.load_state_dict(state_dict)
        self.engine.cache_dtype, self.engine._decode = step_function(self.engine.model)
        self.engine.version = version
        return WeightLoad(version, time.perf_counter() - start, time.time())

    def load_packed(self, packet, version: int) -> WeightLoad:
        return self.advance([], packet, version, 0.0).loaded  # the fleet's call, no requests


def counts(shape: dict) -> tuple[int, int, int]:
    """(parameters, tied parameters, parameters the engine's fused decode copies)."""
    h, layers, inter = shape["hidden_size"], shape["num_hidden_layers"], shape["intermediate_size"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * inter + 2 * h + 2 * kv + h  # + norms, biases
    tied = shape["vocab_size"] * h
    return tied + layers * per_layer + h, tied, layers * (h * (h + 2 * kv) + 2 * h * inter)


def peaks_gb(path: SyncPath, shape: dict, workers: int) -> tuple[float, float]:
    """Estimated peak memory (GB) live, and composed (the larger of the two sides)."""
    params, tied, fused = counts(shape)
    engine = 2 if path.engine_dtype == "bfloat16" else 4
    learner = PROCESS_GB + RAY_GB + 4 * params / 1e9
    if path.packed:
        # The packer's buckets; live, the store holds the new version beside the one the
        # workers still map; a worker maps its weights, keeps its fused copies (two, briefly).
        extra = store = engine * params / 1e9
        older, worker = store, PROCESS_GB + 2 * engine * fused / 1e9
    else:
        # The snapshot and the pickle of every tensor (a stream and its bytes) beside it;
        # each worker unpickles its own copy (bytes and tensors) beside its model.
        store = 4 * (params + tied) / 1e9
        extra, older = 3 * store, 0.0
        worker = PROCESS_GB + engine * (params + 2 * fused) / 1e9 + 2 * store
    live = learner + extra + store + older + workers * worker
    return live, max(learner + extra + store, PROCESS_GB + RAY_GB + store + worker)


def fitting_layers(path: SyncPath, shape: dict, cap_gb: float) -> int:
    """The most layers whose composed run fits `cap_gb` (0: not even the embedding)."""
    layers = shape["num_hidden_layers"]
    while layers and peaks_gb(path, {**shape, "num_hidden_layers": layers}, 1)[1] > cap_gb:
        layers -= 1
    return layers


def expected_bytes(path: SyncPath, shape: dict) -> int:
    """What one version puts in the object store (today: the tied matrix twice, fp32)."""
    params, tied, _ = counts(shape)
    return 4 * (params + tied) if not path.packed else (
        2 if path.engine_dtype == "bfloat16" else 4) * params


def store_bytes(path: SyncPath, state: dict[str, torch.Tensor]) -> int:
    if not path.packed:
        return sum(t.numel() * t.element_size() for t in state.values())
    return sum(plan_buckets(state, getattr(torch, path.engine_dtype), DEFAULT_BUCKET_BYTES)[1])


def put(path: SyncPath, publisher: RayWeightPublisher | None, state, version: int):
    """The learner's side of a version: its object-store ref."""
    if publisher is None:
        return import_ray().put(today_snapshot(state))
    return publisher.put(state, version)


def load(path: SyncPath, worker, ref, version: int):
    return (worker.load_packed if path.packed else worker.load_today).remote(ref, version)


def spawn(path: SyncPath, shape: dict, count: int) -> tuple[list, list[int]]:
    ray = import_ray()
    handles = [ray.remote(num_cpus=1)(BenchWorker).remote(shape, path.engine_dtype, 1)
               for _ in range(count)]
    return handles, ray.get([h.ready.remote() for h in handles], timeout=600)


def stop(handles: list, pids: list[int]) -> None:
    """Kill the workers and wait until their memory is back."""
    for handle in handles:
        import_ray().kill(handle)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def run_live(path: SyncPath, shape: dict, versions: int, workers: int) -> Result:
    handles, pids = spawn(path, shape, workers)
    state = build_model(shape, "float32", seed=0).state_dict()
    publisher = RayWeightPublisher(WeightPacker(path.engine_dtype)) if path.packed else None
    samples = []
    try:
        for version in range(versions + 1):  # version 0 warms up: first touch of the pages
            if publisher is not None:
                publisher.swap(None, version - 1)  # the old version goes first (memory)
            called, start = time.time(), time.perf_counter()
            ref = put(path, publisher, state, version)
            learner_s = time.perf_counter() - start
            loads = import_ray().get([load(path, h, ref, version) for h in handles], timeout=600)
            del ref
            if version:
                samples.append((learner_s, max(x.load_s for x in loads),
                                max(x.served_at for x in loads) - called))
    finally:
        stop(handles, pids)
    return Result(path, "live", store_bytes(path, state), *_medians(samples))


def run_composed(path: SyncPath, shape: dict, versions: int, workers: int) -> Result:
    samples, nbytes = [], 0
    for version in range(versions):
        state = build_model(shape, "float32", seed=version).state_dict()
        nbytes = store_bytes(path, state)
        publisher = RayWeightPublisher(WeightPacker(path.engine_dtype)) if path.packed else None
        start = time.perf_counter()
        ref = put(path, publisher, state, version)
        learner_s = time.perf_counter() - start
        del state, publisher
        gc.collect()
        alone = []
        for _ in range(workers):  # one worker alive at a time
            handles, pids = spawn(path, shape, 1)
            dispatched = time.time()
            loaded = import_ray().get(load(path, handles[0], ref, version), timeout=600)
            alone.append((loaded.load_s, loaded.served_at - dispatched))
            stop(handles, pids)
        del ref
        samples.append((learner_s, max(a for a, _ in alone),
                        learner_s + max(b for _, b in alone)))
    return Result(path, "composed", nbytes, *_medians(samples))


def _medians(samples: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    return tuple(statistics.median(column) for column in zip(*samples, strict=True))


def header(args, shape: dict) -> list[str]:
    lscpu = _lscpu()
    flags = [f for f in lscpu.get("Flags", "").split() if f.startswith(("avx512", "amx"))]
    params, tied, _ = counts(shape)
    import ray

    return [f"# weight sync: shape {args.shape} ({params / 1e6:.3g} M parameters, tied "
            f"embedding {tied / 1e6:.3g} M), {args.workers} local engine workers (1 thread each)",
            f"# CPU: {lscpu.get('Model name', platform.machine())}, {os.cpu_count()} cores; "
            f"flags: {' '.join(flags) or 'no avx512/amx'}",
            f"# torch {torch.__version__}, ray {ray.__version__}; load average at start "
            f"{os.getloadavg()[0]:.1f}; memory cap {args.max_gib} GiB"]


def _lscpu() -> dict[str, str]:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {key.strip(): value.strip() for key, _, value in
            (line.partition(":") for line in out.splitlines())}


def table(results: list[Result]) -> list[str]:
    today = next((r.total_s for r in results if not r.path.packed), None)
    rows = [f"{'path':<24} {'engine':<9} {'mode':<12} {'store MB':>9} {'learner s':>10} "
            f"{'load s':>8} {'total s':>8} {'vs today':>9}"]
    for r in results:
        ratio = f"{today / r.total_s:.1f}x" if today else "-"
        rows.append(f"{r.path.name:<24} {r.path.engine_dtype:<9} {r.mode:<12} "
                    f"{r.store_bytes / 1e6:>9.0f} {r.learner_s:>10.3f} {r.load_s:>8.3f} "
                    f"{r.total_s:>8.3f} {ratio:>9}")
    return rows


class PeakMemory:
    """The largest summed PSS of this process and its descendants (Ray's daemons, workers and
    object store), sampled every 0.25 s in a thread: what the benchmark really held."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def take(self) -> float:
        """The peak since the last `take`, in GB."""
        peak, self.peak = self.peak, 0
        return peak / 1e9

    def close(self) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(0.25):
            self.peak = max(self.peak, sum(_pss(pid) for pid in _family(os.getpid())))


def _family(root: int) -> set[int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    family, grew = {root}, True
    while grew:
        more = {pid for pid, parent in parents.items() if parent in family} - family
        family |= more
        grew = bool(more)
    return family


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            line = next((x for x in f if x.startswith("Pss:")), "Pss: 0 kB")
    except OSError:
        return 0
    return int(line.split()[1]) * 1024


def measure(path: SyncPath, shape: dict, args) -> Result:
    """Live when the estimate fits the cap; else composed; else composed on the layers that
    fit, its seconds scaled to the whole shape by bytes (copies and pickling go by bytes)."""
    cap = args.max_gib * 2**30 / 1e9
    live, composed = peaks_gb(path, shape, args.workers)
    if live <= cap:
        mode, small = "live", shape
    elif composed <= cap:
        mode, small = "composed", shape
    else:
        layers = fitting_layers(path, shape, cap)
        if not layers:
            raise SystemExit(f"{path.name}: no layer count fits --max-gib {args.max_gib}")
        mode, small = f"scaled {layers}/{shape['num_hidden_layers']}", {
            **shape, "num_hidden_layers": layers}
    print(f"# {path.name} ({path.engine_dtype} engine): estimated peak {live:.1f} GB live, "
          f"{composed:.1f} GB composed -> {mode}", flush=True)
    runner = run_live if mode == "live" else run_composed
    result = runner(path, small, args.versions, args.workers)
    if small is not shape:
        factor = expected_bytes(path, shape) / expected_bytes(path, small)
        result = Result(path, mode, round(result.store_bytes * factor),
                        result.learner_s * factor, result.load_s * factor,
                        result.total_s * factor)
    result.mode = mode
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    parser.add_argument("--versions", type=int, default=3, help="timed versions per path")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-gib", type=float, default=8.0,
                        help="a path whose estimated live peak is above this runs composed")
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    torch.set_num_threads(1)  # the learner's snapshot copies as the packer's (see WeightPacker)
    print("\n".join(header(args, shape)), flush=True)
    results, memory = [], PeakMemory()
    with ray_session(num_cpus=max(args.workers, 2)):
        for path in PATHS:
            memory.take()
            results.append(measure(path, shape, args))
            print(f"#   measured peak {memory.take():.1f} GB (PSS of this benchmark's "
                  "processes)", flush=True)
    memory.close()
    print(f"# load average at end {os.getloadavg()[0]:.1f}")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
