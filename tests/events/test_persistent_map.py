"""PersistentMap: a mapping no one changes, whose updates share storage."""

from __future__ import annotations

import copy
import pickle
import threading
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from events import _persistent_map
from events._persistent_map import PersistentMap

PROPERTY = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)

#: (which earlier version to update, key, value): updating an older version
#: branches, as a fold resumed from a saved state does.
UPDATES = st.lists(st.tuples(st.integers(0, 1_000), st.integers(0, 12), st.integers()), max_size=60)


def assert_same(version: PersistentMap[int, int], model: dict[int, int]) -> None:
    assert list(version) == list(model)  # first-insertion order, as a dict
    assert dict(version.items()) == model
    assert len(version) == len(model)
    assert version == model
    for key in range(-1, 14):
        assert (key in version) is (key in model)
        assert version.get(key) == model.get(key)
        assert version.get(key, "absent") == model.get(key, "absent")
        if key in model:
            assert version[key] == model[key]
        else:
            with pytest.raises(KeyError):
                version[key]


@PROPERTY
@pytest.mark.parametrize("limit", [128, 3, 0])
@given(updates=UPDATES)
def test_every_version_keeps_its_contents(limit: int, updates: list[tuple[int, int, int]]) -> None:
    # The limit decides when a map leaves the copied dict for the journal:
    # 0 puts every map in a journal, 3 switches early, 128 never here.
    with mock.patch.object(_persistent_map, "_COPY_LIMIT", limit):
        versions: list[PersistentMap[int, int]] = [PersistentMap()]
        models: list[dict[int, int]] = [{}]
        for which, key, value in updates:
            index = which % len(versions)
            versions.append(versions[index].set(key, value))
            models.append({**models[index], key: value})
        for version, model in zip(versions, models, strict=True):
            assert_same(version, model)


def test_large_maps_stay_linear_and_correct() -> None:
    versions = [PersistentMap[str, int]()]
    for index in range(3_000):
        # Each key is written twice, the second time much later.
        key = f"step-{index % 1_500}"
        versions.append(versions[-1].set(key, index))
    assert len(versions[-1]) == 1_500
    assert versions[-1]["step-0"] == 1_500
    assert versions[1_500]["step-1499"] == 1_499
    assert "step-1" not in versions[1]
    assert list(versions[2_000]) == [f"step-{index}" for index in range(1_500)]
    # Branching from an old version leaves the newer ones alone.
    branch = versions[10].set("step-3", -1)
    assert branch["step-3"] == -1
    assert versions[11]["step-3"] == 3
    assert versions[-1]["step-3"] == 1_503


def test_construction_equality_and_copies() -> None:
    mapping = PersistentMap({"b": 1, "a": 2})
    plain = {"b": 1, "a": 2}
    assert PersistentMap([("b", 1), ("a", 2)]) == mapping == plain
    assert plain == mapping  # a dict defers to the mapping's own comparison
    assert mapping != {"b": 1}
    assert repr(mapping) == "PersistentMap({'b': 1, 'a': 2})"
    large = PersistentMap({index: str(index) for index in range(500)}).set(3, "three")
    for copied in (pickle.loads(pickle.dumps(large)), copy.deepcopy(large), copy.copy(large)):
        assert type(copied) is PersistentMap
        assert copied == large
    with pytest.raises(TypeError):
        hash(mapping)
    with pytest.raises(TypeError):
        mapping["c"] = 3  # type: ignore[index]


def test_threads_extending_one_version_each_get_their_own() -> None:
    base = PersistentMap(dict.fromkeys(range(300), 0))
    start = threading.Barrier(4)
    results: dict[int, PersistentMap[int, int]] = {}

    def extend(thread: int) -> None:
        start.wait()
        mapping = base
        for index in range(300):
            mapping = mapping.set(index, thread)
        results[thread] = mapping

    threads = [threading.Thread(target=extend, args=(thread,)) for thread in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert base == dict.fromkeys(range(300), 0)
    for thread, mapping in results.items():
        assert mapping == dict.fromkeys(range(300), thread)
