"""Span exporters chosen by explicit options or by the standard
OpenTelemetry environment variables.

Variables read by :func:`exporter_from_environment` (each ``*_TRACES_*``
variable wins over its generic form)::

    OTEL_SDK_DISABLED                 "true" → no exporter
    OTEL_TRACES_EXPORTER              otlp | console | none, comma-separated;
                                      unset → otlp when an endpoint is set,
                                      else no exporter (tracing is opt-in)
    OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL  grpc (default) | http/protobuf
    OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT  collector address; the generic
                                      form gets "/v1/traces" appended for
                                      http/protobuf, as the specification says
    OTEL_EXPORTER_OTLP_[TRACES_]HEADERS   "key=value,key2=value2"
    OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT   seconds per export (as
                                      opentelemetry-python reads it); unset →
                                      10 s (:data:`DEFAULT_EXPORT_TIMEOUT_S`)
    OTEL_TRACES_SAMPLER[_ARG]         read by :func:`sampler_from_environment`

A value this package does not support never fails a startup: it is logged
once, as a warning on the ``exporters.tracing`` logger, and tracing falls
back (an unknown OTLP protocol → ``http/protobuf`` when it names an HTTP
encoding such as ``http/json``, else ``grpc``; an unknown exporter name is
dropped, and when none is left tracing is off; an endpoint that is not a
URL → no OTLP export; a bad timeout → the default; a headers entry that
is not ``name=value`` → left out, the variable named without its value;
an unknown sampler → ``parentbased_always_on``; a bad ratio → 1.0).

Certificates, compression and ``..._INSECURE`` are left to the OpenTelemetry
exporters, which read them from :data:`os.environ`. The gRPC and HTTP
exporter modules are imported only when such an exporter is created, so
``import exporters`` stays light.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlsplit

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter, SpanExportResult
from opentelemetry.util.re import parse_env_headers

from ._errors import TracingSettingError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.sampling import Sampler

__all__ = [
    "DEFAULT_EXPORT_TIMEOUT_S",
    "OTLP_PROTOCOLS",
    "TRACES_SAMPLERS",
    "combine_exporters",
    "console_exporter",
    "export_timeout_from_environment",
    "exporter_from_environment",
    "otlp_exporter",
    "otlp_grpc_exporter",
    "otlp_http_exporter",
    "sampler_from_environment",
]

_logger = logging.getLogger("exporters.tracing")

#: The OTLP transports this package can create, as the protocol variables
#: spell them.
OTLP_PROTOCOLS: tuple[str, ...] = ("grpc", "http/protobuf")
_TRACES_EXPORTERS = ("otlp", "console", "none")
_DEFAULT_PROTOCOL = "grpc"
#: Bound on one OTLP export (retries included) when no timeout variable is
#: set: the specification's 10 s. A collector that refuses connections costs
#: nothing at the end (the last exports are not retried); a slow one gets
#: this long, so a busy machine never drops a live collector's spans.
DEFAULT_EXPORT_TIMEOUT_S = 10.0
#: The ``OTEL_TRACES_SAMPLER`` values this package honours.
TRACES_SAMPLERS: tuple[str, ...] = tuple(
    f"{parent}{kind}"
    for parent in ("", "parentbased_")
    for kind in ("always_on", "always_off", "traceidratio")
)
_DEFAULT_SAMPLER = "parentbased_always_on"


def otlp_grpc_exporter(
    endpoint: str | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
    insecure: bool | None = None,
) -> SpanExporter:
    """An OTLP/gRPC span exporter.

    Args:
        endpoint: ``http://host:4317`` (plain text), ``https://host:4317``
            (TLS) or ``host:port``; ``None`` lets the exporter read the
            environment (default ``localhost:4317``).
        headers: gRPC metadata sent with every export.
        timeout_s: bound on one export, retries included (default: the
            ``..._TIMEOUT`` variable, else 10 s).
        insecure: force plain text or TLS; ``None`` decides from the scheme.
    """
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return _otlp(OTLPSpanExporter, headers, endpoint=endpoint, insecure=insecure, timeout=timeout_s)


def otlp_http_exporter(
    endpoint: str | None = None,
    *,
    headers: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> SpanExporter:
    """An OTLP/HTTP (protobuf) span exporter.

    Args:
        endpoint: the full traces URL, e.g. ``http://host:4318/v1/traces``;
            ``None`` lets the exporter read the environment (default
            ``http://localhost:4318/v1/traces``).
        headers: HTTP headers sent with every export.
        timeout_s: bound on one export, retries included (default: the
            ``..._TIMEOUT`` variable, else 10 s).
    """
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return _otlp(OTLPSpanExporter, headers, endpoint=endpoint, timeout=timeout_s)


def _otlp(
    exporter_class: Callable[..., SpanExporter], headers: Mapping[str, str] | None, **options: Any
) -> SpanExporter:
    with _malformed_headers_named():
        return exporter_class(headers=dict(headers) if headers else None, **options)


def otlp_exporter(
    protocol: str = _DEFAULT_PROTOCOL,
    *,
    endpoint: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> SpanExporter:
    """An OTLP span exporter for ``protocol`` (one of :data:`OTLP_PROTOCOLS`).

    Raises:
        TracingSettingError: unknown protocol (a ``ValueError``); the message
            names it and the valid ones.
    """
    if protocol not in OTLP_PROTOCOLS:
        raise TracingSettingError("OTLP protocol", protocol, OTLP_PROTOCOLS, "protocol")
    create = otlp_grpc_exporter if protocol == "grpc" else otlp_http_exporter
    return create(endpoint, headers=headers, timeout_s=timeout_s)


def console_exporter(stream: TextIO | None = None) -> SpanExporter:
    """OpenTelemetry's console exporter: one JSON document per span, written
    to ``stream`` (default :data:`sys.stdout`)."""
    return ConsoleSpanExporter(out=sys.stdout if stream is None else stream)


def exporter_from_environment(
    environ: Mapping[str, str] | None = None, *, timeout_s: float | None = None
) -> SpanExporter | None:
    """The exporter the standard variables ask for (see the module
    documentation), or ``None`` when tracing is off.

    Args:
        environ: the variables (default :data:`os.environ`).
        timeout_s: bound on one OTLP export; overrides the timeout variables.

    A value it does not support is logged once and tracing falls back:
    nothing here raises for a bad variable.
    """
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    names_text = env.get("OTEL_TRACES_EXPORTER", "").strip()
    if not names_text:
        if _otlp_variable(env, "ENDPOINT")[1] is None:
            return None
        names_text = "otlp"
    names = [name.strip().lower() for name in names_text.split(",") if name.strip()]
    if unknown := [name for name in names if name not in _TRACES_EXPORTERS]:
        names = [name for name in names if name in _TRACES_EXPORTERS]
        _warn(
            f"OTEL_TRACES_EXPORTER: {', '.join(map(repr, unknown))} not supported "
            f"(valid: {', '.join(_TRACES_EXPORTERS)}); "
            + (f"exporting with {', '.join(names)} only" if names else "tracing is off")
        )
    if not names or "none" in names:
        return None
    exporters = [
        _otlp_from_environment(env, timeout_s) if name == "otlp" else console_exporter()
        for name in dict.fromkeys(names)
    ]
    kept = [exporter for exporter in exporters if exporter is not None]
    return combine_exporters(*kept) if kept else None


def combine_exporters(*exporters: SpanExporter) -> SpanExporter:
    """One exporter that hands every batch to each of ``exporters`` (the one
    itself when there is just one).

    Raises:
        ValueError: no exporter given.
    """
    if not exporters:
        raise ValueError("combine_exporters needs at least one exporter")
    return exporters[0] if len(exporters) == 1 else _FanOutExporter(list(exporters))


def protocol_from_environment(env: Mapping[str, str]) -> str:
    """The OTLP protocol the protocol variables ask for (one of
    :data:`OTLP_PROTOCOLS`; unset → ``grpc``; an unsupported one is logged
    once and falls back, see the module documentation)."""
    protocol_variable, protocol = _otlp_variable(env, "PROTOCOL")
    protocol = (protocol or _DEFAULT_PROTOCOL).strip()
    if protocol in OTLP_PROTOCOLS:
        return protocol
    fallback = "http/protobuf" if protocol.lower().startswith("http") else _DEFAULT_PROTOCOL
    return _unsupported(protocol_variable, protocol, OTLP_PROTOCOLS, fallback)


def _otlp_from_environment(env: Mapping[str, str], timeout_s: float | None) -> SpanExporter | None:
    protocol = protocol_from_environment(env)
    endpoint_variable, endpoint = _otlp_variable(env, "ENDPOINT")
    try:
        _ = urlsplit(endpoint or "").port
    except ValueError as exc:
        _warn(f"{endpoint_variable}={endpoint!r} is not a URL ({exc}); not exporting over OTLP")
        return None
    generic = endpoint_variable == "OTEL_EXPORTER_OTLP_ENDPOINT"
    if endpoint is not None and generic and protocol == "http/protobuf":
        endpoint = f"{endpoint.removesuffix('/')}/v1/traces"

    headers_variable, headers_text = _otlp_variable(env, "HEADERS")
    if timeout_s is None:
        timeout_s = export_timeout_from_environment(env)
    with _malformed_headers_named(headers_variable):
        headers = parse_env_headers(headers_text, liberal=True) if headers_text else None
        return otlp_exporter(protocol, endpoint=endpoint, headers=headers, timeout_s=timeout_s)


@contextlib.contextmanager
def _malformed_headers_named(variable: str | None = None) -> Iterator[None]:
    """OpenTelemetry logs each malformed entry of a headers variable, value
    (a token) included, every time it parses one: within it, such entries
    are captured as a guarded export's records are, and are one warning that
    names the variable and no value. (Nested, the outermost speaks.)"""
    from ._live import _capture, _capture_filter, captured_messages

    if getattr(_capture, "captured", None) is not None:
        yield  # within the outer one, which speaks
        return
    logging.getLogger(parse_env_headers.__module__).addFilter(_capture_filter)
    with captured_messages() as said:
        yield
    if said:
        variable = variable or _otlp_variable(os.environ, "HEADERS")[0]
        _warn(f"{variable}: an entry is not name=value (comma-separated); sent without it")


#: The longest OTLP export timeout taken from the environment (a larger
#: one, 1e10, overflowed the exporter's wait).
_MAX_EXPORT_TIMEOUT_S = 3600.0


def export_timeout_from_environment(environ: Mapping[str, str] | None = None) -> float:
    """Seconds one OTLP export may take: ``OTEL_EXPORTER_OTLP_TRACES_TIMEOUT``,
    else ``OTEL_EXPORTER_OTLP_TIMEOUT``, else :data:`DEFAULT_EXPORT_TIMEOUT_S`
    (a value that is not a positive number of seconds, at most an hour, is
    logged once and ignored)."""
    env = os.environ if environ is None else environ
    variable, text = _otlp_variable(env, "TIMEOUT")
    if not text:
        return DEFAULT_EXPORT_TIMEOUT_S
    timeout_s = -1.0
    with contextlib.suppress(ValueError):
        timeout_s = float(text)
    if not 0 < timeout_s <= _MAX_EXPORT_TIMEOUT_S:  # nan and inf too
        _warn(
            f"{variable}={text!r} is not a positive number of seconds (at most "
            f"{_MAX_EXPORT_TIMEOUT_S:g}); using {DEFAULT_EXPORT_TIMEOUT_S:g} s"
        )
        return DEFAULT_EXPORT_TIMEOUT_S
    return timeout_s


def sampler_from_environment(environ: Mapping[str, str] | None = None) -> Sampler:
    """The SDK sampler ``OTEL_TRACES_SAMPLER`` and ``OTEL_TRACES_SAMPLER_ARG``
    ask for (one of :data:`TRACES_SAMPLERS`; default ``parentbased_always_on``;
    an unsupported value is logged once and falls back, see the module
    documentation)."""
    from opentelemetry.sdk.trace import sampling

    env = os.environ if environ is None else environ
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or _DEFAULT_SAMPLER
    if name not in TRACES_SAMPLERS:
        name = _unsupported("OTEL_TRACES_SAMPLER", name, TRACES_SAMPLERS, _DEFAULT_SAMPLER)
    kind = name.removeprefix("parentbased_")
    if kind == "traceidratio":
        text = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip() or "1.0"
        ratio = -1.0
        with contextlib.suppress(ValueError):
            ratio = float(text)
        if not 0.0 <= ratio <= 1.0:
            _warn(f"OTEL_TRACES_SAMPLER_ARG={text!r} is not a ratio between 0 and 1; using 1.0")
            ratio = 1.0
        sampler: Sampler = sampling.TraceIdRatioBased(ratio)
    else:
        sampler = sampling.ALWAYS_ON if kind == "always_on" else sampling.ALWAYS_OFF
    return sampler if kind == name else sampling.ParentBased(sampler)


#: Whether a bad setting is a warning here (see :func:`settings_reported`).
_REPORTS = contextvars.ContextVar("exporters_settings_reported", default=True)


@contextlib.contextmanager
def settings_reported(reported: bool) -> Iterator[None]:
    """Within it, a bad setting is a warning only if ``reported``, else a
    DEBUG record: the ranks of a node share their environment, so one of
    them (local rank 0) says it for all."""
    token = _REPORTS.set(reported)
    try:
        yield
    finally:
        _REPORTS.reset(token)


def _warn(message: str) -> None:
    level = logging.WARNING if _REPORTS.get() else logging.DEBUG
    _logger.log(level, "tracing: %s", message)


def _unsupported(variable: str, value: str, valid: Sequence[str], fallback: str) -> str:
    _warn(f"{variable}={value!r} not supported (valid: {', '.join(valid)}); using {fallback}")
    return fallback


def _otlp_variable(env: Mapping[str, str], setting: str) -> tuple[str, str | None]:
    """The first set of ``OTEL_EXPORTER_OTLP_[TRACES_]<setting>``: (name, value)."""
    names = (f"OTEL_EXPORTER_OTLP_TRACES_{setting}", f"OTEL_EXPORTER_OTLP_{setting}")
    for name in names:
        if value := env.get(name):
            return name, value
    return names[-1], None


class _FanOutExporter(SpanExporter):
    """Sends every batch to several exporters (``OTEL_TRACES_EXPORTER=otlp,console``)."""

    def __init__(self, exporters: Sequence[SpanExporter]) -> None:
        self.members = tuple(exporters)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        results = [exporter.export(spans) for exporter in self.members]
        delivered = all(result is SpanExportResult.SUCCESS for result in results)
        return SpanExportResult.SUCCESS if delivered else SpanExportResult.FAILURE

    def shutdown(self, timeout_millis: float = 30_000, **_: Any) -> None:
        for exporter in self.members:
            exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        # Every member is flushed, even after one fails.
        results = [exporter.force_flush(timeout_millis) for exporter in self.members]
        return all(results)
