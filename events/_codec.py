"""Events to JSON and back.

A record is one JSON object: ``{"v": <schema version>, "type": <tag>, ...}``
followed by the envelope and payload fields by name. Fields equal to their
default are omitted, so records of healthy steps stay short.

Decoding accepts only plain JSON values and builds only the event classes of
:data:`events.EVENT_TYPES`; nothing named in a record is imported, looked up
or evaluated. Every field is type-checked strictly (``"1"`` is not an int).
Records of older schema versions are upgraded, one version at a time, before
they are checked.

Each class gets an encoder and a decoder generated once, on first use, from
its attrs field definitions (a field's type must be one :func:`_shape`
knows). The decoder checks each field as it builds the instance and names
the first one that is wrong by its path (``cause.frames[0].filename``). The
encoder makes a record only orjson sees (it may hold enum members and
tuples, and share the instance's dicts).

An exception record read from a log is cut to ``MAX_CHAIN`` linked records
before it is decoded (:func:`~events._exception_info.cut_chain`), as capture
cuts a live chain, so what is decoded stays small enough to walk by
recursion; a line nested deeper than orjson reads is not valid JSON.
"""

from __future__ import annotations

import enum
import hashlib
import reprlib
import sys
import threading
import types
import typing
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs
import orjson

from ._builders import twin
from ._errors import DecodeError, UnknownEventTypeError, UnsupportedVersionError, public_type_name
from ._exception_info import ExceptionInfo, FrameInfo, cut_chain
from ._launch import derive_trace_id
from ._model import EVENT_TYPES, SCHEMA_VERSION, Event

__all__ = [
    "decode",
    "decode_exception",
    "decode_record",
    "encode",
    "encode_exception",
    "encode_record",
    "structure",
    "unstructure",
]

T = TypeVar("T")


def _v0_to_v1(record: dict[str, Any]) -> dict[str, Any]:
    """Version 0 (pre-release logs) stored the time as float seconds in
    ``time`` with no monotonic clock, a single ``reason`` string on
    ``step.unavailable``, and no spans. Version 1 stores integer nanoseconds
    and a list; each step of a version-0 log gets a span id of its own,
    derived from its path (so its start and end agree), and the run's events
    share the root's, so that no two steps read as one span; the trace id is
    the run's, as a run without a launcher's derives it."""
    if "span_id" not in record:
        path = str(record.get("step", "")).encode()
        record["span_id"] = hashlib.blake2b(path, digest_size=8).hexdigest()
    if "trace_id" not in record:
        record["trace_id"] = derive_trace_id(str(record.get("run_id", "")))
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


def _v1_to_v2(record: dict[str, Any]) -> dict[str, Any]:
    """Version 2 records exception types by their public paths
    (:func:`~events._errors.public_type_name`): the types of ``cause`` (and
    of the causes, contexts and group members nested in it, cut as decoding
    cuts them) are renamed, in copies of the records renamed. The rule holds
    for every exception class these packages had when version 1 was written
    (a test checks each one)."""
    cause = record.get("cause")
    if isinstance(cause, dict):
        record["cause"] = cut_chain(cause, rename=public_type_name)
    return record


def _v2_to_v3(record: dict[str, Any]) -> dict[str, Any]:
    """Version 3 records where a failure started (``step.failed``'s
    ``origin``, replacing ``propagated``, which was always true) and a stop
    from outside (``run.finished``'s ``stop``). A version-2 failure has no
    origin: its readers infer it from the causes, as they always did. A
    version-2 stop is said only by its cause, an
    ``orchestrator.StartupInterrupted`` whose message is ``received
    SIGNAL[: reason]`` or ``stopped[: reason]``: it is read back from that."""
    tag = record.get("type")
    if tag == "step.failed":
        record.pop("propagated", None)
    cause = record.get("cause")
    if (
        tag == "run.finished"
        and type(cause) is dict
        and cause.get("type") == "orchestrator.StartupInterrupted"
    ):
        head, _, reason = str(cause.get("message", "")).partition(": ")
        signal = head.removeprefix("received ") if head.startswith("received ") else None
        record["stop"] = {"signal": signal, "reason": reason or None}
    return record


#: Version N's record to version N + 1's: each takes a record of its own
#: (it may change it) and returns it.
_UPGRADES: tuple[Callable[[dict[str, Any]], dict[str, Any]], ...] = (
    _v0_to_v1,
    _v1_to_v2,
    _v2_to_v3,
)
assert len(_UPGRADES) == SCHEMA_VERSION


class _Bad(ValueError):
    """A record that does not fit: ``head``, then the paths of the fields at
    fault (relative to the record being decoded; an enclosing decoder adds
    its field in front), then ``tail``.

    A ``ValueError``, so that a reader trying the generated decoders first
    falls back to :func:`decode` on it, which raises the
    :class:`DecodeError`."""

    def __init__(self, head: str, paths: tuple[str, ...] = (), tail: str = "") -> None:
        super().__init__(head)
        self.head = head
        self.paths = paths
        self.tail = tail

    def within(self, prefix: str) -> _Bad:
        return _Bad(self.head, tuple(prefix + path for path in self.paths), self.tail)

    def error(self) -> DecodeError:
        field = self.paths[0] if self.paths else None
        return DecodeError(self.head + ", ".join(map(repr, self.paths)) + self.tail, field=field)


def _wrong(path: str, expected: str, value: Any) -> _Bad:
    # repr() of a container recurses through it, and a record may nest
    # arbitrarily deep: show containers a few levels down only.
    shown = _PREVIEW.repr(value) if type(value) in (dict, list) else repr(value)
    return _Bad("field ", (path,), f": expected {expected}, got {_json_type(value)} {shown:.60}")


def _at(container: Any, item: Any) -> str:
    """The index (or key) where ``item`` itself is in ``container``, as a
    path part: only asked for once ``item`` is known to be wrong."""
    if type(container) is dict:
        return f"[{next(key for key, value in container.items() if value is item)!r}]"
    return f"[{next(index for index, value in enumerate(container) if value is item)}]"


def _unknown(record: dict[Any, Any], names: frozenset[str], cls_name: str) -> _Bad:
    key = next(key for key in record if key not in names)
    valid = ", ".join(sorted(names - {"v", "type"}))
    return _Bad("field ", (str(key),), f" is not a field of {cls_name} (valid: {valid})")


def _missing(record: dict[Any, Any], required: frozenset[str], cls_name: str) -> _Bad:
    return _Bad(f"{cls_name} is missing field(s) ", tuple(sorted(required.difference(record))))


_PREVIEW = reprlib.Repr()
_PREVIEW.maxlevel = 2
_PREVIEW.maxstring = _PREVIEW.maxother = 60


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


#: The JSON scalars a field typed as their union (``str | int | None``) holds.
_SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})


def _shape(tp: Any) -> tuple[Any, ...]:
    """What kind of value a field of annotated type ``tp`` holds; the one
    place that decides which types the codec knows."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return ("any",)
    if origin in (types.UnionType, typing.Union) and type(None) in args and len(args) == 2:
        (inner,) = (arg for arg in args if arg is not type(None))
        return ("optional", inner)
    if origin in (types.UnionType, typing.Union) and set(args) <= _SCALAR_TYPES:
        return ("scalars", args)
    if tp in (str, int, float, bool):
        return ("scalar", tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return ("enum", tp)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return ("tuple", args[0])
    if origin is tuple and args and Ellipsis not in args:
        return ("fixed", args)
    if origin is Mapping and args[0] is str and args[1] in (str, Any):
        return ("str_mapping",) if args[1] is str else ("json_mapping",)
    if origin is Mapping and args[0] is str and attrs.has(args[1]):
        return ("record_mapping", args[1])
    if isinstance(tp, type) and attrs.has(tp):
        return ("record", tp)
    raise TypeError(f"the codec has no rule for field type {tp!r}")


# --- generated encoders and decoders ------------------------------------------------
#
# As attrs does for ``__init__``, the source is made only from class
# definitions (field names and the shapes of their types); values (tags,
# defaults, enum tables) are reached through the namespace, never spelled
# into the source. Nothing from a record ever reaches the source.


#: Stands for a field missing from a record (``None`` is a JSON value).
_MISSING: Any = object()


def _share(value: dict[str, Any] | list[Any]) -> None:
    """Intern, in place, the texts of a JSON object or array read from a log
    (results and attributes repeat them from event to event and rank to
    rank)."""
    intern = sys.intern
    # A work list, not recursion: JSON nests deeper than Python recurses.
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        pairs = item.items() if type(item) is dict else enumerate(item)
        for key, inner in pairs:
            kind = type(inner)
            if kind is str:
                item[key] = intern(inner)
            elif kind is dict or kind is list:
                pending.append(inner)


#: The frames decoded and still in use, by their fields: the ranks of a run
#: record the same tracebacks, each frame then held once.
_FRAMES: weakref.WeakValueDictionary[tuple[Any, ...], FrameInfo] = weakref.WeakValueDictionary()


def _same_frame(frame: FrameInfo) -> FrameInfo:
    return _FRAMES.setdefault((frame.filename, frame.lineno, frame.name, frame.line), frame)


class _Generated:
    """Encoders and decoders for a closed set of classes, compiled into one
    namespace so that nested (and self-nesting) classes call each other."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {
            "_Bad": _Bad,
            "_MISSING": _MISSING,
            "_VERSION": SCHEMA_VERSION,
            "_at": _at,
            "_cut_chain": cut_chain,
            "_intern": sys.intern,
            "_same_frame": _same_frame,
            "_share": _share,
            "_missing": _missing,
            "_unknown": _unknown,
            "_wrong": _wrong,
        }
        self.ids: dict[type[Any], int] = {}
        self.source: list[str] = []
        # The class being generated: its own records nested in it are not
        # cut again (see _check).
        self._own: type[Any] | None = None

    def add(self, cls: type[Any], *, tag: str | None = None) -> None:
        """Generate ``cls``'s functions; with ``tag`` its records carry ``v``
        and ``type`` and its ``schema_version`` field is not a record field."""
        ident = self.ids.setdefault(cls, len(self.ids))
        self.namespace[f"cls_{ident}"] = cls
        # Decoders build the instance as its twin (see events._builders),
        # running a class's converters and validators (an input file's) as
        # ``__init__`` would, naming the field at fault.
        self.namespace[f"twin_{ident}"] = twin(cls)
        hints = typing.get_type_hints(cls)
        fields = [
            field for field in attrs.fields(cls) if tag is None or field.name != "schema_version"
        ]
        self._own = cls
        self.source += self._encoder(ident, tag, fields, hints)
        self.source += self._decoder(ident, tag, fields, hints)

    def compile(self) -> None:
        """Compile everything added so far, with the functions of every class
        their fields hold, nested or not (added here)."""
        while nested := [cls for cls, i in self.ids.items() if f"cls_{i}" not in self.namespace]:
            for cls in nested:
                self.add(cls)
        code = compile("\n".join(self.source) + "\n", "<events codec, generated>", "exec")
        exec(code, self.namespace)

    def functions(self, cls: type[Any]) -> tuple[Any, Any]:
        """``cls``'s compiled encoder and decoder."""
        ident = self.ids[cls]
        return self.namespace[f"encode_{ident}"], self.namespace[f"decode_{ident}"]

    def _constant(self, name: str, value: Any) -> str:
        if name in self.namespace:
            raise AssertionError(f"generated name {name!r} used twice")
        self.namespace[name] = value
        return name

    # Encoding ---------------------------------------------------------------------------

    def _encoder(
        self, ident: int, tag: str | None, fields: list[Any], hints: dict[str, Any]
    ) -> list[str]:
        """``encode_N(obj)``: the line record of ``obj``, leaving out each
        field equal to its default (``omitted_N_NAME``)."""
        # The leading required fields go in the dict literal.
        literal = []
        if tag is not None:
            literal += ['"v": obj.schema_version', f'"type": {self._constant(f"tag_{ident}", tag)}']
        stores: list[str] = []
        for field in fields:
            name, tp = field.name, hints[field.name]
            shape = _shape(tp)
            if field.default is None and shape[0] == "optional":
                # Emitted only when not None: no need to test for None again.
                tp = shape[1]
            dump = self._dump(tp, "value", 0)
            store = f"record[{name!r}] = {dump}"
            default = field.default
            if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                default = default.factory()
            if default is attrs.NOTHING and not stores and dump == "value":
                literal.append(f"{name!r}: obj.{name}")
                continue
            stores.append(f"value = obj.{name}")
            if default is attrs.NOTHING:
                stores.append(store)
            elif default is None:
                stores += ["if value is not None:", f"    {store}"]
            else:
                constant = self._constant(f"omitted_{ident}_{name}", default)
                stores += [f"if value != {constant}:", f"    {store}"]
        lines = [f"record = {{{', '.join(literal)}}}", *stores, "return record"]
        return [f"def encode_{ident}(obj):", *(f"    {line}" for line in lines), ""]

    def _dump(self, tp: Any, var: str, depth: int) -> str:
        """An expression turning the value in variable ``var`` into what
        orjson writes as its JSON."""
        match _shape(tp):
            case ("optional", inner):
                dump = self._dump(inner, var, depth)
                return var if dump == var else f"(None if {var} is None else {dump})"
            case ("tuple", item):
                name = f"item{depth}"
                dump = self._dump(item, name, depth + 1)
                return var if dump == name else f"[{dump} for {name} in {var}]"
            case ("str_mapping",) | ("json_mapping",):
                return f"({var} if type({var}) is dict else dict({var}))"
            case ("record_mapping", record_cls):
                ident = self.ids.setdefault(record_cls, len(self.ids))
                name = f"key{depth}"
                return f"{{{name}: encode_{ident}({var}[{name}]) for {name} in {var}}}"
            case ("record", record_cls):
                ident = self.ids.setdefault(record_cls, len(self.ids))
                return f"encode_{ident}({var})"
            case _:  # enum members, fixed-size tuples and scalars: orjson's own
                return var

    # Decoding ---------------------------------------------------------------------------

    def _decoder(
        self, ident: int, tag: str | None, fields: list[Any], hints: dict[str, Any]
    ) -> list[str]:
        cls = self.namespace[f"cls_{ident}"]
        # ``unread`` counts the record's keys not read yet (an event's ``v``
        # and ``type`` are read by its caller) and must end at 0: counting
        # costs less than a set comparison of the keys.
        required = frozenset(field.name for field in fields if field.default is attrs.NOTHING)
        names = frozenset(field.name for field in fields) | ({"v", "type"} if tag else set())
        unread = f"len(record) - {len(required) + (2 if tag is not None else 0)}"
        lines: list[str] = []
        validated: list[str] = []
        for field in fields:
            name = field.name
            check, _ = self._check(hints[name], "value", 0, f"{ident}_{name}", repr(name))
            if field.converter is not None:
                convert = self._constant(f"convert_{ident}_{name}", field.converter)
                check.append(f"value = {convert}(value)")
            if field.validator is not None:
                # Run once every field is set, as attrs' __init__ runs them.
                validate = self._constant(f"validate_{ident}_{name}", field.validator)
                attribute = self._constant(f"attribute_{ident}_{name}", field)
                validated += [
                    "try:",
                    f"    {validate}(obj, {attribute}, obj.{name})",
                    "except (TypeError, ValueError) as exc:",
                    f"    raise _Bad('field ', ({name!r},), ': ' + str(exc)) from None",
                ]
            default = field.default
            if default is attrs.NOTHING:
                # A missing field is a KeyError, named by _missing below.
                lines += [f"value = record[{name!r}]", *check]
            else:
                if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                    missing = self._constant(f"factory_{ident}_{name}", default.factory) + "()"
                else:
                    missing = self._constant(f"default_{ident}_{name}", default)
                lines += [
                    f"value = record.get({name!r}, _MISSING)",
                    "if value is _MISSING:",
                    f"    value = {missing}",
                    "else:",
                    "    unread -= 1",
                    *(f"    {line}" for line in check),
                ]
            lines.append(f"obj.{name} = value")
        required_const = self._constant(f"required_{ident}", required)
        names_const = self._constant(f"names_{ident}", names)
        name_const = self._constant(f"name_{ident}", cls.__name__)
        if getattr(cls, "__attrs_post_init__", None) is not None:
            validated += [
                "try:",
                "    obj.__attrs_post_init__()",
                "except (TypeError, ValueError) as exc:",
                f"    raise _Bad({name_const} + ': ' + str(exc)) from None",
            ]
        return [
            f"def decode_{ident}(record):",
            f"    unread = {unread}",
            f"    obj = twin_{ident}()",
            "    try:",
            *(f"        {line}" for line in lines),
            "    except KeyError:",
            f"        raise _missing(record, {required_const}, {name_const}) from None",
            "    if unread:",
            f"        raise _unknown(record, {names_const}, {name_const})",
            # An event's version is not a record field: its caller read "v".
            *(["    obj.schema_version = _VERSION"] if tag is not None else []),
            f"    obj.__class__ = cls_{ident}",
            *(f"    {line}" for line in validated),
            "    return obj",
            "",
        ]

    def _check(self, tp: Any, var: str, depth: int, key: str, path: str) -> tuple[list[str], bool]:
        """Statements that check the value in ``var``, converting it in place
        where the field's value differs from JSON, and raising the
        :class:`_Bad` that names the expression ``path`` where it is wrong;
        and whether they convert it."""

        def wrong(expected: str, value: str = var, at: str = path) -> str:
            return f"raise _wrong({at}, {expected!r}, {value})"

        an_object = [f"if type({var}) is not dict:", f"    {wrong('an object')}"]
        match _shape(tp):
            case ("scalar", scalar) if scalar is float:
                return [
                    f"if type({var}) is not float:",
                    f"    if type({var}) is not int:",
                    f"        {wrong('a number')}",
                    f"    {var} = float({var})",
                ], True
            case ("scalar", scalar):
                check = [f"if type({var}) is not {scalar.__name__}:", f"    {wrong(_A[scalar])}"]
                if scalar is not str:
                    return check, False
                # Logs repeat their texts (runs, steps, span ids, frames),
                # and the ranks of a run each other's: each is kept once per
                # process while in use.
                return [*check, f"{var} = _intern({var})"], True
            case ("any",):
                return [
                    f"if type({var}) is dict or type({var}) is list:",
                    f"    _share({var})",
                ], False
            case ("optional", inner):
                check, converts = self._check(inner, var, depth, key, path)
                return [f"if {var} is not None:", *(f"    {line}" for line in check)], converts
            case ("enum", enum_cls):
                members = {member.value: member for member in enum_cls}
                table = self._constant(f"members_{key}_{depth}", members)
                expected = self._constant(f"expected_{key}_{depth}", f"one of {sorted(members)}")
                return [
                    "try:",
                    f"    {var} = {table}[{var}]",
                    "except (KeyError, TypeError):",
                    f"    raise _wrong({path}, {expected}, {var}) from None",
                ], True
            case ("tuple", item_type):
                item, items = f"item{depth}", f"items{depth}"
                at = f"{path} + _at({var}, {item})"
                check, converts = self._check(item_type, item, depth + 1, key, at)
                lines = [f"if type({var}) is not list:", f"    {wrong('an array')}"]
                loop = [f"for {item} in {var}:", *(f"    {line}" for line in check)]
                if converts:
                    lines += [f"{items} = []", *loop, f"    {items}.append({item})"]
                else:
                    lines += loop
                return [*lines, f"{var} = tuple({items if converts else var})"], True
            case ("scalars", members):
                table = self._constant(f"scalars_{key}_{depth}", frozenset(members))
                return [f"if type({var}) not in {table}:", f"    {wrong('a JSON scalar')}"], False
            case ("fixed", item_types):
                item, items = f"item{depth}", f"items{depth}"
                lines = [
                    f"if type({var}) is not list or len({var}) != {len(item_types)}:",
                    f"    {wrong(f'an array of {len(item_types)}')}",
                    f"{items} = []",
                ]
                for index, item_type in enumerate(item_types):
                    at = f"{path} + '[{index}]'"
                    check, _ = self._check(item_type, item, depth + 1, f"{key}_{index}", at)
                    lines += [f"{item} = {var}[{index}]", *check, f"{items}.append({item})"]
                return [*lines, f"{var} = tuple({items})"], True
            case ("record_mapping", record_cls):
                item, items, name = f"item{depth}", f"items{depth}", f"key{depth}"
                at = f"{path} + _at({var}, {item})"
                check, _ = self._check(record_cls, item, depth + 1, key, at)
                return [
                    *an_object,
                    f"{items} = {{}}",
                    f"for {name}, {item} in {var}.items():",
                    *(f"    {line}" for line in check),
                    f"    {items}[{name}] = {item}",
                    f"{var} = {items}",
                ], True
            case ("str_mapping",):
                item = f"item{depth}"
                return [
                    *an_object,
                    f"for {item} in {var}.values():",
                    f"    if type({item}) is not str:",
                    f"        {wrong('a string', item, f'{path} + _at({var}, {item})')}",
                ], False
            case ("json_mapping",):
                return [*an_object, f"_share({var})"], False
            case ("record", record_cls):
                ident = self.ids.setdefault(record_cls, len(self.ids))
                # An exception record entered from outside is cut first.
                cut = record_cls is ExceptionInfo is not self._own
                return [
                    *an_object,
                    "try:",
                    f"    {var} = decode_{ident}({f'_cut_chain({var})' if cut else var})",
                    "except _Bad as bad:",
                    f"    raise bad.within({path} + '.') from None",
                    *([f"{var} = _same_frame({var})"] if record_cls is FrameInfo else []),
                ], True
        raise AssertionError(tp)  # pragma: no cover - _shape covers every case


#: How a scalar type's check names what it expected.
_A = {str: "a string", int: "an integer", bool: "true or false"}


class _Table(dict[Any, Any]):
    """Generated functions by type tag (or class), filled with every other
    table the first time one is looked up: importing the package compiles
    nothing. Lookups are a dict's after that."""

    def __missing__(self, key: Any) -> Any:
        _compile()  # or wait for the thread compiling them
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        raise KeyError(key)


#: The decoders of records of :data:`SCHEMA_VERSION`, by type tag, for a
#: reader that skips :func:`decode_record`'s checks of version and type:
#: they raise a ``ValueError`` for anything but a valid record.
CURRENT_DECODERS: dict[str, Callable[[dict[str, Any]], Event]] = _Table()
#: The encoders, by type tag, for a log that writes
#: ``orjson.dumps(encoder(event))`` itself: the record is fit only for orjson.
LINE_ENCODERS: dict[str, Callable[[Event], dict[str, Any]]] = _Table()
_COMPILING = threading.Lock()


def _compile() -> None:
    with _COMPILING:
        if CURRENT_DECODERS:
            return
        generated = _Generated()
        for tag, event_cls in EVENT_TYPES.items():
            generated.add(event_cls, tag=tag)
        generated.compile()
        for tag, event_cls in EVENT_TYPES.items():
            LINE_ENCODERS[tag], CURRENT_DECODERS[tag] = generated.functions(event_cls)


# --- public functions ---------------------------------------------------------------


def encode_record(event: Event) -> dict[str, Any]:
    """The JSON object for ``event`` (``v`` and ``type`` first)."""
    record: dict[str, Any] = orjson.loads(encode(event))
    return record


def encode(event: Event) -> bytes:
    """``event`` as one line of UTF-8 JSON, without the trailing newline."""
    return orjson.dumps(LINE_ENCODERS[event.TYPE](event))


def decode_record(record: object) -> Event:
    """Build the event a JSON object describes.

    The record is not modified.

    Raises:
        DecodeError: ``record`` is not an object or its fields do not fit.
        UnknownEventTypeError: its ``type`` is not known.
        UnsupportedVersionError: its ``v`` is missing or newer than this release.
    """
    if type(record) is not dict:
        raise DecodeError(f"a record must be a JSON object, not {_json_type(record)}")
    version = record.get("v")
    if type(version) is not int or not 0 <= version <= SCHEMA_VERSION:
        raise UnsupportedVersionError(version, SCHEMA_VERSION)
    if version < SCHEMA_VERSION:
        record = dict(record)
        for upgrade in _UPGRADES[version:]:
            record = upgrade(record)
    type_tag: Any = record.get("type")
    if type(type_tag) is not str or type_tag not in EVENT_TYPES:
        raise UnknownEventTypeError(type_tag, tuple(EVENT_TYPES))
    return _decoded(CURRENT_DECODERS[type_tag], record)


def _decoded(decoder: Callable[[dict[str, Any]], T], record: dict[str, Any]) -> T:
    """What ``decoder`` builds of ``record``, its :class:`_Bad` raised as the
    :class:`DecodeError` it describes."""
    try:
        return decoder(record)
    except _Bad as bad:
        error = bad.error()
    # Outside the except block, so the error raised carries no context.
    raise error


def encode_exception(info: ExceptionInfo) -> dict[str, Any]:
    """``info`` as a JSON object (the form events embed)."""
    return unstructure(info)


def decode_exception(record: object) -> ExceptionInfo:
    """Rebuild an :class:`ExceptionInfo` from :func:`encode_exception`'s form.

    Raises:
        DecodeError: the object does not describe an exception record.
    """
    if type(record) is not dict:
        raise DecodeError(f"an exception record must be a JSON object, not {_json_type(record)}")
    return structure(ExceptionInfo, cut_chain(record))


#: The generated encoder and decoder of each class :func:`structure` or
#: :func:`unstructure` has met, by class.
_RECORD_FUNCTIONS: dict[type[Any], tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {}


def _record_functions(cls: type[Any]) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    if cls not in _RECORD_FUNCTIONS:
        with _COMPILING:  # once per class, as the event tables are
            if cls not in _RECORD_FUNCTIONS:
                generated = _Generated()
                generated.add(cls)
                generated.compile()
                _RECORD_FUNCTIONS[cls] = generated.functions(cls)
    return _RECORD_FUNCTIONS[cls]


def structure(cls: type[T], record: object) -> T:
    """An instance of attrs class ``cls`` read from its JSON form, as
    strictly as an event is: each field's type checked (``"1"`` is not an
    int), unknown fields refused, missing fields defaulted, and then the
    class's validators and ``__attrs_post_init__`` run, as its ``__init__``
    would. The one reader of the JSON files the distribution reads (run
    manifests, host profiles, fault files, severity policies). ``cls``'s
    field types must be ones the codec knows.

    Raises:
        DecodeError: naming the field at fault by its path
            (``field 'gpus.count': ...``).
    """
    _, decoder = _record_functions(cls)
    if type(record) is not dict:
        raise DecodeError(f"expected a JSON object, got {_json_type(record)}")
    built: T = _decoded(decoder, record)
    return built


def unstructure(instance: Any) -> dict[str, Any]:
    """The JSON form :func:`structure` reads back: every field that differs
    from its default, by name."""
    encoder, _ = _record_functions(type(instance))
    record: dict[str, Any] = orjson.loads(orjson.dumps(encoder(instance)))
    return record


def decode(line: bytes | str) -> Event:
    """Parse one JSON line and :func:`decode_record` it.

    Raises:
        DecodeError: the line is not JSON (nesting deeper than orjson reads
            is not: the error gives orjson's explanation), or not a valid
            event (see :func:`decode_record`).
    """
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        # The column within the line: its place in the file is the reader's.
        raise DecodeError(f"not valid JSON at column {exc.colno}: {exc.msg}") from None
    return decode_record(record)
