"""Fault plans: which import or step fails how, on which ranks.

A fault plan is data. It is parsed from command-line specs::

    [RANKS:]TARGET=EXCEPTION[:MESSAGE]

    zentorch=OSError:libzentorch.so: undefined symbol: _ZN3c10
    3:flashinfer.comm=TypeError:type 'array.array' is not subscriptable
    0-3:attention/FLASH_ATTN=hang
    1,5:platform/cuda=crash

or from a JSON file for structured arguments::

    [{"target": "flashinfer", "exception": "PermissionError",
      "args": [13, "Permission denied", "/root/.cache/flashinfer"],
      "ranks": "0-3"}]

TARGET is a module a probe imports or a step path. EXCEPTION is the name of
a builtin exception class, ``hang`` (never returns until the run releases it)
or ``crash`` (the process dies with SIGSEGV). Exception classes are looked up
among the builtins only; nothing named in a spec is imported or evaluated.
"""

from __future__ import annotations

import builtins
import enum
import json
import os
import re
import signal
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from ._errors import FaultSpecError

__all__ = ["Fault", "FaultAction", "FaultPlan", "parse_ranks"]

_TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")
_RANKS = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


def _builtin_exceptions() -> dict[str, type[BaseException]]:
    return {
        name: value
        for name, value in vars(builtins).items()
        if isinstance(value, type) and issubclass(value, BaseException)
    }


_EXCEPTIONS = _builtin_exceptions()


class FaultAction(enum.StrEnum):
    """What an injected fault does."""

    RAISE = "raise"
    HANG = "hang"
    CRASH = "crash"


def parse_ranks(text: str, *, spec: str | None = None) -> frozenset[int]:
    """``"3"``, ``"0-3"``, ``"1,5"``, ``"0-1,6-7"`` to a set of ranks.

    Raises:
        FaultSpecError: malformed, or a range that runs backwards.
    """
    cleaned = text.replace(" ", "")
    if not _RANKS.match(cleaned):
        raise FaultSpecError(
            spec or text, text, "ranks are like 3, 0-3 or 1,5 (non-negative integers)"
        )
    ranks: set[int] = set()
    for part in cleaned.split(","):
        low, _, high = part.partition("-")
        start, end = int(low), int(high or low)
        if end < start:
            raise FaultSpecError(spec or text, part, "a rank range must not run backwards")
        ranks.update(range(start, end + 1))
    return frozenset(ranks)


@attrs.frozen(kw_only=True)
class Fault:
    """One injected fault.

    Attributes:
        target: module name or step path.
        action: raise, hang or crash.
        exception: builtin exception class name, for :attr:`FaultAction.RAISE`.
        args: constructor arguments (JSON scalars).
        kwargs: keyword arguments (only ``name``/``path`` for ImportError types).
        ranks: ranks it applies to; ``None`` for every rank.
    """

    target: str
    action: FaultAction = FaultAction.RAISE
    exception: str | None = None
    args: tuple[str | int | float | bool | None, ...] = ()
    kwargs: Mapping[str, str] = attrs.field(factory=dict)
    ranks: frozenset[int] | None = None

    def applies_to(self, rank: int) -> bool:
        """Whether the fault fires on ``rank``."""
        return self.ranks is None or rank in self.ranks

    def make_exception(self) -> BaseException:
        """A fresh instance of the configured exception.

        ImportError types without an explicit ``name`` get the target as their
        ``name`` (as a real failed import of it would), and a
        ModuleNotFoundError without a message says ``No module named ...``.
        """
        if self.exception is None:
            raise ValueError(f"fault on {self.target!r} has no exception to raise")
        cls = _EXCEPTIONS[self.exception]
        args = self.args
        kwargs = dict(self.kwargs)
        if issubclass(cls, ImportError):
            kwargs.setdefault("name", self.target)
            if not args and issubclass(cls, ModuleNotFoundError):
                args = (f"No module named {self.target!r}",)
        return cls(*args, **kwargs)

    def fire(self, release: threading.Event) -> None:
        """Do what the fault says: raise, block until ``release`` is set (then
        raise TimeoutError, as the result is no longer wanted), or crash."""
        if self.action is FaultAction.RAISE:
            raise self.make_exception()
        if self.action is FaultAction.HANG:
            release.wait()
            raise TimeoutError(f"injected hang on {self.target!r} was released")
        # A real crash: the process dies by signal, no Python cleanup runs.
        os.kill(os.getpid(), signal.SIGSEGV)
        signal.pause()  # pragma: no cover - the signal ends the process

    def to_json(self) -> dict[str, Any]:
        """The JSON form :meth:`FaultPlan.from_json` reads."""
        data: dict[str, Any] = {"target": self.target}
        data["exception"] = self.exception if self.action is FaultAction.RAISE else self.action
        if self.args:
            data["args"] = list(self.args)
        if self.kwargs:
            data["kwargs"] = dict(self.kwargs)
        if self.ranks is not None:
            data["ranks"] = sorted(self.ranks)
        return data


@attrs.frozen(kw_only=True)
class FaultPlan:
    """An ordered set of faults; the first that matches a target and rank wins."""

    faults: tuple[Fault, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.faults)

    def for_target(self, target: str, rank: int) -> Fault | None:
        """The fault for ``target`` on ``rank``, if any."""
        for fault in self.faults:
            if fault.target == target and fault.applies_to(rank):
                return fault
        return None

    def targets(self, rank: int) -> frozenset[str]:
        """Every target with a fault on ``rank``."""
        return frozenset(f.target for f in self.faults if f.applies_to(rank))

    def __add__(self, other: FaultPlan) -> FaultPlan:
        return FaultPlan(faults=self.faults + other.faults)

    @classmethod
    def parse(cls, specs: Iterable[str]) -> FaultPlan:
        """Parse ``[RANKS:]TARGET=EXCEPTION[:MESSAGE]`` specs.

        Raises:
            FaultSpecError: naming the bad part and what would be valid.
        """
        return cls(faults=tuple(_parse_spec(spec) for spec in specs))

    @classmethod
    def from_json(cls, data: object, *, source: str = "fault file") -> FaultPlan:
        """Build a plan from the JSON form (a list of fault objects).

        Raises:
            FaultSpecError: naming the bad entry and field.
        """
        if isinstance(data, dict) and "faults" in data:
            data = data["faults"]
        if not isinstance(data, list):
            raise FaultSpecError(source, "<top level>", "expected a list of fault objects")
        return cls(faults=tuple(_fault_from_json(item, source, i) for i, item in enumerate(data)))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> FaultPlan:
        """Read a JSON fault file.

        Raises:
            FaultSpecError: the file is unreadable, not JSON, or malformed.
        """
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise FaultSpecError(str(path), str(path), f"cannot read: {exc.strerror}") from exc
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise FaultSpecError(
                str(path), f"line {exc.lineno} column {exc.colno}", f"not valid JSON: {exc.msg}"
            ) from exc
        return cls.from_json(data, source=str(path))

    def to_json(self) -> list[dict[str, Any]]:
        """The JSON form (for handing a plan to a child process)."""
        return [fault.to_json() for fault in self.faults]


def _check_target(spec: str, target: str) -> str:
    if not _TARGET.match(target):
        raise FaultSpecError(
            spec,
            target or "<empty target>",
            "the target is a module name (zentorch, flashinfer.comm) or a step path "
            "(attention/FLASH_ATTN)",
        )
    return target


def _action_for(spec: str, name: str) -> tuple[FaultAction, str | None]:
    if name in ("hang", "crash"):
        return FaultAction(name), None
    cls = _EXCEPTIONS.get(name)
    if cls is None:
        close = sorted(n for n in _EXCEPTIONS if n.lower().startswith(name[:3].lower()))[:6]
        hint = f" (did you mean {', '.join(close)}?)" if close and name else ""
        raise FaultSpecError(
            spec,
            name or "<empty exception>",
            f"expected hang, crash or a builtin exception class name{hint}",
        )
    return FaultAction.RAISE, name


def _parse_spec(spec: str) -> Fault:
    left, equals, right = spec.partition("=")
    if not equals:
        raise FaultSpecError(spec, spec, "expected [RANKS:]TARGET=EXCEPTION[:MESSAGE]")
    ranks: frozenset[int] | None = None
    if ":" in left:
        rank_text, _, left = left.partition(":")
        ranks = parse_ranks(rank_text, spec=spec)
    target = _check_target(spec, left.strip())
    name, colon, message = right.partition(":")
    action, exception = _action_for(spec, name.strip())
    if action is not FaultAction.RAISE and colon:
        raise FaultSpecError(spec, right, f"{action} takes no message")
    args: tuple[str, ...] = (message,) if colon else ()
    return Fault(target=target, action=action, exception=exception, args=args, ranks=ranks)


_SCALARS = (str, int, float, bool, type(None))


def _fault_from_json(item: object, source: str, index: int) -> Fault:
    where = f"entry {index}"
    if not isinstance(item, dict):
        raise FaultSpecError(source, where, "each fault is an object with target and exception")
    unknown = set(item) - {"target", "exception", "args", "kwargs", "ranks"}
    if unknown:
        raise FaultSpecError(
            source,
            f"{where}: {sorted(unknown)[0]}",
            "allowed fields: target, exception, args, kwargs, ranks",
        )
    target = item.get("target")
    if not isinstance(target, str):
        raise FaultSpecError(source, f"{where}: target", "a string is required")
    _check_target(source, target)
    name = item.get("exception")
    if not isinstance(name, str):
        raise FaultSpecError(source, f"{where}: exception", "a string is required")
    action, exception = _action_for(source, name)
    args = item.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, _SCALARS) for a in args):
        raise FaultSpecError(source, f"{where}: args", "a list of strings and numbers")
    kwargs = item.get("kwargs", {})
    if not isinstance(kwargs, dict) or not all(
        k in ("name", "path") and isinstance(v, str) for k, v in kwargs.items()
    ):
        raise FaultSpecError(
            source, f"{where}: kwargs", "only name and path (strings), for ImportError types"
        )
    if kwargs and (exception is None or not issubclass(_EXCEPTIONS[exception], ImportError)):
        raise FaultSpecError(source, f"{where}: kwargs", "only ImportError types take kwargs")
    ranks_value = item.get("ranks")
    ranks: frozenset[int] | None
    if ranks_value is None:
        ranks = None
    elif isinstance(ranks_value, str):
        ranks = parse_ranks(ranks_value, spec=source)
    elif isinstance(ranks_value, list) and all(type(r) is int and r >= 0 for r in ranks_value):
        ranks = frozenset(ranks_value)
    else:
        raise FaultSpecError(source, f"{where}: ranks", 'a string like "0-3" or a list of ranks')
    try:
        fault = Fault(
            target=target,
            action=action,
            exception=exception,
            args=tuple(args),
            kwargs=kwargs,
            ranks=ranks,
        )
        if action is FaultAction.RAISE:
            fault.make_exception()
    except TypeError as exc:
        raise FaultSpecError(source, f"{where}: args", f"{name}{tuple(args)!r}: {exc}") from exc
    return fault


def describe_exceptions() -> Sequence[str]:
    """The exception names a spec may use (for help texts)."""
    return sorted(_EXCEPTIONS)
