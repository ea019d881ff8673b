"""Our codec against the libraries that could replace it.

Run from the repository root, with the libraries installed in an environment
of their own (they are not dependencies of the project)::

    python3 -m venv /tmp/benchvenv
    /tmp/benchvenv/bin/pip install attrs orjson cattrs msgspec
    PYTHONPATH=. /tmp/benchvenv/bin/python benchmarks/bench_libraries.py
    PYTHONPATH=. /tmp/benchvenv/bin/python benchmarks/bench_libraries.py --events 50000 --repeat 9

A library that is not installed is left out, with a note; with none of them
(the project's own environment) only our side is timed.

It prints, side by side in one run, on the events ``bench_events.py`` uses
(with the ``seq`` a log gives them):

* encode, event to one JSON line, and decode, one JSON line to the event:
  ``events.encode``/``events.decode`` against cattrs' orjson converter
  (``cattrs.preconf.orjson``, configured to write our records: ``v`` and
  ``type``, defaults left out, unknown keys refused), against msgspec's own
  handling of attrs classes (which cannot write our records), and against
  ``msgspec.Struct`` mirrors of the model made from its attrs fields (frozen,
  ``tag_field``, ``omit_defaults``, ``forbid_unknown_fields``, ``rename``),
  which write our records and read them into the mirrors;
* the guarantees each keeps, probed with small concrete records:
  the table printed last.

Times are as ``bench_events.py`` takes them: the best of ``--repeat``
interleaved rounds, the cyclic garbage collector paused, in this process's
CPU time, per event.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import operator
import os
import platform
import sys
import time
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import orjson

sys.path.insert(0, str(Path(__file__).parent))

from bench_events import best_of, realistic_events

import events

#: Every attrs class the codec writes, nested ones included.
RECORD_CLASSES = (events.RankIdentity, events.FrameInfo, events.ExceptionInfo)
EVENT_CLASSES = tuple(events.EVENT_TYPES.values())


def available(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


# --- cattrs ---------------------------------------------------------------------------


def cattrs_codec() -> tuple[Callable[[events.Event], bytes], Callable[[bytes], Any]]:
    """encode and decode with cattrs' orjson converter, set up to write and
    read our records: ``schema_version`` written as ``v``, a ``type`` tag
    from each class's ``TYPE``, fields equal to their default left out,
    unknown keys refused. The tag is written after the fields (cattrs adds
    it last), so the lines are equal to ours as JSON, not byte for byte."""
    from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
    from cattrs.preconf.orjson import make_converter
    from cattrs.strategies import configure_tagged_union

    converter = make_converter(forbid_extra_keys=True)
    for cls in (*RECORD_CLASSES, *EVENT_CLASSES):
        renamed: dict[str, Any] = {}
        if cls in EVENT_CLASSES:
            renamed["schema_version"] = override(rename="v", omit_if_default=False)
        converter.register_unstructure_hook(
            cls,
            make_dict_unstructure_fn(cls, converter, _cattrs_omit_if_default=True, **renamed),
        )
        converter.register_structure_hook(
            cls,
            make_dict_structure_fn(cls, converter, _cattrs_forbid_extra_keys=True, **renamed),
        )
    union: Any = typing.Union[EVENT_CLASSES]  # noqa: UP007 - a Union object, built at run time
    configure_tagged_union(union, converter, tag_name="type", tag_generator=lambda cls: cls.TYPE)

    def encode(event: events.Event) -> bytes:
        return converter.dumps(event, union)

    def decode(line: bytes) -> Any:
        return converter.loads(line, union)

    return encode, decode


# --- msgspec --------------------------------------------------------------------------


def msgspec_codec() -> tuple[Callable[[events.Event], bytes], Callable[[bytes], Any]]:
    """msgspec's own handling of attrs classes. It cannot write our records:
    it writes every field (defaults too), ``schema_version`` by that name and
    no ``type`` tag, and it has no tagged union of attrs classes. So encode
    is ``msgspec.json.encode(event)`` (a different, longer line), and decode
    parses our line with msgspec, takes the class from ``type`` and converts
    the rest with ``msgspec.convert(..., strict=True)``."""
    import msgspec

    decoder = msgspec.json.Decoder()
    classes = dict(events.EVENT_TYPES)

    def encode(event: events.Event) -> bytes:
        return msgspec.json.encode(event)

    def decode(line: bytes) -> Any:
        record = decoder.decode(line)
        cls = classes[record.pop("type")]
        record["schema_version"] = record.pop("v")
        return msgspec.convert(record, cls, strict=True)

    return encode, decode


def msgspec_struct_codec() -> tuple[Callable[[events.Event], bytes], Callable[[bytes], Any]]:
    """What the model would be as ``msgspec.Struct`` classes: one frozen
    mirror per attrs class, made from its fields, with ``tag_field="type"``,
    ``omit_defaults``, ``forbid_unknown_fields`` and ``schema_version``
    renamed ``v`` (required, so that it is always written, as ours is). One
    decoder reads a line into the tagged union of every event's mirror.

    Encode writes the mirror of the event (built before the clock starts, as a
    Struct model would hold it); decode returns the mirror, and a mirror
    compares equal to an event when its JSON equals the event's record."""
    import msgspec

    mirrors: dict[type[Any], type[Any]] = {}
    module = type(sys)("_bench_mirrors")
    sys.modules[module.__name__] = module

    def mirrored(tp: Any) -> Any:
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if isinstance(tp, type) and attrs.has(tp):
            return mirror(tp)
        if origin is tuple:
            return tuple[mirrored(args[0]), ...]  # type: ignore[misc]
        if origin in (types.UnionType, typing.Union):
            # Optional[...]: the item may be a forward reference (a name).
            return typing.Optional[mirrored(next(a for a in args if a is not type(None)))]  # noqa: UP045
        if origin is not None and args and args[0] is str:  # Mapping[str, X]
            return dict[str, args[1]]  # type: ignore[valid-type]
        return tp

    def mirror(cls: type[Any]) -> Any:
        """The mirror of ``cls``; its name (a forward reference, resolved
        when the decoder is made) while it is being made."""
        if cls in mirrors:
            return mirrors[cls]
        tag = getattr(cls, "TYPE", None) if cls in events.EVENT_TYPES.values() else None
        name = f"{cls.__name__}Struct"
        mirrors[cls] = name  # type: ignore[assignment]
        hints = typing.get_type_hints(cls)
        spec: list[Any] = []
        for field in attrs.fields(cls):
            tp = mirrored(hints[field.name])
            default = field.default
            if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                default = msgspec.field(default_factory=default.factory)
            if field.name == "schema_version" or default is attrs.NOTHING:
                spec.append((field.name, tp))
            else:
                spec.append((field.name, tp, default))
        spec.sort(key=lambda item: len(item) == 3)  # required fields first
        made = msgspec.defstruct(
            name,
            spec,
            module=module.__name__,
            frozen=True,
            omit_defaults=True,
            forbid_unknown_fields=True,
            rename={"schema_version": "v"},
            **({"tag_field": "type", "tag": tag} if tag else {}),
        )
        setattr(module, name, made)
        mirrors[cls] = made
        return made

    union = functools.reduce(operator.or_, (mirror(cls) for cls in EVENT_CLASSES))
    decoder = msgspec.json.Decoder(union)
    encoder = msgspec.json.Encoder()
    built: dict[int, Any] = {}

    def to_mirror(event: events.Event) -> Any:
        return msgspec.convert(orjson.loads(events.encode(event)), union)

    def encode(event: events.Event) -> bytes:
        struct = built.get(id(event))
        if struct is None:
            struct = built[id(event)] = to_mirror(event)
        return encoder.encode(struct)

    def decode(line: bytes) -> Any:
        return _Mirrored(decoder.decode(line))

    encode.prepare = lambda sample: [encode(e) for e in sample]  # type: ignore[attr-defined]
    return encode, decode


class _Mirrored:
    """A decoded mirror, equal to the event whose record its builtins equal."""

    __slots__ = ("struct",)

    def __init__(self, struct: Any) -> None:
        self.struct = struct

    def __eq__(self, other: object) -> bool:
        import msgspec

        if not isinstance(other, events.Event):
            return NotImplemented
        return bool(orjson.loads(msgspec.json.encode(self.struct)) == events.encode_record(other))

    __hash__ = None  # type: ignore[assignment]


# --- the guarantees ---------------------------------------------------------------------

Decode = Callable[[bytes], Any]


def _refuses(decode: Decode, record: dict[str, Any]) -> tuple[bool, str]:
    """Whether ``decode`` refuses ``record``, and its message."""
    try:
        decode(orjson.dumps(record))
    except RecursionError:
        return True, "RecursionError"
    except Exception as exc:
        return True, _message(exc)
    return False, "accepted"


def _message(exc: BaseException) -> str:
    try:
        from cattrs import transform_error

        if hasattr(exc, "exceptions"):
            return "; ".join(transform_error(exc))  # type: ignore[arg-type]
    except ImportError:
        pass
    return f"{type(exc).__name__}: {exc}"


def codec_probes(decode: Decode, sample: events.Event) -> dict[str, str]:
    """What ``decode`` does with records that break one rule each."""
    good = events.encode_record(sample)
    nested = next(iter(good["cause"]["frames"]), None) if "cause" in good else None
    assert nested is not None, "the probes need a step.unavailable with frames"
    deep: dict[str, Any] = {"type": "E", "message": "m", "reason": "r"}
    for _ in range(200):
        deep = {"type": "E", "message": "m", "reason": "r", "cause": deep}
    results: dict[str, str] = {}

    def probe(label: str, change: Callable[[dict[str, Any]], None], want_refused: bool) -> None:
        record = orjson.loads(orjson.dumps(good))
        change(record)
        refused, message = _refuses(decode, record)
        verdict = "yes" if refused == want_refused else "NO"
        results[label] = f"{verdict}: {message[:110]}"

    probe("accepts our record", lambda r: None, False)
    probe('refuses a str for an int (rank: "0")', lambda r: r.update(rank="0"), True)
    probe("refuses a bool for an int (rank: true)", lambda r: r.update(rank=True), True)
    probe("refuses an int for a str (step: 7)", lambda r: r.update(step=7), True)
    probe(
        'names a nested field (cause.frames[0].lineno: "x")',
        lambda r: r["cause"]["frames"][0].update(lineno="x"),
        True,
    )
    probe("refuses an unknown field", lambda r: r.update(colour="red"), True)
    probe("refuses an unknown type tag (os.system)", lambda r: r.update(type="os.system"), True)
    probe("refuses a newer schema version (v: 99)", lambda r: r.update(v=99), True)
    probe(
        "upgrades a v0 record (time in float seconds)",
        lambda r: (r.update(v=0, time=1.5), r.pop("wall_ns"), r.pop("mono_ns")),
        False,
    )
    probe("reads a cause chain 200 deep", lambda r: r.update(cause=deep), False)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000, help="events per run")
    parser.add_argument("--repeat", type=int, default=5, help="runs; the best is kept")
    args = parser.parse_args(argv)
    n = args.events

    sample = [attrs.evolve(event, seq=seq) for seq, event in enumerate(realistic_events(n))]
    lines = [events.encode(event) for event in sample]
    unavailable = next(event for event in sample if isinstance(event, events.StepUnavailable))

    codecs: dict[str, tuple[Callable[[events.Event], bytes], Decode]] = {
        "events (ours)": (events.encode, events.decode)
    }
    notes: list[str] = []
    for name, library, factory in (
        ("cattrs", "cattrs", cattrs_codec),
        ("msgspec", "msgspec", msgspec_codec),
        ("msgspec.Struct", "msgspec", msgspec_struct_codec),
    ):
        if available(library):
            codecs[name] = factory()
            prepare = getattr(codecs[name][0], "prepare", None)
            if prepare is not None:
                prepare(sample)
        else:
            notes.append(f"{library} is not installed: {name} left out")
    # What each codec makes of our events, before timing it.
    equivalence: dict[str, str] = {}
    for name, (encode, decode) in codecs.items():
        same_json = all(
            orjson.loads(encode(e)) == orjson.loads(ours)
            for e, ours in zip(sample, lines, strict=True)
        )
        same_bytes = all(encode(e) == ours for e, ours in zip(sample, lines, strict=True))
        try:
            round_trip = all(
                decode(line) == event for line, event in zip(lines, sample, strict=True)
            )
        except Exception as exc:
            round_trip = False
            notes.append(f"{name} could not decode our lines: {_message(exc)[:120]}")
        form = "byte-identical" if same_bytes else "equal as JSON" if same_json else "NOT ours"
        equivalence[name] = (
            f"lines {form}; decodes our lines to equal events: {'yes' if round_trip else 'NO'}"
        )

    runs: dict[str, Callable[[], object]] = {}
    operations: dict[str, int] = {}
    for name, (encode, decode) in codecs.items():
        runs[f"encode: {name}"] = lambda encode=encode: _each(encode, sample)
        runs[f"decode: {name}"] = lambda decode=decode: _each(decode, lines)
        operations[f"encode: {name}"] = operations[f"decode: {name}"] = n
    timed = best_of(args.repeat, runs, time.process_time)
    per_op = {name: seconds / operations[name] for name, seconds in timed.items()}

    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs")
    versions = ", ".join(
        f"{library} {_version(library)}"
        for library in ("orjson", "attrs", "cattrs", "msgspec")
        if available(library)
    )
    print(f"libraries: {versions}")
    print(f"events: {n}; best of {args.repeat} interleaved runs; CPU time of this process")
    for note in notes:
        print(f"note: {note}")
    print("\ncodec, per event                          us/event   vs ours")
    for kind in ("encode", "decode"):
        ours = per_op[f"{kind}: events (ours)"]
        for name in codecs:
            value = per_op[f"{kind}: {name}"]
            print(f"  {kind} {name:<34} {value * 1e6:8.2f}  {value / ours:7.2f}x")
    print("\nwhat each codec makes of our events")
    for name, text in equivalence.items():
        print(f"  {name:<16} {text}")
    print("\nguarantees of the codec (yes: kept; NO: not kept; the message it gave)")
    for name, (_encode, decode) in codecs.items():
        print(f"  [{name}]")
        for label, verdict in codec_probes(decode, unavailable).items():
            print(f"    {label:<52} {verdict}")


def _each(function: Callable[[Any], object], items: list[Any]) -> None:
    for item in items:
        function(item)


def _version(library: str) -> str:
    from importlib.metadata import version

    try:
        return version(library)
    except Exception:
        return "?"


if __name__ == "__main__":
    main()
