"""Rank identity and run id from the launcher environment."""

from __future__ import annotations

import re

import pytest

from events import MAX_WORLD_SIZE, RankIdentity
from orchestrator import RUN_ID_VARIABLE, RankEnvironmentError, new_run_id
from orchestrator._identity import identity_from_environment, run_id_from_environment

TORCHRUN = {
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "16",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
}


def test_torchrun_variables() -> None:
    assert identity_from_environment(TORCHRUN) == RankIdentity(
        rank=5, local_rank=1, world_size=16, local_world_size=4, node_rank=1
    )


def test_open_mpi_variables_as_mpirun_sets_them() -> None:
    # Rank 6 of 8, four a node, as Open MPI 4's mpirun sets it: its
    # OMPI_COMM_WORLD_NODE_RANK is the rank among the node's processes (2),
    # not the node (1); read as the node, it was refused as past the count.
    env = {
        "OMPI_COMM_WORLD_RANK": "6",
        "OMPI_COMM_WORLD_LOCAL_RANK": "2",
        "OMPI_COMM_WORLD_SIZE": "8",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "OMPI_COMM_WORLD_NODE_RANK": "2",
    }
    assert identity_from_environment(env) == RankIdentity(
        rank=6, local_rank=2, world_size=8, local_world_size=4, node_rank=1
    )
    one_node = {**env, "OMPI_COMM_WORLD_LOCAL_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "6"}
    one_node["OMPI_COMM_WORLD_NODE_RANK"] = "6"
    assert identity_from_environment(one_node).node_rank == 0


def test_no_variables_is_rank_zero_of_one() -> None:
    assert identity_from_environment({}) == RankIdentity(
        rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0
    )


def test_missing_local_values_are_derived() -> None:
    identity = identity_from_environment({"RANK": "6", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"})
    assert (identity.local_rank, identity.node_rank) == (2, 1)
    alone = identity_from_environment({"RANK": "3", "WORLD_SIZE": "4"})
    assert (alone.local_rank, alone.local_world_size, alone.node_rank) == (3, 4, 0)


def test_blank_values_count_as_unset() -> None:
    assert identity_from_environment({"RANK": " ", "WORLD_SIZE": ""}) == RankIdentity()


def test_values_may_be_overridden_in_code() -> None:
    identity = identity_from_environment(TORCHRUN, rank=7, local_rank=3)
    assert (identity.rank, identity.local_rank, identity.world_size) == (7, 3, 16)
    assert identity_from_environment({}, rank=1, world_size=2).rank == 1


@pytest.mark.parametrize(
    ("environ", "overrides", "variable", "value"),
    [
        ({"RANK": "16", "WORLD_SIZE": "16"}, {}, "RANK", 16),
        ({"RANK": "two"}, {}, "RANK", "two"),
        ({"RANK": "1.0", "WORLD_SIZE": "2"}, {}, "RANK", "1.0"),
        ({"RANK": "-1"}, {}, "RANK", "-1"),
        ({"WORLD_SIZE": "0"}, {}, "WORLD_SIZE", 0),
        ({"WORLD_SIZE": "eight"}, {}, "WORLD_SIZE", "eight"),
        ({"WORLD_SIZE": "65537"}, {}, "WORLD_SIZE", 65537),
        ({"WORLD_SIZE": "1" + "0" * 30}, {}, "WORLD_SIZE", 10**30),
        ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "0"}, {}, "LOCAL_WORLD_SIZE", 0),
        ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "16"}, {}, "LOCAL_WORLD_SIZE", 16),
        ({**TORCHRUN, "LOCAL_RANK": "4"}, {}, "LOCAL_RANK", 4),
        ({**TORCHRUN, "GROUP_RANK": "4"}, {}, "GROUP_RANK", 4),
        ({}, {"rank": 1}, "RANK", 1),
        ({}, {"world_size": True}, "WORLD_SIZE", True),
        ({}, {"local_rank": -2}, "LOCAL_RANK", -2),
    ],
)
def test_inconsistent_values_are_rank_environment_errors(
    environ: dict[str, str], overrides: dict[str, int], variable: str, value: object
) -> None:
    with pytest.raises(RankEnvironmentError) as raised:
        identity_from_environment(environ, **overrides)
    assert raised.value.variable == variable
    assert raised.value.value == value
    assert type(raised.value.value) is type(value)
    assert str(raised.value).startswith(f"{variable}={value!r}: ")


def test_the_error_says_what_is_wrong() -> None:
    with pytest.raises(RankEnvironmentError) as raised:
        identity_from_environment({"RANK": "16", "WORLD_SIZE": "16"})
    assert raised.value.reason == "must be below WORLD_SIZE=16 (ranks are 0-based)"


def test_run_id_precedence() -> None:
    both = {RUN_ID_VARIABLE: "ours-1", "TORCHELASTIC_RUN_ID": "torchrun-1"}
    assert run_id_from_environment(both) == "ours-1"
    assert run_id_from_environment({"TORCHELASTIC_RUN_ID": "torchrun-1"}) == "torchrun-1"
    assert run_id_from_environment({"TORCHELASTIC_RUN_ID": "none"}) is None
    assert run_id_from_environment({RUN_ID_VARIABLE: " ", "TORCHELASTIC_RUN_ID": "t"}) == "t"
    assert run_id_from_environment({}) is None


def test_a_restarted_torchrun_worker_group_is_a_run_of_its_own() -> None:
    first = {"TORCHELASTIC_RUN_ID": "job-7", "TORCHELASTIC_RESTART_COUNT": "0"}
    assert run_id_from_environment(first) == "job-7"
    restarted = {**first, "TORCHELASTIC_RESTART_COUNT": "1"}
    assert run_id_from_environment(restarted) == "job-7-restart-1"
    again = {**first, "TORCHELASTIC_RESTART_COUNT": "2"}
    assert run_id_from_environment(again) == "job-7-restart-2"
    # Our own variable names the run whatever torchrun restarted.
    assert run_id_from_environment({**again, RUN_ID_VARIABLE: "ours-1"}) == "ours-1"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        (RUN_ID_VARIABLE, "../etc"),
        (RUN_ID_VARIABLE, "a" * 129),
        ("TORCHELASTIC_RUN_ID", "has space"),
        ("TORCHELASTIC_RUN_ID", "-leading-dash"),
    ],
)
def test_a_run_id_that_cannot_name_a_directory_is_rejected(variable: str, value: str) -> None:
    with pytest.raises(RankEnvironmentError) as raised:
        run_id_from_environment({variable: value})
    assert raised.value.variable == variable
    assert raised.value.value == value


def test_new_run_ids_are_valid_and_unique() -> None:
    first, second = new_run_id(), new_run_id()
    assert first != second
    assert re.fullmatch(r"\d{8}T\d{6}-[0-9a-f]{6}", first)
    assert run_id_from_environment({RUN_ID_VARIABLE: first}) == first


def test_slurm_nodes_of_unequal_shares_each_count_their_own_tasks() -> None:
    # srun -n 5 over two nodes of 2 and 3 free CPUs: SLURM_TASKS_PER_NODE
    # is "2,3". The third task of node 1 was refused (SLURM_LOCALID=2 "must
    # be below SLURM_NTASKS_PER_NODE=2", a variable nobody set), and the
    # last node of "1(x2),3" was past the node count.
    def task(layout: str, rank: int, local_rank: int, node: int) -> RankIdentity:
        return identity_from_environment(
            {
                "SLURM_PROCID": str(rank),
                "SLURM_LOCALID": str(local_rank),
                "SLURM_NODEID": str(node),
                "SLURM_NTASKS": "5",
                "SLURM_TASKS_PER_NODE": layout,
            }
        )

    assert task("2,3", 4, 2, 1) == RankIdentity(
        rank=4, local_rank=2, world_size=5, local_world_size=3, node_rank=1
    )
    assert task("2,3", 1, 1, 0).local_world_size == 2
    assert task("1(x2),3", 4, 2, 2) == RankIdentity(
        rank=4, local_rank=2, world_size=5, local_world_size=3, node_rank=2
    )
    assert task("1(x2),3", 1, 0, 1).local_world_size == 1
    with pytest.raises(RankEnvironmentError, match=r"^SLURM_LOCALID=3: "):
        task("2,3", 4, 3, 1)


def test_torchrun_started_by_srun_is_read_as_torchrun() -> None:
    # srun starts one torchrun per node and torchrun its workers: a worker
    # holds the node's SLURM task and its own torchrun rank; the torchrun
    # rank is the worker's.
    env = {
        **TORCHRUN,
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "4",
        "SLURM_NODEID": "1",
    }
    assert identity_from_environment(env) == RankIdentity(
        rank=5, local_rank=1, world_size=16, local_world_size=4, node_rank=1
    )


def test_a_slurm_task_without_its_world_size_is_refused_by_its_rank() -> None:
    # SLURM_PROCID alone says the process is a SLURM task: its rank is read
    # and checked against a world of one, not dropped for rank 0.
    with pytest.raises(RankEnvironmentError) as raised:
        identity_from_environment({"SLURM_PROCID": "3"})
    assert (raised.value.variable, raised.value.value) == ("SLURM_PROCID", 3)


def test_the_largest_world_is_accepted() -> None:
    identity = identity_from_environment(
        {"RANK": str(MAX_WORLD_SIZE - 1), "WORLD_SIZE": str(MAX_WORLD_SIZE)}
    )
    assert (identity.rank, identity.world_size) == (MAX_WORLD_SIZE - 1, MAX_WORLD_SIZE)


def test_a_slurm_job_names_the_run_only_for_its_tasks() -> None:
    # A shell of an allocation (salloc) has a job id but is no task of a
    # step: each run started from it is a run of its own.
    assert run_id_from_environment({"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "3"}) is None
    task = {"SLURM_JOB_ID": "42", "SLURM_STEP_ID": "3", "SLURM_PROCID": "0"}
    assert run_id_from_environment(task) == "slurm-42-3"


def test_an_open_mpi_job_names_the_run_only_for_its_processes() -> None:
    # The namespace mpirun gives its processes, kept to what names a
    # directory; a shell that merely inherited it is no process of the job.
    namespace = {"PMIX_NAMESPACE": "prterun-node1-1234@1"}
    assert run_id_from_environment(namespace) is None
    process = {**namespace, "OMPI_COMM_WORLD_RANK": "3"}
    assert run_id_from_environment(process) == "ompi-prterun-node1-1234-1"
    older = {"OMPI_MCA_ess_base_jobid": "2749628417", "OMPI_COMM_WORLD_RANK": "0"}
    assert run_id_from_environment(older) == "ompi-2749628417"


def test_a_slurm_node_runs_the_tasks_its_layout_gives_it_not_the_most_it_may_run() -> None:
    # srun -N2 -n6 --ntasks-per-node=4: SLURM_NTASKS_PER_NODE=4 is the most
    # a node may run; SLURM_TASKS_PER_NODE="4,2" is what each runs.
    def task(rank: int, local_rank: int, node: int, **more: str) -> RankIdentity:
        env = {
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(local_rank),
            "SLURM_NODEID": str(node),
            "SLURM_NTASKS": "6",
            "SLURM_NTASKS_PER_NODE": "4",
            **more,
        }
        return identity_from_environment(env)

    assert task(5, 1, 1, SLURM_TASKS_PER_NODE="4,2").local_world_size == 2
    assert task(1, 1, 0, SLURM_TASKS_PER_NODE="4,2").local_world_size == 4
    # Without a layout, the most asked for is all there is to go by.
    assert task(5, 1, 1).local_world_size == 4
