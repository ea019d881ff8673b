"""vLLM's own start, recorded in every one of its processes.

The entry point (:func:`orchestrator.recording.vllm_plugin`) runs once in
every vLLM process (the main process, each engine core, each worker, the
model-inspection subprocess) after vLLM detected its platform, and records
its start in ``$STARTUP_ORCHESTRATOR_RUNS/<run-id>/rank-<n>.jsonl``.

* **One run per launch.** The run id is ``STARTUP_ORCHESTRATOR_RUN_ID``
  when set; else the main process makes one and sets the variable, so every
  process it starts inherits it. Each process takes the lowest free log
  (the main process ``rank-0``), and records its role (``main``, ``engine
  core`` or ``engine core DP<d>``, ``worker TP<t>`` (``PP<p>``), ``model
  inspection``), its pid and its parent's pid in its identity.
* **Platform detection**, as issue-free as vLLM's own: vLLM resolved its
  platform before this plugin runs, so its platform plugins are run again,
  recorded (:class:`orchestrator.engine._vllm.VllmPlugins`: each plugin's
  answer and the reason it declined, from what vLLM logged), and the answer
  is compared with vLLM's (``platform.vllm_detected``).
* **The phases of the start** are steps under ``startup``, wrapped around
  vLLM's own functions (:data:`HOOKS`, checked against the installed
  release; a hook vLLM no longer has is left out with a warning):

  ======================  ==============================================
  main                    ``config`` (``EngineArgs.create_engine_config``,
                          with ``inspect_model`` below it when the model
                          is inspected in a subprocess), ``engine``
                          (``LLMEngine``/``AsyncLLM``), with
                          ``engine_core`` (starting the engine cores and
                          waiting for them) below it; ready after it
  engine core             ``workers`` (the executor: starting the workers
                          and waiting for them to load the model),
                          ``kv_cache`` (sizing, allocating, warming up);
                          ready when its busy loop starts
  worker                  ``worker_init`` (the worker class's constructor:
                          the CPU backend checks memory there),
                          ``distributed_init``, ``model_load``,
                          ``kv_cache_sizing``, ``kv_cache_allocation``,
                          ``warm_up``; ready after it
  model inspection        ``inspect_model``, until the process exits
  ======================  ==============================================

  A phase that raises is recorded with its exception chain, in the process
  where it happened, and that process's start fails with it; vLLM goes on
  as it would have.
* **Processes.** Each process started by a recorded one (engine cores by
  the main process, workers by an engine core) is a step under
  ``processes`` with its pid, ended ``crashed`` with its exit status or the
  signal that killed it if it ends before its parent's start does.

Nothing in vLLM's files changes: the hooks wrap attributes of vLLM's
classes in the recorded process only.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import logging
import multiprocessing
import os
import pkgutil
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from events import JsonlLog, RankIdentity

from .._identity import RUN_ID_VARIABLE, new_run_id
from .._policy import ANY_EXCEPTION_POLICY
from .._run_directory import claim_run_directory, rank_log_path
from .._vllm_releases import TESTED_RELEASES, installed_vllm_version, is_tested
from ._recorder import Recording

__all__ = ["HOOKS", "TESTED_RELEASES", "Hook", "record_this_process"]

_logger = logging.getLogger("orchestrator.recording")

#: This process's recording, once the plugin ran.
_RECORDING: Recording | None = None


@attrs.frozen(kw_only=True)
class Hook:
    """One vLLM function wrapped as a phase.

    Attributes:
        role: the processes it is installed in (``main``, ``engine core``,
            ``worker``).
        target: ``module:Class.attribute`` (or ``module:function``).
        phase: the step it becomes under ``startup``; ``None`` when it only
            marks readiness or announces processes.
        ready: the process's start is ready when it returns (or, for
            ``ready="enter"``, as soon as it is called).
        delegate: the attribute is reached through ``__getattr__`` (a
            worker wrapper forwarding to its worker): the wrapper is set on
            the class and forwards to ``self.worker``.
    """

    role: str
    target: str
    phase: str | None = None
    ready: str | None = None
    delegate: bool = False


_WRAPPER = "vllm.v1.worker.worker_base:WorkerWrapperBase."

#: What is wrapped, by role: ``(target, phase, ready, delegate)`` each.
_WRAPPED = {
    "main": (
        ("vllm.engine.arg_utils:EngineArgs.create_engine_config", "config", None, False),
        ("vllm.model_executor.models.registry:_run_in_subprocess", "inspect_model", None, False),
        ("vllm.v1.engine.llm_engine:LLMEngine.__init__", "engine", "exit", False),
        ("vllm.v1.engine.async_llm:AsyncLLM.__init__", "engine", "exit", False),
        ("vllm.v1.engine.core_client:EngineCoreClient.make_client", "engine_core", None, False),
        ("vllm.v1.engine.utils:CoreEngineProcManager.__init__", None, None, False),
    ),
    "engine core": (
        ("vllm.v1.executor.abstract:Executor.__init__", "workers", None, False),
        ("vllm.v1.engine.core:EngineCore._initialize_kv_caches", "kv_cache", None, False),
        ("vllm.v1.engine.core:EngineCoreProc.run_busy_loop", None, "enter", False),
        ("vllm.v1.engine.core:DPEngineCoreProc.run_busy_loop", None, "enter", False),
        ("vllm.v1.executor.multiproc_executor:WorkerProc.make_worker_process", None, None, False),
    ),
    "worker": (
        (_WRAPPER + "init_device", "distributed_init", None, False),
        (_WRAPPER + "load_model", "model_load", None, True),
        (_WRAPPER + "determine_available_memory", "kv_cache_sizing", None, True),
        (_WRAPPER + "initialize_from_config", "kv_cache_allocation", None, False),
        (_WRAPPER + "compile_or_warm_up_model", "warm_up", "exit", True),
    ),
}

#: What is wrapped, by role.
HOOKS: tuple[Hook, ...] = tuple(
    Hook(role=role, target=target, phase=phase, ready=ready, delegate=delegate)
    for role, rows in _WRAPPED.items()
    for target, phase, ready, delegate in rows
)


def record_this_process(directory: str) -> None:
    """Record this vLLM process's start under ``directory`` (once per
    process). It never fails vLLM: a recording that cannot start says why
    on stderr, once, and vLLM goes on."""
    global _RECORDING
    if _RECORDING is not None:
        return
    try:
        _RECORDING = _start(Path(directory))
    except Exception as exc:
        print(
            f"startup-orchestrator: not recording this vLLM process (pid {os.getpid()}): "
            f"{type(exc).__name__}: {exc}",
            file=sys.stderr,
        )


# --- who this process is ------------------------------------------------------------


def _role() -> tuple[str, str, int]:
    """``(kind, role, first)``: ``kind`` selects the hooks (``main``,
    ``engine core``, ``worker``, ``model inspection``), ``role`` names the
    process, ``first`` is where it starts looking for a free rank: 0 for the
    main process, after the engine core (1) for worker N (2 + N), so that a
    launch's ranks come out the same each time (a model inspection started
    first takes rank 1, and everyone after it moves on by one)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(spec, "name", None) == "vllm.model_executor.models.registry":
        return "model inspection", "model inspection", 1
    name = multiprocessing.current_process().name
    if name.startswith("EngineCore"):
        _, _, dp = name.partition("_")
        return "engine core", f"engine core {dp}".strip(), 1
    if not name.startswith("VllmWorker"):
        return "main", "main", 0
    # The global rank is in the process name; the parallel sizes are those
    # of the configuration the worker is being initialised with.
    rank_text = name.rpartition("-")[2]
    rank = int(rank_text) if rank_text.isdecimal() else 0
    parallel = next(_parallel_configs(), None)
    tp = int(getattr(parallel, "tensor_parallel_size", 1) or 1)
    pp = int(getattr(parallel, "pipeline_parallel_size", 1) or 1)
    role = f"worker TP{rank % tp}" + (f" PP{rank // tp}" if pp > 1 else "")
    return "worker", role, 2 + rank


def _parallel_configs() -> Iterator[Any]:
    """The ``vllm_config.parallel_config`` of each calling method's ``self``, innermost first."""
    frame = sys._getframe(1)
    while frame is not None:
        config = getattr(frame.f_locals.get("self"), "vllm_config", None)
        parallel = getattr(config, "parallel_config", None)
        if parallel is not None:
            yield parallel
        frame = frame.f_back  # type: ignore[assignment]


# --- starting the recording -----------------------------------------------------------


def _start(directory: Path) -> Recording:
    kind, role, first = _role()
    run_id = os.environ.get(RUN_ID_VARIABLE, "").strip()
    if not run_id:
        # Every process this one starts inherits it: one run per launch.
        run_id = os.environ[RUN_ID_VARIABLE] = new_run_id()
    run_dir = directory / run_id
    claim_run_directory(run_dir, run_id)
    log = _claim_log(run_dir, run_id, first=first)
    identity = RankIdentity(
        rank=log.rank, world_size=log.rank + 1, role=role, parent_pid=os.getppid()
    )
    version = installed_vllm_version()
    hooks, missing = _resolve(hook for hook in HOOKS if hook.role == kind)
    if kind == "worker":
        # A worker class that does not import is vLLM's error to report, not a missing hook.
        hooks += _resolve(_worker_class_hooks())[0]
    if missing or not is_tested(version):
        left_out = ", ".join(missing)
        _logger.warning(
            "recording vLLM %s (tested: %s)%s",
            version,
            ", ".join(TESTED_RELEASES),
            f"; not found in this release, so not recorded: {left_out}" if left_out else "",
        )
    from ..engine._config import EngineConfig
    from ..engine._platform import make_platform_step
    from ..engine._resolution import ENGINE_DECIDERS
    from ..engine._vllm import VllmPlugins

    config = EngineConfig()
    # vLLM already decided; its detection is recorded beside the start, and
    # what it finds never stops the recording of what vLLM does next.
    platform = attrs.evolve(
        make_platform_step(config, plugin_set=VllmPlugins(config, modelled=())),
        policy=ANY_EXCEPTION_POLICY,
    )
    recording = Recording(
        log,
        identity=identity,
        role=role,
        steps=(platform,),
        spawns=kind in ("main", "engine core"),
        deciders=ENGINE_DECIDERS,
        config={
            "recorded": "vllm",
            "vllm_version": version,
            "hooks": [hook.target for hook, _found in hooks],
            "missing_hooks": list(missing),
        },
    )
    recording.start()
    for hook, (owner, attribute) in hooks:
        _install(recording, hook, owner, attribute)
    if kind == "model inspection":
        _record_inspection(recording)
    else:
        atexit.register(recording.at_exit)
    return recording


def _claim_log(run_dir: Path, run_id: str, *, first: int) -> JsonlLog:
    """This process's log: the lowest free rank from ``first`` on, each
    created exclusively, so two processes never share one."""
    rank = first
    while True:
        try:
            return JsonlLog(rank_log_path(run_dir, rank), run_id=run_id, rank=rank, exclusive=True)
        except FileExistsError:
            rank += 1


def _resolve(hooks: Iterable[Hook]) -> tuple[list[tuple[Hook, tuple[Any, str]]], list[str]]:
    """``hooks`` found in the installed vLLM, with their ``(owner,
    attribute)``, and the targets not found."""
    found: list[tuple[Hook, tuple[Any, str]]] = []
    missing: list[str] = []
    for hook in hooks:
        module_name, _, path = hook.target.partition(":")
        owner_path, _, attribute = path.rpartition(".")
        try:
            owner: Any = pkgutil.resolve_name(f"{module_name}:{owner_path}")
            if not hook.delegate:
                getattr(owner, attribute)
        except (ImportError, AttributeError, ValueError):
            missing.append(hook.target)
            continue
        found.append((hook, (owner, attribute)))
    return found, missing


def _worker_class_hooks() -> list[Hook]:
    """The constructor of the worker class this worker is about to build
    (``parallel_config.worker_cls``, read off the worker wrapper that is
    initialising it, a caller of this plugin)."""
    for parallel in _parallel_configs():
        name = getattr(parallel, "worker_cls", None)
        if isinstance(name, str) and "." in name:
            module_name, _, class_name = name.rpartition(".")
            target = f"{module_name}:{class_name}.__init__"
            return [Hook(role="worker", target=target, phase="worker_init")]
    return []


# --- the hooks ------------------------------------------------------------------------


def _install(recording: Recording, hook: Hook, owner: Any, attribute: str) -> None:
    original: Any
    if hook.delegate:

        def original(self: Any, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.worker, attribute)(*args, **kwargs)

    else:
        original = inspect.getattr_static(owner, attribute)
    static = isinstance(original, staticmethod)
    function = original.__func__ if static else original

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if hook.ready == "enter":
            recording.finish()
            return function(*args, **kwargs)
        if hook.phase is None:
            result = function(*args, **kwargs)
            _announce_processes(recording, args, result)
            return result
        top_level = recording.depth == 0
        try:
            with recording.phase(hook.phase):
                result = function(*args, **kwargs)
        except BaseException as error:
            if top_level:
                # A phase of the start that fails ends the start with it.
                recording.finish(error)
            raise
        if hook.ready == "exit":
            recording.finish()
        return result

    setattr(owner, attribute, staticmethod(wrapper) if static else wrapper)


def _announce_processes(recording: Recording, args: tuple[Any, ...], result: Any) -> None:
    """Announce what a process-starting function started: an engine core
    manager's processes (its ``self``), a worker handle's process."""
    manager = args[0] if args else None
    for process in getattr(manager, "processes", None) or ():
        recording.spawned(str(process.name), process)
    process = getattr(result, "proc", None)
    if process is not None and getattr(process, "pid", None) is not None:
        recording.spawned(str(process.name), process)


def _record_inspection(recording: Recording) -> None:
    """The model-inspection subprocess runs one function and exits: its one
    phase lasts until then, and an uncaught exception is its failure."""
    # The start's end ends the phase with it (Recording.finish).
    recording.begin_phase("inspect_model")
    previous = sys.excepthook

    def excepthook(kind: type[BaseException], error: BaseException, traceback: Any) -> None:
        recording.finish(error)
        previous(kind, error, traceback)

    sys.excepthook = excepthook
    atexit.register(recording.finish)
