"""A rank's tracing, set up once: exporters, live spans, the SDK provider.

:class:`Tracing` chooses the exporters from explicit options and the
``OTEL_*`` variables, follows a rank's log with :class:`LiveSpans`, makes
each step's span current while the step runs, and routes the spans probe
code creates through the same queue under the rank's resource, built as
replay builds it (:func:`rank_resource`)::

    tracing = Tracing.from_environment()        # None-cost when nothing asks for spans
    tracing.attach(log, severity_of=bridge.severity_of)
    runner.span_activator = tracing.span_activator
    ...
    tracing.close()

Nothing here is imported by the orchestrator runtime; the embedding API
loads it only when tracing is asked for.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlsplit

from events import EventLog, RunStarted

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

    from ._spans import SeverityOf

__all__ = ["Tracing"]

#: The variables that ask for spans (a collector, or an exporter by name).
_ASKING = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
)


class Tracing:
    """Which spans a rank exports and where, and the machinery that does it.

    Args:
        otlp_endpoint: send spans to this OTLP collector (overrides the
            ``OTEL_EXPORTER_OTLP_*`` endpoint variables).
        otlp_protocol: ``grpc`` or ``http/protobuf`` for ``otlp_endpoint``
            (default: the ``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL`` variables,
            else ``grpc``).
        trace_file: also write the trace as a Jaeger-UI JSON file; in a world
            of several ranks each rank writes ``<stem>-rank-<N><suffix>``.
        console: also print spans to this stream.
        environ: the variables to read (default :data:`os.environ`);
            ``OTEL_SDK_DISABLED=true`` turns every exporter off.

    Creating one is cheap and imports nothing of the SDK: exporters are made
    in :meth:`attach`.
    """

    def __init__(
        self,
        *,
        otlp_endpoint: str | None = None,
        otlp_protocol: str | None = None,
        trace_file: str | os.PathLike[str] | None = None,
        console: TextIO | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self._env = os.environ if environ is None else environ
        self._disabled = self._env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
        self._otlp_endpoint = otlp_endpoint
        self._otlp_protocol = otlp_protocol
        self._trace_file = None if trace_file is None else Path(trace_file)
        self._console = console
        self._live: Any = None
        self._uses_network = False
        self._sampler: Any = None

    def _otlp_exporter(self) -> Any:
        from ._environment import (
            exporter_from_environment,
            otlp_exporter,
            protocol_from_environment,
        )

        if self._otlp_endpoint:
            protocol = self._otlp_protocol or protocol_from_environment(self._env)
            endpoint = self._otlp_endpoint
            # OTLP/HTTP posts to the full traces URL: a collector address
            # without a path gets /v1/traces, as OTEL_EXPORTER_OTLP_ENDPOINT does.
            if protocol == "http/protobuf" and urlsplit(endpoint).path in ("", "/"):
                endpoint = f"{endpoint.rstrip('/')}/v1/traces"
            return otlp_exporter(protocol, endpoint=endpoint, timeout_s=self._export_timeout_s)
        return exporter_from_environment(self._env, timeout_s=self._export_timeout_s)

    @functools.cached_property
    def _export_timeout_s(self) -> float:
        from ._environment import export_timeout_from_environment

        return export_timeout_from_environment(self._env)

    def _sampled(self, trace_id: str, parent_span_id: str | None) -> bool:
        """The SDK sampler's decision (``OTEL_TRACES_SAMPLER``) for a root
        span of the trace (a rank's, whose parent is the launch's span; the
        launch's, whose parent is the launcher's ``TRACEPARENT``). Every rank
        of a launch shares the trace id and the launcher's ``TRACEPARENT``,
        so the decision is the same on every rank and for the launch: a
        launch is traced whole or not at all."""
        from opentelemetry import trace
        from opentelemetry.sdk.trace.sampling import Decision

        from ._environment import sampler_from_environment
        from ._propagation import hex_id, parse_traceparent, span_context
        from ._spans import ROOT_SPAN_NAME

        sampler = self._sampler = sampler_from_environment(self._env)
        parent = None
        if parent_span_id is not None:
            sampled = True
            with contextlib.suppress(ValueError):  # no TRACEPARENT, or not one
                traceparent = parse_traceparent(self._env.get("TRACEPARENT", ""))
                if traceparent.trace_id == trace_id:
                    sampled = traceparent.sampled
            remote = span_context(trace_id, parent_span_id, is_remote=True, sampled=sampled)
            parent = trace.set_span_in_context(trace.NonRecordingSpan(remote))
        result = sampler.should_sample(parent, hex_id(trace_id, 32, "trace id"), ROOT_SPAN_NAME)
        return result.decision is Decision.RECORD_AND_SAMPLE

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Tracing:
        """Tracing as the standard variables ask for it (off when they ask
        for nothing)."""
        return cls(environ=environ)

    @property
    def wanted(self) -> bool:
        """Whether anything asks for spans (an option, or the variables);
        ``OTEL_SDK_DISABLED=true`` turns every exporter off."""
        return not self._disabled and bool(
            self._trace_file is not None
            or self._console is not None
            or self._otlp_endpoint
            or any(self._env.get(name) for name in _ASKING)
        )

    def attach(self, log: EventLog, *, severity_of: SeverityOf | None = None) -> None:
        """Turn ``log``'s events into spans from its first event on, and make
        this rank's SDK tracer provider export the spans probe code creates.
        Call it once the log holds ``run.started``; does nothing when
        tracing is off.

        Spans are exported only when the sampler (``OTEL_TRACES_SAMPLER``,
        parent-based by default, so a ``TRACEPARENT`` whose flags say "not
        sampled" turns export off) samples the launch's trace. A variable
        holding a value this release does not support is logged once and
        tracing falls back; it never raises for one.

        Raises:
            TracingSettingError: the ``otlp_protocol`` option is not one of
                ``grpc``, ``http/protobuf`` (a ``ValueError``).
            RuntimeError: it is already attached, or the log has no
                ``run.started`` yet.
        """
        if not self.wanted:
            return
        if self._live is not None:
            raise RuntimeError("this Tracing is already attached to a log")
        started = next(iter(log.read()), None)
        if not isinstance(started, RunStarted):
            raise RuntimeError("attach tracing once the log holds run.started")
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        from ._environment import combine_exporters, console_exporter, settings_reported
        from ._jaeger import JaegerJsonExporter
        from ._live import LiveSpans
        from ._spans import rank_resource

        # The ranks of a node share their variables: local rank 0 speaks for
        # them all, about bad settings and about a collector it cannot reach.
        speaks = started.identity.local_rank == 0
        with settings_reported(speaks):
            if not self._sampled(started.trace_id, started.parent_span_id):
                return  # the log keeps everything: replay export can still send it
            otlp = self._otlp_exporter()
            self._uses_network = otlp is not None
            exporters = [] if otlp is None else [otlp]
            if self._trace_file is not None:
                path = self._trace_file
                if started.identity.world_size > 1:
                    path = path.with_name(f"{path.stem}-rank-{started.identity.rank}{path.suffix}")
                exporters.append(JaegerJsonExporter(path))
            if self._console is not None:
                exporters.append(console_exporter(self._console))
            if not exporters:
                return  # the variables asked for "none"
            self._live = LiveSpans(combine_exporters(*exporters), severity_of=severity_of)
            self._live.peer_reports_unreachable = not speaks
            log.subscribe(self._live, from_seq=0)
            # Spans that probe code creates go through the same queue, under
            # the resource replay rebuilds, nested under the current step. Our
            # sampler, not the SDK's reading of the variables (which would log
            # its own complaint about a value already reported).
            provider = TracerProvider(
                resource=rank_resource(started), sampler=self._sampler, shutdown_on_exit=False
            )
            provider.add_span_processor(self._live.span_processor)
            trace.set_tracer_provider(provider)

    def send(self, spans: Sequence[ReadableSpan]) -> bool:
        """Send finished ``spans`` (a launch's own span, once its ranks have
        ended) to the OTLP collector this tracing asks for, at once, waiting
        at most the export timeout; the trace file and the console are the
        ranks' and get nothing. Spans of a trace the sampler does not sample
        are not sent.

        Returns:
            Whether they were delivered (``True`` when no collector is asked
            for, or nothing is to be sent).
        """
        if self._disabled or not spans:
            return True
        from ._environment import settings_reported
        from ._errors import SpanExportError
        from ._replay import send_spans

        first = spans[0]
        parent = None if first.parent is None else f"{first.parent.span_id:016x}"
        # The ranks, which share these variables, have said what is wrong
        # with them.
        with settings_reported(False):
            if not self._sampled(f"{first.context.trace_id:032x}", parent):
                return True
            exporter = self._otlp_exporter()
        if exporter is None:
            return True
        try:
            send_spans(spans, exporter)
        except SpanExportError:
            return False
        finally:
            exporter.shutdown()
        return True

    @property
    def span_activator(self) -> Any:
        """The runner's ``span_activator`` (``None`` when tracing is off)."""
        if self._live is None:
            return None
        from ._propagation import activate_span

        return activate_span

    def close(self, *, timeout_s: float | None = None) -> None:
        """Export what is queued and release the exporters. Closing twice, or
        a tracing never attached, is harmless.

        Args:
            timeout_s: the most it waits; default the OTLP export timeout
                (``OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT``, else 10 s) when spans
                go to a collector, else 5 s. The SDK's exit hook is off: this
                is the flush.
        """
        if self._live is not None:
            if timeout_s is None:
                timeout_s = self._export_timeout_s if self._uses_network else 5.0
            self._live.shutdown(timeout_s=timeout_s)
            self._live = None
