"""Text views of a run for humans: the fallback tree, blame, critical path, diff.

Each view is a pure function of a replayed run (its timeline: each rank's
steps and how they ended), and ``diff`` of two report
documents, so it shows the same thing live, on replay, and on any machine.
Ranks whose views are identical are shown once, with their rank range.

Views are text for a terminal, and step names, reasons, messages and values
come from logs and probes: every line goes through :func:`terminal_text`,
so control characters are escaped and the continuation lines of a
multi-line text are indented (in the fallback tree, under their step).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from events import (
    ExceptionInfo,
    LaunchRecord,
    RankTimeline,
    Replay,
    StepCrashed,
    StepFailed,
    StepTimedOut,
    StepTiming,
    StepUnavailable,
    format_ranks,
)

from ._report import _role, stall_lines, waited_in
from ._terminal import terminal_text

__all__ = [
    "blame_text",
    "critical_path_text",
    "decisions_of",
    "diff_text",
    "explain_text",
    "run_differences",
]


def _seconds(ns: int) -> str:
    if ns < 1_000_000:
        return f"{ns / 1_000:.0f}us"
    if ns < 1_000_000_000:
        return f"{ns / 1_000_000:.1f}ms"
    return f"{ns / 1_000_000_000:.3f}s"


def _alive_until_mono_ns(timeline: RankTimeline, launch: LaunchRecord | None) -> int:
    """Until when a rank's steps in flight ran, on its monotonic clock: when
    its process was seen to end, for a rank whose log has no end and whose
    launcher saw it die; else its last sign of life (its last event)."""
    last = timeline.last
    if last is None:
        return max((t.start_mono_ns for t in timeline.steps.values()), default=0)
    ended = None if launch is None else launch.ended_wall_ns(timeline.rank)
    if ended is None or timeline.finished is not None:
        return last.mono_ns
    return last.mono_ns + max(0, ended - last.wall_ns)


def _began_mono_ns(timeline: RankTimeline) -> int:
    if timeline.start_mono_ns is not None:
        return timeline.start_mono_ns
    return min((t.start_mono_ns for t in timeline.steps.values()), default=0)


def _describe_end(timing: StepTiming) -> str:
    if timing.outcome is None:
        return "still running when the log ends"
    text = str(timing.outcome)
    match timing.end:
        case None if isinstance(timing.result, dict):
            summary = ", ".join(
                f"{k}={v}"
                for k, v in timing.result.items()
                if v not in (None, [], {}) and k != "priority"
            )
            if summary:
                text += f" ({_clip(summary, 120)})"
        case StepUnavailable(reasons=reasons) if reasons:
            text += f": {_clip('; '.join(reasons), 200)}"
        case StepFailed(cause=cause):
            text += f": {_chain_summary(cause, 300)}"
        case StepTimedOut(timeout_s=timeout):
            text += f" after {timeout:g}s"
        case StepCrashed(exit_code=code, signal=sig):
            text += f" (signal {sig})" if sig is not None else f" (exit code {code})"
    return text


def _chain_summary(cause: ExceptionInfo, limit: int) -> str:
    """The reasons of ``cause``'s chain, ``" <- "``-joined and cut at
    ``limit`` characters (:func:`_clip`), reading no more links than that
    takes."""
    reasons: list[str] = []
    length = -4
    node: ExceptionInfo | None = cause
    while node is not None and length < limit:
        reasons.append(node.reason)
        length += len(node.reason) + 4
        node = node.cause or node.context
    return _clip(" <- ".join(reasons), limit, more=node is not None)


_ELLIPSIS = "…"
_OPENERS = {"(": ")", "[": "]", "{": "}", "<": ">"}


def _clip(text: str, limit: int, *, more: bool = False) -> str:
    """``text`` in at most ``limit`` characters: whole, or cut at a word (or
    chain link) boundary and ended with an ellipsis, never inside a bracketed
    token (a bracket the cut would leave open is cut off with what follows
    it). ``more``: something follows ``text`` that is left out anyway.

    A line such as ``closed by peer [127.0.0.1]:29500 [953.7ms]`` is thus
    never shown as ``closed by peer [1 [953.7ms]``."""
    if len(text) <= limit and not more:
        return text
    room = max(limit - len(_ELLIPSIS) - 1, 0)
    if len(text) <= room:
        return f"{text} {_ELLIPSIS}"
    head = text[: room + 1]
    boundary = max(head.rfind(" "), head.rfind("\n"))
    # No boundary at all (one enormous token): cut it; the brackets are
    # balanced below all the same.
    head = head[:boundary] if boundary > 0 else text[:room]
    head = head[: _first_open_at(text, len(head))].rstrip()
    while head.endswith(("<-", ":", ",", ";", "(", "[", "{", "<")):
        head = head.removesuffix("<-").rstrip(":,;([{<").rstrip()
    return f"{head} {_ELLIPSIS}" if head else _ELLIPSIS


def _first_open_at(text: str, cut: int) -> int:
    """Where the outermost bracket that is open at ``cut`` and closed after
    it starts (``cut`` when there is none): a bracket ``text`` never closes
    is left as it is."""
    closes = set(_OPENERS.values())
    stack: list[tuple[int, str]] = []
    pairs: list[tuple[int, int]] = []
    for index, char in enumerate(text):
        if char in _OPENERS and text[index : index + 2] != "<-":  # "<-" joins links
            stack.append((index, _OPENERS[char]))
        elif char in closes:
            # The innermost open bracket this closes; unmatched closers are
            # ignored.
            for depth in range(len(stack) - 1, -1, -1):
                if stack[depth][1] == char:
                    pairs.append((stack[depth][0], index))
                    del stack[depth:]
                    break
    spanning = [start for start, end in pairs if start < cut <= end]
    return min(spanning, default=cut)


def _printable(lines: Iterable[str]) -> str:
    return "".join(terminal_text(line) + "\n" for line in lines)


#: How many levels ``explain`` and ``critical-path`` indent; deeper lines
#: stay at that indentation.
_MAX_INDENT = 32


def _tree_lines(
    timeline: RankTimeline, *, with_times: bool, launch: LaunchRecord | None = None
) -> list[str]:
    last_mono = _alive_until_mono_ns(timeline, launch)
    outcome = timeline.outcome or "incomplete (no run.finished)"
    lines = [f"run: {outcome}"]
    # Each level's indentation, down to the step shown; it stops growing at
    # _MAX_INDENT levels, so the text stays linear in the events.
    levels: list[str] = []
    for depth, last, timing in timeline.tree():
        del levels[depth:]
        prefix = "".join(levels[:_MAX_INDENT])
        levels.append("   " if last else "│  ")
        below = "".join(levels[:_MAX_INDENT])
        duration = ""
        if with_times and timing.duration_ns is not None:
            duration = f" [{_seconds(timing.duration_ns)}]"
        elif with_times:
            # In flight when the log ends: it ran at least until the rank's
            # process ended, or its last sign of life.
            duration = f" [>= {_seconds(last_mono - timing.start_mono_ns)}]"
        branch = "└─ " if last else "├─ "
        line = f"{prefix}{branch}{timing.step}: {_describe_end(timing)}{duration}"
        # A multi-line reason continues under its step, inside the tree.
        lines.append(terminal_text(line, indent=below + "   "))
        if timing.stall is not None and with_times:
            lines.extend(stall_lines(timing.stall, indent=below + "   "))
        elif waited := waited_in(timing.stall):
            lines.append(f"{below}   waiting in {waited}")
    lines.extend(
        terminal_text(f"decision {d.name} = {d.value!r} ({d.step})") for d in timeline.decisions
    )
    return lines


def _timelines(replay: Replay, rank: int | None) -> dict[int, RankTimeline]:
    ranks = replay.timeline.ranks
    return {r: ranks[r] for r in sorted(ranks) if rank is None or r == rank}


def explain_text(replay: Replay, *, rank: int | None = None) -> str:
    """The fallback tree of every step of every rank (or of ``rank``), with
    outcomes, causes and decisions; ranks with identical trees are shown
    once (timings of the first rank of the group), the root cause's group
    first, then by lowest rank. With the run's launch record, a step in
    flight when its rank died lasts until the process ended."""
    timelines = _timelines(replay, rank)
    groups: dict[tuple[str, ...], list[int]] = {}
    for r, timeline in timelines.items():
        groups.setdefault(tuple(_tree_lines(timeline, with_times=False)), []).append(r)
    first = None if replay.root_cause is None else replay.root_cause.rank
    out: list[str] = []
    for ranks in sorted(groups.values(), key=lambda ranks: first not in ranks):
        role = _role(replay.states.get(ranks[0]))
        label = f" ({terminal_text(role)})" if role and len(ranks) == 1 else ""
        tree = _tree_lines(timelines[ranks[0]], with_times=True, launch=replay.launch)
        out += [f"== {format_ranks(ranks)}{label} ==", *tree, ""]
    # The tree lines are escaped already.
    return "\n".join(out).rstrip() + "\n"


def blame_text(replay: Replay, *, rank: int | None = None) -> str:
    """Steps by time spent, slowest first (as ``systemd-analyze blame``); for
    several ranks, each step's slowest rank. A step in flight when its log
    ends counts until its rank's process ended (the run's launch record),
    else until the rank's last event."""
    slowest: dict[str, tuple[int, int, bool]] = {}
    timelines = _timelines(replay, rank)
    for r, timeline in timelines.items():
        last_mono = _alive_until_mono_ns(timeline, replay.launch)
        for timing in timeline.steps.values():
            duration = timing.duration_ns
            if duration is None:
                duration = last_mono - timing.start_mono_ns
            if timing.step not in slowest or duration > slowest[timing.step][0]:
                slowest[timing.step] = (duration, r, not timing.finished)
    rows = sorted(slowest.items(), key=lambda item: -item[1][0])
    if not rows:
        return "no steps\n" if timelines else "no events\n"
    width = max((len(_seconds(d)) for _, (d, _, _) in rows), default=0)
    return _printable(
        f"{_seconds(duration):>{width}} {step} (rank {r}"
        + (", still running when its log ends)" if open_ else ")")
        for step, (duration, r, open_) in rows
    )


def critical_path_text(replay: Replay, *, rank: int | None = None) -> str:
    """The chain of steps that decided the startup's wall time, on the rank
    that took longest: each line ``@start +duration`` relative to the rank's
    start, like ``systemd-analyze critical-chain``; a failed rank's ends in
    the step its failure went up through. A rank that died lasts
    until its process ended (the run's launch record), else until its last
    event."""
    timelines = _timelines(replay, rank)
    if not timelines:
        return "no events\n"
    alive = {r: _alive_until_mono_ns(t, replay.launch) for r, t in timelines.items()}
    took = {r: alive[r] - _began_mono_ns(t) for r, t in timelines.items()}
    chosen = max(took, key=took.__getitem__)
    timeline = timelines[chosen]
    finished = timeline.finished
    origin = _began_mono_ns(timeline)
    # A failed run ended when its failure went up, not when the steps it
    # cancelled finished unwinding: the chain ends in the failed step's.
    failed = None if finished is None else finished.failed_step
    current = None
    top: dict[str, StepTiming] = {}
    inside: dict[str, list[StepTiming]] = {}
    path: list[StepTiming] = []
    for depth, _, timing in timeline.tree():
        del path[depth:]
        if not path:
            top[timing.step] = timing
        elif timing.finished:
            inside.setdefault(path[-1].step, []).append(timing)
        path.append(timing)
        if timing.step == failed:
            current = path[0]

    def end_of(timing: StepTiming) -> int:
        if timing.duration_ns is None:
            return alive[chosen]
        return timing.start_mono_ns + timing.duration_ns

    if current is None:
        current = max(top.values(), key=end_of, default=None)
    chain: list[StepTiming] = []
    while current is not None:
        chain.append(current)
        # A crafted log may make the dependencies a cycle: each step once.
        on_chain = {timing.step for timing in chain}
        deps = [top[d] for d in current.depends_on if d in top and d not in on_chain]
        current = max(deps, key=end_of) if deps else None
    # The run is incomplete while any of its ranks is (a rank that died
    # may not be the slowest one).
    unfinished = [r for r, t in timelines.items() if t.finished is None]
    outcome = "incomplete" if finished is None or unfinished else str(finished.outcome)
    lines = [f"run {outcome} +{_seconds(took[chosen])} (rank {chosen}, the slowest)"]
    if unfinished and rank is None:
        lines.append(
            f"  {format_ranks(unfinished)} did not finish: steps in flight there count until "
            "the process ended, else the last sign of life"
        )
    for level, timing in enumerate(chain):
        start = timing.start_mono_ns - origin
        indent = "   " * min(level, _MAX_INDENT)
        lines.append(
            f"{indent}└─ {timing.step} @{_seconds(start)} "
            f"+{_seconds(end_of(timing) - timing.start_mono_ns)}"
        )
        if inner := inside.get(timing.step):
            slow = max(inner, key=lambda t: end_of(t) - t.start_mono_ns)
            lines.append(
                f"{indent}      (slowest inside: {slow.step} "
                f"+{_seconds(end_of(slow) - slow.start_mono_ns)})"
            )
    return _printable(lines)


#: Messages about how long a step took and where it was at a moment: they
#: differ between any two launches, as durations do, and are no difference.
_TIMING_CODES = frozenset({"step.stalled"})


def _message_keys(document: Mapping[str, Any]) -> dict[tuple[str, str, str], list[int]]:
    return {
        (m["severity"], m["code"], m["text"]): list(m["ranks"])
        for m in document.get("messages", [])
        if m["code"] not in _TIMING_CODES
    }


def diff_text(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    *,
    decisions_a: Mapping[tuple[int, str], Any] | None = None,
    decisions_b: Mapping[tuple[int, str], Any] | None = None,
    label_a: str = "A",
    label_b: str = "B",
) -> str:
    """What changed between two report documents (``report_json``): outcome,
    root cause, per-rank state, decisions and messages (the lines of
    :func:`run_differences`), under ``---``/``+++`` headers."""
    lines = [f"--- {label_a}", f"+++ {label_b}"]
    # Neither is a real start in the same way: said first, not a difference.
    for field, what in _NOT_REAL:
        same = _not_real(a.get(field))
        if same and same == _not_real(b.get(field)):
            lines.append(f"both runs: {what} {same}")
    differences = run_differences(a, b, decisions_a=decisions_a, decisions_b=decisions_b)
    lines += differences or ["no differences in outcome, state, decisions or messages"]
    return _printable(lines)


#: What makes a run not a real start, by report field.
_NOT_REAL = (("simulated", "simulated host"), ("injected", "injected faults"))


def run_differences(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    *,
    decisions_a: Mapping[tuple[int, str], Any] | None = None,
    decisions_b: Mapping[tuple[int, str], Any] | None = None,
) -> list[str]:
    """The differences between two report documents, one line each (empty:
    none). ``-`` lines are only in A, ``+`` lines only in B.

    Ranks with the same difference share one line (``ranks 0-7: ...``), for
    state and decisions alike. What differs between any two launches (a
    rank's pid, and the description that quotes it and its timing; a
    ``step.stalled`` message, which says how long a step had run and where
    it was then) is not a difference; how a rank's process ended is."""
    lines: list[str] = []
    for field in ("outcome", "world_size"):
        if a.get(field) != b.get(field):
            lines.append(f"{field}: {a.get(field)} -> {b.get(field)}")
    for field, what in _NOT_REAL:
        old, new = _not_real(a.get(field)), _not_real(b.get(field))
        if old != new:
            lines.append(f"{what}: {old or 'none'} -> {new or 'none'}")
    cause_a, cause_b = a.get("root_cause"), b.get("root_cause")
    # A root cause's description has the timing.
    if _comparable(cause_a, ("description",)) != _comparable(cause_b, ("description",)):
        lines.append(f"root cause: {_cause_text(cause_a)} -> {_cause_text(cause_b)}")
    ranks_a = {r["rank"]: _comparable(r) for r in a.get("ranks", [])}
    ranks_b = {r["rank"]: _comparable(r) for r in b.get("ranks", [])}
    both = set(ranks_a) & set(ranks_b)
    for only, side in ((set(ranks_a) - both, "first"), (set(ranks_b) - both, "second")):
        if only:
            lines.append(f"{format_ranks(only)}: only in the {side} run")
    # (kind, what, old, new) -> the ranks where it changed so: the state's
    # fields first, then the decisions.
    changes: dict[tuple[str, str, str, str], list[int]] = {}
    for rank in sorted(both):
        left, right = ranks_a[rank], ranks_b[rank]
        for field in sorted((left.keys() | right.keys()) - {"rank"}):
            before, after = left.get(field), right.get(field)
            if before != after:
                changes.setdefault(("", field, repr(before), repr(after)), []).append(rank)
    old_decisions, new_decisions = decisions_a or {}, decisions_b or {}
    for rank, decision in sorted(old_decisions.keys() | new_decisions.keys()):
        if rank not in both and (ranks_a or ranks_b):
            continue  # a rank of one run only: said above
        before, after = old_decisions.get((rank, decision)), new_decisions.get((rank, decision))
        if before != after:
            changes.setdefault(("decision ", decision, repr(before), repr(after)), []).append(rank)
    for (kind, what, old, new), ranks in changes.items():
        lines.append(f"{format_ranks(ranks)}: {kind}{what} {old} -> {new}")
    messages_a, messages_b = _message_keys(a), _message_keys(b)
    for sign, mine, theirs in (("-", messages_a, messages_b), ("+", messages_b, messages_a)):
        for (severity, code, text), ranks in mine.items():
            if theirs.get((severity, code, text)) != ranks:
                lines.append(f"{sign} {severity.upper()} [{format_ranks(ranks)}] {text}")
    return lines


def _not_real(value: Any) -> str:
    """What a report says made a run not a real start (its simulated host,
    its injected faults), as text; ``""`` for a real start."""
    if isinstance(value, list):
        return ", ".join(str(item) for item in value)
    return "" if value is None else str(value)


#: What differs between any two launches: a process's pid, and its
#: description, which quotes the pid and the timing.
_LAUNCH_SPECIFIC = ("process.pid", "process.description")


def _comparable(entry: Any, dropped: tuple[str, ...] = ()) -> Any:
    """An entry of a report (a rank, the root cause) with its nested objects
    (its process) as dotted fields, so that a difference names the one field
    that differs; without ``dropped`` and :data:`_LAUNCH_SPECIFIC`."""
    if not isinstance(entry, Mapping):
        return entry
    flat: dict[str, Any] = {}
    for field, value in entry.items():
        if isinstance(value, Mapping):
            flat.update({f"{field}.{key}": item for key, item in value.items()})
        else:
            flat[field] = value
    ignored = {*dropped, *_LAUNCH_SPECIFIC}
    return {field: value for field, value in flat.items() if field not in ignored}


def _cause_text(cause: Mapping[str, Any] | None) -> str:
    if not cause:
        return "none"
    exception = cause.get("exception")
    if not exception:
        # A rank that died or never started: its description says which and how.
        return str(cause.get("description"))
    return (
        f"rank {cause.get('rank')} step {cause.get('step')}: "
        f"{exception.get('type')}: {exception.get('message')}"
    )


def decisions_of(replay: Replay) -> dict[tuple[int, str], Any]:
    """Every recorded decision, by (rank, "name@step")."""
    return {
        (rank, f"{decision.name}@{decision.step}"): decision.value
        for rank, timeline in replay.timeline.ranks.items()
        for decision in timeline.decisions
    }
