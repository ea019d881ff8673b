"""Building frozen attrs instances without keyword parsing.

On the hot paths (the codec after its checks, a log assigning ``seq``, the
projections freezing their state) the caller already holds every field
value, and attrs' keyword-only ``__init__``, which stores each field through
the frozen class's guarded ``__setattr__``, would cost more than the rest of
the work (``benchmarks/bench_builders.py``).

So an instance is built as its class's *twin*: a subclass that adds only
plain attribute assignment (:class:`object`'s ``__setattr__`` and
``__delattr__``) and :class:`object`'s ``__init__``, so that calling the
twin makes a blank instance (a little faster than ``object.__new__(twin)``).
The twin has the class's memory layout: once every field is stored, the
instance's ``__class__`` is set to the frozen class and only then is
``__attrs_post_init__`` run. What comes out equals what ``__init__`` builds;
a twin instance never leaves the function that builds it.

Only classes the plain ``__init__`` would build the same way qualify for
:func:`builder` and :func:`evolve`: every field an ``__init__`` argument
under its own name, no validator, converter, ``__attrs_pre_init__``,
``__new__`` of its own or slot besides the fields. For any other class
:func:`builder` raises :class:`TypeError` and :func:`evolve` uses attrs. A
twin asks only for no ``__new__`` of its own: the codec, which runs
validators and converters itself, builds every class it reads as its twin.
"""

from __future__ import annotations

import keyword
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

__all__ = ["builder", "evolve", "field_names", "twin"]

T = TypeVar("T")


def builder(cls: type[T]) -> Callable[..., T]:
    """A function taking every field of ``cls`` positionally, in attrs field
    order, and returning the instance.

    Raises:
        TypeError: ``cls`` does not qualify.
    """
    fields = field_names(cls)
    # Numbered arguments: a field may be named like the generated
    # function's own locals (``obj``, ``cls``).
    arguments = [f"value{index}" for index in range(len(fields))]
    body = [f"def build({', '.join(arguments)}):", "    obj = mutable()"]
    body += [f"    obj.{name} = {value}" for name, value in zip(fields, arguments, strict=True)]
    return _compile(cls, "build", body)


def evolve(instance: T, changes: Mapping[str, Any]) -> T:
    """A copy of ``instance`` with the fields ``changes`` names set to their
    values: what ``attrs.evolve(instance, **changes)`` returns. A class that
    does not qualify is evolved by attrs.

    Raises:
        TypeError: ``changes`` names a field the class does not have.
    """
    cls = type(instance)
    made = _EVOLVERS.get(cls)
    if made is None:
        made = _EVOLVERS[cls] = _evolver(cls)
    evolved: T = made(instance, changes)
    return evolved


_EVOLVERS: dict[type[Any], Callable[[Any, Mapping[str, Any]], Any]] = {}


def _evolver(cls: type[Any]) -> Callable[[Any, Mapping[str, Any]], Any]:
    try:
        fields = field_names(cls)
    except TypeError:
        return lambda instance, changes: attrs.evolve(instance, **changes)
    body = ["def evolve(source, changes):", "    obj = mutable()"]
    # Every field copied, then the few changed set again: cheaper than
    # asking ``changes`` about every field (an event gains only its seq).
    body += [f"    obj.{field} = source.{field}" for field in fields]
    body += [
        "    for name, value in changes.items():",
        "        if name not in names:",
        "            unknown = sorted(changes.keys() - names)",
        "            raise TypeError(f'{cls.__qualname__} has no fields {unknown}')",
        "        setattr(obj, name, value)",
    ]
    return _compile(cls, "evolve", body, names=frozenset(fields))


def twin(cls: type[Any]) -> type[Any]:
    """The mutable twin of ``cls`` (see the module docstring). Code that
    builds an instance of it must set the instance's ``__class__`` to
    ``cls`` and then call ``__attrs_post_init__``, if ``cls`` has one,
    before anyone else sees it.

    Raises:
        TypeError: ``cls`` is not an attrs class, or has a ``__new__`` of
            its own (calling the twin would run it).
    """
    made = _TWINS.get(cls)
    if made is not None:
        return made
    if not attrs.has(cls) or cls.__new__ is not object.__new__:
        raise TypeError(f"{cls.__qualname__} cannot be built without its __init__")
    namespace = {
        "__slots__": (),
        "__setattr__": object.__setattr__,
        # Both, or the interpreter keeps dispatching stores to Python code.
        "__delattr__": object.__delattr__,
        "__init__": object.__init__,
        "__module__": cls.__module__,
        "__qualname__": f"{cls.__qualname__}.<mutable twin>",
    }
    made = _TWINS[cls] = type(f"{cls.__name__}Twin", (cls,), namespace)
    return made


_TWINS: dict[type[Any], type[Any]] = {}


def field_names(cls: type[Any]) -> tuple[str, ...]:
    """The fields of ``cls``, in attrs order, once ``cls`` qualifies.

    Raises:
        TypeError: building ``cls`` without ``__init__`` would differ from it.
    """
    twin(cls)  # refuses a class attrs did not make, or one with a __new__ of its own
    refusal = TypeError(f"{cls.__qualname__} cannot be built without its __init__")
    fields = attrs.fields(cls)
    if getattr(cls, "__attrs_pre_init__", None) is not None or any(
        not field.init
        or field.alias != field.name
        or field.validator is not None
        or field.converter is not None
        or not field.name.isidentifier()
        or keyword.iskeyword(field.name)
        for field in fields
    ):
        raise refusal
    slots: set[str] = set()
    for klass in cls.__mro__[:-1]:
        if "__slots__" not in vars(klass):
            raise refusal  # a base without __slots__ gives instances a dict
        declared = vars(klass)["__slots__"]
        slots.update((declared,) if isinstance(declared, str) else declared)
    names = tuple(field.name for field in fields)
    if "__dict__" in slots or slots - {"__weakref__"} != set(names):
        # An instance dict, or an extra slot (attrs' cached hash, a
        # hand-written one) that would be left unset.
        raise refusal
    return names


def _compile(cls: type[Any], name: str, body: list[str], **constants: Any) -> Callable[..., Any]:
    # As attrs does for __init__: the source is built from the class
    # definition alone (field names, which field_names() checked are
    # identifiers) and compiled into a private namespace holding only the
    # class and its twin.
    body.append("    obj.__class__ = cls")
    if getattr(cls, "__attrs_post_init__", None) is not None:
        body.append("    obj.__attrs_post_init__()")
    body.append("    return obj")
    namespace: dict[str, Any] = {"cls": cls, "mutable": twin(cls), **constants}
    filename = f"<events generated {name} {cls.__module__}.{cls.__qualname__}>"
    exec(compile("\n".join(body) + "\n", filename, "exec"), namespace)
    made: Callable[..., Any] = namespace[name]
    made.__qualname__ = f"{cls.__qualname__}.<{name}>"
    return made
