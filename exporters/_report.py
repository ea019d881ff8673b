"""The replay report: a stable JSON document and a text report.

:func:`report_json` gives the document of SPEC §6 (``replay --json``). Its
fields never change meaning; new fields may be added. Schema (version 1)::

    {
      "report_version": 1,
      "run_id": str | null,
      "world_size": int,
      "outcome": "ready" | "failed" | "interrupted" | "incomplete"
                 | "running",                  # running: only at a cutoff (until)
      "until": int | null,                     # the cutoff seq, when replayed to one
      "simulated": str | null,                 # the simulated host, if any
      "injected": [str, ...],                  # injected faults, canonical specs
      "ranks": [                               # one per rank of the world, by rank
        {"rank": int,
         "outcome": "ready" | "failed" | "interrupted" | "incomplete" | "running",
         "log": "complete" | "unfinished" | "empty" | "missing",
         <fact>: JSON value, ...               # the facts the replay's slices report,
                                               #   in their declared order (the
                                               #   reference engine's are listed in
                                               #   orchestrator.engine)
         "last_step": str | null,              # for a rank that died: the step it was in
         "in_flight": [str, ...],              # steps running when it died or was
                                               #   interrupted (innermost only)
         "role": str,                          # only where its log names one (a
                                               #   recorded engine process: "worker TP1")
         "process": null | {"pid": int | null, "exit_code": int | null,
                            "signal": str | null, "stopped_by_launcher": str | null,
                            "observer": str | null,   # who saw it end, when not
                            "description": str}}      #   its launcher
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
        "outcome": "failed" | "interrupted"    # that rank's outcome (ready when
                   | "incomplete" | "ready",   #   it went on without a collective)
        "left_out": str | null,                # the collective it went on without
        "description": str,                    # one line, as the text report says it
        "no_events": null | "no log" | "empty log" | "another node's",
        "in_flight": [str, ...],
        "process": null | {...},               # as in "ranks"
        "exception": null | {"type": str,      # qualified type name
                             "message": str,
                             "cause": {...} | null},  # the next link: __cause__,
                                                       # else __context__; at most
                                                       # 32 links: the outermost and
                                                       # the root, the link before
                                                       # the root then carrying
                                                       # "omitted_links": int; the
                                                       # innermost recorded link has
                                                       # "truncated": true when the
                                                       # record was cut below it
        "waiting": null | {                    # where the step was last seen waiting
          "step": str,                         #   (its latest step.stalled)
          "why": "stalled" | "timed out" | "abandoned",
          "elapsed_s": float,                  # how long it had run then
          "waiting_in": str | null,            # "wait_for_fabric (fabric.py:42)"
          "threads": [{"thread": str,          # the threads doing its work, their
                       "frames": [{"filename": str, "lineno": int | null,
                                   "name": str}]}]   # frames innermost first
        }
      },
      "divergences": [
        {"code": str, "severity": str, "subject": str,
         "values": [{"value": str | null, "ranks": [int, ...]}],
         "text": str}
      ],
      "warnings": [str, ...],                  # about the logs (torn tails, missing ranks)
      "degraded": [                            # a ready run that lost something: its
        {"code": str, "severity": str,         #   ERROR messages and timed-out probes,
         "ranks": [int, ...]}                  #   grouped as in "messages"; [] otherwise
      ],
      "losses": [                              # what a degraded run lost (the slices'
        {"fact": str, "what": str,             #   losses) on which ready ranks;
         "ranks": [int, ...]}                  #   [] unless degraded
      ]
    }

The run's ``outcome`` is judged against its world (every rank of
``world_size``): ``incomplete`` if a rank has no events or no
``run.finished`` (it died, was killed, or never started); else ``failed`` if
any rank failed; else ``interrupted`` if any rank was interrupted; else
``ready``. Divergences appear in ``divergences`` and, grouped, in
``messages``.

:func:`report_text` puts the outcome first, then whether the host was
simulated and which faults were injected (so an injected failure never looks
real), the root cause, the ranks without events, the ranks' state (identical
rows collapsed into rank ranges), the grouped messages, the divergences and
the warnings about the logs. The state table's columns are ROLE (where the
logs name the ranks' roles), OUTCOME, the columns the replay's slices declare
(:class:`events.Column`), then LAST STEP.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from events import (
    Column,
    ExceptionInfo,
    GroupedMessage,
    Loss,
    RankProcess,
    RankState,
    RankStates,
    Replay,
    RunOutcome,
    Severity,
    StepStalled,
    format_ranks,
    group_messages,
)

from ._terminal import terminal_text

__all__ = ["REPORT_VERSION", "report_header", "report_json", "report_text"]

#: The version of the JSON document's schema.
REPORT_VERSION = 1

#: At most this many groups of one code are listed in the text report (a
#: per-rank text such as a duration would otherwise print once per rank).
_GROUPS_PER_CODE = 8

#: At most this many ranks without events are described one by one (with
#: what their launcher saw); the rest are listed as rank ranges.
_RANKS_DESCRIBED = 8

#: Links of a root cause's chain nested in the JSON document: the outermost
#: ones and the innermost (the root).
_JSON_CHAIN_LINKS = 32


def stall_lines(stall: StepStalled, *, indent: str, name_step: bool = False) -> list[str]:
    """Where a stuck step waited, then each of its threads' innermost frames
    (innermost first), for the text views; ``name_step`` starts with the
    step (for a rank that had several in flight)."""
    summary = stall.summary()
    if not summary:
        return []
    named = f"{stall.step}: " if name_step else ""
    lines = [terminal_text(f"{indent}{named}{summary}")]
    for thread in stall.threads:
        lines.append(terminal_text(f"{indent}  thread {thread.thread!r}, innermost first:"))
        lines.extend(terminal_text(f"{indent}    {line}") for line in thread.format())
    return lines


def waited_in(stall: StepStalled | None) -> str:
    """Where a step's latest ``stall`` saw it waiting (``wait (threading.py:331)``;
    ``""``: nowhere recorded): ranks alike but for it are not alike."""
    frame = stall.waiting_in if stall is not None else None
    return frame.where() if frame is not None else ""


def stall_json(stall: StepStalled | None) -> dict[str, Any] | None:
    """A ``step.stalled`` for the JSON document (see the module docstring)."""
    if stall is None:
        return None
    return {
        "step": stall.step,
        "why": stall.why.value,
        "elapsed_s": round(stall.elapsed_ns / 1e9, 3),
        "waiting_in": waited_in(stall) or None,
        "threads": [
            {
                "thread": thread.thread,
                "frames": [
                    {"filename": f.filename, "lineno": f.lineno, "name": f.name}
                    for f in reversed(thread.frames)
                ],
            }
            for thread in stall.threads
        ],
    }


def _running_lines(replay: Replay) -> list[str]:
    """The ranks still running, each in the step where it waits; first
    those not waiting for another process (the ones the others wait for)."""
    found: list[tuple[bool, list[str]]] = []
    for rank in sorted(replay.running):
        state = replay.states.get(rank)
        if state is None or state.finished:
            continue
        # Of the steps it is in, the one that says where it waits: a rank
        # waiting in one step may have started another beside it since.
        stalled = [step for step in state.in_flight if step in state.stalls]
        step = stalled[-1] if stalled else state.last_step
        stall = state.stalls.get(step) if step else None
        waits = replay.waits_for_another(stall)
        where = (f", in {step}" if step else "") + (
            ", waiting for another process" if waits else ""
        )
        lines = [terminal_text(f"  {rank_label(replay, rank)} is still running{where}")]
        if stall is not None:
            lines.extend(stall_lines(stall, indent="    "))
        found.append((waits, lines))
    return [line for _, lines in sorted(found, key=lambda entry: entry[0]) for line in lines]


def _shown_links(info: ExceptionInfo, links: int) -> tuple[list[ExceptionInfo], int]:
    """At most ``links`` links of ``info``'s chain: the outermost ones and the
    root; and how many were left out between them."""
    chain = info.chain()
    omitted = max(0, len(chain) - links)
    return ([*chain[: links - 1], chain[-1]] if omitted else list(chain)), omitted


def _exception_json(info: ExceptionInfo | None) -> dict[str, Any] | None:
    if info is None:
        return None
    chain, omitted = _shown_links(info, _JSON_CHAIN_LINKS)
    nested: dict[str, Any] | None = None
    for position, link in enumerate(reversed(chain)):
        nested = {"type": link.type, "message": link.message, "cause": nested}
        if link.truncated:
            nested["truncated"] = True
        if omitted and position == 1:
            # Between this link and its "cause" (the root), links were left out.
            nested["omitted_links"] = omitted
    return nested


def _process_json(process: RankProcess | None, replay: Replay) -> dict[str, Any] | None:
    if process is None:
        return None
    return {
        "pid": process.pid,
        "exit_code": process.exit_code,
        "signal": process.signal,
        "stopped_by_launcher": process.stopped_by_launcher,
        "host": process.host,
        "node_rank": process.node_rank,
        "local_rank": process.local_rank,
        "not_delivered": process.not_delivered,
        "lost": process.lost,
        "observer": process.observer,
        "description": process.describe(since_ns=_launched_ns(replay)),
    }


def _launched_ns(replay: Replay) -> int | None:
    return replay.launch.started_wall_ns if replay.launch is not None else None


def _process_of(replay: Replay, rank: int) -> RankProcess | None:
    return replay.launch.processes.get(rank) if replay.launch is not None else None


def _log_state(replay: Replay, rank: int) -> str:
    why = replay.no_events.get(rank)
    if why is not None:
        return "empty" if why == "empty log" else "missing"
    return "complete" if replay.states[rank].finished else "unfinished"


def _rank_json(replay: Replay, rank: int, facts: tuple[str, ...]) -> dict[str, Any]:
    state = replay.states.get(rank) or RankStates(replay.slices).new(rank, replay.run_id)
    role = _role(state)
    return {
        "rank": rank,
        "outcome": replay.outcome_of(rank).value,
        "log": _log_state(replay, rank),
        **{fact: state.facts.get(fact) for fact in facts},
        "last_step": state.last_step,
        "in_flight": list(state.in_flight),
        **({"role": role} if role else {}),
        "process": _process_json(_process_of(replay, rank), replay),
    }


def _all_ranks(replay: Replay) -> list[int]:
    """Every rank of the world, and any rank with events beyond it."""
    return sorted(set(range(replay.world_size)) | set(replay.states))


def report_json(replay: Replay) -> dict[str, Any]:
    """The stable JSON document of ``replay`` (schema in the module docstring)."""
    cause = replay.root_cause
    facts = tuple(dict.fromkeys(fact for part in replay.slices for fact in part.reported_facts()))
    return {
        "report_version": REPORT_VERSION,
        "run_id": replay.run_id,
        "world_size": replay.world_size,
        "outcome": replay.outcome.value,
        "until": replay.until,
        "simulated": replay.simulated,
        "injected": list(replay.injected),
        "ranks": [_rank_json(replay, rank, facts) for rank in _all_ranks(replay)],
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
            "left_out": cause.left_out,
            "description": cause.describe(since_ns=_launched_ns(replay)),
            "no_events": cause.no_events,
            "in_flight": list(cause.in_flight),
            "process": _process_json(cause.process, replay),
            "exception": _exception_json(cause.exception),
            "waiting": stall_json(cause.waiting),
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
        "degraded": [
            {"code": g.code, "severity": g.severity.name.lower(), "ranks": list(g.ranks)}
            for g in degraded_by(replay)
        ],
        "losses": [
            {"fact": loss.fact, "what": loss.what, "ranks": list(ranks)}
            for loss, ranks in lost_by(replay)
        ],
    }


# Timed-out probes are never on the critical path of a ready run (the start
# went on without them), whatever severity their slice gives them.
_DEGRADING_CODES = frozenset({"step.timed_out"})


def degraded_by(replay: Replay) -> list[GroupedMessage]:
    """What a ready run lost: its grouped messages of ERROR severity and its
    timed-out probes, in the order of the report's messages (``[]`` unless the run, or the
    cutoff, is ready)."""
    if replay.outcome is not RunOutcome.READY:
        return []
    return [
        group
        for group in replay.grouped
        if group.severity >= Severity.ERROR or group.code in _DEGRADING_CODES
    ]


#: The outcomes, worst first: the headline counts and the page's lanes go in this order.
_OUTCOME_ORDER = tuple(map(RunOutcome, ["failed", "incomplete", "interrupted", "running", "ready"]))


def _headline(replay: Replay) -> str:
    counts = Counter(replay.outcome_of(rank) for rank in replay.states)
    total = len(replay.states)
    parts = [f"{counts[outcome]} {outcome.value}" for outcome in _OUTCOME_ORDER if counts[outcome]]
    if replay.no_events:
        parts.append(f"{len(replay.no_events)} without events")
    run = f"run {replay.run_id}, " if replay.run_id else ""
    ranks = f"{total} of {replay.world_size} ranks" if total or replay.world_size else "no ranks"
    state = f"Startup {replay.outcome.value}"
    if degraded_by(replay):
        state += ", degraded"
    if replay.until is not None:
        state += f" at the cutoff seq {replay.until}"
        if not all(rank.finished for rank in replay.states.values()) or replay.no_events:
            state += " (the state then, not how the run ended)"
    return f"{state}: {', '.join(parts) or 'no events'} ({run}{ranks})"


def _provenance_line(replay: Replay) -> list[str]:
    parts = []
    if replay.simulated:
        parts.append(f"simulated host {replay.simulated}")
    if replay.injected:
        parts.append(f"injected faults: {'; '.join(replay.injected)}")
    return [terminal_text(f"Not a real start: {'; '.join(parts)}")] if parts else []


#: Links of a root cause's chain the text report shows: the outermost ones
#: and the root, with a count of those in between.
_TEXT_CHAIN_LINKS = 12


def _chain_lines(info: ExceptionInfo) -> list[str]:
    lines: list[str] = []
    shown, omitted = _shown_links(info, _TEXT_CHAIN_LINKS)
    for previous, link in zip([None, *shown], shown, strict=False):
        if previous is None:
            lead = "  "
        elif omitted and link is shown[-1]:
            lines.append(f"  ... {omitted:,} more linked exceptions ...")
            lead = "  innermost recorded: " if link.truncated else "  at the root: "
        elif previous.cause is link:
            lead = "  caused by "
        else:
            lead = "  while handling "
        text = f"{link.name}: {link.message}" if link.message else link.name
        lines.append(terminal_text(lead + text, indent="      "))
        if link.frames:
            frame = link.frames[-1]
            lines.append(terminal_text(f"      at {frame.filename}:{frame.lineno} in {frame.name}"))
    if shown[-1].truncated:
        lines.append("  ... the chain was cut here when it was recorded")
    return lines


def _root_cause_lines(replay: Replay) -> list[str]:
    cause = replay.root_cause
    if cause is None:
        if replay.outcome is RunOutcome.RUNNING and replay.until is not None:
            return ["Root cause: none so far (no rank had failed by the cutoff)"]
        if replay.outcome is RunOutcome.RUNNING:
            return ["Root cause: none so far (no rank has failed)", *_running_lines(replay)]
        if replay.outcome is RunOutcome.READY:
            return _degraded_lines(replay) or ["Root cause: none (every rank is ready)"]
        return ["Root cause: unknown (no rank recorded a failure)"]
    since = _launched_ns(replay)
    if cause.no_events is not None:
        return [terminal_text(f"Root cause: {cause.describe(since_ns=since)}")]
    where = rank_label(replay, cause.rank) + (f", step {cause.step}" if cause.step else "")
    process = cause.process if cause.process is not None and cause.process.ended else None
    if cause.exception is not None:
        lines = [f"Root cause: {where}", *_chain_lines(cause.exception)]
    elif cause.outcome is RunOutcome.INCOMPLETE and process is not None and process.observer:
        # Its parent watched it die: how, and when, in its own words.
        lines = [f"Root cause: {where}: {process.how(since_ns=since)} (seen by {process.observer})"]
        process = None
    elif cause.outcome is RunOutcome.INCOMPLETE:
        lines = [
            f"Root cause: {where}: the process died before the rank finished "
            "(no run.finished in its log: it crashed or was killed)"
        ]
    else:
        lines = [f"Root cause: {where}: {cause.outcome.value}, no exception recorded"]
    if cause.waiting is not None:
        lines.extend(
            stall_lines(cause.waiting, indent="  ", name_step=cause.waiting.step != cause.step)
        )
    if cause.left_out is not None:
        lines.append(terminal_text(f"  {cause.left_out_text()}"))
    if len(cause.in_flight) > 1:
        in_flight = f"{len(cause.in_flight)} steps were in flight: {', '.join(cause.in_flight)}"
        lines.append(terminal_text(f"  {in_flight}"))
    if process is not None:
        seen = f"seen by {process.observer}" if process.observer else "its launcher saw"
        lines.append(terminal_text(f"  {seen}: {process.describe(since_ns=since)}"))
    return [terminal_text(lines[0]), *lines[1:]]


def rank_label(replay: Replay, rank: int) -> str:
    """``rank 3``, with the rank's role and pid where its log names a role
    (``rank 3 (worker TP1, pid 4711)``)."""
    role = _role(replay.states.get(rank))
    if not role:
        return f"rank {rank}"
    pid = replay.pids.get(rank)
    return f"rank {rank} ({role}" + (f", pid {pid})" if pid is not None else ")")


_DEGRADED_SHOWN = 3


def lost_by(replay: Replay) -> list[tuple[Loss, tuple[int, ...]]]:
    """The capabilities a degraded ready run lost (its slices'
    :class:`~events.Loss`), each with the ready ranks that lost it (``[]``
    unless the run is degraded)."""
    if not degraded_by(replay):
        return []
    ready = [rank for rank in sorted(replay.states) if replay.outcome_of(rank) is RunOutcome.READY]
    found = [
        (loss, tuple(rank for rank in ready if replay.states[rank].facts.get(loss.fact) is True))
        for part in replay.slices
        for loss in part.losses
    ]
    return [(loss, ranks) for loss, ranks in found if ranks]


def _degraded_lines(replay: Replay) -> list[str]:
    """In place of "Root cause: none": what the ready start lost; the
    divergences follow, as they often name where the loss began."""
    groups = degraded_by(replay)
    lines: list[str] = [
        terminal_text(f"Lost: {loss.what} on {format_ranks(ranks)}")
        for loss, ranks in lost_by(replay)
    ]
    for group in groups[:_DEGRADED_SHOWN]:
        lines.append(terminal_text(f"Degraded: {group.code} on {format_ranks(group.ranks)}"))
        lines.append(terminal_text(f"  {group.text}", indent="    "))
    if rest := groups[_DEGRADED_SHOWN:]:
        codes = ", ".join(dict.fromkeys(group.code for group in rest))
        lines.append(f"Degraded: and {len(rest)} more ({codes}); see the messages below")
    if groups:
        for divergence in replay.divergences:
            ranks = format_ranks(divergence.ranks)
            lines.append(terminal_text(f"Ranks differ: {divergence.code} on {ranks}"))
            lines.append(terminal_text(f"  {divergence.text}", indent="    "))
    return lines


def _no_events_lines(replay: Replay) -> list[str]:
    if not replay.no_events:
        return []
    since = _launched_ns(replay)
    lines = ["", "Ranks without events:"]
    # Ranks the launcher saw are described one by one (each has its own pid
    # and exit), up to a node's worth; the others, and the rest, are grouped
    # by why they have no events, so a lost node of a large launch is a line.
    unseen: dict[str, list[int]] = {}
    described = 0
    for rank, why in sorted(replay.no_events.items()):
        process = _process_of(replay, rank)
        if process is not None and described < _RANKS_DESCRIBED:
            described += 1
            lines.append(f"  {process.describe(since_ns=since)}; {why}")
        else:
            unseen.setdefault(why, []).append(rank)
    for why, ranks in unseen.items():
        if why == "another node's":
            text = "not here: another node's (each node keeps its own copy; read them together)"
        else:
            text = f"{why} (never started, or killed before its first event)"
        lines.append(terminal_text(f"  {format_ranks(ranks)}: {text}"))
    return lines


def _columns(replay: Replay) -> tuple[Column, ...]:
    columns: dict[str, Column] = {}
    for part in replay.slices:
        for column in part.columns:
            columns.setdefault(column.fact, column)
    return tuple(columns.values())


def _cells(
    replay: Replay, state: RankState | None, rank: int, columns: Sequence[Column]
) -> tuple[str, ...]:
    """OUTCOME, the slices' columns, LAST STEP (for a rank that did not
    end ready, the step it failed, stopped or died in)."""
    outcome = replay.outcome_of(rank).value
    if state is None:
        return (outcome, *("-" for _column in columns), "(no events)")
    cause = state.root_cause
    step = cause.step if cause is not None and cause.step else state.last_step
    cells = (column.cell(state.facts.get(column.fact)) for column in columns)
    return (outcome, *cells, step or "-")


def _role(state: RankState | None) -> str | None:
    return state.identity.role if state is not None and state.identity is not None else None


def _table(replay: Replay, ranks: Sequence[int]) -> list[str]:
    columns = _columns(replay)
    # A launch whose processes are not alike (an engine's own start) says
    # what each one is first.
    roles = any(_role(state) for state in replay.states.values())
    rows: dict[tuple[str, ...], list[int]] = {}
    for rank in ranks:
        state = replay.states.get(rank)
        cells = _cells(replay, state, rank, columns)
        rows.setdefault((_role(state) or "-", *cells) if roles else cells, []).append(rank)
    # Each distinct row is made fit for a terminal once; rows that then read
    # the same are one.
    shown: dict[tuple[str, ...], list[int]] = {}
    for cells, same in rows.items():
        shown.setdefault(tuple(map(terminal_text, cells)), []).extend(same)
    # The ranks that differ come first: fewest ranks first, then by lowest
    # rank, so the one failed rank of a thousand is the first row, not the
    # last, and the rows for the run's common state end the table.
    lines = [
        (format_ranks(ranks, label=False), *cells)
        for cells, ranks in sorted(shown.items(), key=lambda row: (len(row[1]), min(row[1])))
    ]
    titles = [column.title for column in columns]
    header = ("RANKS", *(["ROLE"] if roles else []), "OUTCOME", *titles, "LAST STEP")
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(len(header))]
    return [
        "  "
        + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *lines]
    ]


def capped(
    rows: Iterable[tuple[str, Iterable[int], str]], more: Callable[[str, int, set[int]], str]
) -> list[str]:
    """At most :data:`_GROUPS_PER_CODE` ``(code, ranks, row)`` rows of a code
    (texts that name a rank differ on every rank), then for each code's rest
    ``more(code, count, ranks)``."""
    rows_of: dict[str, int] = {}
    rest: dict[str, set[int]] = {}
    out: list[str] = []
    for code, ranks, row in rows:
        rows_of[code] = rows_of.get(code, 0) + 1
        if rows_of[code] <= _GROUPS_PER_CODE:
            out.append(row)
        else:
            rest.setdefault(code, set()).update(ranks)
    out.extend(more(code, rows_of[code] - _GROUPS_PER_CODE, seen) for code, seen in rest.items())
    return out


def report_header(replay: Replay) -> str:
    """The first block of :func:`report_text`: the outcome, what was
    simulated or injected, the root cause and the ranks without events (the
    views print it above their own output)."""
    lines = [
        terminal_text(_headline(replay)),
        *_provenance_line(replay),
        *_root_cause_lines(replay),
        *_no_events_lines(replay),
    ]
    return "\n".join(lines) + "\n"


def report_text(
    replay: Replay,
    *,
    min_severity: Severity = Severity.INFO,
    rank: int | None = None,
    printed_above: str | None = None,
) -> str:
    """The human report of ``replay``, its sections in the order the module
    docstring gives: the root cause's exception chain outermost first, the
    grouped messages at ``min_severity`` or above.

    With ``rank``, the table and the messages are that rank's only (the
    outcome, root cause and divergences stay the run's). With
    ``printed_above`` (the messages were printed live just above, on the
    same terminal), the messages section says how many there are and
    ``printed_above`` (how to see them again) instead of repeating them.

    Text that came from a log (messages, exception text, file names) is
    shown with control characters escaped and continuation lines indented,
    so nothing in a log can forge a report line or drive the terminal.
    """
    lines = [report_header(replay).removesuffix("\n")]
    if rank is None:
        ranks = _all_ranks(replay)
        groups: Sequence[GroupedMessage] = replay.grouped
    else:
        ranks = [rank] if rank in replay.states or rank in replay.no_events else []
        groups = group_messages(m for m in replay.messages if m.rank == rank)
    lines += ["", "Ranks:" if rank is None else f"Rank {rank}:"]
    lines.extend(_table(replay, ranks) if ranks else ["  (no log for this rank)"])
    messages = capped(
        (
            (group.code, group.ranks, terminal_text(f"  {group.describe()}", indent="      "))
            for group in groups
            if group.severity >= min_severity and not group.code.endswith(".divergence")
        ),
        lambda code, _count, ranks: f"  ... and more {code} messages on {format_ranks(ranks)}",
    )
    heading = f"Messages ({min_severity.name.lower()} and above):"
    if printed_above is not None and messages:
        lines += ["", f"{heading} {len(messages)}, printed above; {printed_above}"]
    else:
        lines += ["", heading, *(messages or ["  (none)"])]
    if replay.divergences:
        lines += ["", "Divergences:"]
        lines.extend(terminal_text(f"  {d.grouped().describe()}") for d in replay.divergences)
    if replay.warnings:
        lines += ["", "Log warnings:"]
        lines.extend(terminal_text(f"  {warning}") for warning in replay.warnings)
    return "\n".join(lines) + "\n"
