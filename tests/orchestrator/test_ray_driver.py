"""The Ray driver numbers ranks node by node and refuses what it cannot
launch before writing anything, in one line that says what to do; importing
the Ray embedding imports neither Ray nor torch. No Ray cluster is started
here."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest

from events import RankIdentity
from orchestrator import FaultSpecError, RankEnvironmentError
from orchestrator.ray import RayLaunchError, launch_on_ray, rank_identities


def test_importing_the_embedding_imports_neither_ray_nor_torch() -> None:
    code = (
        "import sys, orchestrator.ray; "
        "print(sorted(m for m in ('ray', 'torch') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_without_ray_the_error_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError

    with pytest.raises(RayLaunchError) as raised:
        launch_on_ray(2, run_dir=tmp_path / "run")

    assert raised.value.problem.startswith("Ray is not importable")
    assert raised.value.remedy == "install it: pip install 'startup-orchestrator[torch,ray]'"
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs Ray installed")
def test_without_a_cluster_the_error_says_to_call_ray_init(tmp_path: Path) -> None:
    import ray

    assert not ray.is_initialized()
    with pytest.raises(RayLaunchError, match=r"call ray\.init\(\) first"):
        launch_on_ray(2, run_dir=tmp_path / "run")

    assert not ray.is_initialized()  # no cluster was started on the caller's behalf
    assert not (tmp_path / "run").exists()


def test_without_torch_on_the_driver_the_error_offers_no_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cluster is connected (as far as the driver asks), torch is not there.
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch.distributed", None)

    with pytest.raises(RayLaunchError) as raised:
        launch_on_ray(2, run_dir=tmp_path / "run")

    assert raised.value.problem.startswith("torch is not importable on the driver")
    assert raised.value.remedy == (
        "install it (pip install 'startup-orchestrator[torch,ray]'), or pass process_group=False"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("faults", "expected"),
    [
        (["7:flash_attn=RuntimeError:x"], "rank 7"),
        (["nonexistent_module_xyz=RuntimeError:x"], "nonexistent_module_xyz"),
        (["flash_attn"], "flash_attn"),
    ],
)
def test_a_fault_the_launch_cannot_inject_is_refused_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, faults: list[str], expected: str
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # checked before Ray is needed

    with pytest.raises(FaultSpecError, match=expected):
        launch_on_ray(4, faults=faults, run_dir=tmp_path / "run")

    assert not (tmp_path / "run").exists()


def test_a_bad_run_id_is_refused_first(tmp_path: Path) -> None:
    with pytest.raises(RankEnvironmentError, match="a run id is"):
        launch_on_ray(2, run_id="no spaces/allowed", runs_root=tmp_path)

    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "options",
    [
        {"world_size": 0},
        {"world_size": 2, "timeout_s": 0},
        {"world_size": 2, "group_timeout_s": -1},
    ],
)
def test_bad_sizes_and_timeouts_are_value_errors(tmp_path: Path, options: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be"):
        launch_on_ray(runs_root=tmp_path, **options)

    assert list(tmp_path.iterdir()) == []


def identity(rank: int, local_rank: int, local_world_size: int, node_rank: int) -> RankIdentity:
    return RankIdentity(
        rank=rank,
        local_rank=local_rank,
        world_size=4,
        local_world_size=local_world_size,
        node_rank=node_rank,
    )


def test_ranks_are_numbered_node_by_node_the_drivers_node_first() -> None:
    identities = rank_identities(["node-b", "node-a", "node-b", "node-a"], driver_node="node-a")

    assert identities == [
        identity(2, 0, 2, 1),  # created first, on the other node
        identity(0, 0, 2, 0),
        identity(3, 1, 2, 1),
        identity(1, 1, 2, 0),
    ]


def test_without_an_actor_on_the_drivers_node_the_first_node_seen_is_node_0() -> None:
    identities = rank_identities(["node-x", "node-y", "node-x", "node-x"], driver_node="driver")

    assert [(i.rank, i.node_rank, i.local_rank) for i in identities] == [
        (0, 0, 0),
        (3, 1, 0),
        (1, 0, 1),
        (2, 0, 2),
    ]


def test_an_actor_never_placed_gets_the_last_rank() -> None:
    identities = rank_identities([None, "node-a", "node-a", "node-a"], driver_node="node-a")

    assert [i.rank for i in identities] == [3, 0, 1, 2]
    assert identities[0].node_rank == 1
