"""Many concurrent anyio tasks (and worker threads) appending to one log."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

import events

from .samples import numbered

TASKS = 1_000


def make(kind: str, path: Path) -> events.MemoryLog | events.JsonlLog:
    if kind == "memory":
        return events.MemoryLog("run-1", 0)
    return events.JsonlLog(path, run_id="run-1", rank=0, durability="never")


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["memory", "jsonl"])
@pytest.mark.parametrize("via", ["tasks", "threads"])
async def test_concurrent_appends_are_gapless_and_intact(
    tmp_path: Path, kind: str, via: str
) -> None:
    path = tmp_path / "rank-0.jsonl"
    log = make(kind, path)
    delivered: list[int] = []
    log.subscribe(lambda event: delivered.append(event.seq))
    drafts = numbered("run-1", 0, TASKS)
    assigned: dict[str, int] = {}
    go = anyio.Event()

    async def append(event: events.Event) -> None:
        await go.wait()
        # Let the others run too, so appends really interleave.
        await anyio.lowlevel.checkpoint()
        if via == "threads":
            seq = await anyio.to_thread.run_sync(log.append, event)
        else:
            seq = log.append(event)
        assigned[event.step] = seq

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            for event in drafts:
                group.start_soon(append, event)
            go.set()
    log.close()

    assert sorted(assigned.values()) == list(range(TASKS))
    assert delivered == list(range(TASKS))
    stored = list(log.read())
    assert [event.seq for event in stored] == list(range(TASKS))
    # Every event exactly once, under the seq it was given.
    assert {event.step: event.seq for event in stored} == assigned
    if kind == "jsonl":
        contents = events.read_log(path)
        assert contents.torn_tail is None
        assert list(contents.events) == stored
        assert path.read_bytes().count(b"\n") == TASKS
