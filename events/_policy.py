"""The severity policy: which severity and scope message codes have, as
versioned data a JSON document holds, laid over the slices as the last one."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from ._errors import DecodeError, EventsError
from ._severity import Scope, Severity
from ._slices import Rule, Slice, _code_rules

__all__ = ["PolicyError", "Rule", "SeverityPolicy"]


class PolicyError(EventsError, ValueError):
    """A severity policy document is malformed.

    Attributes:
        reason: what is wrong and what would be valid.
    """

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"invalid severity policy: {reason}")


#: The codes the kernel derives for every graph. A slice adds its own.
_GENERIC: dict[str, Rule] = {
    "step.failed": (Severity.ERROR, Scope.PROCESS),
    "step.timed_out": (Severity.ERROR, Scope.PROCESS),
    "step.crashed": (Severity.ERROR, Scope.PROCESS),
    # A step past the stall threshold: once per step, once per node.
    "step.stalled": (Severity.INFO, Scope.LOCAL),
    "run.ready": (Severity.INFO, Scope.GLOBAL),
    "run.failed": (Severity.ERROR, Scope.PROCESS),
    "run.interrupted": (Severity.ERROR, Scope.PROCESS),
    # A candidate that did not fit is expected on many hosts: one DEBUG line.
    "candidate.unavailable": (Severity.DEBUG, Scope.PROCESS),
    # An attempt a fallback recovered: recovered breakage, once per node.
    "fallback.used": (Severity.WARNING, Scope.LOCAL),
}


@attrs.frozen(kw_only=True)
class SeverityPolicy:
    """Which severity and scope message codes have: data, versioned.

    A newer policy file re-derives the messages of an old log: put it last
    among the slices, ``replay(logs, slices=[ENGINE,
    SeverityPolicy.from_json(text).as_slice()])``. A code the policy does not
    name keeps its slice's severity and scope (the kernel's own for the
    generic codes).

    Attributes:
        version: the policy's version (written in its JSON form).
        rules: code -> ``(severity, scope)``.
    """

    version: int = 1
    rules: Mapping[str, Rule] = attrs.field(factory=dict, converter=_code_rules)

    def as_slice(self) -> Slice:
        """The policy as a slice that claims no step and only sets its codes'
        severities and scopes: what replay, the projections, the logging
        bridge and the exporters take, last among the slices it overrides."""
        return Slice(name=f"severity policy v{self.version}", severities=self.rules)

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
        old = self.rules.get(code) or _GENERIC.get(code, (Severity.ERROR, Scope.PROCESS))
        rules = {**self.rules, code: (severity or old[0], scope or old[1])}
        return SeverityPolicy(version=self.version + 1 if version is None else version, rules=rules)

    def to_json(self) -> str:
        """The policy as a JSON document::

        {"version": 1, "rules": {"step.timed_out": {"severity": "warning",
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

        Rules are laid over ``base`` (default: none, so a code the file does
        not name keeps its default: its slice's, or the kernel's for the
        generic codes), so a file may name only the codes it changes; a rule
        may leave out ``scope`` for a code ``base`` or the kernel knows (read
        a file naming only engine codes with ``base`` the engine's policy).

        Raises:
            PolicyError: not JSON, no integer ``version``, or a rule with an
                unknown severity or scope (the message names the code and the
                valid values).
        """
        from ._codec import structure

        parsed: Any = data
        if isinstance(data, str | bytes):
            try:
                parsed = json.loads(data)
            except ValueError as exc:
                raise PolicyError(f"not JSON ({exc})") from None
        try:
            document = structure(
                PolicyFile, dict(parsed) if isinstance(parsed, Mapping) else parsed
            )
        except DecodeError as exc:
            raise PolicyError(str(exc)) from None
        # Severities and scopes are parsed by the rules' converter.
        rules: dict[str, tuple[Any, Any]] = {} if base is None else dict(base.rules)
        for code, rule in document.rules.items():
            known = rules.get(code) or _GENERIC.get(code)
            if not (scope := rule.scope or (known and known[1])):
                raise PolicyError(f"rule {code!r} needs a 'scope' (process, local or global)")
            rules[code] = (rule.severity, scope)
        return cls(version=document.version, rules=rules)


def _parsed(parse: Any) -> Any:
    def check(_instance: object, _attribute: object, value: str | None) -> None:
        if value is not None:
            parse(value)

    return check


def _positive(_instance: object, _attribute: object, value: int) -> None:
    if value < 1:
        raise ValueError(f"must be a positive integer, not {value!r}")


@attrs.frozen(kw_only=True)
class PolicyRule:
    """One code's rule, as a policy file writes it."""

    severity: str = attrs.field(validator=_parsed(Severity.parse))
    scope: str | None = attrs.field(default=None, validator=_parsed(Scope.parse))


@attrs.frozen(kw_only=True)
class PolicyFile:
    """A policy file, as :meth:`SeverityPolicy.to_json` writes it."""

    version: int = attrs.field(validator=_positive)
    rules: Mapping[str, PolicyRule] = attrs.field(factory=dict)
