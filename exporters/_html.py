"""A self-contained HTML timeline of a run: one row per step per rank.

The page needs no network and no JavaScript: bars are absolutely positioned
``div`` elements scaled to the run's wall time, coloured by outcome, with the
reasons in their tooltips.
"""

from __future__ import annotations

import html
from collections.abc import Iterable

from events import Event, Outcome, RunStarted, StepStarted, StepUnavailable, outcome_of

__all__ = ["timeline_html"]

_COLOURS = {
    Outcome.OK: "#3c9a5f",
    Outcome.ABSENT: "#9aa5b1",
    Outcome.UNAVAILABLE: "#d9a400",
    Outcome.INVALID: "#d9a400",
    Outcome.FAILED: "#c8372d",
    Outcome.TIMED_OUT: "#c8372d",
    Outcome.CANCELLED: "#7d7d7d",
    Outcome.CRASHED: "#8e1b14",
}


def timeline_html(events: Iterable[Event], *, title: str = "startup timeline") -> str:
    """The timeline of ``events`` (one rank or a merged run) as an HTML page."""
    rows: list[tuple[int, str, int, int | None, Outcome | None, str]] = []
    open_steps: dict[tuple[int, str], tuple[int, str]] = {}
    origin: int | None = None
    last = 0
    run_id = ""
    for event in events:
        origin = event.wall_ns if origin is None else min(origin, event.wall_ns)
        last = max(last, event.wall_ns)
        if isinstance(event, RunStarted):
            run_id = event.run_id
        if isinstance(event, StepStarted):
            open_steps[(event.rank, event.span_id)] = (event.wall_ns, event.step)
            continue
        outcome = outcome_of(event)
        key = (event.rank, event.span_id)
        if outcome is not None and key in open_steps:
            start, step = open_steps.pop(key)
            detail = "; ".join(event.reasons) if isinstance(event, StepUnavailable) else ""
            rows.append((event.rank, step, start, event.wall_ns, outcome, detail))
    for (rank, _span), (start, step) in open_steps.items():
        rows.append((rank, step, start, None, None, "still running when the log ends"))
    origin = origin or 0
    span = max(last - origin, 1)
    rows.sort(key=lambda row: (row[0], row[2]))
    body: list[str] = []
    for rank, step, start, end, outcome, detail in rows:
        left = (start - origin) / span * 100
        width = max(((end or last) - start) / span * 100, 0.3)
        colour = _COLOURS.get(outcome, "#444") if outcome is not None else "#444"
        duration = "" if end is None else f"{(end - start) / 1e6:.1f} ms"
        tip = html.escape(f"{step}: {outcome or 'running'} {duration} {detail}".strip())
        body.append(
            f'<div class="row"><span class="label">rank {rank} {html.escape(step)}</span>'
            f'<span class="track"><span class="bar" title="{tip}" style="left:{left:.3f}%;'
            f'width:{width:.3f}%;background:{colour}"></span></span></div>'
        )
    total = f"{span / 1e6:.1f} ms"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>"
        "body{font:13px system-ui,sans-serif;margin:1.5em}"
        ".row{display:flex;align-items:center;height:20px}"
        ".label{width:360px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}"
        ".track{position:relative;flex:1;height:14px;background:#f1f3f5}"
        ".bar{position:absolute;top:0;height:14px;border-radius:2px}"
        "</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>run {html.escape(run_id)}, {total} "
        "(green ok, grey absent or cancelled, amber unavailable or invalid, red failed, "
        "timed out or crashed)</p>" + "".join(body) + "</body></html>\n"
    )
