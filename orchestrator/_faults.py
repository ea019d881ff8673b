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
a builtin exception class, ``hang`` (never returns, as a real hang)
or ``crash`` (the process dies with SIGSEGV). Exception classes are looked up
among the builtins only; nothing named in a spec is imported or evaluated.

RANKS are kept as inclusive ranges (:class:`RankRanges`), never expanded, so
``0-999999999`` costs what ``3`` costs. Parsing checks the syntax and that
the exception can be built from its arguments; what a plan may name on a
given launch (its world size, the targets its graph has) is checked by
:meth:`FaultPlan.check`.
"""

from __future__ import annotations

import bisect
import builtins
import difflib
import enum
import os
import re
import signal
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping
from typing import Any

import attrs

from events import DecodeError, format_ranks
from events._codec import structure

from ._errors import FaultSpecError
from ._json_text import load_json, read_input

__all__ = ["Fault", "FaultAction", "FaultPlan", "RankRanges"]

_TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-/]*$")
_RANKS = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")


#: The builtin exception classes by name: the only ones a fault names, and
#: the ones an isolated step's exception is rebuilt as.
BUILTIN_EXCEPTIONS: dict[str, type[BaseException]] = {
    name: value
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}


class FaultAction(enum.StrEnum):
    """What an injected fault does."""

    RAISE = "raise"
    HANG = "hang"
    CRASH = "crash"


def _merged_spans(spans: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Sorted, with overlapping and adjacent ranges joined: one form per set."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if start < 0 or end < start:
            raise ValueError(
                f"rank range {start}-{end} is negative or runs backwards; ranks are non-negative"
            )
        if merged and start <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return tuple(merged)


@attrs.frozen
class RankRanges(Collection[int]):
    """A set of ranks held as sorted, disjoint, non-adjacent inclusive ranges.

    Membership is a binary search over the ranges and iteration is lazy, so
    a range of a billion ranks takes the memory of one. Any inclusive
    ``(low, high)`` ranges may be given; they are sorted and joined, so equal
    sets are equal however they were written (``"0-1,2-3"`` == ``"0-3"``).
    ``str()`` is the spec syntax :meth:`parse` reads.

    Raises:
        ValueError: a range is negative or runs backwards.
    """

    spans: tuple[tuple[int, int], ...] = attrs.field(converter=_merged_spans)

    @classmethod
    def parse(cls, text: str, *, spec: str | None = None) -> RankRanges:
        """``"3"``, ``"0-3"``, ``"1,5"``, ``"0-1, 6-7"`` to ranges.

        Raises:
            FaultSpecError: malformed, or a range that runs backwards.
        """
        cleaned = text.replace(" ", "")
        if not _RANKS.match(cleaned):
            raise FaultSpecError(
                spec or text, text, "ranks are like 3, 0-3 or 1,5 (non-negative integers)"
            )
        spans: list[tuple[int, int]] = []
        for part in cleaned.split(","):
            low, _, high = part.partition("-")
            start, end = int(low), int(high or low)
            if end < start:
                raise FaultSpecError(spec or text, part, "a rank range must not run backwards")
            spans.append((start, end))
        return cls(tuple(spans))

    @classmethod
    def of(cls, ranks: Iterable[int]) -> RankRanges:
        """The ranges covering exactly ``ranks``.

        Raises:
            ValueError: a rank is negative.
        """
        return cls(tuple((rank, rank) for rank in ranks))

    def __contains__(self, rank: object) -> bool:
        if not isinstance(rank, int):
            return False
        # The last range starting at or before ``rank`` is the only candidate.
        index = bisect.bisect_right(self.spans, rank, key=lambda span: span[0]) - 1
        return index >= 0 and rank <= self.spans[index][1]

    def __iter__(self) -> Iterator[int]:
        for start, end in self.spans:
            yield from range(start, end + 1)

    def __len__(self) -> int:
        return sum(end - start + 1 for start, end in self.spans)

    def __str__(self) -> str:
        return format_ranks(self.spans, label=False)

    def first_outside(self, world_size: int) -> int | None:
        """The smallest rank that is ``>= world_size``, if any."""
        return next(
            (max(start, world_size) for start, end in self.spans if end >= world_size), None
        )


def _rank_ranges(value: RankRanges | str | Iterable[int] | None) -> RankRanges | None:
    if value is None or isinstance(value, RankRanges):
        return value
    if isinstance(value, str):
        return RankRanges.parse(value)
    return RankRanges.of(value)


@attrs.frozen(kw_only=True)
class Fault:
    """One injected fault.

    Attributes:
        target: module name or step path.
        action: raise, hang or crash.
        exception: builtin exception class name, for :attr:`FaultAction.RAISE`.
        args: constructor arguments (JSON scalars).
        kwargs: keyword arguments (only ``name``/``path`` for ImportError types).
        ranks: ranks it applies to; ``None`` for every rank. Given as
            :class:`RankRanges`, spec text (``"0-3"``) or any iterable of
            ranks, and kept as ranges.
    """

    target: str
    action: FaultAction = FaultAction.RAISE
    exception: str | None = None
    args: tuple[str | int | float | bool | None, ...] = ()
    kwargs: Mapping[str, str] = attrs.field(factory=dict)
    ranks: RankRanges | None = attrs.field(default=None, converter=_rank_ranges)

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
        cls = BUILTIN_EXCEPTIONS[self.exception]
        args = self.args
        kwargs = dict(self.kwargs)
        if issubclass(cls, ImportError):
            kwargs.setdefault("name", self.target)
            if not args and issubclass(cls, ModuleNotFoundError):
                args = (f"No module named {self.target!r}",)
        return cls(*args, **kwargs)

    def describe(self) -> str:
        """The fault as one canonical spec line, as a report header shows it::

            1:zentorch=RuntimeError:unknown zentorch failure
            0-3:flashinfer=PermissionError(13, 'Permission denied', '/root/.cache/flashinfer')
            attention/FLASH_ATTN=hang

        A single printable message keeps the ``--inject`` form (which parses
        back to the same fault); other arguments are written as a call.
        """
        prefix = f"{self.target}=" if self.ranks is None else f"{self.ranks}:{self.target}="
        name = self.exception or "<no exception>"
        message = self.args[0] if len(self.args) == 1 else None
        if self.action is not FaultAction.RAISE:
            return f"{prefix}{self.action}"
        if not self.args and not self.kwargs:
            return prefix + name
        if isinstance(message, str) and not self.kwargs and message.isprintable():
            return f"{prefix}{name}:{message}"
        return prefix + self._call_text()

    __str__ = describe

    def _call_text(self) -> str:
        """``Name(arg, ..., key='value')``: how the exception is built."""
        parts = [repr(arg) for arg in self.args]
        parts.extend(f"{key}={value!r}" for key, value in self.kwargs.items())
        return f"{self.exception}({', '.join(parts)})"

    def fire(self) -> None:
        """Do what the fault says: raise, block forever (as a hung driver
        call does: nothing releases it, so what a run does with a real hang
        is what it does with this one), or crash."""
        if self.action is FaultAction.RAISE:
            raise self.make_exception()
        if self.action is FaultAction.HANG:
            threading.Event().wait()
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
            data["ranks"] = str(self.ranks)
        return data


@attrs.frozen(kw_only=True)
class FaultPlan:
    """An ordered set of faults; the first that matches a target and rank wins."""

    faults: tuple[Fault, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.faults)

    def for_target(self, target: str, rank: int) -> Fault | None:
        """The fault for ``target`` on ``rank``, if any."""
        return next((f for f in self.faults if f.target == target and f.applies_to(rank)), None)

    def targets(self, rank: int) -> frozenset[str]:
        """Every target with a fault on ``rank``."""
        return frozenset(f.target for f in self.faults if f.applies_to(rank))

    def check(self, *, world_size: int, targets: Collection[str]) -> None:
        """Check the plan against a launch: every rank a fault names exists
        and every target is one the graph has, so that no fault is silently
        never fired.

        A target is valid when it is in ``targets`` or is a package of a
        dotted module in ``targets`` (a fault on ``flashinfer`` breaks the
        import of ``flashinfer.comm``, see :class:`~orchestrator.InjectingImporter`).

        Args:
            world_size: how many ranks the launch has.
            targets: the modules probes import and the step paths the graph
                can have (for the reference engine,
                ``orchestrator.engine._targets.injection_targets()``).

        Raises:
            FaultSpecError: the first fault with a rank ``>= world_size``
                (``rank 5 is outside the world of 2 ranks (0-1)``) or an
                unknown target (the valid ones listed, a close one
                suggested).
            ValueError: ``world_size`` is not positive.
        """
        if world_size < 1:
            raise ValueError(f"world_size must be at least 1; got {world_size}")
        known = frozenset(targets)
        world = "1 rank (0)" if world_size == 1 else f"{world_size} ranks (0-{world_size - 1})"
        for fault in self.faults:
            outside = None if fault.ranks is None else fault.ranks.first_outside(world_size)
            if outside is not None:
                reason = f"rank {outside} is outside the world of {world}"
                raise FaultSpecError(fault.describe(), str(fault.ranks), reason)
            if not _is_target(fault.target, known):
                raise FaultSpecError(
                    fault.describe(), fault.target, _unknown_target(fault.target, known)
                )

    def __add__(self, other: FaultPlan) -> FaultPlan:
        return FaultPlan(faults=self.faults + other.faults)

    @classmethod
    def parse(cls, specs: Iterable[str]) -> FaultPlan:
        """Parse ``[RANKS:]TARGET=EXCEPTION[:MESSAGE]`` specs.

        Raises:
            FaultSpecError: naming the bad part and what would be valid.
            TypeError: ``specs`` is one string, not a list of them.
        """
        if isinstance(specs, str):  # not one spec per letter
            raise TypeError(f"fault specs are one string: pass a list of specs: [{specs!r}]")
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
            data = load_json(read_input(path))
        except OSError as exc:
            raise FaultSpecError(str(path), str(path), f"cannot read: {exc.strerror}") from exc
        except ValueError as exc:
            raise FaultSpecError(str(path), str(path), str(exc)) from exc
        return cls.from_json(data, source=str(path))

    def to_json(self) -> list[dict[str, Any]]:
        """The JSON form (for handing a plan to a child process)."""
        return [fault.to_json() for fault in self.faults]


def _is_target(target: str, known: frozenset[str]) -> bool:
    if target in known:
        return True
    # A package of a module a probe imports: importing ``a.b`` imports ``a``
    # first, so a fault on ``a`` fires. A submodule of a known module does
    # not: nothing imports it through the importer, so the fault never fires.
    return "/" not in target and any(name.startswith(target + ".") for name in known)


def _unknown_target(target: str, known: frozenset[str]) -> str:
    # Matched case-insensitively: attention/flash_attn means FLASH_ATTN.
    by_folded: dict[str, str] = {}
    for name in sorted(known):
        by_folded.setdefault(name.casefold(), name)
    close = difflib.get_close_matches(target.casefold(), list(by_folded), n=1, cutoff=0.6)
    hint = f" (did you mean {by_folded[close[0]]}?)" if close else ""
    valid = ", ".join(sorted(known)) or "none"
    return f"unknown target {target!r}{hint}; valid targets: {valid}"


def _checked(fault: Fault, spec: str, part: str) -> Fault:
    """``fault``, once its exception is known to be constructible (a fault
    that cannot be raised would otherwise fail in the middle of a run), and
    one that raises nothing has no arguments to drop unsaid."""
    if fault.action is not FaultAction.RAISE and fault.args:
        raise FaultSpecError(spec, part, f"{fault.action} takes no arguments")
    if fault.action is FaultAction.RAISE:
        try:
            fault.make_exception()
        except (TypeError, ValueError) as exc:
            raise FaultSpecError(spec, part, f"{fault._call_text()}: {exc}") from exc
    return fault


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
    if name not in BUILTIN_EXCEPTIONS:
        raise FaultSpecError(
            spec,
            name or "<empty exception>",
            f"expected hang, crash or {not_an_exception(name)}",
        )
    return FaultAction.RAISE, name


def not_an_exception(name: str) -> str:
    """What a name that is no builtin exception class should have been:
    ``a builtin exception class name (did you mean RuntimeError?)``."""
    close = sorted(n for n in BUILTIN_EXCEPTIONS if n.lower().startswith(name[:3].lower()))[:6]
    hint = f" (did you mean {', '.join(close)}?)" if close and name else ""
    return f"a builtin exception class name{hint}"


def _parse_spec(spec: str) -> Fault:
    left, equals, right = spec.partition("=")
    if not equals:
        raise FaultSpecError(spec, spec, "expected [RANKS:]TARGET=EXCEPTION[:MESSAGE]")
    ranks: RankRanges | None = None
    if ":" in left:
        rank_text, _, left = left.partition(":")
        ranks = RankRanges.parse(rank_text, spec=spec)
    target = _check_target(spec, left.strip())
    name, colon, message = right.partition(":")
    action, exception = _action_for(spec, name.strip())
    if action is not FaultAction.RAISE and colon:
        raise FaultSpecError(spec, right, f"{action} takes no message")
    args: tuple[str, ...] = (message,) if colon else ()
    fault = Fault(target=target, action=action, exception=exception, args=args, ranks=ranks)
    return _checked(fault, spec, right)


@attrs.frozen(kw_only=True)
class FaultEntry:
    """One fault as a fault file writes it (:meth:`Fault.to_json`): the
    action is written as the exception (``hang``, ``crash``), the ranks as
    spec text or a list of ranks."""

    target: str
    exception: str
    args: tuple[str | int | float | bool | None, ...] = ()
    kwargs: Mapping[str, str] = attrs.field(factory=dict)
    ranks: Any = None


def _fault_from_json(item: object, source: str, index: int) -> Fault:
    where = f"entry {index}"
    try:
        entry = structure(FaultEntry, item)
    except DecodeError as exc:
        if exc.field is None:
            raise FaultSpecError(source, where, exc.reason) from None
        # The part names the field; the reason need not say it again.
        reason = exc.reason.removeprefix(f"field {exc.field!r}: ")
        raise FaultSpecError(source, f"{where}: {exc.field}", reason) from None
    _check_target(source, entry.target)
    action, exception = _action_for(source, entry.exception)
    if entry.kwargs and (
        exception is None
        or not issubclass(BUILTIN_EXCEPTIONS[exception], ImportError)
        or not set(entry.kwargs) <= {"name", "path"}
    ):
        raise FaultSpecError(
            source, f"{where}: kwargs", "only name and path (strings), for ImportError types"
        )
    ranks = entry.ranks
    if isinstance(ranks, str):
        ranks = RankRanges.parse(ranks, spec=source)
    elif isinstance(ranks, list) and all(type(r) is int and r >= 0 for r in ranks):
        ranks = RankRanges.of(ranks)
    elif ranks is not None:
        raise FaultSpecError(source, f"{where}: ranks", 'a string like "0-3" or a list of ranks')
    fault = Fault(
        target=entry.target,
        action=action,
        exception=exception,
        args=entry.args,
        kwargs=entry.kwargs,
        ranks=ranks,
    )
    return _checked(fault, source, f"{where}: args")
