"""Placement (runtime/placement.py): the config's per-role resources become Ray bundles and
actor options, each GPU actor sees only its own GPU, an unsatisfiable request fails within
its deadline with one line, and the config refuses what Ray or vLLM could not honour. The
cluster is a local Ray with 2 fake GPUs (Ray schedules them; nothing touches CUDA)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import pytest

from rlscale.config import ConfigError, load_config
from rlscale.rlvr.config import RLVRConfig
from rlscale.runtime.placement import (
    InferenceResources,
    PlacementConfig,
    RoleResources,
    actor_options,
    create_placement_group,
    ray_bundles,
    release_placement_group,
    visible_devices,
    worker_device,
)


def config_error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config(RLVRConfig, None, ["model.path=models/base", *overrides])
    return str(err.value)


def test_the_defaults_are_today_s_cpu_fleet():
    cfg = load_config(RLVRConfig, None, ["model.path=models/base"])
    assert cfg.placement == PlacementConfig()
    assert ray_bundles(cfg.placement.inference, 2) == [{"CPU": 1.0}, {"CPU": 1.0}]
    assert actor_options(cfg.placement.inference) == {"num_cpus": 1, "num_gpus": 0}
    assert worker_device(cfg.placement.inference) == "cpu"
    assert cfg.inert_fleet_fields() == []


def test_bundles_carry_the_role_s_cpus_and_gpus_and_leave_out_zeros():
    assert ray_bundles(RoleResources(cpus=2, gpus=1), 3) == [{"CPU": 2.0, "GPU": 1.0}] * 3
    assert ray_bundles(RoleResources(cpus=0, gpus=0.5), 2) == [{"GPU": 0.5}] * 2
    tp = InferenceResources(cpus=4, gpus=2, tensor_parallel_size=2)
    assert ray_bundles(tp, 1) == [{"CPU": 4.0, "GPU": 2.0}]
    assert ray_bundles(tp, 0) == []


def test_config_refusals_are_one_line_and_name_the_field():
    message = config_error("placement.inference.gpus=1.5")
    assert "placement.inference.gpus" in message and "below 1" in message
    message = config_error("placement.inference.tensor_parallel_size=2")
    assert "placement.inference.tensor_parallel_size" in message
    assert "needs gpus: 2" in message and "not 0" in message
    assert "both 0" in config_error("placement.learner.cpus=0")
    assert "STRICT_SPREAD" in config_error("placement.strategy=spread")
    assert "gpu_memory_utilization" in config_error(
        "placement.inference.gpu_memory_utilization=1.5")
    for message in [config_error("placement.inference.gpus=1.5"),
                    config_error("placement.inference.tensor_parallel_size=4",
                                 "placement.inference.gpus=2")]:
        assert "\n" not in message
    ok = load_config(RLVRConfig, None, [
        "model.path=m", "placement.inference.gpus=4", "placement.inference.tensor_parallel_size=4",
        "placement.inference.gpu_memory_utilization=0.5", "placement.learner.gpus=1"])
    assert ok.placement.inference.tensor_parallel_size == 4


def test_a_sync_run_names_inference_placement_as_inert_and_resume_may_change_it():
    from rlscale.rlvr.config import RESUME_FREE_FIELDS

    cfg = load_config(RLVRConfig, None, ["model.path=m", "placement.inference.gpus=1"])
    assert [f.split("=")[0] for f in cfg.inert_fleet_fields()] == ["placement.inference"]
    assert "placement.*" in RESUME_FREE_FIELDS


def test_outside_ray_the_visible_devices_are_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    assert visible_devices() == ["3", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_devices() == []


# -- a local Ray cluster with 2 fake GPUs ------------------------------------------------------
ray = pytest.importorskip("ray", reason="placement needs Ray (pip install 'rlscale[ray]')")


class Probe:
    """What an actor was given: Ray's GPU ids, its CUDA_VISIBLE_DEVICES and what
    placement.visible_devices / worker_device say (no CUDA here: the GPUs are fake)."""

    def report(self, role: RoleResources) -> tuple[list[str], str | None, list[str], str]:
        return ([str(i) for i in ray.get_gpu_ids()], os.environ.get("CUDA_VISIBLE_DEVICES"),
                visible_devices(), worker_device(role))


@pytest.fixture(scope="module")
def fake_gpu_cluster():
    # The probe lives in this test module, which Ray's workers cannot import: send it by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    temp_dir = tempfile.mkdtemp(prefix="rlray-", dir="/tmp")  # short: Unix socket paths
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=4, num_gpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False, _temp_dir=temp_dir)
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_each_gpu_actor_sees_exactly_its_own_gpu(fake_gpu_cluster):
    role = InferenceResources(cpus=1, gpus=1)
    group = create_placement_group(ray_bundles(role, 2), "PACK", "test-inference", 30)
    try:
        options = [actor_options(role, group, i) for i in range(2)]
        assert options[1]["num_gpus"] == 1 and options[1]["num_cpus"] == 1
        strategy = options[1]["scheduling_strategy"]
        assert strategy.placement_group is group
        assert strategy.placement_group_bundle_index == 1
        actors = [ray.remote(**o)(Probe).remote() for o in options]
        reports = ray.get([a.report.remote(role) for a in actors], timeout=60)
        for ray_ids, cuda_visible, visible, device in reports:
            assert len(ray_ids) == 1  # one GPU each, and the process is told so
            assert cuda_visible == ray_ids[0] and visible == ray_ids
            assert device == "cpu"  # fake GPUs: torch sees no CUDA, the engine stays on CPU
        assert reports[0][0] != reports[1][0]  # two actors, two different GPUs
        for actor in actors:
            ray.kill(actor)
    finally:
        release_placement_group(group)


def test_an_unsatisfiable_request_fails_in_time_with_one_line(fake_gpu_cluster):
    start = time.monotonic()
    with pytest.raises(ValueError) as err:
        create_placement_group(ray_bundles(RoleResources(gpus=1), 3), "PACK", "too-many", 1.5)
    assert time.monotonic() - start < 10
    message = str(err.value)
    assert "\n" not in message
    assert "'too-many'" in message and "3 bundles of 1 CPU, 1 GPU" in message
    assert "3 CPU, 3 GPU in all" in message and "the cluster has 4 CPU, 2 GPU" in message
    # removed, not left pending: the cluster's GPUs can all be reserved again
    group = create_placement_group(ray_bundles(RoleResources(gpus=1), 2), "PACK", "fits", 30)
    release_placement_group(group)
    release_placement_group(group)  # twice, or after the cluster is gone: no error


def test_a_gpu_fleet_places_its_workers_in_one_group_and_releases_it(fake_gpu_cluster,
                                                                     tiny_model_dir):
    from ray.util.placement_group import placement_group_table

    from rlscale.rlvr.fleet import FleetRollouts
    from rlscale.rlvr.model import load_tokenizer

    cfg = load_config(RLVRConfig, None, [
        f"model.path={tiny_model_dir}", "runtime.mode=async", "runtime.inference_workers=2",
        "placement.inference.gpus=1", "placement.timeout_s=30"])
    # Workers made one by one (not `start`): no task or verifier pool is needed for that.
    fleet = FleetRollouts(cfg, None, load_tokenizer(tiny_model_dir), None, start_version=0,
                          dynamic_sampling=False)
    worker = fleet._make_worker(1)  # the group is made at the first worker, whichever it is
    group = fleet._placement_group
    try:
        assert ray.get(worker.pid.remote(), timeout=120) > 0  # built its engine in bundle 1
        table = placement_group_table(group)
        assert table["state"] == "CREATED"
        assert list(table["bundles"].values()) == [{"CPU": 1.0, "GPU": 1.0}] * 2
        ray.kill(worker)
    finally:
        fleet.close()
    assert fleet._placement_group is None
    assert placement_group_table(group)["state"] == "REMOVED"
