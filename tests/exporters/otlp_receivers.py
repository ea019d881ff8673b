"""In-process OTLP trace receivers for tests: gRPC and HTTP on 127.0.0.1.

Each receiver implements the OTLP trace collector service with
``opentelemetry-proto`` (gRPC: ``TraceService/Export``; HTTP: ``POST
/v1/traces`` with a protobuf body), keeps every request it got, and answers
success. Point the real OTLP exporters at ``receiver.endpoint``::

    with GrpcReceiver() as receiver:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        ...
        spans = receiver.wait_for_spans(count)

Waiting uses a condition variable signalled on every request, never sleeps.
"""

from __future__ import annotations

import abc
import dataclasses
import gzip
import threading
import zlib
from collections.abc import Mapping, Sequence
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

__all__ = [
    "GrpcReceiver",
    "HttpReceiver",
    "OtlpReceiver",
    "ReceivedSpan",
    "any_value",
    "attributes_of",
]


def any_value(value: AnyValue) -> Any:
    """An OTLP ``AnyValue`` as the Python value it holds (arrays as tuples,
    key-value lists as dicts)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(any_value(item) for item in value.array_value.values)
    if kind == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    return getattr(value, kind)


def attributes_of(pairs: Sequence[KeyValue]) -> dict[str, Any]:
    """OTLP key-values as a dict."""
    return {pair.key: any_value(pair.value) for pair in pairs}


@dataclasses.dataclass(frozen=True)
class ReceivedSpan:
    """One span as the receiver got it, with its resource and scope."""

    resource: Mapping[str, Any]
    scope_name: str
    scope_version: str
    span: Span

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_span_id(self) -> str | None:
        return self.span.parent_span_id.hex() or None

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def attributes(self) -> dict[str, Any]:
        return attributes_of(self.span.attributes)

    @property
    def events(self) -> list[tuple[str, int, dict[str, Any]]]:
        """``(name, time_unix_nano, attributes)`` of each span event."""
        return [
            (event.name, event.time_unix_nano, attributes_of(event.attributes))
            for event in self.span.events
        ]

    @property
    def status_code(self) -> int:
        """``Status.StatusCode`` value: 0 unset, 1 ok, 2 error."""
        return int(self.span.status.code)

    @property
    def status_message(self) -> str:
        return self.span.status.message


class OtlpReceiver(abc.ABC):
    """What both receivers share: the requests received, their headers, and
    waiting for a number of spans."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self._headers: list[dict[str, str]] = []

    @property
    @abc.abstractmethod
    def endpoint(self) -> str:
        """The base URL to give an exporter (``http://127.0.0.1:PORT``)."""

    @property
    def requests(self) -> list[trace_service_pb2.ExportTraceServiceRequest]:
        with self._condition:
            return list(self._requests)

    @property
    def headers(self) -> list[dict[str, str]]:
        """Headers (HTTP) or metadata (gRPC) of each request, keys lower-case."""
        with self._condition:
            return [dict(headers) for headers in self._headers]

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, in arrival order."""
        out: list[ReceivedSpan] = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                resource = attributes_of(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        out.append(
                            ReceivedSpan(
                                resource=resource,
                                scope_name=scope_spans.scope.name,
                                scope_version=scope_spans.scope.version,
                                span=span,
                            )
                        )
        return out

    def wait_for_spans(self, count: int, timeout: float = 10.0) -> list[ReceivedSpan]:
        """Block until at least ``count`` spans arrived; return them all.

        Raises:
            AssertionError: fewer arrived within ``timeout`` seconds.
        """
        with self._condition:
            arrived = self._condition.wait_for(lambda: self._span_count() >= count, timeout)
        if not arrived:
            raise AssertionError(f"expected {count} spans, got {len(self.spans())}")
        return self.spans()

    def _span_count(self) -> int:
        return sum(
            len(scope_spans.spans)
            for request in self._requests
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
        )

    def _record(
        self, request: trace_service_pb2.ExportTraceServiceRequest, headers: dict[str, str]
    ) -> None:
        with self._condition:
            self._requests.append(request)
            self._headers.append(headers)
            self._condition.notify_all()

    @abc.abstractmethod
    def start(self) -> None:
        """Start serving."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop serving and release the port."""

    def __enter__(self) -> OtlpReceiver:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: GrpcReceiver) -> None:
        self._receiver = receiver

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        metadata = {item.key.lower(): str(item.value) for item in context.invocation_metadata()}
        self._receiver._record(request, metadata)
        return trace_service_pb2.ExportTraceServiceResponse()


class GrpcReceiver(OtlpReceiver):
    """OTLP/gRPC receiver on ``127.0.0.1`` and a free port."""

    def __init__(self) -> None:
        super().__init__()
        self._executor: futures.ThreadPoolExecutor | None = None
        self._server: grpc.Server | None = None
        self._port = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> None:
        self._executor = futures.ThreadPoolExecutor(max_workers=2)
        self._server = grpc.server(self._executor)
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(self), self._server)
        self._port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __enter__(self) -> GrpcReceiver:
        self.start()
        return self


class _TracesHandler(BaseHTTPRequestHandler):
    server: _ReceiverHTTPServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path != "/v1/traces":
            self.send_error(404, f"no such path {self.path}")
            return
        encoding = self.headers.get("Content-Encoding", "")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        request = trace_service_pb2.ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.receiver._record(request, {k.lower(): v for k, v in self.headers.items()})
        payload = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _ReceiverHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    receiver: HttpReceiver


class HttpReceiver(OtlpReceiver):
    """OTLP/HTTP (protobuf) receiver on ``127.0.0.1`` and a free port."""

    def __init__(self) -> None:
        super().__init__()
        self._server: _ReceiverHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def traces_url(self) -> str:
        """The full URL of the traces endpoint."""
        return f"{self.endpoint}/v1/traces"

    def start(self) -> None:
        self._server = _ReceiverHTTPServer(("127.0.0.1", 0), _TracesHandler)
        self._server.receiver = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="otlp-http-receiver", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> HttpReceiver:
        self.start()
        return self
