"""Live span export: an event-log subscriber that never holds up the run.

Each appended event goes through the same :class:`~exporters.SpanProjection`
that replay uses; a span it finishes is only enqueued on a
:class:`BatchSpanProcessor`, which exports on its own thread. A collector
that is down or slow costs the run nothing while it runs, and at the end at
most the ``timeout_s`` given to :meth:`LiveSpans.shutdown`. The first failed
export is logged once (logger ``exporters.tracing``); the spans stay
recoverable from the log by replay export.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from events import Event, Redactor

from ._spans import SeverityOf, SpanProjection

__all__ = ["TRACING_LOGGER_NAME", "LiveSpans"]

#: The stdlib logger tracing problems are reported on.
TRACING_LOGGER_NAME = "exporters.tracing"

_logger = logging.getLogger(TRACING_LOGGER_NAME)


class LiveSpans:
    """Turns a rank's events into spans as they are appended and exports them
    in the background.

    Use it as a log subscriber::

        live = LiveSpans(exporter_from_environment())
        log.subscribe(live)
        ...                              # run the startup
        live.shutdown(timeout_s=5.0)     # flush what is left, release the exporter

    Calling it with an event never blocks on the exporter and never raises:
    a problem building a span is logged once and the event is skipped, so
    tracing can never fail the run. It is safe to call from several threads.

    Args:
        exporter: where spans go (OTLP, console, Jaeger JSON, in-memory...).
            ``LiveSpans`` owns it from now on and shuts it down.
        severity_of: the severity hook of the projection (see
            :class:`~exporters.SpanProjection`).
        max_queue_size, schedule_delay_s, max_export_batch_size: batching
            knobs of the :class:`BatchSpanProcessor`; ``None`` takes the
            SDK's default (or its ``OTEL_BSP_*`` variable).
    """

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        severity_of: SeverityOf | None = None,
        max_queue_size: int | None = None,
        schedule_delay_s: float | None = None,
        max_export_batch_size: int | None = None,
    ) -> None:
        self._projection = SpanProjection(severity_of=severity_of)
        self._exporter = _GuardedExporter(exporter)
        self._processor = BatchSpanProcessor(
            self._exporter,
            max_queue_size=max_queue_size,
            schedule_delay_millis=None if schedule_delay_s is None else schedule_delay_s * 1000,
            max_export_batch_size=max_export_batch_size,
        )
        self._lock = threading.Lock()
        # Shutdown has its own re-entrant lock: it may run from a signal
        # handler that interrupted this thread inside __call__.
        self._shutdown_lock = threading.RLock()
        self._closed = False
        self._feed_failed = False
        self._flushed_failures = 0

    @property
    def peer_reports_unreachable(self) -> bool:
        """When true, a collector that cannot be reached (refused, unknown
        host, no answer) is logged at DEBUG, not WARNING: another rank of the
        node, with the same settings, reports it. Other failures are still
        warnings."""
        return self._exporter.peer_reports_unreachable

    @peer_reports_unreachable.setter
    def peer_reports_unreachable(self, value: bool) -> None:
        self._exporter.peer_reports_unreachable = value

    @property
    def span_processor(self) -> BatchSpanProcessor:
        """The batch processor spans go through. Add it to an SDK
        ``TracerProvider`` (with :func:`~exporters.rank_resource` as its
        resource) to export the spans that probe code creates through the same
        queue; :meth:`shutdown` shuts it down."""
        return self._processor

    @property
    def export_failures(self) -> int:
        """How many exports have failed so far."""
        return self._exporter.failures

    def __call__(self, event: Event) -> None:
        """Project ``event``; enqueue the spans it finished. Never raises."""
        with self._lock:
            if self._closed:
                return
            try:
                spans = self._projection.feed(event)
            except Exception:
                if not self._feed_failed:
                    self._feed_failed = True
                    _logger.warning(
                        "could not build spans from %s (rank %d, seq %d); tracing skips the "
                        "events it cannot project (further problems are not logged)",
                        event.TYPE,
                        event.rank,
                        event.seq,
                        exc_info=True,
                    )
                return
            for span in spans:
                self._processor.on_end(span)

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        """Export every finished span now, waiting at most ``timeout_s``.

        Returns:
            ``True`` when every span finished since the last flush was
            exported successfully in time; ``False`` on timeout, on a failed
            export (this one's, or the background's since the last flush), or
            after :meth:`shutdown`.
        """
        if self._closed:
            return False
        # Failures since the last flush count too: the processor may have
        # tried (and failed) to export a full batch before this call.
        failures = self._flushed_failures
        flushed = _call_with_timeout(self._processor.force_flush, timeout_s)
        self._flushed_failures = self._exporter.failures
        return flushed is True and self._flushed_failures == failures

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Flush what is queued (waiting at most ``timeout_s`` in all), then
        release the exporter. Later events are ignored. Spans of steps still
        open are not exported: replay export recovers them from the log.
        Calling it twice is harmless."""
        with self._shutdown_lock:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + max(timeout_s, 0.0)
        # From now on an export that fails is not retried: the run is ending,
        # and the spans stay in the log for replay export.
        self._exporter.final = True
        _call_with_timeout(self._processor.force_flush, timeout_s)
        # Abort an export still in flight (gRPC retries, a slow collector);
        # from now on exports fail fast, so the processor's own shutdown,
        # which exports whatever is left, cannot wait on the network.
        self._exporter.shutdown(max(deadline - time.monotonic(), 0.0) * 1000)
        _call_with_timeout(self._processor.shutdown, max(deadline - time.monotonic(), 0.1))


def _call_with_timeout(function: Callable[[], object], timeout_s: float) -> object:
    """``function()`` on a helper thread; its result, or ``None`` if it did
    not return within ``timeout_s`` (it then finishes in the background).

    The SDK's flush and shutdown ignore their timeouts while an export runs;
    this is what bounds them.
    """
    results: list[object] = []

    def call() -> None:
        try:
            results.append(function())
        except Exception:
            _logger.debug("span flush failed", exc_info=True)

    thread = threading.Thread(target=call, name="exporters-span-flush", daemon=True)
    thread.start()
    thread.join(max(timeout_s, 0.0))
    return None if thread.is_alive() or not results else results[0]


class _GuardedExporter(SpanExporter):
    """Wraps the user's exporter: counts failures, logs the first one once,
    and after :meth:`shutdown` refuses to touch the network again."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self._closed = False
        self.final = False  # set as the run ends: a failed export is then not retried
        self.failures = 0
        self.peer_reports_unreachable = False
        quiet_opentelemetry_loggers(inner)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._closed:
            return SpanExportResult.FAILURE
        with captured_messages(self._give_up if self.final else None) as messages:
            try:
                result = self._inner.export(spans)
                problem = None if result is SpanExportResult.SUCCESS else "export failed"
            except Exception as exc:
                result = SpanExportResult.FAILURE
                problem = f"{type(exc).__name__}: {exc}"
        if problem is not None:
            self._report(_summary(messages, problem), len(spans))
        return result

    def _give_up(self, _said: Sequence[str]) -> None:
        # Called on the export thread as the OTLP exporter announces a retry,
        # before it waits: shutting it down ends the wait and the export.
        with self._lock:
            self._closed = True
        with contextlib.suppress(Exception):
            _shutdown(self._inner, 0.0)

    def _report(self, detail: str, count: int) -> None:
        with self._lock:
            self.failures += 1
            if self.failures > 1:
                return
        quiet = self.peer_reports_unreachable and detail in _UNREACHABLE
        _logger.log(
            logging.DEBUG if quiet else logging.WARNING,
            "could not export %d span(s) %s; the run goes on, and its event log keeps "
            "every span for replay export",
            count,
            failure_detail(self._inner, detail),
        )

    def shutdown(self, timeout_millis: float = 30_000, **_: Any) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with captured_messages():
            try:
                _shutdown(self._inner, timeout_millis)
            except Exception:
                _logger.debug("span exporter shutdown failed", exc_info=True)


_REASONS = (
    (re.compile(r"connection refused", re.IGNORECASE), "connection refused"),
    (re.compile(r"name or service not known|name resolution|dns", re.IGNORECASE), "unknown host"),
    (re.compile(r"certificate|ssl|tls", re.IGNORECASE), "TLS error"),
    (re.compile(r"max retries or shutdown", re.IGNORECASE), "not reachable"),
    (re.compile(r"deadline exceeded|timed? ?out", re.IGNORECASE), "timed out"),
    (re.compile(r"StatusCode\.([A-Z_]+)"), ""),
)


#: Reasons that every rank sending to the same collector meets alike.
_UNREACHABLE = frozenset({"connection refused", "unknown host", "not reachable", "timed out"})


#: Reasons no retry can mend within an export's time: nobody listens there.
_REFUSED = frozenset({"connection refused", "unknown host"})


class Refused(Exception):
    """Raised from the exporter's own retry announcement (see
    :func:`refused_at_once`): ends that export at once."""


def refused_at_once(said: Sequence[str]) -> None:
    """An ``on_retry`` for :func:`captured_messages`: when what the exporter
    has said is a refused connection or an unknown host, raise
    :class:`Refused` through its retry announcement, so the export ends at
    once instead of retrying until its timeout; a slow collector's retries
    are left to run."""
    if (reason := _summary(said, "")) in _REFUSED:
        raise Refused(reason)


def failure_detail(exporter: SpanExporter, reason: str) -> str:
    """``to HOST:PORT (reason)`` (credentials left out), or ``with
    ExporterClass (reason)`` for an exporter that names no endpoint."""
    endpoint = getattr(exporter, "_endpoint", None)
    if not endpoint:
        return f"with {type(exporter).__name__} ({reason})"
    # The gRPC exporter keeps ``user:token@host`` without a scheme.
    scheme = "" if "://" in str(endpoint) else "grpc://"
    shown = Redactor.from_environment()(scheme + str(endpoint)).removeprefix(scheme)
    return f"to {shown} ({reason})"


def _summary(messages: Sequence[str], problem: str) -> str:
    """A few words on why an export failed, from what the exporter logged
    (its own lines are long and repeat per retry)."""
    text = " ".join(messages)
    for pattern, reason in _REASONS:
        if found := pattern.search(text):
            return reason or found.group(1).lower()
    # Nothing recognised, or nothing said (it raised): its own words, the
    # first complaint (usually the transport error) and the final verdict.
    parts = [message.strip().rstrip(".") for message in dict.fromkeys(messages)]
    if len(parts) > 2:
        parts = [parts[0], parts[-1]]
    detail = "; then: ".join(part for part in parts if part) or problem
    return detail if len(detail) <= 160 else detail[:157] + "..."


def _shutdown(exporter: SpanExporter, timeout_millis: float) -> None:
    if "timeout_millis" in inspect.signature(exporter.shutdown).parameters:
        exporter.shutdown(timeout_millis=timeout_millis)  # type: ignore[call-arg]  # OTLP exporters take it
    else:
        exporter.shutdown()


# While a guarded export runs, the OpenTelemetry exporter's own log records
# (one warning per retry, one error per failed batch) are captured on that
# thread instead of printed: the first and the last (the transport error and
# the final verdict) become the detail of our single message. Records from other threads, and
# from code that is not ours to guard, pass through untouched.
_capture = threading.local()
#: What this thread captures into, and what to call when a retry is announced.
_Captured = tuple[list[str], Callable[[Sequence[str]], None] | None]


def _capture_filter(record: logging.LogRecord) -> bool:
    captured: _Captured | None = getattr(_capture, "captured", None)
    if captured is None:
        return True
    messages, on_retry = captured
    try:
        message = record.getMessage()
    except Exception:
        message = str(record.msg)
    messages.append(message)
    if on_retry is not None and "retrying" in message:
        on_retry(messages)
    return False


def quiet_opentelemetry_loggers(exporter: SpanExporter) -> None:
    # A fan-out exporter (OTEL_TRACES_EXPORTER=otlp,console) holds the real ones.
    for member in getattr(exporter, "members", ()):
        quiet_opentelemetry_loggers(member)
    for cls in type(exporter).__mro__:
        if cls.__module__.startswith("opentelemetry."):
            logging.getLogger(cls.__module__).addFilter(_capture_filter)  # added once


@contextlib.contextmanager
def captured_messages(
    on_retry: Callable[[Sequence[str]], None] | None = None,
) -> Iterator[list[str]]:
    """Capture, on this thread, the OpenTelemetry exporters' log records;
    ``on_retry(messages)`` is called with what was captured so far when one
    announces a retry (before it waits)."""
    previous = getattr(_capture, "captured", None)
    messages: list[str] = []
    _capture.captured = (messages, on_retry)
    try:
        yield messages
    finally:
        _capture.captured = previous
