"""A self-contained HTML report of a run: the file to attach to a bug report.

:func:`report_html` renders a :class:`~events.Replay` as one page that
needs nothing else: inline CSS and no script at all (expanding every step
and zooming the time axis are CSS toggles), no fonts, images or network (a
Content-Security-Policy forbids every fetch and every script). Every text
from the log is escaped, so an exception message cannot inject markup or script,
and its control and bidirectional characters are shown as escapes
(:func:`~exporters.terminal_text`), so it cannot reorder or hide what the
page shows.

The page, from the top: the outcome, the simulated profile and injected
faults, the root cause with its exception chain and a link to its step
(open from the start); then one swimlane per group of identical ranks (the
same steps with the same outcomes and the same exception types collapse
into one lane labelled with the rank set, its fastest and slowest rank,
hosts, pids and start times; texts that differ by rank are shown inside,
each with its ranks), failed and incomplete ranks first, each with its steps
nested under the step each ran in (:meth:`~events.RankTimeline.tree`) on a
time axis with round ticks, each bar with its duration. The axis covers
the whole run, or, when one step every other waited for
(``process_group``) takes most of it, the run from the first step that
waited. A step opens (``<details>``) to its outcome, duration, reasons,
exception chain, the messages it produced (grouped by rank set) and the
decisions recorded at it. Messages, divergences, decisions and warnings of
the whole run follow.
"""

from __future__ import annotations

import html
import math
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from events import (
    DecisionMade,
    Divergence,
    ExceptionInfo,
    GroupedMessage,
    Message,
    Replay,
    RunOutcome,
    Severity,
    StepCancelled,
    StepCrashed,
    StepFailed,
    StepTimedOut,
    StepTiming,
    StepUnavailable,
    format_ranks,
)

from ._report import (
    _OUTCOME_ORDER,
    _launched_ns,
    capped,
    degraded_by,
    lost_by,
    rank_label,
    waited_in,
)
from ._terminal import terminal_text

__all__ = ["report_html"]

#: Outcome -> CSS class (its colour).
_TONE = {
    **dict.fromkeys(("ok", "ready"), "ok"),
    **dict.fromkeys(("absent", "cancelled"), "quiet"),
    **dict.fromkeys(("unavailable", "invalid"), "warn"),
    "running": "run",
    **dict.fromkeys(("failed", "timed_out", "crashed", "interrupted", "incomplete"), "bad"),
}

#: A step's details show this many distinct texts (of reasons and
#: exceptions) across its lane's ranks, then name the rest's ranks.
_VARIANTS = 8

_CSS = (
    "body{font:13px/1.4 system-ui,sans-serif;margin:0 1.2em 2em;color:#1d2329;"
    "overflow-wrap:break-word}"
    "h1{font-size:18px;margin:.6em 0 .2em}h2{font-size:15px;margin:1.2em 0 .4em}"
    "code,pre{font:12px ui-monospace,monospace}pre{white-space:pre-wrap;margin:.2em 0}"
    ".meta{color:#555}.meta b{color:#1d2329}"
    ".badge{display:inline-block;padding:0 .5em;border-radius:3px;color:#fff;font-weight:600}"
    ".ok{background:#3c9a5f}.quiet{background:#9aa5b1}.warn{background:#d9a400}"
    ".bad{background:#c8372d}.run{background:#3d6fb6}.none{background:#444}"
    "#root-cause{border:2px solid #c8372d;border-radius:4px;padding:.4em .8em;margin:.6em 0}"
    "#root-cause.fine{border-color:#3c9a5f}"
    "#degraded{border:2px solid #c98a1b;border-radius:4px;padding:.4em .8em;margin:.6em 0}"
    ".chain{margin:.2em 0 .2em 1em;padding:0;list-style:none}"
    ".chain li{margin:.15em 0}.link{color:#555;font-style:italic}.msg{white-space:pre-wrap}"
    ".lane{border:1px solid #d5dae0;border-radius:4px;margin:.5em 0}"
    ".lane>h3{margin:0;padding:.3em .6em;font-size:13px;background:#f1f3f5}"
    ".axis,.step>summary{display:flex;align-items:center}"
    ".axis{position:sticky;top:0;background:#fff;z-index:1;height:18px;color:#555}"
    ".name{flex:0 0 340px;display:flex;white-space:nowrap;overflow:hidden}"
    ".label{overflow:hidden;text-overflow:ellipsis}"
    ".track{position:relative;flex:1;height:12px;background:#f1f3f5}"
    ".axis .track{background:none;height:18px}"
    ".track{overflow:hidden}.axis .track{overflow:visible}"
    ".ticks{position:absolute;inset:0}.ticks.zoomed{display:none}"
    ".tick{position:absolute;top:0;border-left:1px solid #aab;padding-left:2px;font-size:11px}"
    ".bar{position:absolute;top:0;height:12px;min-width:2px;border-radius:2px;"
    "left:var(--l);width:var(--w)}"
    ".dur{margin-left:auto;padding:0 .6em;color:#555;font-size:11px}"
    ".toggles{margin:.3em 0}.toggles label{margin-right:.6em;cursor:pointer;padding:0 .5em;"
    "border:1px solid #aab;border-radius:3px;background:#f1f3f5}"
    "#zoom:checked~#lanes label[for=zoom],#expand-all:checked~#lanes label[for=expand-all]"
    "{background:#3d6fb6;border-color:#3d6fb6;color:#fff}"
    "#zoom:checked~#lanes .bar{left:var(--zl,var(--l));width:var(--zw,var(--w))}"
    "#zoom:checked~#lanes .ticks.full{display:none}"
    "#zoom:checked~#lanes .ticks.zoomed{display:block}"
    "#expand-all:checked~#lanes details.step::details-content{content-visibility:visible}"
    ".lane-facts{font-weight:normal;color:#555;margin-left:.6em}"
    ".step>summary{cursor:pointer;list-style:none;padding:1px .6em}"
    ".step>summary:hover{background:#eef3fb}.step>summary::-webkit-details-marker{display:none}"
    ".step[open]>summary{background:#e4ecf7}"
    ".info{margin:.2em .6em .4em 2em;padding:.3em .6em;border-left:3px solid #aab}"
    ".root{outline:2px solid #c8372d;outline-offset:-2px}.variant{font-weight:600}"
    "table{border-collapse:collapse}td:last-child{overflow-wrap:anywhere}"
    "td:nth-child(3){overflow-wrap:normal}"
    "td,th{padding:1px .6em;text-align:left;vertical-align:top}"
    "tr:nth-child(even){background:#f6f7f9}"
)

_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; script-src 'none'; "
    "img-src 'none'; form-action 'none'; base-uri 'none'"
)


def _e(text: object) -> str:
    return html.escape(terminal_text(str(text), indent=""), quote=True)


def _ms(ns: int | None) -> str:
    if ns is None:
        return "-"
    ms = ns / 1e6
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.1f} ms"


def _round(ns: int) -> str:
    """A round time as a tick says it: ``0``, ``500 ms``, ``2 s``, ``1.5 s``."""
    if ns == 0:
        return "0"
    if ns >= 1_000_000_000:
        return f"{ns / 1e9:g} s"
    if ns >= 1_000_000:
        return f"{ns / 1e6:g} ms"
    return f"{ns / 1e3:g} \N{MICRO SIGN}s"


def _ticks(start: int, span: int, kind: str) -> str:
    """Round ticks over ``start`` .. ``start + span`` (ns since the page's
    origin), each labelled with its time since the origin: every 1, 2 or 5
    times a power of ten nanoseconds, at most six."""
    wanted = max(span / 6, 1.0)
    power = 10 ** math.floor(math.log10(wanted))
    step = next(int(f * power) for f in (1, 2, 5, 10) if f * power >= wanted)
    ticks = "".join(
        f'<span class="tick" style="left:{(at - start) / span * 100:.2f}%">{_round(at)}</span>'
        for at in range(-(-start // step) * step, start + span + 1, step)
    )
    return f'<span class="ticks {kind}">{ticks}</span>'


def _clock(ns: int, *, date: bool = False) -> str:
    """Wall-clock time, UTC: ``01:40:20.123`` (with the date: ``2026-12-02
    01:40:20.123 UTC``)."""
    seconds, rest = divmod(ns, 1_000_000_000)
    shown = time.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S", time.gmtime(seconds))
    return f"{shown}.{rest // 1_000_000:03d}" + (" UTC" if date else "")


def _ranks(ranks: Iterable[int]) -> str:
    """A table's rank set: it breaks after a comma only, never inside a
    rank (``ranks 0,8,16,..``, one rank a node, is wider than the page)."""
    return _e(format_ranks(ranks)).replace(" ", "&nbsp;").replace(",", ",<wbr>")


def _code(text: object) -> str:
    return f"<code>{_e(text)}</code>"


def _badge(outcome: str) -> str:
    return f'<span class="badge {_TONE.get(outcome, "none")}">{_e(outcome)}</span>'


def _chain_html(chain: Sequence[ExceptionInfo]) -> str:
    """An exception's chain, outermost first, each link with why it follows."""
    items: list[str] = []
    link = ""
    for node in chain:
        frames = ""
        if node.frames:
            lines = "\n".join(
                f"{frame.filename}:{frame.lineno} in {frame.name}"
                + (f"\n    {frame.line}" if frame.line else "")
                for frame in node.frames
            )
            frames = f"<details><summary>frames</summary><pre>{_e(lines)}</pre></details>"
        notes = "".join(f"<pre>{_e(note)}</pre>" for note in node.notes)
        members = "".join(
            f"<li>member: {_code(member.type)}: {_e(member.message)}</li>"
            for member in node.exceptions
        )
        items.append(
            f'<li class="exc">{f"<span class=link>{link}</span> " if link else ""}'
            f"{_code(node.type)}: <span class=msg>{_e(node.message)}</span>"
            f"{' (chain cut here)' if node.truncated else ''}{notes}{frames}"
            f"{f'<ul class=chain>{members}</ul>' if members else ''}</li>"
        )
        link = "caused by" if node.cause is not None else "while handling"
    return f'<ul class="chain">{"".join(items)}</ul>'


#: What the event that ended a step said: its reasons and its exception's chain.
_Said = tuple[tuple[str, ...], tuple[ExceptionInfo, ...]]


def _ended(timing: StepTiming | None) -> _Said | None:
    """What ended ``timing`` said (``None`` while it runs)."""
    if timing is None or not timing.finished:
        return None
    match timing.end:
        case StepUnavailable(reasons=reasons, cause=cause):
            return reasons, () if cause is None else cause.chain()
        case StepFailed(cause=cause):
            return (), cause.chain()
        case StepTimedOut(timeout_s=timeout_s):
            return (f"timed out after {timeout_s:g} s",), ()
        case StepCancelled(reason=reason) if reason:
            return (reason,), ()
        case StepCrashed(signal=signal, exit_code=exit_code, stderr_tail=tail):
            how = f"signal {signal}" if signal is not None else f"exit {exit_code}"
            return (f"the step's process crashed ({how})", *tail), ()
    return (), ()


def _kind(timing: StepTiming) -> tuple[str, ...]:
    """What a lane groups by: the exception types along the chain (the texts
    may name a rank, a port or a pid; the step's details show each text with
    its ranks)."""
    found = _ended(timing)
    if found is None:
        return ()
    reasons, chain = found
    return (str(len(reasons)), *(link.type for link in chain))


def _degraded_html(result: Replay, degraded: Sequence[GroupedMessage]) -> str:
    """A ready run that lost something: what was lost, the messages that
    degraded it and where the ranks differ (as the text report's first
    lines)."""
    items = [
        f'<li class="lost"><b>Lost</b>: {_e(loss.what)} on {_e(format_ranks(ranks))}</li>'
        for loss, ranks in lost_by(result)
    ]
    items += [
        f"<li><b>{_e(group.code)}</b> on {_e(format_ranks(group.ranks))}: {_e(group.text)}</li>"
        for group in degraded
    ]
    items += [
        f'<li class="differ"><b>Ranks differ</b> ({_e(divergence.code)}) on '
        f"{_e(format_ranks(divergence.ranks))}: {_e(divergence.text)}</li>"
        for divergence in result.divergences
    ]
    return (
        '<section id="degraded"><b>Ready, degraded</b>: the start reached ready without '
        f"everything it was set up for.<ul>{''.join(items)}</ul></section>"
    )


def report_html(
    result: Replay, *, title: str | None = None, divergences: Sequence[Divergence] = ()
) -> str:
    """``result`` as one HTML page.

    Args:
        result: the run, replayed (``events.replay``, with its slices); the
            steps' exception chains, reasons and decisions come from its
            timeline.
        title: the page's title (default: ``startup report RUN_ID``).
        divergences: more divergences to show beside the replay's own (the
            decision divergences the command line finds).

    Returns:
        The page, self-contained: no network, no external resources.
    """
    # A step's messages and decisions, by rank, then step: a key tuple per
    # rank and step would cost more than what it indexes.
    step_notes: dict[int, dict[str, list[Message | DecisionMade]]] = defaultdict(dict)
    notes: list[Message | DecisionMade] = [m for m in result.messages if m.step]
    notes += (d for timeline in result.timeline.ranks.values() for d in timeline.decisions)
    for note in notes:
        step_notes[note.rank].setdefault(note.step, []).append(note)

    ranks = result.timeline.ranks
    starts = [r.start_wall_ns for r in ranks.values() if r.start_wall_ns is not None]
    starts += [t.start_wall_ns for r in ranks.values() for t in r.steps.values()]
    origin = min(starts, default=0)
    # Times are since the launch began, as the text report counts them,
    # when its launcher recorded when; else since the first event.
    began = _launched_ns(result)
    since = "the first event"
    if began and began <= origin:
        origin, since = began, "the launch began"
    ends = [t.end_wall_ns or t.start_wall_ns for r in ranks.values() for t in r.steps.values()]
    ends += [origin, *(r.end_wall_ns for r in ranks.values() if r.end_wall_ns is not None)]
    # A rank that died lasts until its launcher saw its process end (cut at
    # --until, it is running there, however it ended later).
    launch = result.launch if result.until is None else None
    died = {
        rank: at
        for rank, rank_timeline in ranks.items()
        if launch is not None
        and rank_timeline.end_wall_ns is None
        and (at := launch.ended_wall_ns(rank)) is not None
    }
    last = max([*ends, *died.values()])
    span = max(last - origin, 1)
    # The axis from the first step that waited for another: the one every
    # probe waits for (process_group, while torch imports and the group
    # forms) may take most of the run and leave each probe a sliver.
    waited = [t for r in ranks.values() for t in r.steps.values() if t.depends_on]
    first_waiting = min(waited, key=lambda t: t.start_wall_ns, default=None)
    zoom: tuple[int, int] | None = None
    if first_waiting is not None and first_waiting.start_wall_ns - origin >= span // 5:
        zoom = (first_waiting.start_wall_ns, max(last - first_waiting.start_wall_ns, 1))
    run_id = result.run_id or "(no events)"
    page_title = title or f"startup report {run_id}"

    out: list[str] = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{_e(page_title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(page_title)}</h1>",
    ]
    outcome = result.outcome.value
    meta = [
        f'<span id="outcome">{_badge(outcome)}</span>',
        f"run <b>{_e(run_id)}</b>",
        f"world size <b>{result.world_size}</b>",
        f"wall time <b>{_ms(last - origin if ranks else None)}</b>",
    ]
    if ranks:
        meta.append(f"began <b>{_clock(origin, date=True)}</b>")
    if result.simulated:
        meta.append(f'simulated <b id="simulated">{_e(result.simulated)}</b>')
    if result.injected:
        faults = ", ".join(_code(fault) for fault in result.injected)
        meta.append(f'<span id="injected">injected faults: {faults}</span>')
    if result.until is not None:
        meta.append(f"replayed until seq <b>{result.until}</b>")
    out.append(f'<p class="meta">{" · ".join(meta)}</p>')

    cause = result.root_cause
    degraded = degraded_by(result)
    if cause is None and degraded:
        out.append(_degraded_html(result, degraded))
    elif cause is None:
        fine = ' class="fine"' if result.outcome is RunOutcome.READY else ""
        out.append(
            f'<section id="root-cause"{fine}><b>No root cause</b>: '
            f"the run ended {_e(outcome)}.</section>"
        )
    else:
        parts = [f"<b>Root cause</b>: {_e(cause.describe(since_ns=origin or None))}"]
        if cause.step is not None and cause.rank in ranks:
            parts.append(f' <a href="#root-step">go to rank {cause.rank}\'s {_e(cause.step)}</a>')
        if cause.exception is not None:
            parts.append(_chain_html(cause.exception.chain()))
        if cause.waiting is not None:
            parts.extend(
                f"<details open><summary>where thread {_code(thread.thread)} "
                f"waited, innermost first</summary><pre>{_e(chr(10).join(thread.format()))}</pre>"
                "</details>"
                for thread in cause.waiting.threads
            )
        if cause.in_flight:
            parts.append(f"<div>in flight: {_e(', '.join(cause.in_flight))}</div>")
        if cause.process is not None and cause.no_events is None:
            parts.append(f"<div>{_e(cause.process.describe(since_ns=origin or None))}</div>")
        out.append(f'<section id="root-cause">{"".join(parts)}</section>')
    if result.warnings:
        items = "".join(f"<li>{_e(w)}</li>" for w in result.warnings)
        out.append(_section("warnings", "Warnings about the logs", f"<ul>{items}</ul>"))

    # Swimlanes: identical ranks share one; ranks without events (the
    # likeliest root cause), the root cause's and failed ranks first.
    # Identical: the same steps, outcomes and kinds of failure, and where a
    # step waited, in any order (concurrent steps start in a different order
    # on each rank).
    lanes: dict[tuple[Any, ...], list[int]] = {}
    for rank in sorted(ranks):
        steps = sorted(
            (t.step, t.kind, t.outcome or "", _kind(t), waited_in(t.stall))
            for t in ranks[rank].steps.values()
        )
        lanes.setdefault((result.outcome_of(rank), tuple(steps)), []).append(rank)
    cause_rank = cause.rank if cause is not None else -1
    ordered = sorted(
        lanes.items(),
        key=lambda lane: (cause_rank not in lane[1], _OUTCOME_ORDER.index(lane[0][0]), lane[1][0]),
    )
    ticks = _ticks(0, span, "full")
    toggles = ['<label for="expand-all">expand every step</label>']
    # CSS toggles, no script: each checkbox comes before the lanes it changes.
    out.append('<input type="checkbox" id="expand-all" hidden>')
    if zoom is not None and first_waiting is not None:
        ticks += _ticks(zoom[0] - origin, zoom[1], "zoomed")
        toggles.append(
            f'<label for="zoom">zoom: from the first step that waited for '
            f"{_e(', '.join(first_waiting.depends_on))} (+{_ms(zoom[0] - origin)})</label>"
        )
        out.append('<input type="checkbox" id="zoom" hidden>')
    out.append(
        f'<section id="lanes"><h2>Ranks ({len(ordered)} lane{"s" if len(ordered) != 1 else ""}'
        f" for {len(ranks)} rank{'s' if len(ranks) != 1 else ''})</h2>"
        f'<div class="toggles">{"".join(toggles)}</div>'
        f'<div class="axis"><span class="name">time since {since}</span>'
        f'<span class="track">{ticks}</span></div>'
    )
    for why in sorted(set(result.no_events.values())):
        who = format_ranks(r for r, w in result.no_events.items() if w == why)
        out.append(
            f'<div class="lane" data-ranks="{_e(who)}"><h3>{_e(who)} {_badge("incomplete")}'
            f" wrote no events ({_e(why)})</h3></div>"
        )
    axes = [("", origin, span), *([("z", *zoom)] if zoom is not None else [])]
    for (rank_outcome, _steps), members in ordered:
        until = died.get(members[0]) or last
        out.append(_lane(result, members, rank_outcome, step_notes, axes, until))
    out.append("</section>")

    out.append(_messages_html(result))
    out.append(_divergences_html((*result.divergences, *divergences)))
    out.append(_decisions_html(result))
    out.append("</body></html>\n")
    return "".join(out)


def _bar(axes: Sequence[tuple[str, int, int]], start: int, end: int) -> str:
    """A bar's place on each ``(prefix, begin, span)`` time axis (wall-clock
    ns), as CSS variables (percent)."""
    return ";".join(
        f"--{axis}l:{(start - begin) / span * 100:.2f}%;"
        f"--{axis}w:{max((end - start) / span * 100, 0.0):.2f}%"
        for axis, begin, span in axes
    )


def _lane_facts(result: Replay, members: Sequence[int]) -> list[str]:
    """What a lane's heading says of its ranks: where they ran (hosts, pids),
    when they started (UTC), and for several ranks the fastest and slowest."""
    facts: list[str] = []
    timelines = result.timeline.ranks
    where = sorted({s.host for rank in members if (s := timelines[rank].started) is not None})
    if where:
        shown = ", ".join(where[:3]) + (f" and {len(where) - 3} more" if len(where) > 3 else "")
        facts.append(f"host{'s' if len(where) > 1 else ''} {shown}")
    pids = [result.pids[rank] for rank in members if rank in result.pids]
    if len(pids) == 1:
        facts.append(f"pid {pids[0]}")
    elif pids:
        facts.append(f"pids {min(pids)}-{max(pids)}")
    starts = [t for rank in members if (t := timelines[rank].start_wall_ns) is not None]
    if starts:
        until = f" to {_clock(max(starts))}" if len(starts) > 1 else ""
        facts.append(f"started {_clock(min(starts))}{until}")
    took = sorted(
        (duration, rank)
        for rank in members
        if (duration := timelines[rank].duration_ns) is not None
    )
    if len(took) > 1:
        (fast, fastest), (slow, slowest) = took[0], took[-1]
        facts.append(f"fastest rank {fastest} ({_ms(fast)}), slowest rank {slowest} ({_ms(slow)})")
    return facts


def _lane(
    result: Replay,
    members: list[int],
    rank_outcome: RunOutcome,
    step_notes: Mapping[int, Mapping[str, list[Message | DecisionMade]]],
    axes: Sequence[tuple[str, int, int]],
    until: int,
) -> str:
    """One swimlane: the steps of ``members`` (identical ranks), drawn from
    the first, with the duration range across all of them, on ``axes`` (the
    first is the page's); ``until``: when the first member's process was
    seen to end, if it died, else the page's end (its steps in flight last
    until then)."""
    origin = axes[0][1]
    who = format_ranks(members)
    first = members[0]
    timeline = result.timeline.ranks[first]
    cause = result.root_cause
    # A lane of one rank that names its role (a recorded engine process)
    # says it, as the text report does.
    label = rank_label(result, first) if len(members) == 1 else who
    facts = " \N{MIDDLE DOT} ".join(_lane_facts(result, members))
    rows: list[str] = [
        f'<div class="lane" data-ranks="{_e(who)}" data-outcome="{_e(rank_outcome.value)}">'
        f"<h3>{_e(label)} {_badge(rank_outcome.value)}"
        f'<span class="lane-facts">{_e(facts)}</span></h3>'
    ]
    # A step in flight when the log ends: running, or cut short by a death.
    in_flight = "running" if rank_outcome is RunOutcome.RUNNING else "incomplete"
    for depth, _last, timing in timeline.tree():
        step = timing.step
        outcome = timing.outcome or in_flight
        end = timing.end_wall_ns or timeline.end_wall_ns or until
        durations: list[int] = []
        variants: dict[tuple[str, ...], tuple[_Said, list[int]]] = {}
        said: dict[tuple[str, Severity, str], set[int]] = {}
        decided: dict[tuple[str, str], set[int]] = {}
        for rank in members:
            other = result.timeline.ranks[rank].steps.get(step)
            if other is not None and other.duration_ns is not None:
                durations.append(other.duration_ns)
            found = _ended(other)
            if found is not None:
                reasons, chain = found
                text = (*reasons, "", *(link.reason for link in chain))
                variants.setdefault(text, (found, []))[1].append(rank)
            for note in step_notes.get(rank, {}).get(step, ()):
                if isinstance(note, DecisionMade):
                    decided.setdefault((note.name, _json(note.value)), set()).add(rank)
                else:
                    said.setdefault((note.code, note.severity, note.text), set()).add(rank)
        if timing.duration_ns is not None:
            own = duration = _ms(timing.duration_ns)
        else:
            own, duration = (
                f"{sign} {_ms(end - timing.start_wall_ns)}" for sign in ("\u2265", ">=")
            )
        if len(durations) > 1 and min(durations) != max(durations):
            duration = f"{_ms(min(durations))} to {_ms(max(durations))} across {who}"
        is_root = cause is not None and cause.step == step and cause.rank in members
        info = [
            f"<div>outcome {_badge(outcome)} · {_e(timing.kind.value)} · duration {_e(duration)}"
            f" · started at +{_ms(timing.start_wall_ns - origin)}</div>"
        ]
        if timing.depends_on:
            info.append(f"<div>after: {_e(', '.join(timing.depends_on))}</div>")
        for index, ((reasons, chain), ranks) in enumerate(variants.values()):
            if index == _VARIANTS:
                rest = format_ranks(r for _, rs in list(variants.values())[index:] for r in rs)
                info.append(f"<div>{len(variants) - index} more variants: {_e(rest)}</div>")
                break
            if len(variants) > 1:
                info.append(f'<div class="variant">{_e(format_ranks(ranks))}:</div>')
            if reasons:
                items = "".join(f"<li>{_e(reason)}</li>" for reason in reasons)
                info.append(f'<div>reasons:<ul class="reasons">{items}</ul></div>')
            if chain:
                info.append(f"<div>exception:{_chain_html(chain)}</div>")
        if not variants and timing.outcome is None:
            info.append("<div>still running when the log ends</div>")
        if said:
            items = _capped(
                [
                    (
                        code,
                        ranks,
                        f"<li>{_e(severity.name.lower())} {_code(code)} "
                        f"[{_e(format_ranks(ranks))}]: {_e(text)}</li>",
                    )
                    for (code, severity, text), ranks in said.items()
                ],
                "<li>{}</li>",
            )
            info.append(f'<div>messages:<ul class="messages">{items}</ul></div>')
        if decided:
            items = "".join(
                f"<li>decision {_code(name)} = {_code(value)} [{_e(format_ranks(ranks))}]</li>"
                for (name, value), ranks in decided.items()
            )
            info.append(f'<div>decisions:<ul class="decisions">{items}</ul></div>')
        tone = _TONE.get(outcome, "none")
        tip = f"{step}: {outcome}, {duration}"
        # The root cause's step is open from the start, and the root-cause
        # box links to it.
        root = ' id="root-step" open' if is_root else ""
        rows.append(
            f'<details class="step{" root" if is_root else ""}" data-step="{_e(step)}"'
            f' data-outcome="{_e(outcome)}"{root}><summary title="{_e(tip)}">'
            f'<span class="name" style="padding-left:{depth * 14}px">'
            f'<span class="label">{_e(step)}</span><span class="dur">{_e(own)}</span></span>'
            f'<span class="track"><span class="bar {tone}" '
            f'style="{_bar(axes, timing.start_wall_ns, end)}"></span></span></summary>'
            f'<div class="info">{"".join(info)}</div></details>'
        )
    rows.append("</div>")
    return "".join(rows)


def _json(value: object) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return repr(value)


def _severity(severity: Severity) -> str:
    name = severity.name.lower()
    return '<span class="badge bad">error</span>' if name == "error" else _e(name)


def _capped(rows: Iterable[tuple[str, Iterable[int], str]], more: str) -> str:
    """Rendered rows as :func:`capped` keeps them, then one ``more`` row per
    code for the rest: how many, and their ranks."""

    def rest(code: str, count: int, seen: set[int]) -> str:
        return more.format(_e(f"and {count} more {code} messages, from {format_ranks(seen)}"))

    return "".join(capped(rows, rest))


def _section(name: str, title: str, body: str) -> str:
    return f'<section id="{name}"><h2>{title}</h2>{body}</section>'


def _row(*cells: str, tag: str = "td") -> str:
    return "<tr>" + "".join(f"<{tag}>{cell}</{tag}>" for cell in cells) + "</tr>"


def _messages_html(result: Replay) -> str:
    if not result.grouped:
        return _section("messages", "Messages", "<p>none</p>")
    rows = _capped(
        [
            (
                m.code,
                m.ranks,
                _row(_severity(m.severity), _code(m.code), _ranks(m.ranks), _e(m.text)),
            )
            for m in result.grouped
        ],
        "<tr><td></td><td colspan=3>{}</td></tr>",
    )
    head = _row("severity", "code", "ranks", "text", tag="th")
    return _section("messages", "Messages (grouped by rank set)", f"<table>{head}{rows}</table>")


def _divergences_html(found: Sequence[Divergence]) -> str:
    items = "".join(
        f"<li>{_e(d.severity.name.lower())} {_code(d.code)}: {_e(d.text)}"
        + "".join(f"<div>{_e(value)}: {_e(format_ranks(ranks))}</div>" for value, ranks in d.values)
        + "</li>"
        for d in found
    )
    return _section("divergences", "Divergences", f"<ul>{items}</ul>" if found else "<p>none</p>")


def _decisions_html(result: Replay) -> str:
    grouped: dict[tuple[str, str], set[int]] = {}
    for rank, timeline in sorted(result.timeline.ranks.items()):
        for d in sorted(timeline.decisions, key=lambda d: d.step):
            grouped.setdefault((f"{d.name}@{d.step}", _json(d.value)), set()).add(rank)
    if not grouped:
        return _section("decisions", "Decisions", "<p>none recorded</p>")
    rows = "".join(
        _row(_code(name), _code(value), _ranks(ranks)) for (name, value), ranks in grouped.items()
    )
    head = _row("decision", "value", "ranks", tag="th")
    return _section("decisions", "Decisions", f"<table>{head}{rows}</table>")
