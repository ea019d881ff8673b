"""Run engine startup as an anyio task graph whose steps emit events.

In a launcher, one :class:`Startup` per rank process does it all (identity,
run id, run directory, log, logging, tracing, signals, process group)::

    from orchestrator import Startup

    with Startup() as startup:
        result = startup.run()

For your own probes, declare steps, run them on asyncio or trio, and get a
complete, replayable log whose outcomes follow the steps' error policies::

    import anyio
    from events import MemoryLog
    from orchestrator import Graph, Step, run

    def probe_numpy(ctx):
        ctx.import_module("numpy")
        return {"numpy": True}

    graph = Graph("mine", [Step(name="numpy", body=probe_numpy)])
    log = MemoryLog("run-1")
    result = anyio.run(run, graph, log)
"""

import importlib
import typing

if typing.TYPE_CHECKING:
    from ._candidates import Candidate as Candidate
    from ._candidates import CandidateReport as CandidateReport
    from ._candidates import ExplicitCandidateInvalidError as ExplicitCandidateInvalidError
    from ._candidates import NoValidCandidateError as NoValidCandidateError
    from ._candidates import Selection as Selection
    from ._candidates import select_candidate as select_candidate
    from ._context import StepBody as StepBody
    from ._context import StepContext as StepContext
    from ._context import StepResult as StepResult
    from ._context import Unavailable as Unavailable
    from ._decisions import DEFAULT_DECIDERS as DEFAULT_DECIDERS
    from ._decisions import Decider as Decider
    from ._decisions import check_decisions as check_decisions
    from ._errors import CycleError as CycleError
    from ._errors import DuplicateStepError as DuplicateStepError
    from ._errors import FaultSpecError as FaultSpecError
    from ._errors import GraphError as GraphError
    from ._errors import IsolatedStepError as IsolatedStepError
    from ._errors import OrchestratorError as OrchestratorError
    from ._errors import RankEnvironmentError as RankEnvironmentError
    from ._errors import StartupInterrupted as StartupInterrupted
    from ._errors import StepCrashedError as StepCrashedError
    from ._errors import StepTimeoutError as StepTimeoutError
    from ._errors import UnknownDependencyError as UnknownDependencyError
    from ._fallback import Attempt as Attempt
    from ._fallback import ChainResult as ChainResult
    from ._fallback import run_fallback_chain as run_fallback_chain
    from ._faults import Fault as Fault
    from ._faults import FaultAction as FaultAction
    from ._faults import FaultPlan as FaultPlan
    from ._faults import RankRanges as RankRanges
    from ._faults import parse_ranks as parse_ranks
    from ._graph import Graph as Graph
    from ._graph import Isolation as Isolation
    from ._graph import Step as Step
    from ._group import PROCESS_GROUP_STEP as PROCESS_GROUP_STEP
    from ._group import DeferredGroup as DeferredGroup
    from ._group import Group as Group
    from ._group import GroupError as GroupError
    from ._group import LocalGroup as LocalGroup
    from ._group import TorchDistributedGroup as TorchDistributedGroup
    from ._group import init_torch_distributed_group as init_torch_distributed_group
    from ._group import process_group_step as process_group_step
    from ._identity import RUN_ID_VARIABLE as RUN_ID_VARIABLE
    from ._identity import identity_from_environment as identity_from_environment
    from ._identity import new_run_id as new_run_id
    from ._identity import run_id_from_environment as run_id_from_environment
    from ._importer import Importer as Importer
    from ._importer import InjectingImporter as InjectingImporter
    from ._importer import RealImporter as RealImporter
    from ._policy import ANY_EXCEPTION_POLICY as ANY_EXCEPTION_POLICY
    from ._policy import PROBE_POLICY as PROBE_POLICY
    from ._policy import Action as Action
    from ._policy import Classification as Classification
    from ._policy import ErrorPolicy as ErrorPolicy
    from ._policy import Rule as Rule
    from ._policy import When as When
    from ._policy import optional_module_policy as optional_module_policy
    from ._run_directory import RunDirectoryError as RunDirectoryError
    from ._runner import Runner as Runner
    from ._runner import RunResult as RunResult
    from ._runner import SpanActivator as SpanActivator
    from ._runner import derive_trace_id as derive_trace_id
    from ._runner import run as run
    from ._startup import Startup as Startup
    from ._startup import StartupResult as StartupResult

# Public names load on first use (PEP 562), so importing the package for one
# thing (the command line's --help) does not import everything.
_LAZY = {
    "RunDirectoryError": "._run_directory",
    "StartupResult": "._startup",
    "Startup": "._startup",
    "RankRanges": "._faults",
    "process_group_step": "._group",
    "PROCESS_GROUP_STEP": "._group",
    "DeferredGroup": "._group",
    "StartupInterrupted": "._errors",
    "Candidate": "._candidates",
    "CandidateReport": "._candidates",
    "ExplicitCandidateInvalidError": "._candidates",
    "NoValidCandidateError": "._candidates",
    "Selection": "._candidates",
    "select_candidate": "._candidates",
    "StepContext": "._context",
    "StepResult": "._context",
    "Unavailable": "._context",
    "DEFAULT_DECIDERS": "._decisions",
    "Decider": "._decisions",
    "check_decisions": "._decisions",
    "CycleError": "._errors",
    "DuplicateStepError": "._errors",
    "FaultSpecError": "._errors",
    "GraphError": "._errors",
    "IsolatedStepError": "._errors",
    "OrchestratorError": "._errors",
    "RankEnvironmentError": "._errors",
    "StepCrashedError": "._errors",
    "StepTimeoutError": "._errors",
    "UnknownDependencyError": "._errors",
    "Attempt": "._fallback",
    "ChainResult": "._fallback",
    "run_fallback_chain": "._fallback",
    "Fault": "._faults",
    "FaultAction": "._faults",
    "FaultPlan": "._faults",
    "parse_ranks": "._faults",
    "Graph": "._graph",
    "Isolation": "._graph",
    "Step": "._graph",
    "StepBody": "._context",
    "Group": "._group",
    "GroupError": "._group",
    "LocalGroup": "._group",
    "TorchDistributedGroup": "._group",
    "init_torch_distributed_group": "._group",
    "RUN_ID_VARIABLE": "._identity",
    "identity_from_environment": "._identity",
    "new_run_id": "._identity",
    "run_id_from_environment": "._identity",
    "Importer": "._importer",
    "InjectingImporter": "._importer",
    "RealImporter": "._importer",
    "ANY_EXCEPTION_POLICY": "._policy",
    "PROBE_POLICY": "._policy",
    "Action": "._policy",
    "Classification": "._policy",
    "ErrorPolicy": "._policy",
    "Rule": "._policy",
    "When": "._policy",
    "optional_module_policy": "._policy",
    "Runner": "._runner",
    "RunResult": "._runner",
    "SpanActivator": "._runner",
    "derive_trace_id": "._runner",
    "run": "._runner",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "ANY_EXCEPTION_POLICY",
    "DEFAULT_DECIDERS",
    "PROBE_POLICY",
    "PROCESS_GROUP_STEP",
    "RUN_ID_VARIABLE",
    "Action",
    "Attempt",
    "Candidate",
    "CandidateReport",
    "ChainResult",
    "Classification",
    "CycleError",
    "Decider",
    "DeferredGroup",
    "DuplicateStepError",
    "ErrorPolicy",
    "ExplicitCandidateInvalidError",
    "Fault",
    "FaultAction",
    "FaultPlan",
    "FaultSpecError",
    "Graph",
    "GraphError",
    "Group",
    "GroupError",
    "Importer",
    "InjectingImporter",
    "IsolatedStepError",
    "Isolation",
    "LocalGroup",
    "NoValidCandidateError",
    "OrchestratorError",
    "RankEnvironmentError",
    "RankRanges",
    "RealImporter",
    "Rule",
    "RunDirectoryError",
    "RunResult",
    "Runner",
    "Selection",
    "SpanActivator",
    "Startup",
    "StartupInterrupted",
    "StartupResult",
    "Step",
    "StepBody",
    "StepContext",
    "StepCrashedError",
    "StepResult",
    "StepTimeoutError",
    "TorchDistributedGroup",
    "Unavailable",
    "UnknownDependencyError",
    "When",
    "check_decisions",
    "derive_trace_id",
    "identity_from_environment",
    "init_torch_distributed_group",
    "new_run_id",
    "optional_module_policy",
    "parse_ranks",
    "process_group_step",
    "run",
    "run_fallback_chain",
    "run_id_from_environment",
    "select_candidate",
]
