"""Which Pods have waited for an unobtainable image longer than the grace, and which Jobs a webhook
denied a Pod: the watchdog's memory, with time passed in (no clock is read here).

A Pod is remembered from the first status that shows a container stuck (see pull_failures) until
it recovers, settles or goes; it is due once it has been stuck for `grace` seconds without a
break. A Job's FailedCreate carrying a webhook's denial is due at once: the denial is the decision
the next attempt would get too. A Pod whose kubelet reports that the runtime lacks its sandbox
image (FailedCreatePodSandBox, see pull_failures) is due after the same grace from that first
report, while the Pod stays bound and unstarted: the Event names the Pod, the Pod its Job, so each
bound unstarted Pod is remembered (namespace, name, owner, node, labels) until it starts or goes.
A report counts for a Pod only when the Event is written in the Pod's namespace and names its
namespace, name and uid (pull_failures.not_about): reports are kept by all three, so one written
elsewhere, or naming another Pod's uid, neither arms nor disarms that Pod's stall. What is due is
not yet proven: the watchdog's shell checks that the Pod is its Job's (pull_failures.not_the_jobs_pod)
and, for a sandbox, that the node's own NodeImages says so (pull_failures.sandbox_unconfirmed).
Each subject is handed out once; a failed action is put back. Only the opted-in namespaces are
handed out, so a namespace labelled later gets its stuck Pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from image_preflight.core.objects import as_mapping, as_text
from image_preflight.core.watchdog.pull_failures import (
    FAILED_SANDBOX,
    Owner,
    SandboxFailure,
    Stuck,
    awaiting_sandbox,
    controller_of,
    labels_of,
    not_about,
    reference_of,
    sandbox_image_missing,
    stuck_containers,
    untrusted,
    webhook_denial,
)

POD, JOB, SANDBOX = "pod/", "job/", "sandbox/"  # key prefixes: a Pod's images, a denied Job, a Pod's sandbox
REPORT = "report/"  # a kubelet's sandbox report: "report/<Event's namespace>/<Pod name>/<Pod uid>"
MAX_IGNORED = 4096  # untrusted Events remembered as said; a flood of forgeries is said again, not held


@dataclass(frozen=True, slots=True)
class Stall:
    key: str  # "pod/<uid>", "sandbox/<pod uid>" or "job/<uid>"
    namespace: str
    kind: str  # of the subject: "Pod" or "Job"
    name: str
    uid: str
    owner: Owner | None  # the Job to fail; for a denial the Job itself
    node: str  # "" for a denial (no Pod) or an unscheduled Pod
    stuck: Stuck | None  # the first stuck container (a Pod); for its sandbox, reason FAILED_SANDBOX and no container
    denial: str | None  # the webhook's words (a Job)
    since: float
    labels: tuple[tuple[str, str], ...] = ()  # the Pod's (sorted): whose Pod it is (pull_failures.not_the_jobs_pod)


def pod_stall(pod: Mapping[str, Any], now: float, *, include_always: bool) -> Stall | None:
    stuck = stuck_containers(pod, include_always=include_always)
    metadata = as_mapping(pod.get("metadata"))
    uid = as_text(metadata.get("uid"))
    if not stuck or not uid:
        return None
    spec = as_mapping(pod.get("spec"))
    return Stall(f"pod/{uid}", as_text(metadata.get("namespace")), "Pod", as_text(metadata.get("name")), uid,
                 controller_of(pod), as_text(spec.get("nodeName")), stuck[0], None, now, labels_of(pod))


def denial_stall(event: Mapping[str, Any], now: float, webhooks: frozenset[str]) -> Stall | None:
    denial = webhook_denial(event, webhooks)
    job = as_mapping(event.get("involvedObject"))
    if denial is None or not as_text(job.get("uid")):
        return None
    uid = job["uid"]
    owner = Owner(as_text(job.get("apiVersion")) or "batch/v1", "Job", as_text(job.get("name")), uid)
    namespace = as_text(as_mapping(event.get("metadata")).get("namespace"))  # untrusted() holds it the Job's
    return Stall(f"job/{uid}", namespace, "Job", owner.name, uid, owner, "", None, denial, now)


@dataclass(frozen=True, slots=True)
class _Unstarted:
    """What a sandbox stall needs of a bound Pod whose sandbox is not up yet."""

    namespace: str
    name: str
    owner: Owner | None
    node: str
    labels: tuple[tuple[str, str], ...]


def sandbox_stall(uid: str, pod: _Unstarted, failure: SandboxFailure, since: float) -> Stall:
    # The node is the Pod's (awaiting_sandbox: bound), never the host the Event says: the NodeImages
    # read to confirm the stall is that node's.
    stuck = Stuck("", failure.image, reference_of(failure.image), "", FAILED_SANDBOX, failure.message)
    return Stall(SANDBOX + uid, pod.namespace, "Pod", pod.name, uid, pod.owner, pod.node, stuck, None, since,
                 pod.labels)


def pod_key(pod: Mapping[str, Any]) -> str:
    return f"{POD}{as_text(as_mapping(pod.get('metadata')).get('uid'))}"


def report_key(namespace: str, name: str, uid: str) -> str:
    """A sandbox report by all it says of its Pod; the namespace is the Event's own. Namespace names
    hold no "/", so a report from another namespace never takes a Pod's key."""
    return f"{REPORT}{namespace}/{name}/{uid}"


def event_key(event: Mapping[str, Any]) -> str:
    """A FailedCreatePodSandBox is keyed by the Pod it names (report_key), a FailedCreate by its Job."""
    involved = as_mapping(event.get("involvedObject"))
    if event.get("reason") == FAILED_SANDBOX:
        return report_key(as_text(as_mapping(event.get("metadata")).get("namespace")), as_text(involved.get("name")),
                          as_text(involved.get("uid")))
    return f"{JOB}{as_text(involved.get('uid'))}"


class Stalls:
    def __init__(self, grace: float, *, include_always: bool = False,
                 webhooks: frozenset[str] = frozenset()) -> None:
        self.grace = grace
        self.include_always = include_always
        self.webhooks = webhooks
        self._pending: dict[str, tuple[Stall, float]] = {}  # key -> (stall, due)
        self._handed: set[str] = set()  # keys handed out, until their subject goes
        self._unstarted: dict[str, _Unstarted] = {}  # pod uid -> bound Pod whose sandbox is not up
        self._sandbox: dict[str, tuple[SandboxFailure, float]] = {}  # report_key -> (latest words, first seen)
        self._ignored: set[str] = set()  # uids of the untrusted Events already said, until they go

    def __len__(self) -> int:
        return len(self._pending)

    # -- what the watches report ---------------------------------------------------------------

    def see_pod(self, pod: Mapping[str, Any], now: float) -> None:
        key = pod_key(pod)
        self._see_unstarted(pod)
        stall = pod_stall(pod, now, include_always=self.include_always)
        if stall is None:
            self._pending.pop(key, None)  # recovered within the grace, or settled
        elif key not in self._handed:
            earlier = self._pending.get(key)
            # Stuck without a break since the first sighting: keep that time, take the newer words.
            since = earlier[0].since if earlier else now
            self._pending[key] = (replace(stall, since=since), earlier[1] if earlier else since + self.grace)

    def forget_pod(self, pod: Mapping[str, Any]) -> None:
        key = pod_key(pod)
        self.forget(key)
        self._forget_unstarted(key[len(POD):])

    def _see_unstarted(self, pod: Mapping[str, Any]) -> None:
        metadata = as_mapping(pod.get("metadata"))
        uid = as_text(metadata.get("uid"))
        if not uid:
            return
        namespace, name = as_text(metadata.get("namespace")), as_text(metadata.get("name"))
        if not awaiting_sandbox(pod):
            if uid in self._unstarted or self._sandbox:  # most Pods: neither, and nothing to drop
                # Its sandbox is up (or it settled): whatever the kubelet said before no longer holds.
                self._unstarted.pop(uid, None)
                self._sandbox.pop(report_key(namespace, name, uid), None)
                self._pending.pop(SANDBOX + uid, None)
            return
        self._unstarted[uid] = _Unstarted(namespace, name, controller_of(pod),
                                          as_text(as_mapping(pod.get("spec")).get("nodeName")), labels_of(pod))
        self._arm_sandbox(uid)

    def _forget_unstarted(self, uid: str) -> None:
        pod = self._unstarted.pop(uid, None)
        if pod is not None:
            self._sandbox.pop(report_key(pod.namespace, pod.name, uid), None)
        self.forget(SANDBOX + uid)

    def _arm_sandbox(self, uid: str) -> None:
        """Pending once both the Pod and a report about it (not_about) are known; due a grace after
        the report."""
        key = SANDBOX + uid
        pod = self._unstarted.get(uid)
        if pod is None or key in self._handed:
            return
        reported = self._sandbox.get(report_key(pod.namespace, pod.name, uid))
        if reported is None or not_about(reported[0], pod.namespace, pod.name, uid) is not None:
            return
        failure, since = reported
        self._pending[key] = (sandbox_stall(uid, pod, failure, since), since + self.grace)

    def _drop_report(self, key: str) -> None:
        """A report gone (its Event expired or relisted away): the stall it armed goes with it, and
        only that one (a report from elsewhere naming the same uid armed nothing)."""
        reported = self._sandbox.pop(key, None)
        if reported is None:
            return
        uid = reported[0].pod_uid
        pod = self._unstarted.get(uid)
        if pod is None or report_key(pod.namespace, pod.name, uid) == key:
            self.forget(SANDBOX + uid)

    def see_event(self, event: Mapping[str, Any], now: float) -> str | None:
        """Take in a FailedCreate or FailedCreatePodSandBox Event; why it is ignored (one line)
        when it would have counted but cannot be trusted (pull_failures.untrusted), else None."""
        failure = sandbox_image_missing(event)
        stall = denial_stall(event, now, self.webhooks) if failure is None else None
        if failure is None and stall is None:
            return None  # not one the watchdog acts on
        why = untrusted(event)
        if why is None and failure is not None and (pod := self._unstarted.get(failure.pod_uid)) is not None:
            why = not_about(failure, pod.namespace, pod.name, failure.pod_uid)
        if why is not None:
            uid = as_text(as_mapping(event.get("metadata")).get("uid"))
            if uid in self._ignored:
                return None  # said once (a relist brings it again)
            if len(self._ignored) >= MAX_IGNORED:
                self._ignored.clear()
            self._ignored.add(uid)
            return why
        if failure is not None:
            key = report_key(failure.namespace, failure.pod, failure.pod_uid)
            earlier = self._sandbox.get(key)
            # Reported again (the Event's count rises): keep the first sighting, take the newer words.
            self._sandbox[key] = (failure, earlier[1] if earlier else now)
            self._arm_sandbox(failure.pod_uid)
        elif stall is not None and stall.key not in self._handed and stall.key not in self._pending:
            self._pending[stall.key] = (stall, now)
        return None

    def forget_event(self, event: Mapping[str, Any]) -> None:
        self._ignored.discard(as_text(as_mapping(event.get("metadata")).get("uid")))
        key = event_key(event)
        if key.startswith(REPORT):
            self._drop_report(key)
        else:
            self.forget(key)

    def forget(self, key: str) -> None:
        self._pending.pop(key, None)
        self._handed.discard(key)

    def replace(self, prefix: str, keys: Iterable[str]) -> None:
        """After a relist of one kind (POD, JOB or REPORT): forget what the list no longer has."""
        present = set(keys)
        if prefix == REPORT:
            for key in [k for k in self._sandbox if k not in present]:
                self._drop_report(key)
            return
        for key in [k for k in (*self._pending, *self._handed) if k.startswith(prefix) and k not in present]:
            self.forget(key)
        if prefix == POD:
            for uid in [u for u in self._unstarted if POD + u not in present]:
                self._forget_unstarted(uid)

    # -- what is due ---------------------------------------------------------------------------

    def take_due(self, now: float, namespaces: frozenset[str] | set[str]) -> list[Stall]:
        due = [stall for stall, at in self._pending.values() if at <= now and stall.namespace in namespaces]
        for stall in due:
            del self._pending[stall.key]
            self._handed.add(stall.key)
        return sorted(due, key=lambda stall: stall.since)

    def retry(self, stall: Stall, at: float) -> None:
        """An action that failed (the API unreachable): hand the stall out again at `at`."""
        if stall.key in self._handed:
            self._handed.discard(stall.key)
            self._pending[stall.key] = (stall, at)

    def next_due(self, namespaces: frozenset[str] | set[str]) -> float | None:
        return min((at for stall, at in self._pending.values() if stall.namespace in namespaces), default=None)

