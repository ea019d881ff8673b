"""Building frozen instances without ``__init__``: the same objects, or a refusal."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import events
from events import Outcome
from events._builders import builder, evolve, twin

from .samples import PERMISSION_DENIED
from .strategies import EVENTS

PROPERTY = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


def fields_of(instance: object) -> dict[str, object]:
    return {field.name: getattr(instance, field.name) for field in attrs.fields(type(instance))}


@PROPERTY
@given(event=EVENTS)
def test_built_instances_are_what_init_builds(event: events.Event) -> None:
    cls = type(event)
    values = fields_of(event)
    built = builder(cls)(*values.values())
    assert type(built) is cls
    assert built == cls(**values)  # type: ignore[arg-type]
    assert fields_of(built) == values
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        built.step = "changed"  # type: ignore[misc]


def test_post_init_invariants_still_hold() -> None:
    envelope = {"run_id": "r", "rank": 0, "seq": 0, "wall_ns": 1, "mono_ns": 1}
    fine = events.StepUnavailable(**envelope, outcome=Outcome.ABSENT, cause=PERMISSION_DENIED)
    values = fields_of(fine) | {"outcome": Outcome.OK}
    with pytest.raises(ValueError, match="must be absent, unavailable or invalid"):
        builder(events.StepUnavailable)(*values.values())


def test_the_twin_never_shows() -> None:
    event = events.StepStarted(run_id="r", rank=0, wall_ns=1, mono_ns=1)
    copy = evolve(event, {"seq": 3})
    assert type(copy) is events.StepStarted
    assert issubclass(twin(events.StepStarted), events.StepStarted)  # a subclass...
    assert twin(events.StepStarted) is twin(events.StepStarted)  # ...made once
    assert type(copy) is not twin(events.StepStarted)
    identity = events.RankIdentity(rank=1, world_size=2)
    assert hash(builder(events.RankIdentity)(*fields_of(identity).values())) == hash(identity)


@attrs.frozen(kw_only=True)
class Validated:
    level: int = attrs.field(validator=attrs.validators.ge(0))


@attrs.frozen(kw_only=True)
class Converted:
    level: int = attrs.field(converter=int)


@attrs.frozen(kw_only=True)
class PreInit:
    level: int

    def __attrs_pre_init__(self) -> None:
        pass


@attrs.frozen(kw_only=True)
class Private:
    _level: int


@attrs.frozen(kw_only=True, cache_hash=True)
class CachedHash:
    level: int


@attrs.define(frozen=True, slots=False)
class WithDict:
    level: int


class NotAttrs:
    __slots__ = ("level",)


@attrs.frozen(kw_only=True)
class OwnNew:
    level: int

    def __new__(cls, **fields: object) -> OwnNew:
        return super().__new__(cls)


@pytest.mark.parametrize(
    "cls", [Validated, Converted, PreInit, Private, CachedHash, WithDict, NotAttrs, OwnNew]
)
def test_classes_init_would_build_differently_are_refused(cls: type[object]) -> None:
    with pytest.raises(TypeError, match="cannot be built without its __init__"):
        builder(cls)


@attrs.frozen(kw_only=True)
class CheckedStart(events.StepStarted):
    """A user's own event class, with a validator."""

    budget: int = attrs.field(default=0, validator=attrs.validators.ge(0))


def test_logs_copy_other_classes_with_attrs() -> None:
    log = events.MemoryLog("r")
    event = CheckedStart(run_id="r", rank=0, wall_ns=1, mono_ns=1, budget=5)
    assert log.append(event) == 0
    assert log.append(event) == 1
    second = log.events[1]
    assert type(second) is CheckedStart
    assert second == attrs.evolve(event, seq=1)


@PROPERTY
@given(event=EVENTS, data=st.data())
def test_evolved_instances_are_what_attrs_evolve_builds(
    event: events.Event, data: st.DataObject
) -> None:
    names = [field.name for field in attrs.fields(type(event))]
    changed = data.draw(st.lists(st.sampled_from(names), unique=True, max_size=3))
    values = fields_of(event)
    changes = {name: values[name] for name in changed} | (
        {"seq": event.seq + 1} if "seq" in changed else {}
    )
    evolved = evolve(event, changes)
    assert type(evolved) is type(event)
    assert evolved == attrs.evolve(event, **changes)
    assert fields_of(evolved) == fields_of(attrs.evolve(event, **changes))
    with pytest.raises(TypeError, match="has no fields"):
        evolve(event, {"nope": 1})


@pytest.mark.parametrize("cls", [Validated, Converted, Private, CachedHash, WithDict])
def test_classes_that_do_not_qualify_are_evolved_by_attrs(cls: type[object]) -> None:
    source = cls(level=2)  # type: ignore[call-arg]
    assert evolve(source, {"level": 3}) == attrs.evolve(source, level=3)  # type: ignore[misc]


def test_evolve_keeps_post_init_invariants() -> None:
    envelope = {"run_id": "r", "rank": 0, "seq": 0, "wall_ns": 1, "mono_ns": 1}
    fine = events.StepUnavailable(**envelope, outcome=Outcome.ABSENT, cause=PERMISSION_DENIED)
    with pytest.raises(ValueError, match="must be absent, unavailable or invalid"):
        evolve(fine, {"outcome": Outcome.FAILED})
