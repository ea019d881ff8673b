"""Error policies: which exceptions a step records and which propagate.

A policy is data: an ordered tuple of :class:`Rule` objects, each naming an
exception type (matched against the exception's MRO by qualified name, so a
rule for ``OSError`` covers ``PermissionError``) and what to do. The first
matching rule wins; no match means *propagate*. Non-``Exception``
BaseExceptions (KeyboardInterrupt, SystemExit) always propagate, whatever
the rules say. Because rules match by name, the same policy classifies a live
exception and one that came back as data from an isolated subprocess.
The defaults below are those of SPEC §3.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

from events import Outcome

from ._importer import dotted_prefixes

__all__ = [
    "ANY_EXCEPTION_POLICY",
    "PROBE_POLICY",
    "Action",
    "Classification",
    "ErrorPolicy",
    "Rule",
    "When",
    "optional_module_policy",
]


class Action(enum.StrEnum):
    """What a rule does with a matching exception."""

    RECORD = "record"
    PROPAGATE = "propagate"


class When(enum.StrEnum):
    """Extra conditions a rule may require beyond the type.

    ``always``                the type is enough;
    ``names_probed_module``   the ImportError's ``name`` is the policy's
                              module or one of its parent packages (the
                              module itself is not installed).
    """

    ALWAYS = "always"
    NAMES_PROBED_MODULE = "names_probed_module"


#: The outcomes a step that ends without propagating an error may record.
RECORDED_OUTCOMES = (Outcome.ABSENT, Outcome.UNAVAILABLE, Outcome.INVALID)


@attrs.frozen(kw_only=True)
class Rule:
    """Match ``exception`` (a qualified type name, bare for builtins) and act.

    ``outcome`` is the recorded outcome (``absent``, ``unavailable`` or
    ``invalid``) for :attr:`Action.RECORD`.
    """

    exception: str
    action: Action = Action.RECORD
    outcome: Outcome = Outcome.UNAVAILABLE
    when: When = When.ALWAYS

    def __attrs_post_init__(self) -> None:
        if self.action is Action.RECORD and self.outcome not in RECORDED_OUTCOMES:
            raise ValueError(
                f"a recording rule's outcome is absent, unavailable or invalid, not {self.outcome}"
            )


@attrs.frozen(kw_only=True)
class Classification:
    """The verdict of a policy on one exception."""

    action: Action
    outcome: Outcome
    rule: Rule | None = None

    @property
    def record(self) -> bool:
        """Whether the exception is recorded and the run goes on."""
        return self.action is Action.RECORD


_PROPAGATE = Classification(action=Action.PROPAGATE, outcome=Outcome.FAILED)


@attrs.frozen(kw_only=True)
class ErrorPolicy:
    """An ordered list of rules plus what to do on timeout and crash.

    Attributes:
        name: for display (``"probe"``, ``"optional module zentorch"``).
        rules: checked in order; the first match decides.
        module: the probed module, for :attr:`When.NAMES_PROBED_MODULE`.
        on_timeout: :attr:`Action.RECORD` (outcome ``timed_out``, the run goes
            on) or :attr:`Action.PROPAGATE` (the run fails with
            :class:`~orchestrator.StepTimeoutError`).
        on_crash: the same choice for an isolated step whose process died.
    """

    name: str
    rules: tuple[Rule, ...] = ()
    module: str | None = None
    on_timeout: Action = Action.RECORD
    on_crash: Action = Action.RECORD

    def classify(self, exc: BaseException) -> Classification:
        """Decide what to do with a live exception."""
        names, module_name = exception_names(exc)
        return self.classify_names(names, module_name=module_name)

    def classify_names(
        self, mro: Sequence[str], *, module_name: str | None = None
    ) -> Classification:
        """Decide from an exception's MRO as qualified names (how an isolated
        step's exception comes back) and, for ImportError, its ``name``."""
        if "Exception" not in mro:
            return _PROPAGATE
        for rule in self.rules:
            if rule.exception not in mro:
                continue
            if rule.when is When.NAMES_PROBED_MODULE and not (
                self.module and module_name in dotted_prefixes(self.module)
            ):
                continue
            outcome = rule.outcome if rule.action is Action.RECORD else Outcome.FAILED
            return Classification(action=rule.action, outcome=outcome, rule=rule)
        return _PROPAGATE

    def describe(self) -> str:
        """One line per rule, for ``explain`` and docs."""
        lines = [f"policy {self.name}:"]
        for rule in self.rules:
            condition = "" if rule.when is When.ALWAYS else f" when {rule.when}"
            verdict = rule.outcome if rule.action is Action.RECORD else "propagate"
            lines.append(f"  {rule.exception}{condition} -> {verdict}")
        lines.append("  anything else -> propagate")
        lines.append(f"  timeout -> {self.on_timeout}, crash -> {self.on_crash}")
        return "\n".join(lines)


def qualified_name(cls: type) -> str:
    """``PermissionError`` for builtins, ``module.Qualname`` otherwise."""
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module}.{cls.__qualname__}"


def exception_names(exc: BaseException) -> tuple[tuple[str, ...], str | None]:
    """What a policy matches ``exc`` by: its MRO as qualified names and, for
    an ImportError, the module it names."""
    module = getattr(exc, "name", None) if isinstance(exc, ImportError) else None
    names = tuple(qualified_name(cls) for cls in type(exc).__mro__)
    return names, module if isinstance(module, str) else None


#: SPEC §3.1 (attention-backend probes): environment failures (ImportError,
#: OSError) are recorded as ``unavailable``, programming errors propagate.
PROBE_POLICY = ErrorPolicy(
    name="probe", rules=(Rule(exception="ImportError"), Rule(exception="OSError"))
)

#: SPEC §3.3 (the optional ``flashinfer.comm`` import): any Exception is
#: recorded as ``unavailable`` (BaseExceptions still propagate).
ANY_EXCEPTION_POLICY = ErrorPolicy(name="any exception", rules=(Rule(exception="Exception"),))


def optional_module_policy(module: str) -> ErrorPolicy:
    """SPEC §3.2 (zentorch): absent if ``module`` itself (or a parent package)
    is not installed; broken (unavailable) for any other ImportError or
    OSError; anything else propagates."""
    return ErrorPolicy(
        name=f"optional module {module}",
        module=module,
        rules=(
            Rule(
                exception="ModuleNotFoundError",
                outcome=Outcome.ABSENT,
                when=When.NAMES_PROBED_MODULE,
            ),
            Rule(exception="ImportError"),
            Rule(exception="OSError"),
        ),
    )
