"""One rank's derived state from another's, when their logs are alike.

Two logs with the same :attr:`~events.LogContents.shape` differ only in the
rank's own values: its rank, place, host and pid, its times and its span
ids. When every slice is :attr:`~events.Slice.rank_independent`, folding
them derives the same facts, messages and failures but for those values,
which the kernel's projections take from the events in a few places only:
the rank itself, its ``identity`` (and with it whether a message is
printed), its root span, and the wall-clock time of an event whose ``seq``
is kept beside it (a failure's, a message's last, the rank's last and its
``run.finished``'s). The functions here copy a rank's state with those put
back from the other rank's events, checking each time against the events
it came from; anything not as expected raises :class:`Unlike`, and the rank
is folded as usual. Internal.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._builders import evolve, replacer
from ._failures import _Failure
from ._messages import Message, RankMessages, _printed
from ._model import Event, RankIdentity, RunStarted
from ._rank_state import RankState, RootCause

__all__: list[str] = []


_own_message = replacer(Message, "rank", "wall_ns", "printed")


class Unlike(Exception):
    """A rank's state cannot be had from the other rank's."""


class Rebase:
    """Puts a rank's own values (``events``) in place of another's
    (``source``: the rank folded, its events alike)."""

    def __init__(self, source: Sequence[Event], events: Sequence[Event]) -> None:
        if len(source) != len(events) or not events:
            raise Unlike
        self.source = source
        self.events = events
        self.rank = events[0].rank
        first, source_first = events[0], source[0]
        self.identity: RankIdentity | None = None
        self.source_identity: RankIdentity | None = None
        self.root: str | None = None
        self.source_root: str | None = None
        if isinstance(first, RunStarted) and isinstance(source_first, RunStarted):
            self.identity, self.source_identity = first.identity, source_first.identity
            self.root, self.source_root = first.span_id, source_first.span_id

    def wall(self, value: int, seq: int) -> int:
        """The wall-clock time of this rank's event ``seq``, where the source
        has ``value``, the time of its own event ``seq``."""
        if not 0 <= seq < len(self.source) or self.source[seq].wall_ns != value:
            raise Unlike
        return self.events[seq].wall_ns

    def own_identity(self, identity: RankIdentity | None) -> RankIdentity | None:
        if identity is None:
            return None
        if identity is not self.source_identity:
            raise Unlike
        return self.identity

    def own_root(self, root: str | None) -> str | None:
        if root is None:
            return None
        if root != self.source_root:
            raise Unlike
        return self.root

    def failure(self, failure: _Failure) -> _Failure:
        return evolve(failure, {"wall_ns": self.wall(failure.wall_ns, failure.seq)})

    def cause(self, cause: RootCause | None) -> RootCause | None:
        if cause is None:
            return None
        if cause.process is not None or cause.no_events is not None or cause.waiting is not None:
            raise Unlike
        return evolve(cause, {"rank": self.rank, "wall_ns": self.wall(cause.wall_ns, cause.seq)})

    def state(self, state: RankState) -> RankState:
        """``state``, the source's, with this rank's own values."""
        if state.stalls:
            raise Unlike  # each rank's own stacks and times: folded on its own
        tracking = state.tracking
        finish = tracking.finish_wall_ns
        if finish is not None:
            if tracking.finish_seq is None:
                raise Unlike
            finish = self.wall(finish, tracking.finish_seq)
        tracking = evolve(
            tracking,
            {
                "root_span_id": self.own_root(tracking.root_span_id),
                "failures": tuple(self.failure(f) for f in tracking.failures),
                "finish_wall_ns": finish,
            },
        )
        last = (
            state.last_wall_ns
            if state.last_seq < 0
            else self.wall(state.last_wall_ns, state.last_seq)
        )
        return evolve(
            state,
            {
                "rank": self.rank,
                "identity": self.own_identity(state.identity),
                "failure": self.cause(state.failure),
                "last_wall_ns": last,
                "tracking": tracking,
            },
        )

    def message(self, message: Message, identity: RankIdentity | None) -> Message:
        if not message.seqs:
            raise Unlike
        return _own_message(
            message,
            self.rank,
            self.wall(message.wall_ns, message.seqs[-1]),
            _printed(message.severity, message.scope, identity),
        )

    def messages(self, state: RankMessages) -> RankMessages:
        """``state``, the source's, with this rank's own values."""
        identity = self.own_identity(state.identity)
        tracking = state.tracking
        if tracking.waiting:
            raise Unlike  # each rank's own stacks and times: folded on its own
        opened = {}
        for step, started in tracking.open.items():
            if not 0 <= started.seq < len(self.source) or self.source[started.seq] is not started:
                raise Unlike
            opened[step] = self.events[started.seq]
        tracking = evolve(
            tracking,
            {
                "root_span_id": self.own_root(tracking.root_span_id),
                "open": opened,
                "failures": tuple(self.failure(f) for f in tracking.failures),
            },
        )
        return evolve(
            state,
            {
                "rank": self.rank,
                "identity": identity,
                "messages": tuple(self.message(m, identity) for m in state.messages),
                "tracking": tracking,
            },
        )
