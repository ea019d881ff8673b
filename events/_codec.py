"""Events to JSON and back.

A record is one JSON object: ``{"v": <schema version>, "type": <tag>, ...}``
followed by the envelope and payload fields by name. Fields equal to their
default are omitted, so records of healthy steps stay short.

Decoding accepts only plain JSON values and builds only the event classes of
:data:`events.EVENT_TYPES`; nothing named in a record is imported, looked up
or evaluated. Every field is type-checked strictly (``"1"`` is not an int).
Records of older schema versions are upgraded by the upcasters registered in
an :class:`Upcasters` registry before they are checked.

The field plans below are built once from the attrs classes themselves, so a
field added to the model is encoded and decoded without touching this module
(its type must be one the plans know; an unknown type fails at import).
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import orjson

from ._errors import DecodeError, UnknownEventTypeError, UnsupportedVersionError
from ._exception_info import ExceptionInfo, FrameInfo
from ._model import EVENT_TYPES, SCHEMA_VERSION, Event, RankIdentity

__all__ = [
    "UPCASTERS",
    "Upcaster",
    "Upcasters",
    "decode",
    "decode_exception",
    "decode_record",
    "encode",
    "encode_exception",
    "encode_record",
]

#: An upcaster takes a record of version N (a fresh dict it may change) and
#: returns the same record in version N + 1.
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


class Upcasters:
    """A registry of record upgrades, one per (type tag, from-version).

    A record of version ``v`` is upgraded by the upcaster registered for its
    type at ``v`` (or for ``"*"`` at ``v``, which applies to every type), then
    by the one at ``v + 1`` and so on, until it reaches
    :data:`SCHEMA_VERSION`. A missing step is an
    :class:`~events.UnsupportedVersionError`.
    """

    def __init__(self) -> None:
        self._table: dict[tuple[str, int], Upcaster] = {}

    def register(self, type_tag: str, from_version: int) -> Callable[[Upcaster], Upcaster]:
        """Decorator: register ``fn`` to upgrade ``type_tag`` records from
        ``from_version`` to ``from_version + 1`` (``"*"`` for every type)."""

        def decorator(fn: Upcaster) -> Upcaster:
            key = (type_tag, from_version)
            if key in self._table:
                raise ValueError(f"an upcaster for {type_tag!r} v{from_version} exists already")
            self._table[key] = fn
            return fn

        return decorator

    def upcast(self, record: dict[str, Any]) -> dict[str, Any]:
        """Return ``record`` upgraded to :data:`SCHEMA_VERSION`.

        Raises:
            UnsupportedVersionError: the version is missing, newer than this
                release, or has no upcaster for the record's type.
        """
        version = record.get("v")
        if type(version) is not int or version < 0 or version > SCHEMA_VERSION:
            raise UnsupportedVersionError(version, SCHEMA_VERSION)
        type_tag = record.get("type")
        while version < SCHEMA_VERSION:
            fn = self._table.get((str(type_tag), version)) or self._table.get(("*", version))
            if fn is None:
                raise UnsupportedVersionError(
                    version, SCHEMA_VERSION, f" for type {type_tag!r} (no upcaster)"
                )
            record = fn(dict(record))
            version += 1
            record["v"] = version
            type_tag = record.get("type")
        return record


#: The upcasters this release ships.
UPCASTERS = Upcasters()


@UPCASTERS.register("*", 0)
def _v0_to_v1(record: dict[str, Any]) -> dict[str, Any]:
    """Version 0 (pre-release logs) stored the time as float seconds in
    ``time`` with no monotonic clock, and a single ``reason`` string on
    ``step.unavailable``. Version 1 stores integer nanoseconds and a list."""
    if "time" in record:
        seconds = record.pop("time")
        if not isinstance(seconds, int | float) or isinstance(seconds, bool):
            raise DecodeError(f"v0 field 'time' must be a number, not {seconds!r}")
        record["wall_ns"] = round(seconds * 1_000_000_000)
        record.setdefault("mono_ns", record["wall_ns"])
    if record.get("type") == "step.unavailable" and "reason" in record:
        reason = record.pop("reason")
        record["reasons"] = [] if reason in (None, "") else [reason]
    return record


# --- field plans --------------------------------------------------------------------

_Check = Callable[[Any, str], Any]
_Dump = Callable[[Any], Any] | None


def _fail(path: str, expected: str, value: Any) -> DecodeError:
    return DecodeError(
        f"field {path!r}: expected {expected}, got {_json_type(value)} {value!r:.60}"
    )


def _json_type(value: Any) -> str:
    return {
        type(None): "null",
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(value), type(value).__name__)


def _check_str(value: Any, path: str) -> str:
    if type(value) is not str:
        raise _fail(path, "a string", value)
    return value


def _check_int(value: Any, path: str) -> int:
    if type(value) is not int:
        raise _fail(path, "an integer", value)
    return value


def _check_float(value: Any, path: str) -> float:
    if type(value) is float:
        return value
    if type(value) is int:
        return float(value)
    raise _fail(path, "a number", value)


def _check_bool(value: Any, path: str) -> bool:
    if type(value) is not bool:
        raise _fail(path, "true or false", value)
    return value


def _check_json(value: Any, path: str) -> Any:
    # orjson only ever produces JSON values, so there is nothing to check.
    return value


def _check_json_object(value: Any, path: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise _fail(path, "an object", value)
    return value


def _check_str_mapping(value: Any, path: str) -> dict[str, str]:
    mapping = _check_json_object(value, path)
    for key, item in mapping.items():
        if type(item) is not str:
            raise _fail(f"{path}[{key!r}]", "a string", item)
    return mapping


def _optional(check: _Check) -> _Check:
    def check_optional(value: Any, path: str) -> Any:
        return None if value is None else check(value, path)

    return check_optional


def _optional_dump(dump: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def dump_optional(value: Any) -> Any:
        return None if value is None else dump(value)

    return dump_optional


def _tuple_of(check: _Check) -> _Check:
    def check_tuple(value: Any, path: str) -> tuple[Any, ...]:
        if type(value) is not list:
            raise _fail(path, "an array", value)
        return tuple(check(item, f"{path}[{index}]") for index, item in enumerate(value))

    return check_tuple


def _enum(cls: type[enum.Enum]) -> _Check:
    members = {member.value: member for member in cls}

    def check_enum(value: Any, path: str) -> enum.Enum:
        try:
            return members[value]
        except (KeyError, TypeError):
            raise _fail(path, f"one of {sorted(members)}", value) from None

    return check_enum


class _Plan:
    """How one attrs class is encoded and decoded."""

    __slots__ = ("checks", "cls", "defaults", "dumps", "names", "required", "scalars")

    def __init__(self, cls: type[Any], skip: frozenset[str] = frozenset()) -> None:
        self.cls = cls
        hints = typing.get_type_hints(cls)
        fields = [field for field in attrs.fields(cls) if field.name not in skip]
        self.names = tuple(field.name for field in fields)
        self.checks: dict[str, _Check] = {}
        self.dumps: dict[str, _Dump] = {}
        self.defaults: dict[str, Any] = {}
        self.required = frozenset(f.name for f in fields if f.default is attrs.NOTHING)
        self.scalars: dict[str, tuple[type[Any], object]] = {}
        for field in fields:
            tp = hints[field.name]
            if tp in (str, int, bool):
                self.scalars[field.name] = (tp, False)
            elif tp in (str | None, int | None):
                self.scalars[field.name] = (typing.get_args(tp)[0], None)
            check, dump = _plan_for(tp)
            self.checks[field.name] = check
            self.dumps[field.name] = dump
            default = field.default
            if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                default = default.factory()
            self.defaults[field.name] = default

    def dump(self, obj: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        defaults = self.defaults
        for name in self.names:
            value = getattr(obj, name)
            if name in defaults and value == defaults[name] and name not in self.required:
                continue
            dump = self.dumps[name]
            out[name] = value if dump is None else dump(value)
        return out

    def load(self, record: dict[str, Any], path: str) -> Any:
        # Plain scalar fields (most of every record) are checked inline; the
        # rest go through their checker.
        scalars = self.scalars
        checks = self.checks
        for name, value in record.items():
            expected = scalars.get(name)
            if expected is not None and (
                type(value) is expected[0] or value is None is expected[1]
            ):
                continue
            check = checks.get(name)
            if check is None:
                raise DecodeError(f"field {path + name!r} is not a field of {self.cls.__name__}")
            record[name] = check(value, path + name)
        if not self.required.issubset(record):
            missing = sorted(self.required.difference(record))
            raise DecodeError(
                f"{self.cls.__name__} is missing field(s) "
                + ", ".join(repr(path + name) for name in missing)
            )
        try:
            return self.cls(**record)
        except (TypeError, ValueError) as exc:
            raise DecodeError(f"{self.cls.__name__}: {exc}") from None


_PLANS: dict[type[Any], _Plan] = {}


def _nested(cls: type[Any]) -> tuple[_Check, _Dump]:
    def check_nested(value: Any, path: str) -> Any:
        if type(value) is not dict:
            raise _fail(path, "an object", value)
        # load() writes checked values back into the dict it is given: give
        # it a copy, so the caller's record is left as it was.
        return _PLANS[cls].load(dict(value), path + ".")

    def dump_nested(value: Any) -> Any:
        return _PLANS[cls].dump(value)

    return check_nested, dump_nested


def _plan_for(tp: Any) -> tuple[_Check, _Dump]:
    """Checker and dumper for one annotated type."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return _check_json, None
    if origin in (types.UnionType, typing.Union) and type(None) in args:
        (inner,) = (arg for arg in args if arg is not type(None))
        check, dump = _plan_for(inner)
        return _optional(check), (None if dump is None else _optional_dump(dump))
    if tp is str:
        return _check_str, None
    if tp is bool:
        return _check_bool, None
    if tp is int:
        return _check_int, None
    if tp is float:
        return _check_float, None
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum(tp), _enum_value
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        check, dump = _plan_for(args[0])
        return _tuple_of(check), (list if dump is None else (lambda v: [dump(x) for x in v]))
    if origin is Mapping and args[0] is str:
        return (_check_str_mapping if args[1] is str else _check_json_object), dict
    if isinstance(tp, type) and attrs.has(tp):
        return _nested(tp)
    raise TypeError(f"the codec has no plan for field type {tp!r}")


def _enum_value(value: enum.Enum) -> Any:
    return value.value


# Nested plans are looked up when a record is read, so ExceptionInfo may
# refer to itself.
_PLANS.update({cls: _Plan(cls) for cls in (RankIdentity, FrameInfo, ExceptionInfo)})
_EVENT_PLANS: dict[str, _Plan] = {
    tag: _Plan(cls, skip=frozenset({"schema_version"})) for tag, cls in EVENT_TYPES.items()
}


# --- public functions ---------------------------------------------------------------


def encode_record(event: Event) -> dict[str, Any]:
    """The JSON object for ``event`` (``v`` and ``type`` first)."""
    record: dict[str, Any] = {"v": event.schema_version, "type": event.TYPE}
    record.update(_EVENT_PLANS[event.TYPE].dump(event))
    return record


def encode(event: Event) -> bytes:
    """``event`` as one line of UTF-8 JSON, without the trailing newline."""
    return orjson.dumps(encode_record(event))


def decode_record(record: object, upcasters: Upcasters = UPCASTERS) -> Event:
    """Build the event a JSON object describes.

    The record is not modified.

    Raises:
        DecodeError: ``record`` is not an object or its fields do not fit.
        UnknownEventTypeError: its ``type`` is not known.
        UnsupportedVersionError: its ``v`` is newer or has no upcaster.
    """
    if type(record) is not dict:
        raise DecodeError(f"a record must be a JSON object, not {_json_type(record)}")
    if record.get("v") != SCHEMA_VERSION or type(record.get("v")) is not int:
        record = upcasters.upcast(record)
    type_tag = record.get("type")
    plan = _EVENT_PLANS.get(type_tag) if type(type_tag) is str else None
    if plan is None:
        raise UnknownEventTypeError(type_tag, tuple(EVENT_TYPES))
    fields = dict(record)
    del fields["v"], fields["type"]
    # load() writes checked values back into ``fields``, a private copy.
    event: Event = plan.load(fields, "")
    return event


def encode_exception(info: ExceptionInfo) -> dict[str, Any]:
    """``info`` as a JSON object (the form events embed)."""
    return _PLANS[ExceptionInfo].dump(info)


def decode_exception(record: object) -> ExceptionInfo:
    """Rebuild an :class:`ExceptionInfo` from :func:`encode_exception`'s form.

    Raises:
        DecodeError: the object does not describe an exception record.
    """
    if type(record) is not dict:
        raise DecodeError(f"an exception record must be a JSON object, not {_json_type(record)}")
    info: ExceptionInfo = _PLANS[ExceptionInfo].load(dict(record), "")
    return info


def decode(line: bytes | str, upcasters: Upcasters = UPCASTERS) -> Event:
    """Parse one JSON line and :func:`decode_record` it.

    Raises:
        DecodeError: the line is not JSON or not a valid event (see
            :func:`decode_record`).
    """
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"not valid JSON: {exc}") from None
    return decode_record(record, upcasters)
