"""The container runtime's complete image list, read over CRI (runtime.v1).

node.status.images is capped and truncated; ImageService/ListImages on the runtime
socket is the list kubelet itself works from.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from image_preflight.agent import cri_pb2, cri_pb2_grpc
from image_preflight.agent.config import DEFAULT_CRI_ENDPOINT
from image_preflight.errors import UnavailableError

# kubelet's CRI client limit; the gRPC default of 4 MiB is too small for nodes with
# thousands of images.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# The default reconnect backoff grows to 120 s; a local socket is cheap to retry, so a
# restarted runtime is found again within about a second.
_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


class CRIError(UnavailableError):
    """The runtime could not be asked; the message is one line naming the endpoint."""

    def __init__(self, message: str, *, unimplemented: bool = False, not_found: bool = False) -> None:
        super().__init__(message)
        self.unimplemented = unimplemented
        self.not_found = not_found


@dataclass(frozen=True, slots=True)
class RuntimeImage:
    id: str
    repo_tags: tuple[str, ...]
    repo_digests: tuple[str, ...]
    size: int
    pinned: bool


@dataclass(frozen=True, slots=True)
class RuntimeVersion:
    runtime_name: str
    runtime_version: str
    runtime_api_version: str


def socket_path(endpoint: str) -> str:
    """The socket path of `unix:///path` or `/path`; CRIError for any other form."""
    path = endpoint.removeprefix("unix://")
    if not path.startswith("/"):
        raise CRIError(
            f"unsupported CRI endpoint {endpoint!r}: expected unix:///path or an absolute socket path"
        )
    return path


def sandbox_image_from_info(info: Mapping[str, str]) -> str | None:
    """The sandbox image named in a verbose Status answer's `info`, or None.

    containerd 1.x writes its CRI config as JSON under "config", the image as `sandboxImage`.
    containerd 2.x moved it to the image service's `pinned_images` ("sandbox" key), which its
    Status does not include today; read it there too, should a release add it.
    """
    try:
        config = json.loads(info.get("config") or "null")
    except ValueError:
        return None
    if not isinstance(config, dict):
        return None
    name = config.get("sandboxImage")
    if not name:
        pinned = config.get("pinned_images")
        name = pinned.get("sandbox") if isinstance(pinned, dict) else None
    return name if isinstance(name, str) and name else None


class ImageClient:
    """Lists the runtime's images over one gRPC channel, kept open between calls."""

    def __init__(self, endpoint: str = DEFAULT_CRI_ENDPOINT, *, timeout: float = 10.0) -> None:
        if timeout <= 0:
            raise CRIError(f"CRI endpoint {endpoint}: timeout must be > 0, got {timeout}")
        self.endpoint = endpoint
        self.timeout = timeout
        self._socket = socket_path(endpoint)
        self._channel = grpc.insecure_channel("unix://" + self._socket, options=_CHANNEL_OPTIONS)
        self._images = cri_pb2_grpc.ImageServiceStub(self._channel)
        self._runtime = cri_pb2_grpc.RuntimeServiceStub(self._channel)
        self._closed = False

    def list_images(self) -> list[RuntimeImage]:
        """Every image the runtime holds, in the runtime's order."""
        response = self._call(
            "ImageService/ListImages", self._images.ListImages, cri_pb2.ListImagesRequest()
        )
        return [
            RuntimeImage(
                id=image.id,
                repo_tags=tuple(image.repo_tags),
                repo_digests=tuple(image.repo_digests),
                size=image.size,
                pinned=image.pinned,
            )
            for image in response.images
        ]

    def version(self) -> RuntimeVersion:
        """The runtime's name and versions; a cheap check that the endpoint speaks CRI v1."""
        response = self._call(
            "RuntimeService/Version", self._runtime.Version, cri_pb2.VersionRequest(version="v1")
        )
        return RuntimeVersion(
            runtime_name=response.runtime_name,
            runtime_version=response.runtime_version,
            runtime_api_version=response.runtime_api_version,
        )

    def sandbox_image(self) -> str | None:
        """The image the runtime starts every pod sandbox from, or None when the runtime does not
        say (containerd 2.x keeps it out of Status; CRI-O too; a runtime without Status)."""
        try:
            response = self._call(
                "RuntimeService/Status", self._runtime.Status, cri_pb2.StatusRequest(verbose=True)
            )
        except CRIError as exc:
            if exc.unimplemented:
                return None
            raise
        return sandbox_image_from_info(response.info)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._channel.close()

    def __enter__(self) -> ImageClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, rpc: Callable[..., Any], request: Any) -> Any:
        if self._closed:
            raise CRIError(f"CRI endpoint {self.endpoint}: client is closed")
        return call(self.endpoint, method, rpc, request, timeout=self.timeout)


def call(endpoint: str, method: str, rpc: Callable[..., Any], request: Any, *, timeout: float,
         metadata: tuple[tuple[str, str], ...] = ()) -> Any:
    """`rpc(request)` on the runtime's socket; CRIError with one line naming the endpoint."""
    try:
        return rpc(request, timeout=timeout, metadata=metadata or None)
    except grpc.RpcError as err:
        code = err.code() if isinstance(err, grpc.Call) else None
        raise CRIError(describe(endpoint, method, err, timeout),
                       unimplemented=code == grpc.StatusCode.UNIMPLEMENTED,
                       not_found=code == grpc.StatusCode.NOT_FOUND) from None


def describe(endpoint: str, method: str, err: grpc.RpcError, timeout: float) -> str:
    code = err.code() if isinstance(err, grpc.Call) else None
    details = " ".join(str(err.details() if isinstance(err, grpc.Call) else err).split())
    where = f"CRI endpoint {endpoint}"
    if code == grpc.StatusCode.UNAVAILABLE:
        socket = socket_path(endpoint)
        if not os.path.exists(socket):
            return f"{where}: socket {socket} does not exist (is the runtime running?)"
        return f"{where}: unavailable, connection refused or closed ({details})"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        if method.startswith("containerd."):
            return f"{where}: {method} not implemented (the runtime is not containerd)"
        return (
            f"{where}: runtime.v1.{method} not implemented"
            " (runtime without CRI v1, or its CRI plugin is disabled)"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{where}: no answer to {method} within {timeout:g} s"
    name = code.name if code is not None else "error"
    return f"{where}: {method} failed: {name}: {details}"
