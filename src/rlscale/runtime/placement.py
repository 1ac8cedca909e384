"""Placement: what each role's processes ask Ray for, as data in the config.

Ray gives a process only the devices it asks for. An actor that asks for no GPU gets no
`CUDA_VISIBLE_DEVICES` from Ray 2.60 and sees every GPU of its node, so the engines and the
learner all open cuda:0 and collide. Asked for by bundle in a placement group, the GPUs of
a role are reserved together (or the run fails at start with what was missing, instead of
an actor that waits forever), and Ray sets each actor's `CUDA_VISIBLE_DEVICES` to its own.

Pure functions over small records: `ray_bundles` (the request), `create_placement_group`
(the reservation, with a deadline), `actor_options` (one process in one bundle, for
`ray.remote(**options)`), `visible_devices` / `worker_device` (what a process got). The
inference fleet and the learner group call them the same way.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..config import StrictModel

Strategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]


class RoleResources(StrictModel):
    """What one process of a role (a learner rank, an inference worker) asks Ray for."""

    cpus: float = Field(
        1, ge=0, description="CPU cores Ray reserves per process (scheduling only: torch's "
        "threads are set by train.threads / runtime.worker_threads)")
    gpus: float = Field(
        0, ge=0, description="GPUs per process: a whole number, or a share below 1 (0.5: two "
        "processes per GPU); 0: the process runs on the CPU")

    @field_validator("gpus")
    @classmethod
    def _whole_gpus_above_one(cls, gpus: float) -> float:
        # Ray splits one GPU between actors but never hands out 1.5 of them.
        if gpus > 1 and gpus != int(gpus):
            raise PydanticCustomError(
                "fractional_gpus", "a share of a GPU must be below 1; above 1 ask for whole GPUs")
        return gpus

    @model_validator(mode="after")
    def _asks_for_something(self) -> RoleResources:
        if self.cpus == 0 and self.gpus == 0:
            raise PydanticCustomError(
                "empty_request", "cpus and gpus are both 0: a process must ask Ray for some "
                "CPU or GPU", {})
        return self


class InferenceResources(RoleResources):
    """An inference worker: its resources, and how a vLLM engine uses its GPUs."""

    tensor_parallel_size: int = Field(
        1, ge=1, description="vLLM only: GPUs one engine shards its model over (set gpus to "
        "the same number)")
    gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1, description="vLLM only: the share of each of its GPUs' memory the "
        "engine takes for weights and KV cache (below gpus when gpus is a share of one)")

    # vLLM starts one process per shard, each on its own GPU of the worker's bundle. Checked
    # on the field (the message names it) and again on the record (an assignment to gpus).
    @field_validator("tensor_parallel_size")
    @classmethod
    def _one_gpu_per_shard(cls, size: int, info: ValidationInfo) -> int:
        _check_shard_gpus(size, info.data.get("gpus"))  # absent: gpus itself was refused
        return size

    @model_validator(mode="after")
    def _still_one_gpu_per_shard(self) -> InferenceResources:
        _check_shard_gpus(self.tensor_parallel_size, self.gpus)
        return self


def _check_shard_gpus(size: int, gpus: float | None) -> None:
    if size > 1 and gpus is not None and gpus != size:
        raise PydanticCustomError(
            "tensor_parallel_gpus", f"tensor_parallel_size {size} needs gpus: {size} (one GPU "
            f"per shard), not {gpus:g}")


class PlacementConfig(StrictModel):
    """`placement`: what each process asks Ray for. With GPUs, a role's processes are
    reserved together as a placement group (one bundle each) and each sees only its own
    GPUs; without, they are plain Ray actors (num_cpus), as before. docs/scale.md has the
    layouts (1 learner + 7 engines, 4 + 4, two nodes, CPU only)."""

    # Default instances, not factories (pydantic copies them per config): a config's
    # inert_fleet_fields compares a section with its field's default.
    learner: RoleResources = Field(
        RoleResources(), description="per learner process (train.learner_processes)")
    inference: InferenceResources = Field(
        InferenceResources(), description="per inference worker "
        "(runtime.inference_workers)")
    strategy: Strategy = Field(
        "PACK", description="Ray's placement strategy for a role's bundles: PACK (few nodes), "
        "SPREAD (many), STRICT_PACK (one node), STRICT_SPREAD (one node each)")
    timeout_s: float = Field(
        120, gt=0, description="how long to wait for the cluster to reserve a role's bundles "
        "before the run stops with what was asked and what the cluster has")


def ray_bundles(role: RoleResources, count: int) -> list[dict[str, float]]:
    """`count` bundles of one process's resources, zero entries left out (Ray refuses a
    bundle resource of 0)."""
    bundle = {key: float(value) for key, value in (("CPU", role.cpus), ("GPU", role.gpus))
              if value > 0}
    return [dict(bundle) for _ in range(count)]


def _describe(resources: dict[str, float]) -> str:
    shown = {k: resources.get(k, 0.0) for k in ("CPU", "GPU")}
    return ", ".join(f"{value:g} {key}" for key, value in shown.items())


def _total(bundles: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for bundle in bundles:
        for key, value in bundle.items():
            total[key] = total.get(key, 0.0) + value
    return total


def create_placement_group(bundles: list[dict[str, float]], strategy: Strategy, name: str,
                           timeout_s: float) -> Any:
    """Reserve `bundles` as one placement group and wait until Ray has placed them all.

    Ray would otherwise keep an unsatisfiable group pending forever and its actors with it;
    past `timeout_s` the group is removed and a one-line ValueError names what was asked and
    what the cluster has."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    if not bundles or any(not bundle for bundle in bundles):
        raise ValueError(f"placement group '{name}': every bundle must ask for some resource")
    group = placement_group(bundles, strategy=strategy, name=name)
    start = time.monotonic()
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if ready:
        return group
    remove_placement_group(group)
    raise ValueError(
        f"placement group '{name}' ({len(bundles)} bundles of {_describe(bundles[0])}, "
        f"{strategy}: {_describe(_total(bundles))} in all) was not placed within "
        f"{time.monotonic() - start:.0f} s (placement.timeout_s); the cluster has "
        f"{_describe(ray.cluster_resources())}")


def release_placement_group(group: Any) -> None:
    """Give a group's reservation back (best effort: the cluster may be gone already)."""
    if group is None:
        return
    from ray.util.placement_group import remove_placement_group

    try:
        remove_placement_group(group)
    except Exception:  # noqa: BLE001 - a closing run must not fail on its cleanup
        pass


def actor_options(role: RoleResources, placement_group: Any = None,
                  bundle_index: int | None = None) -> dict[str, Any]:
    """Keyword arguments of `ray.remote(**options)` for one process of `role`: its CPUs and
    GPUs, and with a group the bundle it runs in (its resources come out of that bundle's
    reservation, so it asks for the same amounts)."""
    options: dict[str, Any] = {"num_cpus": role.cpus, "num_gpus": role.gpus}
    if placement_group is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group=placement_group,
            placement_group_bundle_index=-1 if bundle_index is None else bundle_index)
    return options


def _in_ray_actor() -> bool:
    ray = sys.modules.get("ray")  # not imported: not a Ray worker either
    return bool(ray is not None and ray.is_initialized()
                and ray.get_runtime_context().get_actor_id() is not None)


def visible_devices() -> list[str]:
    """The GPU ids this process may use: inside a Ray actor the ones Ray assigned it,
    elsewhere `CUDA_VISIBLE_DEVICES` (unset: every GPU torch counts)."""
    if _in_ray_actor():
        import ray

        return [str(i) for i in ray.get_gpu_ids()]
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [part.strip() for part in listed.split(",") if part.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def worker_device(role: RoleResources) -> str:
    """Where a process of `role` computes: "cuda" when it asked for GPUs and torch sees
    one (Ray made its GPUs the only visible ones, so cuda:0 is its own), else "cpu"."""
    if role.gpus <= 0:
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
