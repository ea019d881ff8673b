"""Whether ``events/_builders.py`` earns its place: building frozen instances
without attrs' keyword parsing, against attrs itself, side by side.

Run from the repository root::

    .venv/bin/python benchmarks/bench_builders.py [--repeat 5] [--number 200000]

Two rows, each ours against attrs in the same run (best of ``--repeat``, the
garbage collector paused, CPU time of this process, per call):

* decoding a ``step.succeeded`` record with the codec's generated decoder,
  which checks every field and builds the event as its twin, against only
  building the same event with its attrs ``__init__`` from ready values (no
  checks at all);
* copying a rank's state with two fields changed: ``_builders.evolve``
  against ``attrs.evolve``, as the projections do once per event.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable

import attrs

import events
from events import RankState, StepSucceeded
from events._builders import evolve
from events._codec import CURRENT_DECODERS


def best(repeat: int, number: int, call: Callable[[], object]) -> float:
    """The best time of ``number`` calls, in microseconds per call."""
    times = []
    for _ in range(repeat):
        started = time.process_time()
        for _ in range(number):
            call()
        times.append(time.process_time() - started)
    return min(times) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--number", type=int, default=200_000)
    args = parser.parse_args()
    event = StepSucceeded(
        run_id="r",
        rank=3,
        seq=5,
        wall_ns=10,
        mono_ns=20,
        step="attention/FLASH_ATTN",
        trace_id="0" * 32,
        span_id="1" * 16,
        parent_span_id="2" * 16,
        result={"backend": "FLASH_ATTN"},
    )
    record = events.encode_record(event)
    decode = CURRENT_DECODERS[StepSucceeded.TYPE]
    fields = {field.name: getattr(event, field.name) for field in attrs.fields(StepSucceeded)}
    state = RankState(rank=1)
    gc.disable()
    rows = [
        (
            "decode step.succeeded (checked, twin)",
            best(args.repeat, args.number, lambda: decode(record)),
            "StepSucceeded(**fields) (no checks)",
            best(args.repeat, args.number, lambda: StepSucceeded(**fields)),
        ),
        (
            "_builders.evolve(state, 2 fields)",
            best(
                args.repeat, args.number, lambda: evolve(state, {"last_seq": 3, "last_wall_ns": 5})
            ),
            "attrs.evolve(state, 2 fields)",
            best(args.repeat, args.number, lambda: attrs.evolve(state, last_seq=3, last_wall_ns=5)),
        ),
    ]
    print(f"best of {args.repeat}, {args.number:,} calls each, CPU time per call")
    for ours_label, ours, theirs_label, theirs in rows:
        print(f"  {ours_label:<40} {ours:6.2f} us")
        print(f"  {theirs_label:<40} {theirs:6.2f} us   ours {ours / theirs:.2f}x")


if __name__ == "__main__":
    main()
