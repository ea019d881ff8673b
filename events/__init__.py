"""Immutable startup events, append-only logs and pure reducers.

This package is pure data and pure functions: it imports neither anyio nor
OpenTelemetry, and only the log modules touch files. Use it on its own to
write, read, validate, merge and fold startup logs::

    from events import JsonlLog, Timeline, fold, read_log

    contents = read_log("startup-runs/RUN/rank-0.jsonl")
    timeline = fold(Timeline(), contents.events)

It is the generic kernel: it names no step of any particular graph. Whoever
owns a set of steps says what they mean in a :class:`Slice` (message rules,
facts, report columns, agreements) and passes it to :func:`replay` and the
projections; without one, every graph gets the generic messages and state.
"""

import importlib
import typing

if typing.TYPE_CHECKING:
    from ._codec import UPCASTERS as UPCASTERS
    from ._codec import Upcaster as Upcaster
    from ._codec import Upcasters as Upcasters
    from ._codec import decode as decode
    from ._codec import decode_exception as decode_exception
    from ._codec import decode_record as decode_record
    from ._codec import encode as encode
    from ._codec import encode_exception as encode_exception
    from ._codec import encode_record as encode_record
    from ._errors import DecodeError as DecodeError
    from ._errors import EventsError as EventsError
    from ._errors import FoldError as FoldError
    from ._errors import ForeignEventError as ForeignEventError
    from ._errors import LogClosedError as LogClosedError
    from ._errors import LogCorruptError as LogCorruptError
    from ._errors import LogError as LogError
    from ._errors import SequenceGapError as SequenceGapError
    from ._errors import StreamMismatchError as StreamMismatchError
    from ._errors import UnknownEventTypeError as UnknownEventTypeError
    from ._errors import UnsupportedVersionError as UnsupportedVersionError
    from ._exception_info import ExceptionInfo as ExceptionInfo
    from ._exception_info import FrameInfo as FrameInfo
    from ._exception_info import Redactor as Redactor
    from ._launch import LaunchRecord as LaunchRecord
    from ._launch import RankProcess as RankProcess
    from ._log import Durability as Durability
    from ._log import EventLog as EventLog
    from ._log import JsonlLog as JsonlLog
    from ._log import MemoryLog as MemoryLog
    from ._log import Subscription as Subscription
    from ._messages import GroupedMessage as GroupedMessage
    from ._messages import Message as Message
    from ._messages import Messages as Messages
    from ._messages import MessagesState as MessagesState
    from ._messages import RankMessages as RankMessages
    from ._messages import format_ranks as format_ranks
    from ._messages import group_messages as group_messages
    from ._messages import span_severity as span_severity
    from ._messages import step_severity as step_severity
    from ._messages import step_severity_hook as step_severity_hook
    from ._model import EVENT_TYPES as EVENT_TYPES
    from ._model import SCHEMA_VERSION as SCHEMA_VERSION
    from ._model import TERMINAL_STEP_EVENTS as TERMINAL_STEP_EVENTS
    from ._model import DecisionMade as DecisionMade
    from ._model import Event as Event
    from ._model import JsonValue as JsonValue
    from ._model import Outcome as Outcome
    from ._model import RankIdentity as RankIdentity
    from ._model import RunFinished as RunFinished
    from ._model import RunOutcome as RunOutcome
    from ._model import RunStarted as RunStarted
    from ._model import StepCancelled as StepCancelled
    from ._model import StepCrashed as StepCrashed
    from ._model import StepFailed as StepFailed
    from ._model import StepKind as StepKind
    from ._model import StepStarted as StepStarted
    from ._model import StepSucceeded as StepSucceeded
    from ._model import StepTimedOut as StepTimedOut
    from ._model import StepUnavailable as StepUnavailable
    from ._model import outcome_of as outcome_of
    from ._policy import DEFAULT_POLICY as DEFAULT_POLICY
    from ._policy import PolicyError as PolicyError
    from ._policy import SeverityPolicy as SeverityPolicy
    from ._rank_state import RankState as RankState
    from ._rank_state import RootCause as RootCause
    from ._reader import LogContents as LogContents
    from ._reader import LogProblem as LogProblem
    from ._reader import ProblemKind as ProblemKind
    from ._reader import TornTail as TornTail
    from ._reader import merge as merge
    from ._reader import read_log as read_log
    from ._reader import validate as validate
    from ._reducers import Composite as Composite
    from ._reducers import Projection as Projection
    from ._reducers import Reducer as Reducer
    from ._reducers import fold as fold
    from ._severity import Scope as Scope
    from ._severity import Severity as Severity
    from ._slices import Agreement as Agreement
    from ._slices import Column as Column
    from ._slices import MessageContext as MessageContext
    from ._slices import MessageHook as MessageHook
    from ._slices import MessageRule as MessageRule
    from ._slices import Slice as Slice
    from ._state import Divergence as Divergence
    from ._state import RankStates as RankStates
    from ._state import Replay as Replay
    from ._state import find_divergences as find_divergences
    from ._state import replay as replay
    from ._state import root_cause as root_cause
    from ._timeline import RankTimeline as RankTimeline
    from ._timeline import StepTiming as StepTiming
    from ._timeline import Timeline as Timeline
    from ._timeline import TimelineState as TimelineState

# Public names load on first use (PEP 562), so importing the package for one
# thing (the command line's --help) does not import everything.
_LAZY = {
    "UPCASTERS": "._codec",
    "Upcaster": "._codec",
    "Upcasters": "._codec",
    "decode": "._codec",
    "decode_exception": "._codec",
    "decode_record": "._codec",
    "encode": "._codec",
    "encode_exception": "._codec",
    "encode_record": "._codec",
    "Divergence": "._state",
    "RankState": "._rank_state",
    "RankStates": "._state",
    "Replay": "._state",
    "RootCause": "._rank_state",
    "find_divergences": "._state",
    "replay": "._state",
    "root_cause": "._state",
    "DecodeError": "._errors",
    "EventsError": "._errors",
    "FoldError": "._errors",
    "ForeignEventError": "._errors",
    "LogClosedError": "._errors",
    "LogCorruptError": "._errors",
    "LogError": "._errors",
    "SequenceGapError": "._errors",
    "StreamMismatchError": "._errors",
    "UnknownEventTypeError": "._errors",
    "UnsupportedVersionError": "._errors",
    "ExceptionInfo": "._exception_info",
    "FrameInfo": "._exception_info",
    "Redactor": "._exception_info",
    "LaunchRecord": "._launch",
    "RankProcess": "._launch",
    "Durability": "._log",
    "EventLog": "._log",
    "JsonlLog": "._log",
    "MemoryLog": "._log",
    "Subscription": "._log",
    "DEFAULT_POLICY": "._policy",
    "GroupedMessage": "._messages",
    "Message": "._messages",
    "Messages": "._messages",
    "MessagesState": "._messages",
    "PolicyError": "._policy",
    "RankMessages": "._messages",
    "SeverityPolicy": "._policy",
    "format_ranks": "._messages",
    "group_messages": "._messages",
    "span_severity": "._messages",
    "step_severity": "._messages",
    "step_severity_hook": "._messages",
    "EVENT_TYPES": "._model",
    "SCHEMA_VERSION": "._model",
    "TERMINAL_STEP_EVENTS": "._model",
    "DecisionMade": "._model",
    "Event": "._model",
    "JsonValue": "._model",
    "Outcome": "._model",
    "RankIdentity": "._model",
    "RunFinished": "._model",
    "RunOutcome": "._model",
    "RunStarted": "._model",
    "StepCancelled": "._model",
    "StepCrashed": "._model",
    "StepFailed": "._model",
    "StepKind": "._model",
    "StepStarted": "._model",
    "StepSucceeded": "._model",
    "StepTimedOut": "._model",
    "StepUnavailable": "._model",
    "outcome_of": "._model",
    "LogContents": "._reader",
    "LogProblem": "._reader",
    "ProblemKind": "._reader",
    "TornTail": "._reader",
    "merge": "._reader",
    "read_log": "._reader",
    "validate": "._reader",
    "Composite": "._reducers",
    "Projection": "._reducers",
    "Reducer": "._reducers",
    "fold": "._reducers",
    "Scope": "._severity",
    "Severity": "._severity",
    "Agreement": "._slices",
    "Column": "._slices",
    "MessageContext": "._slices",
    "MessageHook": "._slices",
    "MessageRule": "._slices",
    "Slice": "._slices",
    "RankTimeline": "._timeline",
    "StepTiming": "._timeline",
    "Timeline": "._timeline",
    "TimelineState": "._timeline",
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
    "DEFAULT_POLICY",
    "EVENT_TYPES",
    "SCHEMA_VERSION",
    "TERMINAL_STEP_EVENTS",
    "UPCASTERS",
    "Agreement",
    "Column",
    "Composite",
    "DecisionMade",
    "DecodeError",
    "Divergence",
    "Durability",
    "Event",
    "EventLog",
    "EventsError",
    "ExceptionInfo",
    "FoldError",
    "ForeignEventError",
    "FrameInfo",
    "GroupedMessage",
    "JsonValue",
    "JsonlLog",
    "LaunchRecord",
    "LogClosedError",
    "LogContents",
    "LogCorruptError",
    "LogError",
    "LogProblem",
    "MemoryLog",
    "Message",
    "MessageContext",
    "MessageHook",
    "MessageRule",
    "Messages",
    "MessagesState",
    "Outcome",
    "PolicyError",
    "ProblemKind",
    "Projection",
    "RankIdentity",
    "RankMessages",
    "RankProcess",
    "RankState",
    "RankStates",
    "RankTimeline",
    "Redactor",
    "Reducer",
    "Replay",
    "RootCause",
    "RunFinished",
    "RunOutcome",
    "RunStarted",
    "Scope",
    "SequenceGapError",
    "Severity",
    "SeverityPolicy",
    "Slice",
    "StepCancelled",
    "StepCrashed",
    "StepFailed",
    "StepKind",
    "StepStarted",
    "StepSucceeded",
    "StepTimedOut",
    "StepTiming",
    "StepUnavailable",
    "StreamMismatchError",
    "Subscription",
    "Timeline",
    "TimelineState",
    "TornTail",
    "UnknownEventTypeError",
    "UnsupportedVersionError",
    "Upcaster",
    "Upcasters",
    "decode",
    "decode_exception",
    "decode_record",
    "encode",
    "encode_exception",
    "encode_record",
    "find_divergences",
    "fold",
    "format_ranks",
    "group_messages",
    "merge",
    "outcome_of",
    "read_log",
    "replay",
    "root_cause",
    "span_severity",
    "step_severity",
    "step_severity_hook",
    "validate",
]
