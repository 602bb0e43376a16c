"""Keep this node's NodeImages object in the apiserver current (the agent's I/O shell).

One object per node, named after it. It is written only when the image set changes or its
lease is due for renewal, so an idle node costs the apiserver one write per renewal: of the whole
list in the listed form, of its Lease (agent/renewal.py) in the hashed one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from image_preflight.agent.inventory import RENEW, fingerprint, node_images_object, publish_reason
from image_preflight.agent.renewal import LeaseRenewal, RenewalError, RenewalRefused
from image_preflight.core.sources.runtime_lists import AGENT_NAMESPACE, GROUP, PLURAL, VERSION, image_hashes
from image_preflight.errors import UnavailableError
from image_preflight.kube.client import custom_object
from image_preflight.kube.status import describe_error

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
