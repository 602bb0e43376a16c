"""Keep this node's NodeImages object in the apiserver current (the agent's I/O shell).

One object per node, named after it. It is written only when the image set changes or its
lease is due for renewal, so an idle node costs the apiserver one write per renewal: of the whole
list in the listed form, of its Lease (agent/renewal.py) in the hashed one.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from image_preflight.agent.cri import CRIError, ImageClient
from image_preflight.agent.events import ImageEvents
from image_preflight.agent.inventory import (
    RENEW,
    fingerprint,
    image_dicts,
    node_images_object,
    publish_reason,
    sandbox_image_report,
)
from image_preflight.agent.metrics import Metrics
from image_preflight.agent.pinner import Pinner
from image_preflight.agent.renewal import LeaseRenewal, RenewalError, RenewalRefused
from image_preflight.core.sources.runtime_lists import AGENT_NAMESPACE, GROUP, PLURAL, VERSION, image_hashes
from image_preflight.errors import UnavailableError
from image_preflight.kube.client import custom_object
from image_preflight.kube.watch import describe_error

log = logging.getLogger(__name__)

_TIMEOUT = (10.0, 60.0)  # connect, read
# Each conflict means someone else wrote the object since we read it; a few retries settle it.
_MAX_ATTEMPTS = 5
# etcd's default --max-request-bytes: larger objects are refused (about 8,000 images with
# SWE-bench-length names). The write is still tried; the warning says why it may fail.
ETCD_REQUEST_LIMIT = int(1.5 * 1024 * 1024)


class PublishError(UnavailableError):
    """The object could not be written; the message is one line naming it."""


class Publisher:
    def __init__(self, api_client: kubernetes.client.ApiClient, node: str, *, lease_seconds: int,
                 hashed: bool = False, namespace: str = AGENT_NAMESPACE) -> None:
        self._api = kubernetes.client.CustomObjectsApi(api_client)
        self.node = node
        self.lease_seconds = lease_seconds
        # Publish spec.imageHashes in place of spec.images, renewed through a Lease in `namespace`
        # (readers of the listed form do not know the Lease: that form renews by writing again).
        self.hashed = hashed
        self.renewal = LeaseRenewal(api_client, node, namespace) if hashed else None
        self._hashes: tuple[str, dict] | None = None  # (fingerprint, its spec.imageHashes)
        self._stored: dict | None = None  # the object as last read or written
        self._stored_digest: tuple[int, str] | None = None  # (id of _stored, its images' fingerprint)
        self._known = False  # False: _stored may be out of date, read before deciding
        # The spec fields the apiserver dropped (a CRD from before them): sending them again would
        # make every cycle see a change and write.
        self.pruned: set[str] = set()

    @property
    def stored(self) -> dict | None:
        return self._stored

    def publish(self, images: list[dict], *, now: float, digest: str | None = None,
                spec: Mapping[str, Mapping | None] | None = None) -> str | None:
        """Write the object if due; returns why it was written (see agent.inventory), or None.
        `digest`: fingerprint(images), where the caller has it; `spec`: the OPTIONAL_SPEC fields
        (agent.inventory), None for none."""
        extra = {field: None if field in self.pruned else value for field, value in (spec or {}).items()}
        digest = fingerprint(images) if digest is None else digest
        hashes = self._hashes_of(images, digest) if self.hashed else None
        for _ in range(_MAX_ATTEMPTS):
            if not self._known:
                self._stored = self._read()
                self._known = True
            reason = publish_reason(self._stored, images, now=now, lease_seconds=self.lease_seconds, spec=extra,
                                    digests=None if self.hashed else (self._digest_of_stored(), digest),
                                    hashes=hashes, renewed_at=self._renewed_at())
            if reason is None:
                return None
            if reason == RENEW and self._renew(now):
                return reason
            body = node_images_object(self.node, images, observed_at=now, lease_seconds=self.lease_seconds,
                                      spec=extra, hashes=hashes)
            self._known = False  # a write that fails in any way leaves the stored object unknown
            try:
                self._stored = self._write(body)
            except ApiException as exc:
                if exc.status not in (404, 409):  # 409: written by another since read; 404: deleted
                    raise PublishError(f"{self.where}: cannot write: {describe_error(exc)}") from None
                continue
            self._known = True
            kept = self._stored.get("spec") or {}
            for field, value in extra.items():
                if value is not None and field not in kept:
                    self.pruned.add(field)
                    log.warning("%s: the apiserver dropped spec.%s, so its NodeImages CRD predates it;"
                                " upgrade the chart (or kubectl apply --server-side -f"
                                " deploy/chart/image-preflight/files/nodeimages-crd.yaml) and restart the agent to"
                                " report it", self.where, field)
            return reason
        raise PublishError(f"{self.where}: still conflicting after {_MAX_ATTEMPTS} attempts")

    def _renewed_at(self) -> float | None:
        if self.renewal is None:
            return None
        try:
            return self.renewal.renewed_at
        except RenewalRefused as exc:
            self._refused(exc)
            return None
        except RenewalError as exc:
            raise PublishError(str(exc)) from None

    def _renew(self, now: float) -> bool:
        """Renew the stored list through the Lease; False when the list itself must be written
        again (no Lease to renew with, or a lease duration the list does not carry yet)."""
        stored_lease = ((self._stored or {}).get("spec") or {}).get("leaseDurationSeconds")
        if self.renewal is None or stored_lease != self.lease_seconds:
            return False
        try:
            self.renewal.renew(now=now, lease_seconds=self.lease_seconds)
        except RenewalRefused as exc:
            self._refused(exc)
            return False
        except RenewalError as exc:
            raise PublishError(str(exc)) from None
        return True

    def _refused(self, exc: RenewalRefused) -> None:
        log.warning("%s; renewing %s by writing it again from now on (grant the agent its Lease: the chart's"
                    " agent Role)", exc, self.where)
        self.renewal = None

    def _hashes_of(self, images: list[dict], digest: str) -> dict:
        """spec.imageHashes of `images`, encoded again only when they changed."""
        if self._hashes is None or self._hashes[0] != digest:
            self._hashes = (digest, image_hashes(images))
        return self._hashes[1]

    def _digest_of_stored(self) -> str:
        """The stored images' fingerprint, digested once per stored object ("" for one that cannot be)."""
        if self._stored_digest is None or self._stored_digest[0] != id(self._stored):
            images = (self._stored or {}).get("spec", {}).get("images") if isinstance(self._stored, dict) else None
            try:
                digest = fingerprint(images) if isinstance(images, list) else ""
            except (TypeError, ValueError, AttributeError):
                digest = ""
            self._stored_digest = (id(self._stored), digest)
        return self._stored_digest[1]

    def _read(self) -> dict | None:
        try:
            return custom_object(self._api.get_cluster_custom_object(
                GROUP, VERSION, PLURAL, self.node, _request_timeout=_TIMEOUT
            ))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise PublishError(f"{self.where}: cannot read: {describe_error(exc)}") from None

    def _write(self, body: dict) -> dict:
        size = len(json.dumps(body, separators=(",", ":")))
        if size > ETCD_REQUEST_LIMIT:
            log.warning("%s: %d images make a %.1f MiB object, over etcd's default request limit"
                        " of 1.5 MiB; the apiserver may refuse it (the agent's --list-form hashes takes a"
                        " thirtieth)", self.where, body["spec"]["imageCount"], size / 2**20)
        if self._stored is None:
            return custom_object(self._api.create_cluster_custom_object(GROUP, VERSION, PLURAL, body,
                                                                        _request_timeout=_TIMEOUT))
        # The resourceVersion makes the replace fail with 409 if anyone wrote since we read.
        body["metadata"]["resourceVersion"] = self._stored["metadata"]["resourceVersion"]
        return custom_object(self._api.replace_cluster_custom_object(
            GROUP, VERSION, PLURAL, self.node, body, _request_timeout=_TIMEOUT
        ))

    @property
    def where(self) -> str:
        return f"{PLURAL}/{self.node}"


# After an image event, list once no further event has come for QUIET_S (an import of many
# images sends many), but no later than COALESCE_MAX_S after the first.
QUIET_S = 0.2
COALESCE_MAX_S = 1.0
# containerd's CRI plugin learns of an image change from the same event, so one more list this
# long after an event-driven one catches what it had not taken in yet.
CONFIRM_AFTER_S = 1.0


class Agent:
    """List the runtime's images every `interval` seconds, and soon after each image event when
    `image_events` (containerd's events service on the same socket), and publish them."""

    def __init__(
        self,
        images: ImageClient,
        publisher: Publisher,
        *,
        interval: float,
        exit_after_failures: int = 3,
        image_events: bool = True,
        sandbox_image: str | None = None,
        pinner: Pinner | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.images = images
        self.publisher = publisher
        self.interval = interval
        self.exit_after_failures = exit_after_failures
        self.image_events = image_events
        self.clock = clock
        self.cri_failures = 0  # consecutive
        self.cycles = 0
        self.sandbox_image_fallback = sandbox_image  # for runtimes that do not name theirs (containerd 2.x)
        self.sandbox_image: str | None = None  # as the runtime last named it
        self._sandbox_present: bool | None = None  # None: not known yet
        self.pinner = pinner  # None: pinning is not enabled
        self.metrics = metrics or Metrics()
        self._wake = threading.Event()  # set by image events, the needed list and stop
        self.events: ImageEvents | None = None

    def wake(self) -> None:
        """Run a cycle soon (after QUIET_S without another wake), not at the next interval."""
        self._wake.set()

    def cycle(self) -> bool:
        """One list and (if due) publish; False when the runtime could not be asked."""
        self.cycles += 1
        try:
            images = image_dicts(self.images.list_images())
        except CRIError as exc:
            # The object is left alone: it goes stale, which readers take as "unknown".
            self.cri_failures += 1
            self.metrics.cycles.labels("runtime_unavailable").inc()
            log.warning("%s (failure %d in a row; %s left as it is)", exc, self.cri_failures,
                        self.publisher.where)
            return False
        self.metrics.images.set(len(images))
        self.metrics.listed_at.set(self.clock())
        if self.cri_failures:
            log.info("CRI endpoint %s answers again", self.images.endpoint)
            self.cri_failures = 0
        digest = fingerprint(images)  # once a cycle, for the pinner and the publisher
        spec = {"sandboxImage": self._sandbox_report(images), "pinning": self._pin(images, digest)}
        try:
            reason = self.publisher.publish(images, now=self.clock(), digest=digest, spec=spec)
        except Exception as exc:  # noqa: BLE001 - refused (PublishError), or any connection error: retry next cycle
            self.metrics.cycles.labels("publish_failed").inc()
            said = str(exc) if isinstance(exc, PublishError) else f"{self.publisher.where}: {describe_error(exc)}"
            log.warning("%s; retrying in %g s", said, self.interval)
            return True
        self.metrics.cycles.labels("listed").inc()
        self.metrics.published_at.set(self.clock())
        if reason is not None:
            log.info("%s: written (%s, %d images)", self.publisher.where, reason, len(images))
        return True

    def _pin(self, images: list[dict], digest: str) -> dict | None:
        """spec.pinning after pinning what is due; the pins show in the next list, which the
        runtime's image events bring within about a second."""
        if self.pinner is None:
            return None
        if not self.pinner.runtime_known:
            try:
                self.pinner.runtime(self.images.version())
            except CRIError as exc:  # ListImages answered a moment ago: try again next cycle
                log.debug("%s; the runtime's version next cycle", exc)
        return self.pinner.apply(images, digest)

    def _sandbox_report(self, images: list[dict]) -> dict | None:
        """spec.sandboxImage for this list; a Status call costs well under a millisecond."""
        try:
            self.sandbox_image = self.images.sandbox_image()
        except CRIError as exc:  # ListImages answered a moment ago: keep the name last named
            log.debug("%s; keeping the sandbox image last named", exc)
        name = self.sandbox_image or self.sandbox_image_fallback
        if name is None:
            return None
        report = sandbox_image_report(name, images)
        if report["present"] != self._sandbox_present:
            if not report["present"]:
                log.warning("sandbox image %s is not on the runtime at %s: every pod sandbox needs it, so unless"
                            " the runtime can pull it, pods here wait in ContainerCreating (FailedCreatePodSandBox)",
                            name, self.images.endpoint)
            elif self._sandbox_present is not None:
                log.info("sandbox image %s is on the runtime again", name)
            self._sandbox_present = report["present"]
        return report

    def run(self, stop: threading.Event) -> bool:
        """Cycle until `stop` is set (True), or until the runtime has failed
        `exit_after_failures` cycles in a row (False; 0 never gives up)."""
        finished = threading.Event()
        # threading.Event has no callbacks: this thread turns `stop` into a wake and ends the
        # subscription at once; it polls only to notice that run() returned on its own.
        relay = threading.Thread(target=self._relay_stop, args=(stop, finished), name="agent-stop", daemon=True)
        relay.start()
        if self.image_events:
            self.events = ImageEvents(self.images.endpoint, self.wake, on_unavailable=self._events_unavailable)
            self.events.start()
        try:
            confirm = False
            while not stop.is_set():
                self.cycle()
                if self.exit_after_failures and self.cri_failures >= self.exit_after_failures:
                    return False
                # After an event-driven cycle, one more after CONFIRM_AFTER_S unless woken again.
                confirm = self._sleep(stop, CONFIRM_AFTER_S if confirm else self.interval)
        finally:
            finished.set()  # the relay ends within its poll
            if self.events is not None:
                self.events.close()
        return True

    def _sleep(self, stop: threading.Event, timeout: float) -> bool:
        """Until `timeout` passes (False) or a burst of wakes is over (True)."""
        if not self._wake.wait(timeout) or stop.is_set():
            return False
        deadline = time.monotonic() + COALESCE_MAX_S
        while True:
            self._wake.clear()  # cleared before the list: a wake during it runs another cycle
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._wake.wait(min(QUIET_S, remaining)):
                return True
            if stop.is_set():
                return False

    def _relay_stop(self, stop: threading.Event, finished: threading.Event) -> None:
        while not stop.wait(1.0):
            if finished.is_set():
                return
        self._wake.set()
        if self.events is not None:
            self.events.close()

    def _events_unavailable(self, reason: str) -> None:
        log.warning("image events unavailable: %s; listing every %g s", reason, self.interval)
