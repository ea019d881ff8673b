"""The messages projection: severity-correct, once-per-rank messages.

The kernel derives these for every graph (``<step>`` is the step path)::

    an error that reached the graph                  step.failed (its deepest step only)
    a step timed out | an isolated step crashed      step.timed_out | step.crashed
      (a timeout names where the step waited)
    a step ran past the stall threshold (its first   step.stalled
      step.stalled: where it waits, and whether
      that is waiting for another process, by the
      slices' peer_waits)
    a candidate step ends unavailable | invalid      candidate.unavailable
      | absent
    an attempt step fails with a fallback left,      fallback.used, derived when the next
      then the next attempt starts                   attempt starts (it names it)
    run.finished ready | failed | interrupted        run.ready | run.failed | run.interrupted

Whoever owns a set of steps adds its own messages in a :class:`~events.Slice`:
message rules as data (:class:`~events.MessageRule`), and a hook for what
data cannot say. Precedence is by order: the slices' rules, then the
kernel's (``candidate.unavailable``, ``fallback.used``; none on the steps a
slice claims); the first that matches speaks, and a failure a rule speaks
for is not a ``step.failed``.

A failure a parent step absorbed (the child ``step.failed``, the parent
``step.unavailable`` with the same cause) is not a ``step.failed`` message:
the parent's outcome says what happened. A propagating error is reported
once, on the deepest step, when it reaches a graph step (the run fails).
Cross-rank divergences are derived by :func:`events.find_divergences` from
the slices' agreements, not here.

Once per rank: a rank derives a given ``(code, args)`` at most once, and the
set of seen keys is never evicted. Scope decides where the live run prints a
message (:attr:`Message.printed`, :class:`~events.Scope`).
"""

from __future__ import annotations

import functools
import itertools
import operator
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs

from ._builders import builder
from ._exception_info import ExceptionInfo
from ._failures import _Failure, _track
from ._model import (
    _UNAVAILABLE_OUTCOMES,
    Event,
    Outcome,
    RankIdentity,
    RunFinished,
    RunOutcome,
    StallReason,
    StepCrashed,
    StepFailed,
    StepKind,
    StepStalled,
    StepStarted,
    StepTimedOut,
    outcome_of,
)
from ._policy import _GENERIC
from ._reducers import (
    DECISION,
    ENDED,
    KINDS,
    OTHER,
    RUN_FINISHED,
    RUN_STARTED,
    STALLED,
    STARTED,
    SUCCEEDED,
    Projection,
)
from ._severity import Scope, Severity
from ._slices import MessageRule, Slice, cause_of, reason_of

__all__ = [
    "GroupedMessage",
    "Message",
    "Messages",
    "MessagesState",
    "RankMessages",
    "format_ranks",
    "group_messages",
    "step_severity",
    "step_severity_hook",
]


@attrs.frozen(kw_only=True)
class Message:
    """One derived message of one rank.

    Attributes:
        code: the stable code (``step.failed``).
        severity, scope: the code's (:meth:`Messages.rule`).
        rank: the global rank it was derived on.
        text: what happened and what to do, one line.
        step: the step it belongs to (``""`` for the run itself); a candidate's
            or attempt's message belongs to that child step.
        seqs: the sequence numbers of the events behind it.
        args: what makes it unique on its rank (with ``code``).
        exception: the recorded exception behind it, whose traceback is
            :attr:`detail`, if any.
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
    exception: ExceptionInfo | None = None
    printed: bool = True
    wall_ns: int = 0

    @property
    def detail(self) -> str | None:
        """The formatted traceback of :attr:`exception`, if any (formatted
        when asked: a replay keeps the exception, which its events hold
        anyway, not a text of kilobytes per message)."""
        return None if self.exception is None else self.exception.format()


#: Builds a :class:`Message` from its fields in order, as the fold makes
#: one for each message of each rank (see events._builders).
_message = builder(Message)


@attrs.frozen(kw_only=True)
class _Tracking:
    """What a rank's derivation remembers between events."""

    root_span_id: str | None = None
    open: Mapping[str, StepStarted] = attrs.field(factory=dict)
    failures: tuple[_Failure, ...] = ()
    #: parent step -> the fallback rule that speaks for its latest failed
    #: attempt with a fallback left (said when the next attempt starts),
    #: that attempt's end and start
    fallbacks: Mapping[str, tuple[MessageRule, Event, StepStarted]] = attrs.field(factory=dict)
    #: the memory of each slice's message hook, in slice order
    slices: tuple[Any, ...] | None = None
    #: open step -> where it was last seen waiting
    waiting: Mapping[str, StepStalled] = attrs.field(factory=dict)


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
        # The ranks in ascending order, each in derivation order: a stable
        # sort by time alone then orders messages of the same time by rank.
        every = [m for r in sorted(self.ranks) for m in self.ranks[r].messages]
        every.sort(key=operator.attrgetter("wall_ns"))
        return tuple(every)


class Messages(Projection[MessagesState]):
    """Projection: :class:`MessagesState` from any stream of events.

    Args:
        slices: what the owners of the steps declared (their rules, hooks
            and codes' severities, a later slice's overriding an earlier
            one's); none gives the kernel's generic messages only.
    """

    def __init__(self, *, slices: Sequence[Slice] = ()) -> None:
        #: The slices messages are derived with.
        self.slices = tuple(slices)
        self._codes = dict(_GENERIC)
        for part in self.slices:
            self._codes.update(part.code_rules())
        self._hooks = tuple(part.messages for part in self.slices if part.messages is not None)
        rules = tuple(rule for part in self.slices for rule in part.rules)
        self._rules_for: Callable[[str], tuple[MessageRule, ...]] = functools.cache(
            lambda step: (
                tuple(rule for rule in rules if rule.matches_step(step))
                + (() if any(part.claims(step) for part in self.slices) else _KERNEL_RULES)
            )
        )

    def rule(self, code: str) -> tuple[Severity, Scope]:
        """The ``(severity, scope)`` of ``code``: the last slice's that names
        it, else the kernel's.

        Raises:
            KeyError: no one knows ``code``.
        """
        if (found := self._codes.get(code)) is None:
            raise KeyError(f"no severity rule for message code {code!r}")
        return found

    def span_severity(
        self, state: MessagesState, rank: int, step: str, outcome_event: Event
    ) -> Severity | None:
        """The severity of a step's span: :func:`step_severity` when a message
        speaks for the step, else by its outcome (failed, timed out, crashed
        as the ``step.*`` code's severity; absent, unavailable, invalid
        DEBUG; ok INFO; cancelled ``None``). Ask after ``outcome_event`` was
        folded into ``state``.
        """
        if (derived := step_severity(state, rank, step)) is not None:
            return derived
        outcome = outcome_of(outcome_event)
        if outcome in _OUTCOME_SEVERITY:
            return _OUTCOME_SEVERITY[outcome]
        return self.rule(f"step.{outcome}")[0]

    def initial(self) -> MessagesState:
        """No ranks, no messages."""
        return MessagesState()

    def apply_many(self, state: MessagesState, events: Iterable[Event]) -> MessagesState:
        """The state after every event of ``events`` in turn; unchanged ranks
        are shared, and ``state`` itself is returned when no rank changed."""
        ranks = dict(state.ranks)
        changed = False
        for rank, run in itertools.groupby(events, operator.attrgetter("rank")):
            fold = _Fold(self, ranks.get(rank) or RankMessages(rank=rank))
            for event in run:
                fold.derive(event)
            if fold.changed:
                ranks[rank], changed = fold.freeze(), True
        return MessagesState(ranks=ranks) if changed else state


def step_severity(state: MessagesState, rank: int, step: str) -> Severity | None:
    """The highest severity derived for ``step`` on ``rank`` (scope does not
    matter), or ``None`` when nothing was.

    A failed attempt with a fallback left counts as its fallback message's
    severity from its own terminal event on, and a failed step as
    ``step.failed`` as soon as it fails, so the answer right after a step's
    terminal event (when a live span ends) is the answer on replay too.
    """
    found = state.ranks.get(rank)
    return None if found is None else found.severities.get(step)


#: Severity of a step outcome no message speaks for (failed, timed out and
#: crashed have the severity of their ``step.*`` code; ``None``: no end).
_OUTCOME_SEVERITY: Mapping[Outcome | None, Severity | None] = {
    None: None,
    Outcome.OK: Severity.INFO,
    **dict.fromkeys(_UNAVAILABLE_OUTCOMES, Severity.DEBUG),
    Outcome.CANCELLED: None,
}


def step_severity_hook(
    events: Iterable[Event], *, slices: Sequence[Slice] = ()
) -> Callable[[int, str, Event], Severity | None]:
    """A span exporter's ``severity_of(rank, step, outcome_event)`` hook for a
    stored run: folds the messages of ``events`` (iterated once) with
    ``slices`` and answers with :meth:`Messages.span_severity`. Severities
    derived for a step never drop, so the whole run's state answers as the
    state right after the step ended.
    """
    projection = Messages(slices=slices)
    return functools.partial(
        projection.span_severity, projection.apply_many(projection.initial(), events)
    )


def reason_text(info: ExceptionInfo) -> str:
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
        return reason_text(cause)
    return f"{reason_text(cause)}, caused by {root.name}"


#: The kernel's rules, tried last, for the steps no slice claims.
_KERNEL_RULES = (
    MessageRule(
        code="fallback.used",
        fallback=True,
        step="*",
        text="Step {step} {verb} ({reason}); falling back to {next}.",
        args=("{step}", "{reason}", "{next}"),
        detail=False,
    ),
    MessageRule(
        code="candidate.unavailable",
        step="*",
        outcomes=_UNAVAILABLE_OUTCOMES,
        when={"kind": StepKind.CANDIDATE},
        text="Candidate {step} is {outcome}: {reason}",
        args=("{step}", "{reason}"),
    ),
)


class _Fold:
    """One rank's messages being derived; while an event is derived, the
    :class:`~events.MessageContext` the slices' hooks see."""

    def __init__(self, setup: Messages, state: RankMessages) -> None:
        tracking = state.tracking
        self.setup = setup
        self.rank = state.rank
        self.identity = state.identity
        self.messages = list(state.messages)
        self.seen = set(state.seen)
        self.severities = dict(state.severities)
        self.root_span_id = tracking.root_span_id
        self.open = dict(tracking.open)
        self.failures = tracking.failures
        self.fallbacks = dict(tracking.fallbacks)
        # A fold is made for a run of events: a rank new to the hooks gets
        # their initial memories now, which changes its state.
        memories = tracking.slices
        hooks = setup._hooks
        self.memories = [hook.initial() for hook in hooks] if memories is None else list(memories)
        self.changed = memories is None and bool(hooks)
        self.waiting = dict(tracking.waiting)
        self.event: Event
        self.started: StepStarted | None = None
        self.originated = False
        self.outcome: Outcome | None = None

    def freeze(self) -> RankMessages:
        return RankMessages(
            rank=self.rank,
            identity=self.identity,
            messages=tuple(self.messages),
            seen=frozenset(self.seen),
            severities=self.severities,
            tracking=_Tracking(
                root_span_id=self.root_span_id,
                open=self.open,
                failures=self.failures,
                fallbacks=self.fallbacks,
                slices=tuple(self.memories) if self.memories else None,
                waiting=self.waiting,
            ),
        )

    def severity(self, code: str) -> Severity:
        return self.setup.rule(code)[0]

    # Any: the kind table stands for isinstance tests the type checker cannot follow.
    def derive(self, event: Any) -> None:
        self.event = event
        self.originated = False
        kind = KINDS[type(event)]
        ends = kind in (SUCCEEDED, ENDED)
        self.started = self.open.get(event.step) if ends else None
        self.outcome = outcome_of(event) if ends else None
        setup = self.setup
        memories = self.memories
        for index, hook in enumerate(setup._hooks):
            if (new := hook.before(self, memories[index])) is not memories[index]:
                memories[index], self.changed = new, True
        if kind != DECISION and kind != OTHER:
            self.changed = True  # what the rank tracks: its steps, failures or identity
        if kind == STARTED:
            self.open[event.step] = event
            if event.kind is StepKind.ATTEMPT and self.fallbacks:
                pending = self.fallbacks.pop(event.step.rpartition("/")[0], None)
                if pending is not None:
                    self.say(*pending, event.step)
        elif ends:
            self.ended(event)
        elif kind == STALLED:
            self.waiting[event.step] = event
            frame = event.waiting_in
            if event.why is StallReason.STALLED and frame is not None:
                other = any(part.waits_for_another(event) for part in setup.slices)
                self.emit(
                    "step.stalled",
                    f"Step {event.step} is still running after {event.elapsed_ns / 1e9:.1f} s, "
                    f"waiting in {frame.where()}{' for another process' if other else ''}.",
                    step=event.step,
                    args=(event.step,),
                )
        elif kind == RUN_STARTED:
            self.identity = event.identity
            self.root_span_id = event.span_id
        elif kind == RUN_FINISHED:
            self.run_finished(event)
        for index, hook in enumerate(setup._hooks):
            if (new := hook.after(self, memories[index])) is not memories[index]:
                memories[index], self.changed = new, True

    def raise_severity(self, step: str, severity: Severity) -> None:
        current = self.severities.get(step)
        if current is None or current < severity:
            self.severities[step] = severity
            self.changed = True

    def emit(
        self,
        code: str,
        text: str,
        *,
        step: str,
        args: Sequence[str],
        seqs: Iterable[int] = (),
        exception: ExceptionInfo | None = None,
    ) -> None:
        key = (code, tuple(args))
        if key in self.seen:
            return
        severity, scope = self.setup.rule(code)
        event, identity = self.event, self.identity
        # Before a rank knows who it is, it prints (as an engine does until
        # its process group is up); an ERROR is printed where it happened.
        printed = (
            severity >= Severity.ERROR
            or scope is Scope.PROCESS
            or identity is None
            or (identity.local_rank if scope is Scope.LOCAL else identity.rank) == 0
        )
        self.messages.append(
            _message(
                code,
                severity,
                scope,
                self.rank,
                # Ranks derive the same texts: each is kept once.
                sys.intern(text),
                step,
                tuple(sorted({*seqs, event.seq})),
                key[1],
                exception,
                printed,
                event.wall_ns,
            )
        )
        self.seen.add(key)
        self.changed = True
        self.raise_severity(step, severity)

    def run_finished(self, event: RunFinished) -> None:
        self.failures, settled, _ = _track(self.failures, event, self.root_span_id)
        self.open.clear()
        self.fallbacks.clear()
        if settled is not None:
            self.settle(settled)
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
                exception=event.cause,
            )
        elif outcome is RunOutcome.INTERRUPTED:
            if event.stop is not None:
                # A stop from outside: the signal, and why it came if known.
                by = f" ({event.stop})"
            else:
                by = "" if event.cause is None else f" by {reason_text(event.cause)}"
            self.emit(
                "run.interrupted",
                f"Startup interrupted{by}{where} before it was ready; "
                "nothing after this point ran on this rank.",
                step="",
                args=(step or "", by),
            )

    def ended(self, event: Event) -> None:
        started = self.started
        step = event.step
        self.open.pop(step, None)
        # A timeout or crash is said where it happens (below), never again as
        # the step.failed of the graph step it reaches.
        stopped = isinstance(event, StepTimedOut | StepCrashed)
        self.failures, settled, self.originated = _track(
            self.failures, event, self.root_span_id, reported=stopped
        )
        rule = self.rule_for(event)
        if isinstance(event, StepFailed) and self.originated:
            if rule is not None:
                # The rule says this failure where it started: no step.failed.
                if settled is not None:
                    settled = attrs.evolve(settled, reported=True)
                else:
                    *rest, failure = self.failures
                    self.failures = (*rest, attrs.evolve(failure, reported=True))
            # Counted as soon as it fails, so the span that ends now gets it.
            self.raise_severity(step, self.severity("step.failed"))
        # A timeout or crash a slice reports itself (an attempt its fallback
        # recovers, say) is not also a step.timed_out or step.crashed.
        if stopped and not any(hook.covers_stop(step, started) for hook in self.setup._hooks):
            self.step_stopped(event)
        if settled is not None:
            self.settle(settled)
        # The chain ended: a fallback that never started is no message.
        self.fallbacks.pop(step, None)
        if started is not None and started.kind is StepKind.ATTEMPT:
            # An attempt a fallback rule speaks for: its span's severity
            # now, its message when the next attempt starts.
            fallback = self.rule_for(event, fallback=True)
            if fallback is not None:
                self.fallbacks[step.rpartition("/")[0]] = (fallback, event, started)
                self.raise_severity(step, self.severity(fallback.code))
        self.say(rule, event, started)
        self.waiting.pop(step, None)

    def rule_for(self, event: Event, *, fallback: bool = False) -> MessageRule | None:
        outcome = self.outcome
        if outcome is None:
            return None
        originated, started = self.originated, self.started
        for rule in self.setup._rules_for(event.step):
            if rule.fallback is fallback and rule.matches_event(
                event, outcome, originated=originated, started=started
            ):
                return rule
        return None

    def say(
        self,
        rule: MessageRule | None,
        event: Event,
        started: StepStarted | None,
        next_step: str = "",
    ) -> None:
        if rule is not None:
            text, args = rule.render(event, started, next_step=next_step)
            exception = cause_of(event) if rule.detail else None
            self.emit(
                rule.code, text, step=event.step, args=args, seqs=(event.seq,), exception=exception
            )

    def step_stopped(self, event: Event) -> None:
        if isinstance(event, StepTimedOut):
            stall = self.waiting.get(event.step)
            frame = stall.waiting_in if stall is not None else None
            where = "find what it waits for" if frame is None else "fix what it waits for"
            code = "step.timed_out"
            text = (
                f"Step {event.step} timed out after {event.timeout_s:g} s"
                + ("" if frame is None else f", waiting in {frame.where()}")
                + f"; raise its timeout if the probe is only slow, or {where}."
            )
        else:  # crashed: only a timed-out or crashed step's end comes here
            code, text = "step.crashed", f"Step {event.step} crashed: {reason_of(event)}."
        self.emit(code, text, step=event.step, args=(event.step,))

    def settle(self, failure: _Failure) -> None:
        """A failure reached the graph: report it on its deepest step, unless
        a timeout/crash message or a slice's more specific message said it
        there (on the step it started in, whichever step it reached)."""
        cause = failure.cause
        # A KeyboardInterrupt means stopped by someone, said as run.interrupted
        # (a SystemExit from a probe is a failure like any other, SPEC §2).
        if failure.reported or cause is None or cause.name == "KeyboardInterrupt":
            return
        self.emit(
            "step.failed",
            f"Step {failure.step} failed: {_chain_reason(cause)}; "
            "the error propagated and stopped the startup.",
            step=failure.step,
            args=(failure.step, cause.reason),
            seqs=failure.seqs,
            exception=cause,
        )


def format_ranks(
    ranks: Iterable[int | tuple[int, int]], *, label: bool = True, separator: str = ","
) -> str:
    """Ranks as short text: runs of consecutive ranks as ``first-last``, in
    ascending order, joined by ``separator``.

    Args:
        ranks: ranks, or inclusive ``(first, last)`` ranges of ranks (so a
            range is never expanded), in any order; duplicates, overlaps and
            adjacent ranges are merged.
        label: prefix ``"rank "`` (one rank) or ``"ranks "`` (more), and say
            ``"no ranks"`` when there are none; without it, the bare ranges
            (``""`` when there are none), as a fault spec writes them.
        separator: between ranges: ``","`` (messages, the report, specs) or
            ``", "`` (prose).

    Returns:
        ``"rank 5"``, ``"ranks 0-3,5"``, ``"no ranks"``; with ``label=False``
        ``"0-3,5"``; with ``separator=", "`` ``"ranks 0-3, 5"``.
    """
    spans = sorted((rank, rank) if isinstance(rank, int) else rank for rank in ranks)
    merged: list[list[int]] = []
    for first, last in spans:
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    text = separator.join(str(a) if a == b else f"{a}-{b}" for a, b in merged)
    if not label:
        return text
    if not merged:
        return "no ranks"
    return ("rank " if merged[0][0] == merged[-1][1] else "ranks ") + text


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
        groups.setdefault(key, (message.scope, set()))[1].add(message.rank)
    grouped = [
        GroupedMessage(code=code, severity=severity, scope=scope, text=text, ranks=tuple(sorted(r)))
        for (code, severity, text), (scope, r) in groups.items()
    ]
    grouped.sort(key=lambda group: -group.severity)
    return grouped
