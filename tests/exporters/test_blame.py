"""The views of time: ``blame`` (steps by the time spent in them, slowest
first, each named with its slowest rank, as ``systemd-analyze blame``),
``critical-path`` (the chain of steps that decided the wall time, as
``systemd-analyze critical-chain``), and ``explain``, which groups ranks
whose trees differ only in their timings."""

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


MS = 1_000_000


def _probed(rank: int, *, extra_ms: int, mono_s: int) -> list[Event]:
    """``platform`` and ``cache`` at once, then ``attention`` (after both,
    and after a ``warmup`` this run never ran) beside ``allreduce``; the
    rank's monotonic clock starts at ``mono_s``, and its ``attention/b``
    takes ``extra_ms`` longer."""
    stream = EventStream(
        run_id="chain", rank=rank, world_size=2, tick_ns=0, mono_ns=mono_s * 1000 * MS
    ).run_started()
    stream.started("platform").started("cache")
    stream.advance(10 * MS).succeeded("cache")
    stream.advance(10 * MS).succeeded("platform")
    stream.started("attention", depends_on=["cache", "platform", "warmup"])
    stream.started("allreduce", depends_on=["platform"])
    stream.started("attention/a").advance(5 * MS).succeeded("attention/a")
    stream.started("attention/b").advance(5 * MS).succeeded("allreduce")
    stream.advance((15 + extra_ms) * MS).succeeded("attention/b").succeeded("attention")
    return stream.run_finished()


def _chain_run() -> list[Event]:
    # Rank 1 is the slower by 7 ms, though its monotonic clock started
    # earlier than rank 0's: each rank is timed from its own start.
    return list(merge([_probed(0, extra_ms=0, mono_s=5), _probed(1, extra_ms=7, mono_s=1)]))


def test_the_critical_path_follows_the_latest_dependency_of_the_slowest_rank() -> None:
    from exporters import critical_path_text

    assert critical_path_text(replay(_chain_run())) == (
        "run ready +52.0ms (rank 1, the slowest)\n"
        "└─ attention @20.0ms +32.0ms\n"
        "      (slowest inside: attention/b +27.0ms)\n"
        "   └─ platform @0us +20.0ms\n"
    )


def test_blame_keeps_the_lowest_rank_of_a_tie_and_aligns_the_durations() -> None:
    assert blame_text(replay(_chain_run())) == (
        "32.0ms attention (rank 1)\n"
        "27.0ms attention/b (rank 1)\n"
        "20.0ms platform (rank 0)\n"
        "10.0ms cache (rank 0)\n"
        "10.0ms allreduce (rank 0)\n"
        " 5.0ms attention/a (rank 0)\n"
    )


def test_explain_shows_ranks_that_differ_only_in_time_once() -> None:
    from exporters import explain_text

    def loads(rank: int, load_ms: int) -> list[Event]:
        stream = EventStream(run_id="alike", rank=rank, world_size=3, tick_ns=0).run_started()
        stream.started("load").advance(load_ms * MS).succeeded("load")
        return stream.run_finished()

    run = replay(list(merge([loads(0, 5), loads(1, 50), loads(2, 7)])))
    # One tree for the three, with the first rank's timings.
    assert explain_text(run) == "== ranks 0-2 ==\nrun: ready\n└─ load: ok [5.0ms]\n"
