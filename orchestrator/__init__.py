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

import typing

from events._surface import Surface as _Surface

# Every public name is declared once, here: the type checkers' re-exports,
# and at run time (events/_surface.py) the table of what loads on first
# use (PEP 562), with __all__ and dir(), so importing the package for one
# thing (the command line's --help) does not import everything.
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
    from ._graph import Graph as Graph
    from ._graph import Isolation as Isolation
    from ._graph import Step as Step
    from ._group import Group as Group
    from ._group import GroupError as GroupError
    from ._group import LocalGroup as LocalGroup
    from ._group import Mailbox as Mailbox
    from ._group import TorchDistributedGroup as TorchDistributedGroup
    from ._identity import RUN_ID_VARIABLE as RUN_ID_VARIABLE
    from ._identity import new_run_id as new_run_id
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
    from ._runner import run as run
    from ._startup import Startup as Startup
    from ._startup import StartupResult as StartupResult

_SURFACE = _Surface(globals())
