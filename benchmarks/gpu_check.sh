#!/usr/bin/env bash
# One prepared check for a lent GPU machine (written for one H200): rlscale's vLLM engine on CUDA.
#
#   OUT=/some/dir bash benchmarks/gpu_check.sh        # from the repository root
#
# 1. a venv with rlscale and PyPI's CUDA vLLM (`.[vllm]`: vllm==0.32.0 pins the matching torch),
#    unless PYTHON names an interpreter that already has rlscale's dependencies (a machine
#    without a registry: then the parts that need vLLM are skipped if it cannot import it);
# 2. torch.cuda.is_available(), device name, versions;
# 3. a two-step trainer run on CUDA, GRPO steps of the reasoning recipe on a random 6.3 M model
#    (seconds per step), then one GRPO step of a 0.5 B Qwen2-shaped model (memory.py) and its
#    sampler's token step alone (sampler_step.py);
# 4. tests/test_vllm_engine.py on CUDA (greedy tokens, mu after top-p, load_weights);
# 5. benchmarks/engine_vllm.py: the tiny model (fp32) and a random Qwen2-0.5B-shape model
#    (bf16, built from a config: nothing is downloaded), the mixed-length workload, tokens/s
#    and peak GPU memory;
# 6. benchmarks/scale_check.py: the learner group, an engine placed beside it, weight sync;
# 6b. issue 52's decode: tests/test_static_decode.py, benchmarks/decode_step.py (tokens/s,
#    eager vs CUDA graphs, syncs per token step) and benchmarks/collect_gap.py (the loop's
#    collect against generate alone), on the 0.5 B shape;
# 7. Zero on CUDA (run right after step 2: it needs no vLLM and takes ~4 min): benchmarks/mcts.py
#    with its GPU rows, tests/zero/test_zero_device.py (its CUDA tests), and a 2-iteration 7x7
#    Go run with `device=cuda` (smaller self-play than the recipe), seconds per iteration.
# PARTS picks groups (comma list of zero, trainer, decode, scale, vllm; empty: all), e.g.
#   PARTS=decode OUT=runs/gpu_check bash benchmarks/gpu_check.sh   # issue 52's, ~6 minutes
# Everything lands in $OUT: one log per part and summary.txt (one line per part, with its exit
# status). A failing part is recorded and the next one still runs.
#
# A machine with no package registry (the lent H200's image: Python 3.12 with torch, numpy,
# tokenizers, safetensors, typer, rich, tensorboard, numba, pytest, but no pydantic and an older
# transformers): download the missing wheels here, carry them, install them there, and run
# rlscale from the checkout:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 -d .whl pydantic==2.14.4 \
#     pydantic_core==2.50.5 annotated-types typing-inspection typing_extensions==4.16.0 \
#     transformers==5.25.0 huggingface_hub==2.4.0 kernels==0.19.1 hf-xet httpx2 httpcore2 \
#     anyio h11 idna certifi sniffio truststore click tomlkit regex tqdm
#   # there:
#   python3 -m pip install -q --no-index --no-deps --target .site .whl/*.whl
#   PYTHONPATH=.site:src PYTHON=python3 OUT=runs/gpu_check bash benchmarks/gpu_check.sh
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-$REPO/gpu_check_out}"
VENV="${VENV:-/tmp/rlscale-gpu-venv}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
cd "$REPO"

want() {  # want GROUP: whether PARTS (a comma list; empty: every group) names it
  [ -z "${PARTS:-}" ] || [[ ",$PARTS," == *",$1,"* ]]
}

part() {  # part NAME COMMAND...: run, log to $OUT/NAME.log, record the exit status
  local name="$1"; shift
  local t0=$SECONDS
  echo "== $name: $*"
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" | tee -a "$SUMMARY"
  tail -n 25 "$OUT/$name.log"
  return $rc
}

install() {
  python3 -m venv "$VENV" && "$VENV/bin/pip" install -q --upgrade pip \
    && "$VENV/bin/pip" install -q -e ".[vllm,dev,lora]"
}

if [ -z "${PYTHON:-}" ]; then
  part install install || { echo "install failed: set PYTHON to an interpreter with vllm" | tee -a "$SUMMARY"; exit 1; }
  PYTHON="$VENV/bin/python"
fi

part cuda "$PYTHON" -c '
import torch, transformers
assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
try:
    import vllm
    vllm_version = vllm.__version__
except ImportError as e:
    vllm_version = f"not importable ({e})"
print("torch", torch.__version__, "cuda", torch.version.cuda, "vllm", vllm_version,
      "transformers", transformers.__version__)
print("device", torch.cuda.get_device_name(0),
      f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB")
' || exit 1
"$PYTHON" -m pip freeze > "$OUT/pip_freeze.txt" 2>/dev/null
nvidia-smi > "$OUT/nvidia_smi.txt" 2>&1

if want zero; then
# Zero on CUDA (6). The Go run: 128 games in flight (one network call of 128 positions per
# simulation step) and 128 per iteration instead of 256; min_replay 1024 so the learner trains
# in both iterations. One summary line per iteration: wall seconds, self-play and learner
# seconds, simulations/s.
part zero_mcts "$PYTHON" benchmarks/mcts.py --model src/rlscale/zero/models/connect4 --seconds 2
part zero_tests "$PYTHON" -m pytest -q -p no:cacheprovider tests/zero/test_zero_device.py
part zero_go7 timeout 240 "$PYTHON" -m rlscale.cli zero train configs/zero/go7.yaml device=cuda \
  train.iterations=2 selfplay.concurrent_games=128 selfplay.games_per_iteration=128 \
  train.min_replay=1024 checkpoint.every=1 --out "$OUT/zero_go7" --overwrite --no-progress
"$PYTHON" - "$OUT/zero_go7/metrics.jsonl" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import json, sys
before = 0.0
for r in map(json.loads, open(sys.argv[1])):
    print(f"zero_go7 iteration {r['step']}: {r['counters/seconds'] - before:.1f} s "
          f"(self-play {r['speed/selfplay_seconds']:.1f} s at "
          f"{r['speed/simulations_per_second']:,.0f} simulations/s, learner "
          f"{r['speed/train_seconds']:.1f} s), {r['counters/games']} games so far")
    before = r["counters/seconds"]
EOF

fi

if want trainer; then
# The trainer on CUDA: two steps of the quickstart recipe on the tiny model, then the 0.5 B
# Qwen2 shape (one GRPO step, full fine-tuning and LoRA: step time and peak GPU memory).
part trainer_init "$PYTHON" -c "from rlscale.rlvr.model import init_model; init_model('tiny', '$OUT/train_base')"
part trainer "$PYTHON" -m rlscale.cli rlvr train src/rlscale/configs/rlvr/quickstart.yaml \
  model.path="$OUT/train_base" run_dir="$OUT/train_run" train.steps=2 device=cuda \
  eval.every=0 checkpoint.every=0
# The reasoning recipe's step (16 prompts x 8 completions, up to 256 tokens) on a random 6.3 M
# model: a random model samples EOS rarely, so most rows run the full budget.
part reasoning_init "$PYTHON" -c "from rlscale.rlvr.model import init_model; init_model('small', '$OUT/reasoning_base')"
part reasoning timeout 300 "$PYTHON" -m rlscale.cli rlvr train configs/rlvr/reasoning.yaml \
  model.path="$OUT/reasoning_base" run_dir="$OUT/reasoning_run" train.steps=4 device=cuda \
  eval.every=0 checkpoint.every=0
"$PYTHON" - "$OUT/reasoning_run/metrics.jsonl" <<'EOF' 2>&1 | tee -a "$SUMMARY"
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    times = {k: round(v, 3) for k, v in r.items() if k.startswith(("time/", "memory/"))}
    print(f"reasoning step {r.get('step')}: {times}")
EOF
part trainer_05b "$PYTHON" benchmarks/memory.py --out "$OUT/memory" --steps 2 --device cuda
# The sampler alone on the same model: a token step, the decode step, the draw.
part sampler_05b "$PYTHON" benchmarks/sampler_step.py --model 0.5b --device cuda --rows 32 \
  --tokens 128 --cache "$OUT/memory"

fi

if want decode; then
# Issue 52's decode on the same model (~5 minutes): the static-decode tests on CUDA (the CUDA
# graph path), decode tokens/s at 32/128/256 rows x 128/512 tokens with the eager step and the
# static step replayed as CUDA graphs, the finished-row check every 1 and 8 token steps, and
# host syncs per token step; then the GRPO step's collect against the same generate calls
# alone, eager and with rollout.static_decode, with a profiler table of the last collect.
part decode_tests "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_static_decode.py
part decode_05b timeout 300 "$PYTHON" benchmarks/decode_step.py --models 0.5b --device cuda \
  --dtype bfloat16 --rows 32,128,256 --tokens 128,512 --forms eager,static \
  --eos-check-every 1,8 --steps 16 --repeats 2 --cache "$OUT/memory"
part collect_gap_05b timeout 240 "$PYTHON" benchmarks/collect_gap.py --model 0.5b --device cuda \
  --steps 3 --cache "$OUT/memory" --out "$OUT/collect_gap" --profile
part collect_gap_05b_static timeout 240 "$PYTHON" benchmarks/collect_gap.py --model 0.5b \
  --device cuda --steps 3 --cache "$OUT/memory" --out "$OUT/collect_gap_static" \
  rollout.static_decode=true

fi

if want scale; then
# Scale-out: the learner group (FSDP2; NCCL over 2+ GPUs, else gloo on the CPU; started by Ray
# where it imports, else by torchrun) against one process, an engine placed on a GPU beside it,
# and time/publish_s; one table.
part scale timeout 420 "$PYTHON" benchmarks/scale_check.py --device cuda --out "$OUT/scale"

fi

if want vllm; then
if "$PYTHON" -c "import vllm" > /dev/null 2>&1; then
  part tests "$PYTHON" -m pytest -q -p no:cacheprovider tests/test_vllm_engine.py
  # Small KV share: the figure of interest is the model's, not the preallocation's.
  part bench_tiny "$PYTHON" benchmarks/engine_vllm.py --models tiny --modes compiled \
    --dtype float32 --slots 256 --engine-arg gpu_memory_utilization=0.2 --json "$OUT/bench_tiny.json"
  part bench_05b "$PYTHON" benchmarks/engine_vllm.py --models 0.5b --modes compiled \
    --dtype bfloat16 --slots 256 --engine-arg gpu_memory_utilization=0.3 --json "$OUT/bench_05b.json"
else
  echo "tests, bench_tiny, bench_05b: skipped (vllm not importable by $PYTHON)" | tee -a "$SUMMARY"
fi
fi

echo "== summary ($SUMMARY)"
cat "$SUMMARY"
