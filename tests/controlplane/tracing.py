"""A loopback OTLP/gRPC receiver for the apiserver's traces (KEP-647, `--tracing-config-file`).

The apiserver exports spans over OTLP's TraceService/Export. k8s.io/apiserver v0.37.2
pkg/admission/plugin/webhook/validating/dispatcher.go (Dispatch, the goroutine per hook) opens
the span "Call validating webhook" around each webhook call, with the hook's name in its
`webhook` attribute: its length is the call as the apiserver times it. Only the message types of
opentelemetry-proto are used; the service is bound with grpc's generic handler, so the receiver
needs no generated stub of a particular grpcio.
"""

from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

WEBHOOK_SPAN = "Call validating webhook"
_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


@dataclass(frozen=True)
class Span:
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, str]

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def _value(any_value) -> str:
    kind = any_value.WhichOneof("value")
    return "" if kind is None else str(getattr(any_value, kind))


class SpanReceiver:
    """Collects the spans exported to it (only those named in `names`, when given: an apiserver
    under a fleet's heartbeats exports hundreds a second); `endpoint` is what a
    TracingConfiguration names."""

    def __init__(self, names: frozenset[str] | None = None) -> None:
        self._names = names
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.unary_unary_rpc_method_handler(
            self._export, request_deserializer=ExportTraceServiceRequest.FromString,
            response_serializer=ExportTraceServiceResponse.SerializeToString)
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(_SERVICE, {"Export": handler}),))
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"127.0.0.1:{self.port}"

    def start(self) -> "SpanReceiver":
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=None)

    def _export(self, request: ExportTraceServiceRequest, context) -> ExportTraceServiceResponse:
        received = [
            Span(span.name, span.start_time_unix_nano, span.end_time_unix_nano,
                 {attribute.key: _value(attribute.value) for attribute in span.attributes})
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans
            if self._names is None or span.name in self._names
        ]
        with self._lock:
            self._spans.extend(received)
        return ExportTraceServiceResponse()

    def spans(self, name: str | None = None) -> list[Span]:
        with self._lock:
            return [span for span in self._spans if name is None or span.name == name]

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()

    def webhook_calls(self, webhook: str) -> list[Span]:
        """The "Call validating webhook" spans of the hook named `webhook`."""
        return [span for span in self.spans(WEBHOOK_SPAN) if span.attributes.get("webhook") == webhook]


def tracing_configuration(path: Path, endpoint: str) -> Path:
    """A TracingConfiguration (apiserver.config.k8s.io/v1) sampling every request to `endpoint`."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "TracingConfiguration",
        "endpoint": endpoint, "samplingRatePerMillion": 1_000_000,
    }), encoding="utf-8")
    return path
