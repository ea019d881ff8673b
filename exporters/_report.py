"""The replay report: a stable JSON document and a text report.

:func:`report_json` gives the document of SPEC §6 (``replay --json``). Its
fields never change meaning; new fields may be added. Schema (version 1)::

    {
      "report_version": 1,
      "run_id": str | null,
      "world_size": int,
      "outcome": "ready" | "failed" | "interrupted" | "incomplete",
      "ranks": [                               # one per rank with a log, by rank
        {"rank": int,
         "outcome": "ready" | "failed" | "interrupted" | "incomplete",
         "platform": str | null,               # the platform plugin
         "platform_class": str | null,
         "attention_backend": str | null,
         "allreduce_backend": str | null,      # null: fusion disabled or not set up
         "fusion_enabled": bool,
         "flashinfer_comm_available": bool | null,
         "last_step": str | null}              # for a rank that died: the step it was in
      ],
      "messages": [                            # grouped across ranks; severity
        {"code": str,                          #   descending, then first appearance
         "severity": "debug" | "info" | "warning" | "error",
         "scope": "process" | "local" | "global",
         "ranks": [int, ...],
         "text": str}
      ],
      "root_cause": null | {
        "rank": int,
        "step": str | null,
        "outcome": "failed" | "interrupted" | "incomplete",   # that rank's outcome
        "exception": null | {"type": str,      # qualified type name
                             "message": str,
                             "cause": {...} | null}   # the next link: __cause__,
      },                                               # else __context__
      "divergences": [
        {"code": str, "severity": str, "subject": str,
         "values": [{"value": str | null, "ranks": [int, ...]}],
         "text": str}
      ],
      "warnings": [str, ...]                   # about the logs (torn tails, missing ranks)
    }

The run's ``outcome`` (over the ranks that have a log): ``failed`` if any rank
failed; else ``incomplete`` if any rank has no ``run.finished`` (it died);
else ``interrupted`` if any rank was interrupted; else ``ready``.
Divergences appear in ``divergences`` and, grouped, in ``messages``.

:func:`report_text` puts the outcome and the root cause first, then the
ranks' state (identical rows collapsed into rank ranges), the grouped
messages, the divergences and the warnings about the logs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from events import (
    EngineState,
    ExceptionInfo,
    GroupedMessage,
    Replay,
    RunOutcome,
    Severity,
    format_ranks,
    group_messages,
)

__all__ = ["REPORT_VERSION", "report_json", "report_text"]

#: The version of the JSON document's schema.
REPORT_VERSION = 1

#: At most this many groups of one code are listed in the text report (a
#: per-rank text such as a duration would otherwise print once per rank).
_GROUPS_PER_CODE = 8


def _exception_json(info: ExceptionInfo | None) -> dict[str, Any] | None:
    # Iterative so a long chain cannot reach the recursion limit.
    if info is None:
        return None
    chain = info.chain()
    nested: dict[str, Any] | None = None
    for link in reversed(chain):
        nested = {"type": link.type, "message": link.message, "cause": nested}
    return nested


def _rank_json(state: EngineState) -> dict[str, Any]:
    return {
        "rank": state.rank,
        "outcome": state.outcome.value,
        "platform": state.platform,
        "platform_class": state.platform_class,
        "attention_backend": state.attention_backend,
        "allreduce_backend": state.allreduce_backend,
        "fusion_enabled": state.fusion_enabled,
        "flashinfer_comm_available": state.flashinfer_comm_available,
        "last_step": state.last_step,
    }


def report_json(replay: Replay) -> dict[str, Any]:
    """The stable JSON document of ``replay`` (schema in the module docstring)."""
    cause = replay.root_cause
    return {
        "report_version": REPORT_VERSION,
        "run_id": replay.run_id,
        "world_size": replay.world_size,
        "outcome": replay.outcome.value,
        "ranks": [_rank_json(replay.states[rank]) for rank in replay.ranks],
        "messages": [
            {
                "code": group.code,
                "severity": group.severity.name.lower(),
                "scope": group.scope.value,
                "ranks": list(group.ranks),
                "text": group.text,
            }
            for group in replay.grouped
        ],
        "root_cause": None
        if cause is None
        else {
            "rank": cause.rank,
            "step": cause.step,
            "outcome": cause.outcome.value,
            "exception": _exception_json(cause.exception),
        },
        "divergences": [
            {
                "code": divergence.code,
                "severity": divergence.severity.name.lower(),
                "subject": divergence.subject,
                "values": [
                    {"value": value, "ranks": list(ranks)} for value, ranks in divergence.values
                ],
                "text": divergence.text,
            }
            for divergence in replay.divergences
        ],
        "warnings": list(replay.warnings),
    }


_OUTCOME_ORDER = (
    RunOutcome.FAILED,
    RunOutcome.INCOMPLETE,
    RunOutcome.INTERRUPTED,
    RunOutcome.READY,
)


def _headline(replay: Replay) -> str:
    counts = dict.fromkeys(_OUTCOME_ORDER, 0)
    for state in replay.states.values():
        counts[state.outcome] += 1
    total = len(replay.states)
    parts = [f"{count} {outcome.value}" for outcome, count in counts.items() if count]
    run = f"run {replay.run_id}, " if replay.run_id else ""
    ranks = f"{total} of {replay.world_size} ranks" if total else "no ranks"
    return f"Startup {replay.outcome.value}: {', '.join(parts) or 'no events'} ({run}{ranks})"


def _chain_lines(info: ExceptionInfo) -> list[str]:
    lines: list[str] = []
    previous: ExceptionInfo | None = None
    for link in info.chain():
        text = f"{link.name}: {link.message}" if link.message else link.name
        if previous is None:
            lead = "  "
        elif previous.cause is link:
            lead = "  caused by "
        else:
            lead = "  while handling "
        lines.append(lead + text)
        if link.frames:
            frame = link.frames[-1]
            lines.append(f"      at {frame.filename}:{frame.lineno} in {frame.name}")
        previous = link
    return lines


def _root_cause_lines(replay: Replay) -> list[str]:
    cause = replay.root_cause
    if cause is None:
        if replay.outcome is RunOutcome.READY:
            return ["Root cause: none (every rank is ready)"]
        return ["Root cause: unknown (no rank recorded a failure)"]
    where = f"rank {cause.rank}" + (f", step {cause.step}" if cause.step else "")
    if cause.exception is not None:
        return [f"Root cause: {where}", *_chain_lines(cause.exception)]
    if cause.outcome is RunOutcome.INCOMPLETE:
        return [
            f"Root cause: {where}: the rank stopped without finishing "
            "(no run.finished in its log: the process died or was killed)"
        ]
    return [f"Root cause: {where}: {cause.outcome.value}, no exception recorded"]


_COLUMNS = (
    ("OUTCOME", "outcome"),
    ("PLATFORM", "platform"),
    ("CLASS", "platform_class"),
    ("ATTENTION", "attention_backend"),
    ("ALLREDUCE", "allreduce_backend"),
    ("FUSION", "fusion_enabled"),
    ("LAST STEP", "last_step"),
)


def _cell(state: EngineState, field: str) -> str:
    if field == "fusion_enabled":
        return "on" if state.fusion_enabled else "off"
    if field == "last_step":
        return state.last_step or "-"
    value = getattr(state, field)
    return "-" if value is None else str(value)


def _table(states: Sequence[EngineState]) -> list[str]:
    rows: dict[tuple[str, ...], list[int]] = {}
    for state in states:
        cells = tuple(_cell(state, field) for _title, field in _COLUMNS)
        rows.setdefault(cells, []).append(state.rank)
    lines = [
        (format_ranks(ranks).partition(" ")[2], *cells)
        for cells, ranks in sorted(rows.items(), key=lambda row: row[1][0])
    ]
    header = ("RANKS", *(title for title, _field in _COLUMNS))
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    return [
        "  "
        + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *lines]
    ]


def _message_lines(groups: Sequence[GroupedMessage], min_severity: Severity) -> list[str]:
    lines: list[str] = []
    shown: dict[str, int] = {}
    hidden: dict[str, set[int]] = {}
    for group in groups:
        if group.severity < min_severity:
            continue
        count = shown.get(group.code, 0)
        if count >= _GROUPS_PER_CODE:
            hidden.setdefault(group.code, set()).update(group.ranks)
            continue
        shown[group.code] = count + 1
        lines.append(f"  {group.describe()}")
    for code, ranks in hidden.items():
        lines.append(f"  ... and more {code} messages on {format_ranks(ranks)}")
    return lines


def report_text(
    replay: Replay, *, min_severity: Severity = Severity.INFO, rank: int | None = None
) -> str:
    """The human report: outcome and root cause first (rank, step, exception
    chain outermost first, each cause below it), then the ranks' state with
    identical rows collapsed into rank ranges, the grouped messages at
    ``min_severity`` or above, the divergences and the log warnings.

    With ``rank``, the table and the messages are that rank's only (the
    outcome, root cause and divergences stay the run's).
    """
    lines = [_headline(replay), *_root_cause_lines(replay)]
    if rank is None:
        states = [replay.states[r] for r in replay.ranks]
        groups: Sequence[GroupedMessage] = replay.grouped
    else:
        states = [replay.states[rank]] if rank in replay.states else []
        groups = group_messages(m for m in replay.messages if m.rank == rank)
    lines.append("")
    lines.append("Ranks:" if rank is None else f"Rank {rank}:")
    lines.extend(_table(states) if states else ["  (no log for this rank)"])
    level = min_severity.name.lower()
    messages = _message_lines(
        [g for g in groups if not g.code.endswith(".divergence")], min_severity
    )
    lines.append("")
    lines.append(f"Messages ({level} and above):")
    lines.extend(messages or ["  (none)"])
    if replay.divergences:
        lines.append("")
        lines.append("Divergences:")
        lines.extend(f"  {d.grouped().describe()}" for d in replay.divergences)
    if replay.warnings:
        lines.append("")
        lines.append("Log warnings:")
        lines.extend(f"  {warning}" for warning in replay.warnings)
    return "\n".join(lines) + "\n"
