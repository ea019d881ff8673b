"""Slices: what the owner of some steps tells the generic projections.

The kernel derives state, messages, divergences and report columns for any
graph; it names no step of any particular one. Whoever owns a set of steps
(the reference engine in ``orchestrator.engine``, or a user's own graph)
describes them in a :class:`Slice`, mostly as data (message rules, report
columns, agreements, severities), with two pure hooks for what data cannot
say. Slices never import a runtime: replaying a log needs only this package
and the slices' pure modules.
"""

from __future__ import annotations

import fnmatch
import os
import string
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from ._errors import InvalidValueError
from ._exception_info import ExceptionInfo
from ._model import (
    Event,
    JsonValue,
    Outcome,
    RunFinished,
    StepCrashed,
    StepFailed,
    StepKind,
    StepStalled,
    StepStarted,
    StepSucceeded,
    StepTimedOut,
    StepUnavailable,
    outcome_of,
)
from ._severity import Scope, Severity

if TYPE_CHECKING:
    from ._rank_state import RankState

__all__ = [
    "Agreement",
    "Collective",
    "Column",
    "Loss",
    "MessageContext",
    "MessageHook",
    "MessageRule",
    "Slice",
    "cause_of",
    "reason_of",
]

#: The prefix of the module names ``--slice FILE.py:NAME`` loads files as.
SLICE_FILE_MODULE = "_startup_orchestrator_slice_"

#: The ``(severity, scope)`` of one message code.
Rule = tuple[Severity, Scope]


def _outcome(value: Any) -> Outcome:
    try:
        return Outcome(value)
    except ValueError:
        valid = [outcome.value for outcome in Outcome]
        raise InvalidValueError("outcome", value, valid, "MessageRule outcomes") from None


def _outcomes(value: Any) -> frozenset[Outcome]:
    found = frozenset(map(_outcome, [value] if isinstance(value, str) else value))
    if not found:
        raise ValueError("MessageRule outcomes is empty: the rule would never speak; name one")
    return found


def _strings(value: Any) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(map(str, value))


def _severity(value: Any) -> Severity:  # a named converter, as type checkers need
    return Severity.parse(value)


def _scope(value: Any) -> Scope:
    return Scope.parse(value)


def _code_rules(value: Mapping[str, tuple[Any, Any]]) -> dict[str, Rule]:
    rules: dict[str, Rule] = {}
    for code, rule in value.items():
        if not isinstance(rule, tuple | list) or len(rule) != 2:
            raise ValueError(
                f"the rule of code {code!r} is {rule!r}: give (severity, scope), "
                "e.g. (Severity.WARNING, Scope.LOCAL)"
            )
        where = f"code {code!r}"
        rules[code] = (Severity.parse(rule[0], where), Scope.parse(rule[1], where))
    return rules


def _tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value)


def _each(cls: type[Any]) -> Callable[[Any, attrs.Attribute[Any], tuple[Any, ...]], None]:
    def check(_instance: Any, attribute: attrs.Attribute[Any], items: tuple[Any, ...]) -> None:
        for index, item in enumerate(items):
            if not isinstance(item, cls):
                raise TypeError(
                    f"Slice {attribute.name}[{index}] is {item!r}, not an events.{cls.__name__}"
                )

    return check


def _one_rule_per_code(_instance: Any, _attribute: Any, rules: tuple[MessageRule, ...]) -> None:
    # A code has one severity and scope: the last rule's would silently be every one's.
    seen: dict[str, MessageRule] = {}
    for rule in rules:
        first = seen.setdefault(rule.code, rule)
        if (first.severity, first.scope) != (rule.severity, rule.scope):
            raise ValueError(
                f"Slice rules: two rules for code {rule.code!r} differ in severity or scope "
                f"({first.severity.name} {first.scope} and {rule.severity.name} {rule.scope}); "
                "a code has one severity and scope: give both rules the same, or each its "
                "own code"
            )


def step_matches(pattern: str, step: str) -> bool:
    """Whether ``step`` matches ``pattern`` (:mod:`fnmatch` rules; ``*``
    also crosses ``/``)."""
    return step == pattern or fnmatch.fnmatchcase(step, pattern)


def cause_of(event: Event) -> ExceptionInfo | None:
    """The recorded exception of ``event`` (an unavailable or failed step,
    or the run's end), if it has one. For message hooks and templates."""
    if isinstance(event, StepUnavailable | StepFailed | RunFinished):
        return event.cause
    return None


def reason_of(event: Event) -> str:
    """One human line for why a step did not end ok: the reasons of an
    unavailable step, else its exception's ``reason``, the timeout, or how
    its process died. The kernel's generic messages use it; so may a
    slice's hook, for messages that read the same."""
    match event:
        case StepUnavailable(reasons=reasons, cause=cause):
            if reasons:
                return "; ".join(reasons)
            return cause.reason if cause is not None else event.outcome.value
        case StepFailed(cause=cause):
            return cause.reason
        case StepTimedOut(timeout_s=timeout_s):
            return f"timed out after {timeout_s:g} s"
        case StepCrashed(signal=signal, exit_code=exit_code, stderr_tail=tail):
            if signal is not None:
                text = f"its process was killed by signal {signal}"
            elif exit_code is not None:
                text = f"its process exited with code {exit_code}"
            else:
                text = "its process died"
            return f"{text}; last stderr line: {tail[-1]}" if tail else text
        case _:
            return outcome_of(event) or "unknown"


class _Keyed(dict[str, Any]):
    """A keyed template field (``{result[backend]}``): a missing key reads
    as ``-`` rather than failing a replay over a log written by another
    release."""

    def __missing__(self, key: str) -> str:
        return "-"


def _mapping(value: object) -> _Keyed:
    return _Keyed(value) if isinstance(value, Mapping) else _Keyed()


class _Fields(dict[str, Any]):
    """The template fields of one event, each worked out when a template
    first names it (a rule names a few, all known: a rule is checked when
    it is made)."""

    __slots__ = ("inputs",)

    def __init__(self, event: Event, started: StepStarted | None, next_step: str) -> None:
        super().__init__()
        self.inputs = (event, started, next_step)

    def __missing__(self, key: str) -> Any:
        value = self[key] = _FIELD_MAKERS[key](*self.inputs)
        return value


def _verb(event: Event) -> str:
    outcome = outcome_of(event)
    return "" if outcome is None else _VERBS.get(outcome, str(outcome))


#: How each template field is worked out from the event, the step's start
#: and the next attempt (a fallback rule's).
_FIELD_MAKERS: Mapping[str, Callable[[Event, StepStarted | None, str], Any]] = {
    "step": lambda event, started, next_step: event.step,
    "name": lambda event, started, next_step: event.step.rpartition("/")[2],
    "parent": lambda event, started, next_step: event.step.rpartition("/")[0],
    "outcome": lambda event, started, next_step: outcome_of(event) or "",
    "verb": lambda event, started, next_step: _verb(event),
    "next": lambda event, started, next_step: next_step,
    "next_name": lambda event, started, next_step: next_step.rpartition("/")[2],
    "reason": lambda event, started, next_step: reason_of(event),
    "error": lambda event, started, next_step: getattr(cause_of(event), "reason", ""),
    "message": lambda event, started, next_step: getattr(cause_of(event), "message", ""),
    "result": lambda event, started, next_step: _mapping(
        event.result if isinstance(event, StepSucceeded) else None
    ),
    "attributes": lambda event, started, next_step: _mapping(
        None if started is None else started.attributes
    ),
}


#: The fields a rule's templates name by one key (``{result[backend]}``),
#: and its ``when`` and ``defaults`` by ``result.backend``.
_KEYED_FIELDS = ("result", "attributes")
#: The fields only a fallback rule's templates have: the next attempt.
_NEXT_FIELDS = frozenset({"next", "next_name"})

#: The outcomes of an attempt that a fallback can follow.
_ATTEMPT_FAILURES = frozenset(Outcome) - {Outcome.OK, Outcome.CANCELLED}

#: How an outcome reads after the step's name (``Step x timed out``), where
#: that is not the outcome itself (``Step x unavailable``).
_VERBS = {Outcome.OK: "succeeded", Outcome.TIMED_OUT: "timed out"}


def _template_fault(template: str, *, fallback: bool) -> str | None:
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        return str(exc)
    for _text, field, spec, _conversion in parts:
        if field is None:
            continue
        root, bracket, key = field.partition("[")
        if root in _NEXT_FIELDS and not fallback:
            return f"{{{field}}} is the next attempt's: only a fallback rule has one"
        if root not in _FIELD_MAKERS:
            return f"{{{field}}} names no field"
        keyed = root in _KEYED_FIELDS and key.endswith("]")
        if (bracket and not keyed) or any(mark in key[:-1] for mark in "[]."):
            return f"{{{field}}}: only result and attributes take a key, and one"
        if spec:
            return f"{{{field}:{spec}}}: a field takes no format spec (values are text)"
    return None


def _recorded_key(key: object, where: str) -> str:
    if not isinstance(key, str) or key.count(".") != 1 or key.split(".")[0] not in _KEYED_FIELDS:
        raise ValueError(
            f"MessageRule {where} key {key!r} is not 'result.KEY' or 'attributes.KEY' "
            "(a key of the step's result or of its start attributes)"
        )
    return key


def _conditions(value: Mapping[str, Any]) -> dict[str, JsonValue]:
    found = dict(value)
    for key, wanted in found.items():
        if key == "cause" and not isinstance(wanted, bool):
            give = "True (the step recorded an exception) or False (it recorded none)"
        elif key == "kind" and wanted not in set(StepKind):
            give = "one of " + ", ".join(repr(kind.value) for kind in StepKind)
        elif key == "message" and not isinstance(wanted, str):
            give = "a pattern over the cause's message ('Checkpoint * missing')"
        else:
            if key not in ("cause", "kind", "message"):
                _recorded_key(key, "when")
            continue
        raise ValueError(f"MessageRule when[{key!r}] is {wanted!r}: give {give}")
    return found


def _defaults(value: Mapping[str, Any]) -> dict[str, str]:
    return {_recorded_key(key, "defaults"): str(text) for key, text in value.items()}


@attrs.frozen(kw_only=True)
class MessageRule:
    """One message, declared as data: which events produce it and its text.

    A rule matches a terminal step event whose step matches ``step`` (an
    :mod:`fnmatch` pattern over the step path), whose outcome is one of
    ``outcomes`` and, when ``exception`` is given, whose cause chain holds an
    exception of that type (``"orchestrator.NoValidCandidateError"`` matches
    the qualified type recorded in the log; a name without a dot matches the
    unqualified name, so ``"PermissionError"`` matches the builtin). A rule
    for ``failed`` matches only on the step the failure started in, not on
    the enclosing steps it goes up through; the failure is then reported by
    this rule instead of the generic ``step.failed``.

    ``when`` adds conditions on what the step recorded, all of which must
    hold: ``{"result.enabled": True}`` (a key of its result, so only when it
    ended ok), ``{"attributes.mode": "fast"}`` (a key of its start
    attributes), ``{"cause": False}`` (whether it recorded an exception),
    ``{"kind": "candidate"}`` (the kind it started as),
    ``{"message": "Checkpoint * missing"}`` (an :mod:`fnmatch` pattern that
    the cause's message matches, for logs whose exception type alone does
    not tell). A missing key reads as ``None``; a bool matches only a bool.

    A *fallback* rule (``fallback``) speaks for an attempt of a fallback
    chain (a step started as an ``attempt`` whose ``fallback_left``
    attribute is true, as :func:`orchestrator.run_fallback_chain` starts
    them) that ended with one of ``outcomes``, and says so when the chain's
    next attempt starts; its templates may also name ``next`` (that
    attempt's step) and ``next_name`` (its last path segment). The attempt's
    span gets the rule's severity when the attempt ends; a chain that ends
    first (the run stopped) gets no message. A fallback rule stands in for
    no other message: a timeout or crash of the attempt is still reported.
    The kernel's own ``fallback.used`` is such a rule, for the steps no
    slice claims.

    Rules are tried in order, the slices' in the order the slices are given,
    the kernel's last; the first that matches an event speaks for it, and
    the later ones do not. A more specific rule therefore goes before a
    general one for the same step.

    ``text`` and ``args`` are :meth:`str.format` templates over these fields:
    ``step``, ``name`` (last path segment), ``parent``, ``outcome``,
    ``verb`` (the outcome after a step's name: ``succeeded``, ``timed out``
    or the outcome itself, ``unavailable``),
    ``reason`` (one line: reasons, cause or timeout), ``error`` (the cause as
    ``Type: message``), ``message`` (the cause's message), ``result`` (the
    step's result, ``{result[key]}``) and ``attributes`` (the step's start
    attributes, ``{attributes[key]}``); a conversion (``{reason!r}``) is
    allowed, a format spec is not. A missing key reads ``-``, or its
    entry in ``defaults`` (``{"attributes.plugin": "{name}"}``: a template
    over the same fields), which also stands for an empty or non-text value.

    Attributes:
        code: the stable message code (``my_engine.cache_missing``).
        text: the message text template.
        step: the step path pattern.
        fallback: a fallback rule: said when the next attempt starts.
        outcomes: the outcomes that match (default ``failed``; a fallback
            rule's, every outcome but ``ok`` and ``cancelled``).
        exception: an exception type the cause chain must hold, or ``None``.
        severity, scope: the code's, as enums or names (``"warning"``,
            ``"local"``; a later slice may override them).
        args: templates of what makes the message unique on its rank (with
            ``code``); ``None``: the rendered text.
        detail: attach the cause's traceback to the message.
        when: conditions on the step's result, attributes and cause.
        defaults: templates for result and attribute values that are
            missing, empty or not text.

    Raises:
        ValueError: a ``when`` or ``defaults`` key is not ``cause``,
            ``kind``, ``message``, ``result.KEY`` or ``attributes.KEY``
            (``defaults``: the last two), ``cause`` is not a bool, ``kind``
            no step kind or ``message`` not text;
            or a template does not parse, names another field, indexes
            one other than ``result`` and ``attributes`` (or by more than
            one key), or has a format spec: found when the rule is made,
            not while a log replays; a fallback rule's ``outcomes`` hold
            ``ok`` or ``cancelled``, or another rule names ``next``;
            ``outcomes`` is empty or names no outcome; ``code`` is empty.
    """

    code: str
    text: str
    step: str
    fallback: bool = False
    outcomes: frozenset[Outcome] = attrs.field(
        default=attrs.Factory(
            lambda rule: _ATTEMPT_FAILURES if rule.fallback else frozenset({Outcome.FAILED}),
            takes_self=True,
        ),
        converter=_outcomes,
    )
    exception: str | None = None
    severity: Severity = attrs.field(default=Severity.INFO, converter=_severity)
    scope: Scope = attrs.field(default=Scope.PROCESS, converter=_scope)
    args: tuple[str, ...] | None = attrs.field(
        default=None, converter=attrs.converters.optional(_strings)
    )
    detail: bool = True
    when: Mapping[str, JsonValue] = attrs.field(factory=dict, converter=_conditions)
    defaults: Mapping[str, str] = attrs.field(factory=dict, converter=_defaults)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.code, str) or not self.code.strip():
            raise ValueError(
                f"MessageRule code is {self.code!r}: give the stable code of the message "
                "('my_engine.cache_missing')"
            )
        templates = [("text", self.text), *(("args", arg) for arg in self.args or ())]
        templates.extend((f"defaults[{key!r}]", value) for key, value in self.defaults.items())
        for where, template in templates:
            if (fault := _template_fault(template, fallback=self.fallback)) is not None:
                raise ValueError(
                    f"MessageRule {self.code!r}: {where} {template!r}: {fault}; a template "
                    "names step, name, parent, outcome, verb, reason, error, message, "
                    "result[KEY] or attributes[KEY] (a fallback rule's also next and "
                    "next_name)"
                )
        ended = self.outcomes & {Outcome.OK, Outcome.CANCELLED}
        if self.fallback and ended:
            raise ValueError(
                f"MessageRule {self.code!r}: a fallback rule speaks for an attempt that "
                f"failed, not one that ended {' or '.join(sorted(ended))}; drop it from "
                "outcomes"
            )

    def matches_step(self, step: str) -> bool:
        """Whether ``step`` matches :attr:`step`."""
        return step_matches(self.step, step)

    def matches_event(
        self,
        event: Event,
        outcome: Outcome,
        *,
        originated: bool,
        started: StepStarted | None = None,
    ) -> bool:
        """Whether this rule speaks for ``event``, whose step
        :meth:`matches_step` (ended with ``outcome``; ``originated``: a
        failure started at this step; ``started``: the step's start, for
        ``attributes`` conditions)."""
        if outcome not in self.outcomes:
            return False
        if outcome is Outcome.FAILED and isinstance(event, StepFailed) and not originated:
            return False
        if self.fallback and (
            started is None
            or started.kind is not StepKind.ATTEMPT
            or not started.attributes.get("fallback_left")
        ):
            return False
        cause = cause_of(event)
        if self.exception is not None and (cause is None or not self.raised(cause)):
            return False
        for key, wanted in self.when.items():
            if key == "cause":
                held = (cause is not None) is wanted
            elif key == "kind":
                held = started is not None and started.kind == wanted
            elif key == "message":
                held = cause is not None and fnmatch.fnmatchcase(cause.message, str(wanted))
            else:
                # ``result.KEY`` or ``attributes.KEY``: the field a template reads.
                where, _, name = key.partition(".")
                value = _FIELD_MAKERS[where](event, started, "").get(name)
                # JSON's true is not its 1: a bool matches only a bool.
                held = value == wanted and isinstance(value, bool) is isinstance(wanted, bool)
            if not held:
                return False
        return True

    def raised(self, cause: ExceptionInfo) -> bool:
        """Whether ``cause``'s chain holds an exception of :attr:`exception`."""
        wanted = self.exception
        qualified = wanted is not None and "." in wanted
        return any((link.type if qualified else link.name) == wanted for link in cause.chain())

    def render(
        self, event: Event, started: StepStarted | None, *, next_step: str = ""
    ) -> tuple[str, tuple[str, ...]]:
        """The message text and args for ``event`` (a fallback rule's:
        ``next_step``, the attempt that started next)."""
        fields = _Fields(event, started, next_step)
        for key, template in self.defaults.items():
            where, _, name = key.partition(".")
            value = fields[where].get(name)
            if not isinstance(value, str) or not value:
                fields[where][name] = template.format_map(fields)
        text = self.text.format_map(fields)
        if self.args is None:
            return text, (text,)
        return text, tuple(template.format_map(fields) for template in self.args)


@attrs.frozen(kw_only=True)
class Column:
    """A column of the report's rank table, and a key of each rank's entry in
    the JSON report.

    The value is the rank's fact ``fact``. With ``step``, the kernel keeps
    that fact itself: the ``key`` of the step's result when it ends ok (the
    whole result when ``key`` is ``None``); otherwise the slice's ``facts``
    hook does.

    Attributes:
        title: the column heading (``CACHE``).
        fact: the fact's name (``cache_dir``).
        step, key: where to read it from, for a result fact.
        labels: how to show some values (``{True: "on", False: "off"}``);
            others are shown as ``str(value)``, ``None`` as ``-``.
    """

    title: str
    fact: str
    step: str | None = None
    key: str | None = None
    labels: Mapping[JsonValue, str] = attrs.field(factory=dict)

    def cell(self, value: JsonValue) -> str:
        """The text shown for ``value``."""
        for known, label in self.labels.items():
            # ``True == 1``: compare types too, so a label for True is not 1's.
            if known == value and type(known) is type(value):
                return label
        return "-" if value is None else str(value)


@attrs.frozen(kw_only=True)
class Agreement:
    """A fact every rank must agree on (SPEC §3.6 divergence codes).

    Ranks whose fact differs make a :class:`~events.Divergence` with
    ``code``; its text is ``"{what}: {value} on ranks ...; .... {Advice}"``.
    Ranks whose fact is ``None`` are left out, unless ``among`` names a fact:
    then exactly the ranks where that fact is true are compared, ``None``
    included (shown as ``none_text``).

    Attributes:
        code: the divergence's message code.
        fact: the fact compared.
        what: what differs, as a sentence start.
        advice: what to do.
        among: the fact that says a rank took part, or ``None``.
        none_text: how a ``None`` value is named.
    """

    code: str
    fact: str
    what: str
    advice: str
    among: str | None = None
    none_text: str = "none"


class MessageContext(Protocol):
    """What the kernel offers a :class:`MessageHook` for one event."""

    @property
    def event(self) -> Event:
        """The event being derived."""
        ...

    @property
    def started(self) -> StepStarted | None:
        """For a terminal step event: its step's ``step.started``."""
        ...

    @property
    def originated(self) -> bool:
        """For a ``step.failed``: the failure started at this step (it is not
        a child's failure going up)."""
        ...

    def severity(self, code: str) -> Severity:
        """The severity of ``code`` under the slices."""
        ...

    def emit(
        self,
        code: str,
        text: str,
        *,
        step: str,
        args: tuple[str, ...] | list[str],
        seqs: tuple[int, ...] | list[int] = (),
        exception: ExceptionInfo | None = None,
    ) -> None:
        """Derive a message (once per rank per ``(code, args)``), with the
        recorded exception whose traceback it carries, if any."""
        ...

    def raise_severity(self, step: str, severity: Severity) -> None:
        """Count ``severity`` for ``step``'s span."""
        ...


class MessageHook(Protocol):
    """Stateful message derivations of a slice, for what rules cannot say.

    The hook's memory is any frozen value; the kernel keeps one per rank and
    hands it back with each event. Both phases must be pure.
    """

    def initial(self) -> Any:
        """The memory of a rank before its first event."""
        ...

    def before(self, context: MessageContext, memory: Any) -> Any:
        """Called first for every event; returns the new memory."""
        ...

    def after(self, context: MessageContext, memory: Any) -> Any:
        """Called after the kernel's own derivations and the rules; returns
        the new memory."""
        ...

    def covers_stop(self, step: str, started: StepStarted | None) -> bool:
        """Whether the hook reports a timeout or crash of ``step`` itself
        (no generic ``step.timed_out``/``step.crashed``). A failure is
        covered by a rule (:class:`MessageRule`), not by a hook."""
        ...


@attrs.frozen(kw_only=True)
class Loss:
    """A capability a rank can lose while the start still reaches ready.

    A rank has lost it when its fact ``fact`` is true. Losses do not make a
    run degraded by themselves (an absence can be expected); when a ready run
    is degraded (ERROR messages, timed-out probes), its report names what was
    lost and on which ranks in its first lines.

    Attributes:
        fact: the rank's fact that says the capability is lost.
        what: what was lost, as a phrase (``all-reduce fusion off``).
    """

    fact: str
    what: str


@attrs.frozen(kw_only=True)
class Collective:
    """A step every rank of a launch joins together: a rank that ends it
    other than ``ok`` (unavailable, absent, invalid: recorded and gone on
    without it) leaves its peers waiting in it, and their failures there or
    in later exchanges are that rank's doing.

    When a run does not end ready, replay names such a rank as the root
    cause if it left before anything else failed (a peer failing at the
    rendezvous long after is not the first failure): the report says the
    rank went on without ``what`` and why (:attr:`RootCause.left_out`).
    Only a run of more than one rank has peers to leave.

    Attributes:
        step: the step path (``process_group``).
        what: what the step forms, as a phrase (``the process group``).
    """

    step: str
    what: str


def checked_slices(slices: Sequence[Any]) -> tuple[Slice, ...]:
    """``slices`` as a tuple, each checked to be a :class:`Slice`.

    Raises:
        TypeError: ``slices`` is one slice or a string, not a sequence, or
            one is not a slice (an import path is what the command line's
            ``--slice`` loads; in code the object is passed).
    """
    if isinstance(slices, str | Slice):
        what = f"the slice {slices.name!r}" if isinstance(slices, Slice) else repr(slices)
        raise TypeError(f"slices is {what}, not a list of events.Slice: pass slices=[...]")
    for index, part in enumerate(slices):
        if not isinstance(part, Slice):
            raise TypeError(
                f"slices[{index}] is {part!r}, not an events.Slice: pass the object "
                "(an import path is what the command line's --slice loads)"
            )
    return tuple(slices)


#: ``facts(facts, event)``, pure: the facts ``event`` (a terminal step event
#: or a decision) changes, or ``None``.
FactsHook = Callable[[Mapping[str, JsonValue], Event], Mapping[str, JsonValue] | None]


@attrs.frozen(kw_only=True)
class Slice:
    """Everything the generic projections need to know about a set of steps.

    Attributes:
        name: the slice's name (``engine``).
        steps: step path patterns the slice claims (no generic candidate or
            fallback messages there).
        rules: message rules (rules with one code give it one severity and
            scope).
        severities: default ``(severity, scope)`` of the codes the slice's
            hook and agreements derive (its rules carry their own; a code
            named both here and by a rule takes its entry here).
        facts: the facts of a rank and their initial values, in report order.
        report_facts: the facts written per rank in the JSON report (default:
            every fact).
        columns: the report's table columns.
        agreements: facts every rank must agree on.
        losses: capabilities a ready rank can lose (named first in the
            report of a degraded run).
        collectives: steps every rank must join (a rank that went on
            without one is named as the root cause of its peers' failures).
        peer_waits: where a stalled thread waits for another process of the
            launch (a peer at a rendezvous, a process it started):
            ``fnmatch`` patterns of the file of
            :attr:`StepStalled.waiting_in` (``*/torch/distributed/*``). A
            rank last seen waiting there did not stop the run on its own:
            the root cause is sought among the ranks that were not (all of
            them, if every one was).
        derive_facts: a :data:`FactsHook`, or ``None``.
        messages: a :class:`MessageHook`, or ``None``.
        state_type: the per-rank state class, a subclass of
            :class:`~events.RankState` with typed views of the facts.
    """

    name: str
    steps: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    rules: tuple[MessageRule, ...] = attrs.field(
        default=(), converter=_tuple, validator=[_each(MessageRule), _one_rule_per_code]
    )
    severities: Mapping[str, Rule] = attrs.field(factory=dict, converter=_code_rules)
    facts: Mapping[str, JsonValue] = attrs.field(factory=dict)
    report_facts: tuple[str, ...] | None = None
    columns: tuple[Column, ...] = attrs.field(default=(), converter=_tuple, validator=_each(Column))
    agreements: tuple[Agreement, ...] = attrs.field(
        default=(), converter=_tuple, validator=_each(Agreement)
    )
    losses: tuple[Loss, ...] = attrs.field(default=(), converter=_tuple, validator=_each(Loss))
    collectives: tuple[Collective, ...] = attrs.field(
        default=(), converter=_tuple, validator=_each(Collective)
    )
    peer_waits: tuple[str, ...] = attrs.field(default=(), converter=_strings)
    derive_facts: FactsHook | None = attrs.field(default=None, eq=False)
    messages: MessageHook | None = attrs.field(default=None, eq=False)
    state_type: type[RankState] | None = None

    def claims(self, step: str) -> bool:
        """Whether ``step`` is one of this slice's."""
        return any(step_matches(pattern, step) for pattern in self.steps)

    def waits_for_another(self, stall: StepStalled | None) -> bool:
        """Whether ``stall`` shows its thread waiting for another process
        of the launch: the file it waits in matches :attr:`peer_waits`."""
        frame = stall.waiting_in if stall is not None else None
        return frame is not None and any(
            fnmatch.fnmatch(frame.filename, pattern) for pattern in self.peer_waits
        )

    def code_rules(self) -> dict[str, Rule]:
        """Every code this slice derives, with its default severity and scope
        (:attr:`severities` over its rules')."""
        found = {rule.code: (rule.severity, rule.scope) for rule in self.rules}
        found.update(self.severities)
        return found

    def import_path(self) -> str:
        """Where this slice can be loaded from, as ``--slice`` takes it: the
        first loaded module holding it as an attribute (``MODULE:NAME``; the
        module's file for a script or a slice loaded from a file), else its
        name alone."""
        found: str | None = None
        for module_name, module in list(sys.modules.items()):
            names = getattr(module, "__dict__", None)
            if not isinstance(names, dict):
                continue
            attribute = next((k for k, v in list(names.items()) if v is self), None)
            if attribute is None:
                continue
            if module_name != "__main__" and not module_name.startswith(SLICE_FILE_MODULE):
                return f"{module_name}:{attribute}"
            path = getattr(module, "__file__", None)
            if found is None and isinstance(path, str) and path.endswith(".py"):
                found = f"{os.path.abspath(path)}:{attribute}"
        return found or self.name

    def reported_facts(self) -> tuple[str, ...]:
        """The facts written per rank in the JSON report."""
        if self.report_facts is not None:
            return self.report_facts
        return tuple(dict.fromkeys([*self.facts, *(column.fact for column in self.columns)]))
