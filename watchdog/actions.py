"""The watchdog's writes: read the Job, patch it, record the Event. What to write is decided in
image_preflight.core.watchdog.job_failure; this module only talks to the apiserver."""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from image_preflight.core.sources.runtime_lists import (
    AGENT_NAMESPACE,
    GROUP,
    LEASE_GROUP,
    LEASE_PLURAL,
    LEASE_VERSION,
    PLURAL,
    VERSION,
    renewal,
)
from image_preflight.core.watchdog import job_failure
from image_preflight.core.watchdog.job_failure import AUDIT, AUDITED, EVENT_ONLY, FAILED, Action
from image_preflight.core.watchdog.pull_failures import FAILED_SANDBOX, not_the_jobs_pod, sandbox_unconfirmed
from image_preflight.core.watchdog.stalls import Stall
from image_preflight.kube.client import json_body
from image_preflight.kube.status import describe_error, status_message

_REQUEST_TIMEOUT = (10.0, 30.0)
_CONFLICT_ATTEMPTS = 5  # a Job changes between our read and our patch only while its controller acts


@dataclass(frozen=True)
class Handled:
    action: Action
    detail: str  # why skipped, or "" ; for a written Event that failed, what went wrong
    record: dict


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Actions:
    def __init__(self, api: kubernetes.client.ApiClient, *, mode: str, instance: str,
                 webhooks: frozenset[str] = frozenset(), agent_namespace: str = AGENT_NAMESPACE) -> None:
        self._batch = kubernetes.client.BatchV1Api(api)
        self._core = kubernetes.client.CoreV1Api(api)
        self._custom = kubernetes.client.CustomObjectsApi(api)
        self.agent_namespace = agent_namespace  # where the Leases renewing hashed lists are
        self.mode = mode
        self.instance = instance
        self.webhooks = webhooks  # whose denials fail a Job

    def handle(self, stall: Stall, waited_s: float) -> Handled:
        """Act on one stall. ApiExceptions other than those answered here (and connection errors)
        propagate: the caller retries later."""
        owner = stall.owner
        if owner is None or not owner.is_job:
            return self._pod_event(stall, waited_s)
        action = AUDITED if self.mode == AUDIT else FAILED
        confirmation: list[str | None] = []  # the node's answer for a sandbox stall, asked once
        for _ in range(_CONFLICT_ATTEMPTS):
            try:
                job = self._read_job(owner.name, stall.namespace)
            except ApiException as exc:
                if exc.status == 404:
                    return Handled(Action.SKIPPED, "gone",
                                   job_failure.record(stall, Action.SKIPPED, at=_now(), waited_s=waited_s))
                raise
            at = _now()
            content = job_failure.record(stall, action, at=at, waited_s=waited_s)
            reason = job_failure.skip_reason(job, owner.uid, self.mode)
            if reason is None and stall.kind == "Pod":
                reason = not_the_jobs_pod(job, dict(stall.labels))
            if reason is None and stall.denial is not None:
                reason = self._unconfirmed(job)
            if reason is None and stall.stuck is not None and stall.stuck.reason == FAILED_SANDBOX:
                if not confirmation:
                    confirmation.append(self._sandbox_unconfirmed(stall))
                reason = confirmation[0]
            if reason is not None:
                return Handled(Action.SKIPPED, reason, {**content, "action": Action.SKIPPED})
            try:
                self._batch.patch_namespaced_job(owner.name, stall.namespace,
                                                 job_failure.job_patch(job, self.mode, content),
                                                 _request_timeout=_REQUEST_TIMEOUT)
            except ApiException as exc:
                if exc.status == 409:
                    continue  # changed since read (maybe by another watchdog): read it again
                if exc.status == 404:
                    return Handled(Action.SKIPPED, "gone", {**content, "action": Action.SKIPPED})
                raise
            problem = self._event(job_failure.event(
                stall, kind="Job", name=owner.name, uid=owner.uid, api_version=owner.api_version, action=action,
                message=job_failure.job_message(stall, action), at=at, instance=self.instance))
            return Handled(action, problem, content)
        return Handled(Action.SKIPPED, "conflicts",
                       job_failure.record(stall, Action.SKIPPED, at=_now(), waited_s=waited_s))

    def _unconfirmed(self, job: dict) -> str | None:
        """Why a FailedCreate's denial does not stand, or None when a dry run of the Job's Pod is
        denied by the same webhook again: an Event proves nothing of who wrote it, the webhook's
        answer now does (and a denial the cluster has since outgrown fails nothing)."""
        namespace = job["metadata"]["namespace"]
        try:
            self._core.create_namespaced_pod(namespace, job_failure.probe_pod(job),  # type: ignore[arg-type]  # a dict body is sent as it is
                                             dry_run="All", _request_timeout=_REQUEST_TIMEOUT)
        except ApiException as exc:
            text = status_message(exc) or describe_error(exc)
            if any(text.startswith(f'admission webhook "{name}" denied the request: ') for name in self.webhooks):
                return None
            if exc.status in (401, 403, 404, 409, 422):  # refused for another reason: not ours to act on
                return f"not confirmed: a dry run of its Pod was refused otherwise ({exc.status}: {text[:200]})"
            raise
        return "not confirmed: a dry run of its Pod is admitted now"

    def _sandbox_unconfirmed(self, stall: Stall) -> str | None:
        """Why the node's own NodeImages does not confirm the sandbox stall, or None when it does.

        The Event is anyone's word who may write Events in the Pod's namespace, and the Pod waiting
        bound looks the same whatever it waits for (a volume, a NotReady node), so neither proves the
        runtime lacks its sandbox image. The node's agent, alone allowed to write that node's
        NodeImages, says what the runtime answered over CRI: that object must say the image is not
        present, under a lease that still runs. One GET, of that node's object only, when the stall
        falls due: a watch of every node's list would hold all of them (5,000 nodes' image lists) for
        the rare sandbox stall. Without the node agent (no such object, or no CRD) a sandbox stall
        fails no Job."""
        if not stall.node:
            return "not confirmed: the Pod names no node"
        try:
            response = self._custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, stall.node,
                                                              _preload_content=False, _request_timeout=_REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return f"not confirmed: node {stall.node} has no NodeImages (no node agent reports its runtime)"
            raise
        try:
            node_images = json_body(response)
        except ValueError:
            return f"not confirmed: node {stall.node}'s NodeImages is not JSON"
        assert stall.stuck is not None  # a sandbox stall carries the image (stalls.sandbox_stall)
        why = sandbox_unconfirmed(node_images if isinstance(node_images, dict) else {}, stall.node,
                                  stall.stuck.image, time.time(), renewed_at=self._renewed_at(stall.node))
        return None if why is None else f"not confirmed: {why}"

    def _renewed_at(self, node: str) -> float | None:
        """When `node`'s agent last renewed its hashed list through its Lease (None: no Lease, or
        none this token may read: the list then counts until observedAt + lease)."""
        try:
            lease = self._custom.get_namespaced_custom_object(LEASE_GROUP, LEASE_VERSION, self.agent_namespace,
                                                              LEASE_PLURAL, node, _request_timeout=_REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status in (403, 404):
                return None
            raise
        found = renewal(lease)
        return found[1] if found is not None and found[0] == node else None

    def _read_job(self, name: str, namespace: str) -> dict:
        return json_body(self._batch.read_namespaced_job(name, namespace, _preload_content=False,
                                                         _request_timeout=_REQUEST_TIMEOUT))

    def _pod_event(self, stall: Stall, waited_s: float) -> Handled:
        at = _now()
        content = job_failure.record(stall, EVENT_ONLY, at=at, waited_s=waited_s)
        problem = self._event(job_failure.event(
            stall, kind=stall.kind, name=stall.name, uid=stall.uid, api_version="v1", action=EVENT_ONLY,
            message=job_failure.pod_message(stall), at=at, instance=self.instance))
        return Handled(EVENT_ONLY, problem, content)

    def _event(self, body: dict) -> str:
        """Create the Event; "" when written (or already written by another watchdog), else why not.
        The annotation is the record that counts, so a lost Event does not undo the action."""
        try:
            self._core.create_namespaced_event(body["metadata"]["namespace"], body,  # type: ignore[arg-type]  # a dict body is sent as it is
                                               _request_timeout=_REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status == 409:
                return ""
            return f"event not recorded: {describe_error(exc)}"
        except Exception as exc:  # noqa: BLE001 - a connection error: the Job is already handled
            return f"event not recorded: {describe_error(exc)}"
        return ""
