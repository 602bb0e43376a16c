"""Keep this node's NodeImages object in the apiserver current (the agent's I/O shell).

One object per node, named after it. It is written only when the image set changes or its
lease is due for renewal, so an idle node costs the apiserver one write per renewal.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from image_preflight.agent.cri import CRIError, ImageClient
from image_preflight.agent.inventory import image_dicts, node_images_object, publish_reason
from image_preflight.kube.watch import describe_error
from image_preflight.core.runtime_inventory import GROUP, PLURAL, VERSION

log = logging.getLogger(__name__)

_TIMEOUT = (10.0, 60.0)  # connect, read
# Each conflict means someone else wrote the object since we read it; a few retries settle it.
_MAX_ATTEMPTS = 5
# etcd's default --max-request-bytes: larger objects are refused (about 8,000 images with
# SWE-bench-length names). The write is still tried; the warning says why it may fail.
ETCD_REQUEST_LIMIT = int(1.5 * 1024 * 1024)


class PublishError(Exception):
    """The object could not be written; the message is one line naming it."""


class Publisher:
    def __init__(self, api_client: kubernetes.client.ApiClient, node: str, *, lease_seconds: int) -> None:
        self._api = kubernetes.client.CustomObjectsApi(api_client)
        self.node = node
        self.lease_seconds = lease_seconds
        self._stored: dict | None = None  # the object as last read or written
        self._known = False  # False: _stored may be out of date, read before deciding

    @property
    def stored(self) -> dict | None:
        return self._stored

    def publish(self, images: list[dict], *, now: float) -> str | None:
        """Write the object if due; returns why it was written (see agent.inventory), or None."""
        for _ in range(_MAX_ATTEMPTS):
            if not self._known:
                self._stored = self._read()
                self._known = True
            reason = publish_reason(self._stored, images, now=now, lease_seconds=self.lease_seconds)
            if reason is None:
                return None
            body = node_images_object(self.node, images, observed_at=now, lease_seconds=self.lease_seconds)
            self._known = False  # a write that fails in any way leaves the stored object unknown
            try:
                self._stored = self._write(body)
            except ApiException as exc:
                if exc.status not in (404, 409):  # 409: written by another since read; 404: deleted
                    raise PublishError(f"{self.where}: cannot write: {describe_error(exc)}") from None
                continue
            self._known = True
            return reason
        raise PublishError(f"{self.where}: still conflicting after {_MAX_ATTEMPTS} attempts")

    def _read(self) -> dict | None:
        try:
            return self._api.get_cluster_custom_object(
                GROUP, VERSION, PLURAL, self.node, _request_timeout=_TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise PublishError(f"{self.where}: cannot read: {describe_error(exc)}") from None

    def _write(self, body: dict) -> dict:
        size = len(json.dumps(body, separators=(",", ":")))
        if size > ETCD_REQUEST_LIMIT:
            log.warning("%s: %d images make a %.1f MiB object, over etcd's default request limit"
                        " of 1.5 MiB; the apiserver may refuse it", self.where, len(body["spec"]["images"]),
                        size / 2**20)
        if self._stored is None:
            return self._api.create_cluster_custom_object(GROUP, VERSION, PLURAL, body, _request_timeout=_TIMEOUT)
        # The resourceVersion makes the replace fail with 409 if anyone wrote since we read.
        body["metadata"]["resourceVersion"] = self._stored["metadata"]["resourceVersion"]
        return self._api.replace_cluster_custom_object(
            GROUP, VERSION, PLURAL, self.node, body, _request_timeout=_TIMEOUT
        )

    @property
    def where(self) -> str:
        return f"{PLURAL}/{self.node}"


class Agent:
    """List the runtime's images every `interval` seconds and publish them."""

    def __init__(
        self,
        images: ImageClient,
        publisher: Publisher,
        *,
        interval: float,
        exit_after_failures: int = 3,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.images = images
        self.publisher = publisher
        self.interval = interval
        self.exit_after_failures = exit_after_failures
        self.clock = clock
        self.cri_failures = 0  # consecutive
        self.cycles = 0

    def cycle(self) -> bool:
        """One list and (if due) publish; False when the runtime could not be asked."""
        self.cycles += 1
        try:
            images = image_dicts(self.images.list_images())
        except CRIError as exc:
            # The object is left alone: it goes stale, which readers take as "unknown".
            self.cri_failures += 1
            log.warning("%s (failure %d in a row; %s left as it is)", exc, self.cri_failures,
                        self.publisher.where)
            return False
        if self.cri_failures:
            log.info("CRI endpoint %s answers again", self.images.endpoint)
            self.cri_failures = 0
        try:
            reason = self.publisher.publish(images, now=self.clock())
        except PublishError as exc:
            log.warning("%s; retrying in %g s", exc, self.interval)
            return True
        except Exception as exc:  # noqa: BLE001 - connection errors of any kind: retry next cycle
            log.warning("%s: %s; retrying in %g s", self.publisher.where, describe_error(exc), self.interval)
            return True
        if reason is not None:
            log.info("%s: written (%s, %d images)", self.publisher.where, reason, len(images))
        return True

    def run(self, stop: threading.Event) -> bool:
        """Cycle until `stop` is set (True), or until the runtime has failed
        `exit_after_failures` cycles in a row (False; 0 never gives up)."""
        while not stop.is_set():
            self.cycle()
            if self.exit_after_failures and self.cri_failures >= self.exit_after_failures:
                return False
            stop.wait(self.interval)
        return True
