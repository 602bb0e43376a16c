"""What the watchdog writes: the Job patch that makes the Job controller fail the Job, the
annotation recording it, and the Event people read. Pure; the watchdog's shell sends them.

Why `spec.activeDeadlineSeconds: 0` (pkg/controller/job/job_controller.go, Kubernetes 1.37):
- it is the Job API's own way to end a Job as failed: a spec change bumps the generation, `updateJob`
  syncs the Job at once, `pastActiveDeadline` holds (time since `status.startTime` >= 0 s), and
  `syncJob` sets FailureTarget, deletes the active Pods (counting them in `status.failed`) and, once
  they are gone, `Failed` with reason `DeadlineExceeded`. agent-lightning's controller
  (agentlightning/controller/k8s_reconciler.py) fails the rollout on whichever it sees first: its
  poll (`_reconcile_once`) on `status.failed > 0` or the Failed condition, its watch
  (`_handle_job_event`) on the Failed condition;
- 0 passes validation (pkg/apis/batch/validation: `ValidateNonnegativeField`) and needs no clock:
  any other value compares our clock with the controller's;
- the alternatives fail worse: deleting the Pod counts against backoffLimit and is retried (only
  `backoffLimit: 0` would fail, as BackoffLimitExceeded), `podFailurePolicy` cannot be added to an
  existing Job, and the status subresource (conditions) belongs to the Job controller.
The patch carries the resourceVersion read, so two watchdogs (or a change in between) cannot both act:
the second gets a 409, reads again, and finds the annotation.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from image_preflight.core.objects import as_mapping, as_text
from image_preflight.core.watchdog.pull_failures import FAILED_SANDBOX, finished
from image_preflight.core.watchdog.stalls import Stall

ANNOTATION = "image-preflight.io/watchdog"
EVENT_REASON = "ImageUnavailable"
COMPONENT = "image-preflight-watchdog"


class Mode(StrEnum):
    ENFORCE = "enforce"  # fail the Job
    AUDIT = "audit"  # record what enforce would do


class Action(StrEnum):
    """What was done, in the annotation, the log and the metrics. A later enforce still acts on a
    Job an audit only recorded."""

    FAILED = "failed"
    AUDITED = "audited"
    EVENT_ONLY = "event-only"
    SKIPPED = "skipped"
    IGNORED = "ignored"  # an Event that would have been acted on, but cannot be trusted
    ERROR = "error"  # the metrics' word for a write that failed


MODES = tuple(Mode)
ENFORCE, AUDIT = MODES
FAILED, AUDITED, EVENT_ONLY = Action.FAILED, Action.AUDITED, Action.EVENT_ONLY
_DONE: dict[str, set[str]] = {ENFORCE: {FAILED}, AUDIT: {FAILED, AUDITED}}
MAX_EVENT_MESSAGE = 1024  # kubectl describe shows it whole; the apiserver refuses past 1 MiB objects


def cause(stall: Stall) -> str:
    """Why, in one line: the kubelet's words for a Pod, the webhook's for a denied Pod."""
    if stall.stuck is None:
        return f"the admission webhook denied its Pod: {stall.denial}"
    stuck = stall.stuck
    where = f"on node {stall.node}" if stall.node else "before it was bound"
    said = f": {stuck.message}" if stuck.message else ""
    if stuck.reason == FAILED_SANDBOX:
        return (f"pod {stall.name} {where} cannot start: the container runtime there lacks its sandbox image "
                f"{stuck.reference} ({stuck.reason}){said}")
    return (f"pod {stall.name} container {stuck.container!r} {where} waits with {stuck.reason} for image "
            f"{stuck.reference} (imagePullPolicy {stuck.pull_policy}){said}")


def kubelet_reason(stall: Stall) -> str:
    return stall.stuck.reason if stall.stuck is not None else "FailedCreate"


def record(stall: Stall, action: str, *, at: str, waited_s: float) -> dict[str, Any]:
    """The annotation's content, and the fields of the log line."""
    return {
        "action": action, "reason": kubelet_reason(stall), "pod": stall.name if stall.kind == "Pod" else "",
        "container": stall.stuck.container if stall.stuck else "",
        "image": stall.stuck.reference if stall.stuck else "",
        "node": stall.node, "at": at, "waited_s": round(waited_s, 3),
    }


def recorded_action(job: Mapping[str, Any]) -> str | None:
    annotations = as_mapping(as_mapping(job.get("metadata")).get("annotations"))
    try:
        action = json.loads(annotations[ANNOTATION]).get("action")
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return action if isinstance(action, str) else None


def skip_reason(job: Mapping[str, Any], owner_uid: str, mode: str) -> str | None:
    """Why this Job is left as it is, or None when the watchdog should act on it."""
    metadata, spec = as_mapping(job.get("metadata")), as_mapping(job.get("spec"))
    if metadata.get("uid") != owner_uid:
        return "replaced"  # a new Job of the same name: not the one whose Pod was stuck
    if recorded_action(job) in _DONE[mode]:
        return "already"  # before "finished": the Job controller may have acted on our patch already
    if finished(job):
        return "finished"
    if spec.get("suspend") is True:
        return "suspended"  # no deadline runs while suspended (pastActiveDeadline)
    return None


def probe_pod(job: Mapping[str, Any]) -> dict[str, Any]:
    """The Pod the Job controller would create for `job` now (pkg/controller/controller_utils.go,
    GetPodFromTemplate: the template's labels, annotations and spec, a generated name, the Job as its
    controller), for a dry run that asks admission again before a denial fails the Job. No
    blockOwnerDeletion, which some apiservers grant only to writers of the Job's finalizers; no
    finalizer, as a dry run keeps nothing."""
    metadata = as_mapping(job.get("metadata"))
    template = as_mapping(as_mapping(job.get("spec")).get("template"))
    template_metadata = as_mapping(template.get("metadata"))
    pod_metadata: dict[str, Any] = {"generateName": f"{as_text(metadata.get('name'))}-",
                          "namespace": as_text(metadata.get("namespace")),
                          "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                                               "name": as_text(metadata.get("name")),
                                               "uid": as_text(metadata.get("uid")), "controller": True}]}
    for field in ("labels", "annotations"):
        if as_mapping(template_metadata.get(field)):
            pod_metadata[field] = dict(as_mapping(template_metadata.get(field)))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_metadata, "spec": dict(as_mapping(template.get("spec")))}


def job_patch(job: Mapping[str, Any], mode: str, content: dict[str, Any]) -> dict[str, Any]:
    """Annotate (both modes) and, in enforce mode, end the Job as failed; conditional on the
    resourceVersion read."""
    metadata = {"resourceVersion": job["metadata"]["resourceVersion"],
                "annotations": {ANNOTATION: json.dumps(content, sort_keys=True)}}
    if mode == AUDIT:
        return {"metadata": metadata}
    return {"metadata": metadata, "spec": {"activeDeadlineSeconds": 0}}


def event(stall: Stall, *, kind: str, name: str, uid: str, api_version: str, action: str, message: str,
          at: str, instance: str) -> dict[str, Any]:
    """A core/v1 Event about `kind`/`name`, as client-go's recorder writes one. Its name is derived
    from the subject and the action, so a second writer's copy is refused as AlreadyExists."""
    digest = hashlib.sha256(f"{uid}/{action}".encode()).hexdigest()[:16]
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{name[:236]}.{digest}", "namespace": stall.namespace},
        "involvedObject": {"apiVersion": api_version, "kind": kind, "name": name, "namespace": stall.namespace,
                           "uid": uid},
        "reason": EVENT_REASON, "message": message[:MAX_EVENT_MESSAGE], "type": "Warning",
        "source": {"component": COMPONENT}, "reportingComponent": COMPONENT, "reportingInstance": instance[:128],
        "firstTimestamp": at, "lastTimestamp": at, "count": 1,
    }


def job_message(stall: Stall, action: str) -> str:
    verbs: dict[str, str] = {FAILED: "failed this Job", AUDITED: "would fail this Job (audit mode)"}
    verb = verbs[action]
    return f"image-preflight watchdog {verb}: {cause(stall)}"


def pod_message(stall: Stall) -> str:
    owner = stall.owner
    whose = f"its owner {owner.kind} {owner.name} is not a Job" if owner else "it has no controller"
    return f"image-preflight watchdog left this Pod alone ({whose}): {cause(stall)}"
