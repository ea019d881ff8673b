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

import typing

from ._surface import Surface as _Surface

# Every public name is declared once, here (see events/_surface.py).
if typing.TYPE_CHECKING:
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
    from ._errors import InvalidValueError as InvalidValueError
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
    from ._exception_info import ThreadStack as ThreadStack
    from ._launch import MAX_WORLD_SIZE as MAX_WORLD_SIZE
    from ._launch import LaunchRecord as LaunchRecord
    from ._launch import RankProcess as RankProcess
    from ._launch import implausible_world as implausible_world
    from ._launch import launch_span_id as launch_span_id
    from ._launch import signal_name as signal_name
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
    from ._model import StallReason as StallReason
    from ._model import StepCancelled as StepCancelled
    from ._model import StepCrashed as StepCrashed
    from ._model import StepFailed as StepFailed
    from ._model import StepKind as StepKind
    from ._model import StepStalled as StepStalled
    from ._model import StepStarted as StepStarted
    from ._model import StepSucceeded as StepSucceeded
    from ._model import StepTimedOut as StepTimedOut
    from ._model import StepUnavailable as StepUnavailable
    from ._model import Stop as Stop
    from ._model import outcome_of as outcome_of
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
    from ._slices import Collective as Collective
    from ._slices import Column as Column
    from ._slices import Loss as Loss
    from ._slices import MessageContext as MessageContext
    from ._slices import MessageHook as MessageHook
    from ._slices import MessageRule as MessageRule
    from ._slices import Slice as Slice
    from ._slices import cause_of as cause_of
    from ._slices import reason_of as reason_of
    from ._state import Divergence as Divergence
    from ._state import FoldedRank as FoldedRank
    from ._state import RankFolder as RankFolder
    from ._state import RankStates as RankStates
    from ._state import Replay as Replay
    from ._state import find_divergences as find_divergences
    from ._state import replay as replay
    from ._state import root_cause as root_cause
    from ._timeline import RankTimeline as RankTimeline
    from ._timeline import StepTiming as StepTiming
    from ._timeline import Timeline as Timeline
    from ._timeline import TimelineState as TimelineState

_SURFACE = _Surface(globals())
