"""Renew this node's hashed list through a Lease, not by writing the list again (the agent's I/O shell).

Kubernetes moved node heartbeats out of Node status into a Lease per node for the same reason
(KEP-589, "Efficient Node Heartbeats"): an idle renewal then writes a few hundred bytes to etcd
and to every watcher, not the whole list. The Lease is named after the node, in the agents'
namespace; readers take the list as confirmed at its renewTime (core.sources.runtime_lists.renewed).
"""

from __future__ import annotations

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from image_preflight.core.sources.runtime_lists import LEASE_GROUP, LEASE_PLURAL, LEASE_VERSION, lease_object, renewal
from image_preflight.errors import UnavailableError
from image_preflight.kube.client import custom_object
from image_preflight.kube.status import describe_error

_TIMEOUT = (10.0, 30.0)  # connect, read


def _leases(namespace: str) -> tuple[str, str, str, str]:
    """Group, version, namespace and plural, as the custom-objects calls take them."""
    return (LEASE_GROUP, LEASE_VERSION, namespace, LEASE_PLURAL)
_MAX_ATTEMPTS = 5


class RenewalError(UnavailableError):
    """The Lease could not be read or written; the message is one line naming it."""


class RenewalRefused(RenewalError):
    """The apiserver refuses this agent the Lease (no RBAC for it, no namespace): renewing by
    writing the list again is all that is left."""


class LeaseRenewal:
    def __init__(self, api_client: kubernetes.client.ApiClient, node: str, namespace: str) -> None:
        # Through the custom-objects path, which sends the body as it is: the generated Lease API
        # (client 37) parses renewTime into a datetime and writes it back without its fraction at a
        # whole second, which the apiserver refuses as a MicroTime.
        self._api = kubernetes.client.CustomObjectsApi(api_client)
        self.node = node
        self.namespace = namespace
        self._stored: dict | None = None
        self._known = False

    @property
    def where(self) -> str:
        return f"leases/{self.node} in {self.namespace}"

    @property
    def renewed_at(self) -> float | None:
        """When the Lease last renewed the list, as last read or written (None: no Lease)."""
        if not self._known:
            self._stored = self._read()
            self._known = True
        found = renewal(self._stored)
        return found[1] if found is not None and found[0] == self.node else None

    def renew(self, *, now: float, lease_seconds: int) -> None:
        body = lease_object(self.node, self.namespace, renewed_at=now, lease_seconds=lease_seconds)
        for _ in range(_MAX_ATTEMPTS):
            if not self._known:
                self._stored = self._read()
                self._known = True
            self._known = False
            try:
                if self._stored is None:
                    written = custom_object(self._api.create_namespaced_custom_object(
                        *_leases(self.namespace), body, _request_timeout=_TIMEOUT))
                else:
                    # The resourceVersion makes the replace fail with 409 if anyone wrote since we read.
                    body["metadata"]["resourceVersion"] = self._stored["metadata"]["resourceVersion"]
                    written = custom_object(self._api.replace_namespaced_custom_object(
                        *_leases(self.namespace), self.node, body, _request_timeout=_TIMEOUT))
            except ApiException as exc:
                if exc.status in (404, 409):  # deleted, or written by another, since read
                    body["metadata"].pop("resourceVersion", None)
                    if exc.status == 404 and self._stored is None:  # the namespace itself is missing
                        raise RenewalRefused(f"{self.where}: cannot create: {describe_error(exc)}") from None
                    continue
                error = RenewalRefused if exc.status == 403 else RenewalError
                raise error(f"{self.where}: cannot write: {describe_error(exc)}") from None
            self._stored = written
            self._known = True
            return
        raise RenewalError(f"{self.where}: still conflicting after {_MAX_ATTEMPTS} attempts")

    def _read(self) -> dict | None:
        try:
            return custom_object(self._api.get_namespaced_custom_object(*_leases(self.namespace), self.node,
                                                                        _request_timeout=_TIMEOUT))
        except ApiException as exc:
            if exc.status == 404:
                return None
            error = RenewalRefused if exc.status == 403 else RenewalError
            raise error(f"{self.where}: cannot read: {describe_error(exc)}") from None
