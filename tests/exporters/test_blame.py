"""``blame``: steps by the time spent in them, slowest first, each step
named with its slowest rank (as ``systemd-analyze blame``)."""

from __future__ import annotations

from events import Event, merge, replay
from events.testing import EventStream
from exporters import blame_text


def _rank(rank: int, load_ms: int) -> list[Event]:
    stream = EventStream(run_id="two", rank=rank, world_size=2).run_started()
    stream.started("load").advance(load_ms * 1_000_000).succeeded("load")
    return stream.run_finished()


def test_blame_names_each_steps_slowest_rank() -> None:
    # Rank 1 loads for 50 ms, rank 0 for 5 ms: the step took 50 ms.
    result = replay(list(merge([_rank(0, 5), _rank(1, 50)])))
    assert blame_text(result) == "51.0ms load (rank 1)\n"
    assert blame_text(result, rank=0) == "6.0ms load (rank 0)\n"
