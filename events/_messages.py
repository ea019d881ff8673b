"""The messages projection: severity-correct, once-per-rank messages.

Messages are derived from the events the engine writes (the step names and
payloads of :mod:`events._conventions`) by a pure projection and a severity
policy that is data. Each message has a stable ``code`` (SPEC §3.6), a
severity and a scope from the policy, the rank, a text that says what
happened and what to do, the step it belongs to and the sequence numbers of
the events behind it.

Derivation rules (``<p>``, ``<B>``, ``<b>`` are the last step segment, or the
candidate's ``plugin``/``candidate``/``backend`` attribute)::

    platform/<p> ends unavailable|failed with a cause   platform.plugin_failed
    platform ok                                         platform.detected
    platform ok after some plugin failed with a cause   platform.fallback (one per plugin)
    platform failed: PlatformConflictError              platform.conflict
    platform failed: UnspecifiedPlatformError           platform.unspecified
    platform/cpu/zentorch ok | absent | unavailable     zentorch.loaded | .absent | .broken
    attention/<B> unavailable|absent | invalid          attention.backend_unavailable | _invalid
    attention ok (automatic | explicit)                 attention.selected | .explicit_selected
    attention failed: ValueError "Selected backend..."  attention.explicit_invalid
    attention failed: ValueError "No valid..."          attention.none_valid
    flashinfer_comm unavailable                         flashinfer_comm.unavailable
      (absent, i.e. flashinfer not installed, is the expected case: no message)
    allreduce_workspace/<b> attempt ends unavailable,   allreduce.attempt_failed, derived when
      failed, timed out or crashed, fallback_left      the next attempt starts (its backend
                                                       names the fallback) or, failing that,
                                                       when the parent step ends
    allreduce_workspace ok, enabled                     allreduce.workspace_ready
    allreduce_workspace ok, disabled, attempts ran      allreduce.workspace_failed
    allreduce_workspace/quant ends unavailable,         allreduce.quant_workspace_failed
      timed out or crashed (quantization fusion off)
    an error that reached the graph, not covered above  step.failed (its deepest step only)
    step.timed_out | step.crashed not covered above     step.timed_out | step.crashed
    run.finished ready | failed | interrupted           run.ready | run.failed | run.interrupted

A failure a parent step absorbed (the child ``step.failed``, the parent
``step.unavailable`` with the same cause) is not a ``step.failed`` message:
the parent's outcome says what happened. A propagating error is reported
once, on the deepest step, when it reaches a graph step (the run fails).
Cross-rank divergences (``allreduce.divergence`` ...) are derived by
:func:`events.find_divergences`, not here.

Once per rank: a rank derives a given ``(code, args)`` at most once, and the
set of seen keys is never evicted. Scope decides where the live run prints a
message (:attr:`Message.printed`): ``process`` every rank, ``local`` local rank
0, ``global`` global rank 0; an ERROR is printed wherever it happened.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from ._conventions import (
    ALLREDUCE_AGREE_STEP,
    ALLREDUCE_QUANT_STEP,
    ALLREDUCE_STEP,
    ATTENTION_STEP,
    FLASHINFER_COMM_STEP,
    PLATFORM_STEP,
    ZENTORCH_STEP,
)
from ._errors import EventsError
from ._exception_info import ExceptionInfo
from ._model import (
    TERMINAL_STEP_EVENTS,
    Event,
    JsonValue,
    Outcome,
    RankIdentity,
    RunFinished,
    RunOutcome,
    RunStarted,
    StepCrashed,
    StepFailed,
    StepKind,
    StepStarted,
    StepSucceeded,
    StepTimedOut,
    StepUnavailable,
    outcome_of,
)
from ._severity import Severity

__all__ = [
    "DEFAULT_POLICY",
    "GroupedMessage",
    "Message",
    "Messages",
    "MessagesState",
    "PolicyError",
    "RankMessages",
    "Scope",
    "SeverityPolicy",
    "format_ranks",
    "group_messages",
    "span_severity",
    "step_severity",
    "step_severity_hook",
]


class Scope(enum.StrEnum):
    """Which ranks print a message live (as vLLM's ``*_once`` helpers).

    ``process`` every rank; ``local`` only local rank 0 of each node;
    ``global`` only global rank 0. An ERROR ignores scope.
    """

    PROCESS = "process"
    LOCAL = "local"
    GLOBAL = "global"


class PolicyError(EventsError, ValueError):
    """A severity policy document is malformed.

    Attributes:
        reason: what is wrong and what would be valid.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"invalid severity policy: {reason}")


#: A rule: the severity and scope of one message code.
Rule = tuple[Severity, Scope]

_DEBUG, _INFO, _WARNING, _ERROR = Severity.DEBUG, Severity.INFO, Severity.WARNING, Severity.ERROR
_PROCESS, _LOCAL, _GLOBAL = Scope.PROCESS, Scope.LOCAL, Scope.GLOBAL

#: SPEC §3.6, row by row, then the codes this release adds to it.
_TABLE: dict[str, Rule] = {
    "platform.plugin_failed": (_DEBUG, _PROCESS),
    "platform.detected": (_INFO, _LOCAL),
    "platform.fallback": (_WARNING, _PROCESS),
    "platform.conflict": (_ERROR, _PROCESS),
    "platform.unspecified": (_ERROR, _PROCESS),
    "zentorch.loaded": (_INFO, _LOCAL),
    "zentorch.absent": (_DEBUG, _LOCAL),
    "zentorch.broken": (_WARNING, _LOCAL),
    "attention.backend_unavailable": (_DEBUG, _PROCESS),
    "attention.backend_invalid": (_DEBUG, _PROCESS),
    "attention.selected": (_INFO, _LOCAL),
    "attention.explicit_selected": (_INFO, _LOCAL),
    "attention.explicit_invalid": (_ERROR, _PROCESS),
    "attention.none_valid": (_ERROR, _PROCESS),
    "flashinfer_comm.unavailable": (_DEBUG, _LOCAL),
    "allreduce.attempt_failed": (_WARNING, _LOCAL),
    "allreduce.workspace_ready": (_INFO, _LOCAL),
    "allreduce.workspace_failed": (_ERROR, _PROCESS),
    "allreduce.divergence": (_ERROR, _GLOBAL),
    # Added: a terminal failure, ERROR once per rank as its plain sibling.
    "allreduce.quant_workspace_failed": (_ERROR, _PROCESS),
    "step.failed": (_ERROR, _PROCESS),
    "step.timed_out": (_ERROR, _PROCESS),
    "step.crashed": (_ERROR, _PROCESS),
    "run.ready": (_INFO, _GLOBAL),
    "run.failed": (_ERROR, _PROCESS),
    "run.interrupted": (_ERROR, _PROCESS),
}

#: Codes outside the table that this release derives (cross-rank findings the
#: table does not name). A policy may override them like any other code.
_EXTENSION_RULES: dict[str, Rule] = {
    # Mixed platforms in one launch cannot run one collective program.
    "platform.divergence": (_ERROR, _GLOBAL),
    # Different attention kernels still run; outputs and speed may differ.
    "attention.divergence": (_WARNING, _GLOBAL),
}


def _rules(value: Mapping[str, Rule]) -> dict[str, Rule]:
    return {code: (Severity(rule[0]), Scope(rule[1])) for code, rule in value.items()}


@attrs.frozen(kw_only=True)
class SeverityPolicy:
    """Which severity and scope each message code has: data, versioned.

    A newer policy file re-derives the messages of an old log: fold the same
    events with ``Messages(policy=SeverityPolicy.from_json(text))``.

    Attributes:
        version: the policy's version (written in its JSON form).
        rules: code -> ``(severity, scope)``.
    """

    version: int = 1
    rules: Mapping[str, Rule] = attrs.field(factory=dict, converter=_rules)

    def rule(self, code: str) -> Rule:
        """The ``(severity, scope)`` of ``code``.

        Raises:
            KeyError: neither this policy nor this release knows ``code``.
        """
        found = self.rules.get(code) or _EXTENSION_RULES.get(code)
        if found is None:
            raise KeyError(f"no severity rule for message code {code!r}")
        return found

    def severity(self, code: str) -> Severity:
        """The severity of ``code``."""
        return self.rule(code)[0]

    def scope(self, code: str) -> Scope:
        """The scope of ``code``."""
        return self.rule(code)[1]

    def with_rule(
        self,
        code: str,
        *,
        severity: Severity | None = None,
        scope: Scope | None = None,
        version: int | None = None,
    ) -> SeverityPolicy:
        """A copy with ``code``'s severity and/or scope replaced (and
        ``version`` bumped by one unless given)."""
        old_severity, old_scope = self.rules.get(code) or _EXTENSION_RULES.get(
            code, (_ERROR, _PROCESS)
        )
        rules = dict(self.rules)
        rules[code] = (severity or old_severity, scope or old_scope)
        return SeverityPolicy(version=self.version + 1 if version is None else version, rules=rules)

    def to_json(self) -> str:
        """The policy as a JSON document::

        {"version": 1, "rules": {"zentorch.broken": {"severity": "warning",
                                                     "scope": "local"}, ...}}
        """
        document = {
            "version": self.version,
            "rules": {
                code: {"severity": severity.name.lower(), "scope": scope.value}
                for code, (severity, scope) in sorted(self.rules.items())
            },
        }
        return json.dumps(document, indent=2)

    @classmethod
    def from_json(
        cls, data: str | bytes | Mapping[str, Any], *, base: SeverityPolicy | None = None
    ) -> SeverityPolicy:
        """Read a policy written by :meth:`to_json` (text or parsed).

        Rules are laid over ``base`` (default :data:`DEFAULT_POLICY`), so a
        file may name only the codes it changes; a rule may leave out
        ``scope`` for a code ``base`` knows.

        Raises:
            PolicyError: not JSON, no integer ``version``, or a rule with an
                unknown severity or scope (the message names the code and the
                valid values).
        """
        if isinstance(data, str | bytes):
            try:
                parsed = json.loads(data)
            except ValueError as exc:
                raise PolicyError(f"not JSON ({exc})") from None
        else:
            parsed = data
        if not isinstance(parsed, Mapping):
            raise PolicyError('expected an object {"version": N, "rules": {...}}')
        version = parsed.get("version")
        if type(version) is not int or version < 1:
            raise PolicyError(f"'version' must be a positive integer, not {version!r}")
        raw_rules = parsed.get("rules", {})
        if not isinstance(raw_rules, Mapping):
            raise PolicyError("'rules' must map message codes to {severity, scope}")
        rules = dict((DEFAULT_POLICY if base is None else base).rules)
        for code, raw in raw_rules.items():
            rules[str(code)] = _parse_rule(str(code), raw, rules.get(str(code)))
        return cls(version=version, rules=rules)


def _parse_rule(code: str, raw: object, known: Rule | None) -> Rule:
    if not isinstance(raw, Mapping):
        raise PolicyError(f"rule {code!r} must be an object with 'severity' and 'scope'")
    try:
        severity = Severity.parse(str(raw.get("severity", "")))
    except ValueError as exc:
        raise PolicyError(f"rule {code!r}: {exc}") from None
    scope_text = raw.get("scope")
    if scope_text is None:
        if known is None:
            raise PolicyError(f"rule {code!r} needs a 'scope' (process, local or global)")
        return severity, known[1]
    try:
        scope = Scope(str(scope_text).strip().lower())
    except ValueError:
        valid = ", ".join(member.value for member in Scope)
        raise PolicyError(f"rule {code!r}: unknown scope {scope_text!r}; valid: {valid}") from None
    return severity, scope


#: The severities and scopes of SPEC §3.6.
DEFAULT_POLICY = SeverityPolicy(version=1, rules=_TABLE)


@attrs.frozen(kw_only=True)
class Message:
    """One derived message of one rank.

    Attributes:
        code: the stable code (``zentorch.broken``).
        severity, scope: from the policy.
        rank: the global rank it was derived on.
        text: what happened and what to do, one line.
        step: the step it belongs to (``""`` for the run itself); a candidate's
            or attempt's message belongs to that child step.
        seqs: the sequence numbers of the events behind it.
        args: what makes it unique on its rank (with ``code``).
        detail: the formatted traceback of the recorded exception, if any.
        printed: whether the live run prints it on this rank (scope applied;
            an ERROR is always printed).
        wall_ns: wall-clock time of the event that completed it.
    """

    code: str
    severity: Severity
    scope: Scope
    rank: int
    text: str
    step: str = ""
    seqs: tuple[int, ...] = ()
    args: tuple[str, ...] = ()
    detail: str | None = None
    printed: bool = True
    wall_ns: int = 0


@attrs.frozen(kw_only=True)
class _Failure:
    """A failure on its way up the step tree (or settled)."""

    step: str
    outcome: Outcome
    cause: ExceptionInfo | None
    seq: int
    wall_ns: int
    seqs: tuple[int, ...]
    #: a message was already derived for it (a timeout or crash)
    reported: bool = False


@attrs.frozen(kw_only=True)
class _PendingAttempt:
    """An all-reduce attempt that failed with a fallback left; its message
    waits for the next attempt, whose backend it names."""

    step: str
    backend: str
    verb: str
    reason: str
    seqs: tuple[int, ...]
    wall_ns: int
    outcome: Outcome


@attrs.frozen(kw_only=True)
class _Tracking:
    """What a rank's derivation remembers between events. Internal."""

    root_span_id: str | None = None
    torch_version: str | None = None
    open: Mapping[str, StepStarted] = attrs.field(factory=dict)
    failed_plugins: tuple[tuple[str, str, int], ...] = ()
    #: all-reduce attempts that ended: (backend, failure reason or None, seq)
    attempts: tuple[tuple[str, str | None, int], ...] = ()
    pending_attempt: _PendingAttempt | None = None
    failures: tuple[_Failure, ...] = ()


@attrs.frozen(kw_only=True)
class RankMessages:
    """One rank's messages.

    Attributes:
        rank: the global rank.
        identity: from ``run.started`` (``None`` before it).
        messages: in the order they were derived.
        seen: the ``(code, args)`` keys derived so far; never evicted.
        severities: step -> the highest severity derived for it (messages,
            and failures on their way up, which count as ``step.failed``).
        tracking: derivation bookkeeping; not part of the stable surface.
    """

    rank: int
    identity: RankIdentity | None = None
    messages: tuple[Message, ...] = ()
    seen: frozenset[tuple[str, tuple[str, ...]]] = frozenset()
    severities: Mapping[str, Severity] = attrs.field(factory=dict)
    tracking: _Tracking = attrs.field(factory=_Tracking)


@attrs.frozen(kw_only=True)
class MessagesState:
    """Every rank's messages, by rank."""

    ranks: Mapping[int, RankMessages] = attrs.field(factory=dict)

    def messages(self, rank: int | None = None) -> tuple[Message, ...]:
        """One rank's messages (derivation order), or every rank's ordered by
        wall-clock time then rank."""
        if rank is not None:
            found = self.ranks.get(rank)
            return () if found is None else found.messages
        every = [m for r in self.ranks.values() for m in r.messages]
        every.sort(key=lambda m: (m.wall_ns, m.rank))
        return tuple(every)


class Messages:
    """Projection: :class:`MessagesState` from any stream of events.

    Args:
        policy: severities and scopes (default :data:`DEFAULT_POLICY`).
    """

    def __init__(self, policy: SeverityPolicy = DEFAULT_POLICY) -> None:
        self._policy = policy

    @property
    def policy(self) -> SeverityPolicy:
        """The policy messages are derived with."""
        return self._policy

    def initial(self) -> MessagesState:
        """No ranks, no messages."""
        return MessagesState()

    def apply(self, state: MessagesState, event: Event) -> MessagesState:
        """Derive what ``event`` completes; unchanged ranks are shared."""
        rank = state.ranks.get(event.rank) or RankMessages(rank=event.rank)
        updated = _Derivation(self._policy, rank, event).run()
        if updated is rank:
            return state
        ranks = dict(state.ranks)
        ranks[event.rank] = updated
        return MessagesState(ranks=ranks)


def step_severity(state: MessagesState, rank: int, step: str) -> Severity | None:
    """The highest severity derived for ``step`` on ``rank`` (scope does not
    matter), or ``None`` when nothing was.

    A failed all-reduce attempt with a fallback left counts as its
    ``allreduce.attempt_failed`` severity from its own terminal event on, and
    a failed step as ``step.failed`` as soon as it fails, so the answer right
    after a step's terminal event (when a live span ends) is the answer on
    replay too.
    """
    found = state.ranks.get(rank)
    return None if found is None else found.severities.get(step)


#: Severity of a step outcome no message speaks for.
_OUTCOME_SEVERITY: Mapping[Outcome, Severity | None] = {
    Outcome.OK: Severity.INFO,
    Outcome.ABSENT: Severity.DEBUG,
    Outcome.UNAVAILABLE: Severity.DEBUG,
    Outcome.INVALID: Severity.DEBUG,
    Outcome.CANCELLED: None,
}
_OUTCOME_CODES = {
    Outcome.FAILED: "step.failed",
    Outcome.TIMED_OUT: "step.timed_out",
    Outcome.CRASHED: "step.crashed",
}


def span_severity(
    state: MessagesState,
    rank: int,
    step: str,
    outcome_event: Event,
    *,
    policy: SeverityPolicy = DEFAULT_POLICY,
) -> Severity | None:
    """The severity of a step's span: :func:`step_severity` when a message
    speaks for the step, else by its outcome (failed, timed out, crashed as
    ``step.*`` in ``policy``; absent, unavailable, invalid DEBUG; ok INFO;
    cancelled ``None``). The shape of an exporter's ``severity_of`` hook once
    ``state`` and ``policy`` are bound; ask after ``outcome_event`` was folded
    into ``state``.
    """
    derived = step_severity(state, rank, step)
    if derived is not None:
        return derived
    outcome = outcome_of(outcome_event)
    if outcome is None:
        return None
    code = _OUTCOME_CODES.get(outcome)
    return policy.severity(code) if code is not None else _OUTCOME_SEVERITY[outcome]


def step_severity_hook(
    events: Iterable[Event], *, policy: SeverityPolicy = DEFAULT_POLICY
) -> Callable[[int, str, Event], Severity | None]:
    """A span exporter's ``severity_of(rank, step, outcome_event)`` hook for a
    stored run: folds the messages of ``events`` (iterated once) and answers
    with :func:`span_severity`. Severities derived for a step never drop, so
    the whole run's state answers as the state right after the step ended.
    """
    projection = Messages(policy)
    state = projection.initial()
    for event in events:
        state = projection.apply(state, event)

    def severity_of(rank: int, step: str, outcome_event: Event) -> Severity | None:
        return span_severity(state, rank, step, outcome_event, policy=policy)

    return severity_of


# --------------------------------------------------------------------------
# Derivation


def _field(value: JsonValue, key: str) -> JsonValue:
    return value.get(key) if isinstance(value, dict) else None


def _text(value: JsonValue) -> str | None:
    return value if isinstance(value, str) else None


def _attribute(started: StepStarted | None, key: str, fallback: str) -> str:
    if started is not None:
        value = started.attributes.get(key)
        if isinstance(value, str) and value:
            return value
    return fallback


def _cause_of(event: Event) -> ExceptionInfo | None:
    if isinstance(event, StepUnavailable | StepFailed | RunFinished):
        return event.cause
    return None


def _reason_of(event: Event) -> str:
    """One human line for why a step did not end ok."""
    match event:
        case StepUnavailable(reasons=reasons, cause=cause):
            if reasons:
                return "; ".join(reasons)
            return cause.reason if cause is not None else event.outcome.value
        case StepFailed(cause=cause):
            return cause.reason
        case StepTimedOut(timeout_s=timeout_s):
            return f"timed out after {timeout_s:g} s"
        case StepCrashed():
            return _crash_text(event)
        case _:
            return outcome_of(event) or "unknown"


def _crash_text(event: StepCrashed) -> str:
    if event.signal is not None:
        text = f"its process was killed by signal {event.signal}"
    elif event.exit_code is not None:
        text = f"its process exited with code {event.exit_code}"
    else:
        text = "its process died"
    if event.stderr_tail:
        text += f"; last stderr line: {event.stderr_tail[-1]}"
    return text


def _detail(cause: ExceptionInfo | None) -> str | None:
    return None if cause is None else cause.format()


def _reason_text(info: ExceptionInfo) -> str:
    """``Type: message``, or the bare type when the message is empty."""
    return info.reason if info.message else info.name


def _chain_reason(cause: ExceptionInfo) -> str:
    """``Outer: msg, caused by RootType`` (the outer alone if it is the root).

    Only the root's type is named: its message often carries per-rank details
    (addresses, ports, pids) that would keep the same failure on many ranks
    from grouping into one line. The whole chain is in the report's root
    cause and in ``explain``.
    """
    root = cause.root()
    if root is cause or (root.message and root.message in cause.message):
        # The outer message already says it (``... Reason: [PermissionError: ...]``).
        return _reason_text(cause)
    return f"{_reason_text(cause)}, caused by {root.name}"


#: Exception names a propagated timeout or crash arrives as on enclosing steps.
_PROPAGATED_NAMES = frozenset({"StepTimeoutError", "StepCrashedError"})
#: Exceptions that mean "stopped by someone", reported as run.interrupted
#: (a SystemExit from a probe is a failure like any other, SPEC §2).
_INTERRUPTS = frozenset({"KeyboardInterrupt"})


def _below(step: str, ancestor: str) -> bool:
    return step.startswith(ancestor + "/")


def _continues(failure: _Failure, cause: ExceptionInfo) -> bool:
    """Whether an enclosing step failing with ``cause`` is ``failure`` going up."""
    if failure.cause is None:
        return failure.outcome is not Outcome.FAILED and cause.name in _PROPAGATED_NAMES
    return failure.cause is cause or failure.cause == cause


def _top_level(event: Event, root_span_id: str | None) -> bool:
    if root_span_id is not None and event.parent_span_id is not None:
        return event.parent_span_id == root_span_id
    return "/" not in event.step


@attrs.frozen(kw_only=True)
class _Tracked:
    """The failure bookkeeping's answer for one event."""

    pending: tuple[_Failure, ...]
    #: a failure that reached a graph step (or the end of the run)
    settled: _Failure | None = None
    #: the step's own failure started here (not a child's going up)
    originated: bool = False


def _track(
    pending: tuple[_Failure, ...], event: Event, *, top_level: bool, reported: bool = False
) -> _Tracked:
    """Follow failures up the step tree: a child's failure goes up when its
    parent fails with the same cause, is absorbed when the parent ends any
    other way, and is settled when it fails a graph step or the run."""
    if isinstance(event, RunFinished):
        settled = next((f for f in pending if f.step == event.failed_step), None)
        if settled is not None:
            settled = attrs.evolve(settled, seqs=(*settled.seqs, event.seq))
        return _Tracked(pending=(), settled=settled)
    step = event.step
    below = [f for f in pending if _below(f.step, step)]
    rest = tuple(f for f in pending if not _below(f.step, step)) if below else pending
    if isinstance(event, StepFailed):
        going_up = next((f for f in below if _continues(f, event.cause)), None)
        if going_up is None:
            failure = _Failure(
                step=step,
                outcome=Outcome.FAILED,
                cause=event.cause,
                seq=event.seq,
                wall_ns=event.wall_ns,
                seqs=(event.seq,),
            )
        else:
            failure = attrs.evolve(
                going_up,
                cause=going_up.cause or event.cause,
                seqs=(*going_up.seqs, event.seq),
            )
        if top_level:
            return _Tracked(pending=rest, settled=failure, originated=going_up is None)
        return _Tracked(pending=(*rest, failure), originated=going_up is None)
    if isinstance(event, StepTimedOut | StepCrashed):
        failure = _Failure(
            step=step,
            outcome=outcome_of(event) or Outcome.FAILED,
            cause=None,
            seq=event.seq,
            wall_ns=event.wall_ns,
            seqs=(event.seq,),
            reported=reported,
        )
        return _Tracked(pending=(*rest, failure), originated=True)
    return _Tracked(pending=rest)


def _covered(step: str, cause: ExceptionInfo) -> str | None:
    """The specific code for a failure that starts at ``step``, if any."""
    if step == PLATFORM_STEP:
        if cause.name == "PlatformConflictError":
            return "platform.conflict"
        if cause.name == "UnspecifiedPlatformError":
            return "platform.unspecified"
    elif step == ATTENTION_STEP and cause.name == "ValueError":
        if cause.message.startswith("Selected backend"):
            return "attention.explicit_invalid"
        if cause.message.startswith("No valid"):
            return "attention.none_valid"
    return None


class _Derivation:
    """Derives what one event completes on one rank. Built per event and
    dropped; the result is a new :class:`RankMessages` (or the same one)."""

    def __init__(self, policy: SeverityPolicy, state: RankMessages, event: Event) -> None:
        self.policy = policy
        self.state = state
        self.event = event
        self._tracking = state.tracking
        # Changes to the bookkeeping are gathered and applied at once: a
        # 1,024-rank replay folds tens of thousands of events.
        self._changes: dict[str, Any] = {}

    def run(self) -> RankMessages:
        event = self.event
        if isinstance(event, StepStarted):
            self.started(event)
        elif isinstance(event, TERMINAL_STEP_EVENTS):
            self.ended(event)
        elif isinstance(event, RunStarted):
            self.run_started(event)
        elif isinstance(event, RunFinished):
            self.run_finished(event)
        tracking = self.tracking
        if tracking is not self.state.tracking:
            self.state = attrs.evolve(self.state, tracking=tracking)
        return self.state

    # -- bookkeeping -------------------------------------------------------

    @property
    def tracking(self) -> _Tracking:
        if self._changes:
            self._tracking = attrs.evolve(self._tracking, **self._changes)
            self._changes = {}
        return self._tracking

    def track(self, **changes: Any) -> None:
        self._changes.update(changes)

    def raise_severity(self, step: str, severity: Severity) -> None:
        current = self.state.severities.get(step)
        if current is not None and current >= severity:
            return
        severities = dict(self.state.severities)
        severities[step] = severity
        self.state = attrs.evolve(self.state, severities=severities)

    def emit(
        self,
        code: str,
        text: str,
        *,
        step: str,
        args: Sequence[str],
        seqs: Iterable[int] = (),
        detail: str | None = None,
    ) -> None:
        key = (code, tuple(args))
        if key in self.state.seen:
            return
        severity, scope = self.policy.rule(code)
        identity = self.state.identity
        message = Message(
            code=code,
            severity=severity,
            scope=scope,
            rank=self.state.rank,
            text=text,
            step=step,
            seqs=tuple(sorted({*seqs, self.event.seq})),
            args=key[1],
            detail=detail,
            printed=_printed(severity, scope, identity),
            wall_ns=self.event.wall_ns,
        )
        self.state = attrs.evolve(
            self.state, messages=(*self.state.messages, message), seen=self.state.seen | {key}
        )
        self.raise_severity(step, severity)

    # -- run ---------------------------------------------------------------

    def run_started(self, event: RunStarted) -> None:
        self.state = attrs.evolve(self.state, identity=event.identity)
        self.track(
            root_span_id=event.span_id,
            torch_version=event.versions.get("torch"),
        )

    def run_finished(self, event: RunFinished) -> None:
        self.flush_attempt()
        tracked = _track(self.tracking.failures, event, top_level=True)
        self.track(failures=tracked.pending, open={})
        if tracked.settled is not None:
            self.settle(tracked.settled, originated=False)
        outcome = event.outcome
        step = event.failed_step
        where = f" (step {step})" if step else ""
        if outcome is RunOutcome.READY:
            # No duration in the text: identical messages group across ranks
            # in reports, and each rank's time is in its state row.
            self.emit("run.ready", "Startup ready.", step="", args=())
        elif outcome is RunOutcome.FAILED:
            reason = _chain_reason(event.cause) if event.cause else "no exception recorded"
            self.emit(
                "run.failed",
                f"Startup failed: {reason}{where}",
                step="",
                args=(step or "", reason),
                detail=_detail(event.cause),
            )
        elif outcome is RunOutcome.INTERRUPTED:
            cause = event.cause
            if cause is None:
                by = ""
            elif cause.name == "StartupInterrupted":
                # A stop from outside: the signal, and why it came if known.
                by = f" ({cause.message})"
            else:
                by = f" by {_reason_text(cause)}"
            self.emit(
                "run.interrupted",
                f"Startup interrupted{by}{where} before it was ready; "
                "nothing after this point ran on this rank.",
                step="",
                args=(step or "", by),
            )

    # -- steps -------------------------------------------------------------

    def started(self, event: StepStarted) -> None:
        tracking = self.tracking
        opened = dict(tracking.open)
        opened[event.step] = event
        self.track(open=opened)
        pending = tracking.pending_attempt
        if (
            pending is not None
            and event.kind is StepKind.ATTEMPT
            and event.step.rpartition("/")[0] == pending.step.rpartition("/")[0]
        ):
            nxt = _attribute(event, "backend", event.step.rpartition("/")[2])
            self.emit_attempt(pending, nxt, seqs=(*pending.seqs, event.seq))
            self.track(pending_attempt=None)

    def ended(self, event: Event) -> None:
        tracking = self.tracking
        started = tracking.open.get(event.step)
        if started is not None:
            opened = dict(tracking.open)
            del opened[event.step]
            self.track(open=opened)
        step = event.step
        parent, _, name = step.rpartition("/")
        is_attempt = parent == ALLREDUCE_STEP and (
            started.kind is StepKind.ATTEMPT
            if started is not None
            else step not in (ALLREDUCE_AGREE_STEP, ALLREDUCE_QUANT_STEP)
        )
        if step == ALLREDUCE_STEP:
            self.flush_attempt()
        # A timeout or crash of an all-reduce attempt or of the quantization
        # workspace is covered by the allreduce codes, one of a platform
        # plugin by the platform codes (a failed plugin); any other is
        # reported where it happened.
        covered = is_attempt or step == ALLREDUCE_QUANT_STEP or parent == PLATFORM_STEP
        reported = isinstance(event, StepTimedOut | StepCrashed) and not covered
        tracked = _track(
            tracking.failures,
            event,
            top_level=_top_level(event, tracking.root_span_id),
            reported=reported or covered,
        )
        self.track(failures=tracked.pending)
        if isinstance(event, StepFailed) and tracked.originated:
            # Counted as soon as it fails, so the span that ends now gets it.
            self.raise_severity(step, self.policy.severity("step.failed"))
        if reported:
            self.step_stopped(event)
        if tracked.settled is not None:
            self.settle(tracked.settled, originated=tracked.originated)

        if step == PLATFORM_STEP:
            self.platform(event, tracked.originated)
        elif parent == PLATFORM_STEP:
            self.plugin(event, started, name)
        elif step == ZENTORCH_STEP:
            self.zentorch(event)
        elif step == ATTENTION_STEP:
            self.attention(event, started, tracked.originated)
        elif parent == ATTENTION_STEP:
            self.attention_candidate(event, started, name)
        elif step == FLASHINFER_COMM_STEP:
            self.flashinfer_comm(event)
        elif step == ALLREDUCE_STEP:
            self.allreduce(event)
        elif is_attempt:
            self.allreduce_attempt(event, started, name)
        elif step == ALLREDUCE_QUANT_STEP:
            self.quant_workspace(event, started)

    def step_stopped(self, event: Event) -> None:
        if isinstance(event, StepTimedOut):
            self.emit(
                "step.timed_out",
                f"Step {event.step} timed out after {event.timeout_s:g} s; raise its timeout "
                "if the probe is only slow, or find what it waits for.",
                step=event.step,
                args=(event.step,),
            )
        elif isinstance(event, StepCrashed):
            self.emit(
                "step.crashed",
                f"Step {event.step} crashed: {_crash_text(event)}.",
                step=event.step,
                args=(event.step,),
            )

    def settle(self, failure: _Failure, *, originated: bool) -> None:
        """A failure reached the graph: report it on its deepest step, unless
        a timeout/crash message or a more specific code already says it."""
        cause = failure.cause
        if failure.reported or cause is None or cause.name in _INTERRUPTS:
            return
        if originated and _covered(failure.step, cause) is not None:
            return
        self.emit(
            "step.failed",
            f"Step {failure.step} failed: {_chain_reason(cause)}; "
            "the error propagated and stopped the startup.",
            step=failure.step,
            args=(failure.step, cause.reason),
            seqs=failure.seqs,
            detail=cause.format(),
        )

    # -- platform ----------------------------------------------------------

    def plugin(self, event: Event, started: StepStarted | None, name: str) -> None:
        # A plugin that raised, timed out or crashed failed: not activated,
        # and worth a WARNING if the run goes on on another platform.
        cause = _cause_of(event)
        stopped = isinstance(event, StepTimedOut | StepCrashed)
        if not stopped and (cause is None or not isinstance(event, StepUnavailable | StepFailed)):
            return
        plugin = _attribute(started, "plugin", name)
        reason = _reason_of(event)
        self.emit(
            "platform.plugin_failed",
            f"Platform plugin {plugin} failed: {reason}",
            step=event.step,
            args=(plugin, reason),
            detail=_detail(cause),
        )
        self.track(failed_plugins=(*self.tracking.failed_plugins, (plugin, reason, event.seq)))

    def platform(self, event: Event, originated: bool) -> None:
        if isinstance(event, StepSucceeded):
            platform_class = _text(_field(event.result, "platform_class")) or "an unknown platform"
            self.emit(
                "platform.detected",
                f"Automatically detected platform {platform_class}.",
                step=event.step,
                args=(platform_class,),
            )
            for plugin, reason, seq in self.tracking.failed_plugins:
                self.emit(
                    "platform.fallback",
                    f"Platform plugin {plugin} failed ({reason}); continuing on "
                    f"{platform_class}. Fix or uninstall the plugin if {plugin} was expected.",
                    step=event.step,
                    args=(plugin, reason, platform_class),
                    seqs=(seq,),
                )
        elif isinstance(event, StepFailed) and originated:
            code = _covered(event.step, event.cause)
            if code is not None:
                self.emit(
                    code,
                    event.cause.message,
                    step=event.step,
                    args=(event.cause.message,),
                    detail=event.cause.format(),
                )

    def zentorch(self, event: Event) -> None:
        outcome = outcome_of(event)
        if outcome is Outcome.OK:
            self.emit(
                "zentorch.loaded",
                "Loaded zentorch; using ZenCpuPlatform.",
                step=event.step,
                args=(),
            )
        elif outcome is Outcome.ABSENT:
            self.emit(
                "zentorch.absent",
                "zentorch is not installed; using CpuPlatform.",
                step=event.step,
                args=(),
            )
        elif outcome is Outcome.UNAVAILABLE:
            reason = _reason_of(event)
            torch = self.tracking.torch_version
            installed = f"the installed torch {torch}" if torch else "the installed torch"
            self.emit(
                "zentorch.broken",
                f"zentorch failed to import ({reason}); the zentorch build probably does not "
                f"match {installed}. Falling back to CpuPlatform; install the zentorch "
                "release built for this torch to use ZenCpuPlatform.",
                step=event.step,
                args=(reason,),
                detail=_detail(_cause_of(event)),
            )

    # -- attention ---------------------------------------------------------

    def attention_candidate(self, event: Event, started: StepStarted | None, name: str) -> None:
        if not isinstance(event, StepUnavailable):
            return
        backend = _attribute(started, "candidate", name)
        if event.outcome is Outcome.INVALID:
            reasons = "; ".join(event.reasons) or "no reason given"
            self.emit(
                "attention.backend_invalid",
                f"Attention backend {backend} does not support this configuration: {reasons}",
                step=event.step,
                args=(backend, reasons),
            )
        else:
            reason = _reason_of(event)
            self.emit(
                "attention.backend_unavailable",
                f"Attention backend {backend} is unavailable: {reason}",
                step=event.step,
                args=(backend, reason),
                detail=_detail(event.cause),
            )

    def attention(self, event: Event, started: StepStarted | None, originated: bool) -> None:
        if isinstance(event, StepSucceeded):
            result = event.result
            backend = _text(_field(result, "backend")) or "an unknown"
            explicit = _field(result, "explicit")
            if explicit:
                self.emit(
                    "attention.explicit_selected",
                    f"Using {backend} backend.",
                    step=event.step,
                    args=(backend,),
                )
                return
            considered = _field(result, "considered")
            if not isinstance(considered, list) and started is not None:
                considered = started.attributes.get("candidates")
            names = [str(item) for item in considered] if isinstance(considered, list) else []
            self.emit(
                "attention.selected",
                f"Using {backend} attention backend out of potential backends: {names!r}",
                step=event.step,
                args=(backend, repr(names)),
            )
        elif isinstance(event, StepFailed) and originated:
            code = _covered(event.step, event.cause)
            if code is not None:
                self.emit(
                    code,
                    event.cause.message,
                    step=event.step,
                    args=(event.cause.message,),
                    detail=event.cause.format(),
                )

    # -- flashinfer.comm ---------------------------------------------------

    def flashinfer_comm(self, event: Event) -> None:
        if not isinstance(event, StepUnavailable) or event.outcome is Outcome.ABSENT:
            return
        if event.cause is not None:
            text = f"flashinfer.comm import failed: {event.cause.message}"
            args = (event.cause.message,)
        else:
            reason = _reason_of(event)
            text = f"flashinfer.comm is unavailable: {reason}"
            args = (reason,)
        self.emit(
            "flashinfer_comm.unavailable",
            text,
            step=event.step,
            args=args,
            detail=_detail(event.cause),
        )

    # -- all-reduce --------------------------------------------------------

    def allreduce_attempt(self, event: Event, started: StepStarted | None, name: str) -> None:
        backend = _attribute(started, "backend", name)
        outcome = outcome_of(event) or Outcome.FAILED
        if outcome in (Outcome.OK, Outcome.CANCELLED):
            self.track(attempts=(*self.tracking.attempts, (backend, None, event.seq)))
            return
        reason = _reason_of(event)
        self.track(attempts=(*self.tracking.attempts, (backend, reason, event.seq)))
        fallback_left = bool(started.attributes.get("fallback_left")) if started else False
        if not fallback_left:
            return
        verb = {
            Outcome.TIMED_OUT: "timed out",
            Outcome.CRASHED: "crashed",
            Outcome.FAILED: "failed",
        }.get(outcome, "unavailable")
        pending = _PendingAttempt(
            step=event.step,
            backend=backend,
            verb=verb,
            reason=reason,
            seqs=(event.seq,),
            wall_ns=event.wall_ns,
            outcome=outcome,
        )
        self.track(pending_attempt=pending)
        self.raise_severity(event.step, self.policy.severity("allreduce.attempt_failed"))

    def flush_attempt(self) -> None:
        """The chain ended before another attempt started: a recorded
        attempt failure is still worth its WARNING; a propagated one is a
        ``step.failed`` instead (no fallback happened)."""
        pending = self.tracking.pending_attempt
        if pending is None:
            return
        self.track(pending_attempt=None)
        if pending.outcome is not Outcome.FAILED:
            self.emit_attempt(pending, "the next backend", seqs=pending.seqs)

    def emit_attempt(self, pending: _PendingAttempt, nxt: str, *, seqs: Iterable[int]) -> None:
        hint = (
            "; likely no NVSwitch multicast support for mnnvl" if pending.backend == "mnnvl" else ""
        )
        self.emit(
            "allreduce.attempt_failed",
            f"FlashInfer allreduce workspace with backend={pending.backend} {pending.verb} "
            f"({pending.reason}{hint}); falling back to {nxt}.",
            step=pending.step,
            args=(pending.backend, pending.reason, nxt),
            seqs=seqs,
            # An attempt that a fallback recovers is expected on many healthy
            # hosts: one line, no traceback (the cause stays in the log).
            detail=None,
        )

    def allreduce(self, event: Event) -> None:
        if not isinstance(event, StepSucceeded):
            return
        result = event.result
        enabled = _field(result, "enabled")
        if enabled is True:
            backend = _text(_field(result, "backend")) or "unknown"
            self.emit(
                "allreduce.workspace_ready",
                f"Initialized FlashInfer allreduce fusion workspace with backend={backend}",
                step=event.step,
                args=(backend,),
            )
            return
        attempts = self.tracking.attempts
        if not attempts:
            return
        last_backend = attempts[-1][0]
        failures = [reason for _backend, reason, _seq in attempts if reason is not None]
        reason = _text(_field(result, "reason")) or (
            failures[-1] if failures else "the ranks did not agree on a backend"
        )
        self.emit(
            "allreduce.workspace_failed",
            f"Failed to initialize FlashInfer allreduce fusion workspace with "
            f"backend={last_backend} ({reason}); allreduce fusion is disabled and startup "
            "continues without it. Make every rank able to create a workspace (mnnvl needs "
            "NVSwitch multicast, trtllm a single node) or choose a backend that works here.",
            step=event.step,
            args=(last_backend, reason),
            seqs=[seq for _b, _r, seq in attempts],
        )

    def quant_workspace(self, event: Event, started: StepStarted | None) -> None:
        # A propagating failure (StepFailed) is a step.failed; a cancelled one
        # is part of a run that stopped for another reason.
        if not isinstance(event, StepUnavailable | StepTimedOut | StepCrashed):
            return
        plain = [backend for backend, reason, _seq in self.tracking.attempts if reason is None]
        backend = _attribute(started, "backend", plain[-1] if plain else "unknown")
        reason = _reason_of(event)
        self.emit(
            "allreduce.quant_workspace_failed",
            f"Failed to initialize FlashInfer allreduce quantization fusion workspace with "
            f"backend={backend} ({reason}); quantization fusion is disabled and startup "
            f"continues with the plain allreduce fusion on backend={backend}. Fix what stopped "
            "the workspace from being created, or turn quantization fusion off in the engine "
            "configuration.",
            step=event.step,
            args=(backend, reason),
            detail=_detail(_cause_of(event)),
        )


def _printed(severity: Severity, scope: Scope, identity: RankIdentity | None) -> bool:
    if severity >= Severity.ERROR or scope is Scope.PROCESS or identity is None:
        # Before a rank knows who it is, it prints (as vLLM does until
        # torch.distributed is up); an ERROR is printed where it happened.
        return True
    if scope is Scope.LOCAL:
        return identity.local_rank == 0
    return identity.rank == 0


# --------------------------------------------------------------------------
# Grouping across ranks


def format_ranks(ranks: Iterable[int]) -> str:
    """``"rank 5"``, ``"ranks 0-7"``, ``"ranks 0-3,5"``; ``"no ranks"`` when
    empty."""
    ordered = sorted(set(ranks))
    if not ordered:
        return "no ranks"
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    parts: list[str] = []
    start = previous = ordered[0]
    for rank in [*ordered[1:], None]:
        if rank is not None and rank == previous + 1:
            previous = rank
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if rank is not None:
            start = previous = rank
    return "ranks " + ",".join(parts)


@attrs.frozen(kw_only=True)
class GroupedMessage:
    """Identical messages (same code, severity and text) of several ranks.

    Attributes:
        code, severity, scope, text: as on each :class:`Message`.
        ranks: the ranks it was derived on, ascending.
    """

    code: str
    severity: Severity
    scope: Scope
    text: str
    ranks: tuple[int, ...]

    @property
    def rank_text(self) -> str:
        """The ranks, compactly (``"ranks 0-7"``)."""
        return format_ranks(self.ranks)

    def describe(self) -> str:
        """``WARNING [ranks 0-7] text``."""
        return f"{self.severity.name} [{self.rank_text}] {self.text}"


def group_messages(messages: Iterable[Message]) -> list[GroupedMessage]:
    """Group identical ``(code, severity, text)`` across ranks.

    Order: severity descending, then first appearance in ``messages`` (pass
    them in time order, as :meth:`MessagesState.messages` gives them).
    """
    groups: dict[tuple[str, Severity, str], tuple[Scope, set[int]]] = {}
    for message in messages:
        key = (message.code, message.severity, message.text)
        found = groups.get(key)
        if found is None:
            groups[key] = (message.scope, {message.rank})
        else:
            found[1].add(message.rank)
    grouped = [
        GroupedMessage(code=code, severity=severity, scope=scope, text=text, ranks=tuple(sorted(r)))
        for (code, severity, text), (scope, r) in groups.items()
    ]
    grouped.sort(key=lambda group: -group.severity)
    return grouped
