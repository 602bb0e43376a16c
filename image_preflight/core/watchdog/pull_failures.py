"""Which containers of a Pod wait for an image their kubelet cannot get, which Pods cannot start
for want of their runtime's sandbox image, and who owns the Pod.

Pure: reads Pods, Jobs and Events as the API returns them (camelCase dicts) and never raises on
their content; what cannot be read is not a failure. The watchdog acts on what this finds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from image_preflight.core.decide.references import InvalidReference, docker_ref
from image_preflight.core.decide.workloads import ALWAYS, WorkloadError, container_images, default_pull_policy
from image_preflight.core.objects import as_mapping, as_text
from image_preflight.core.sources.runtime_lists import format_time, node_images_from_runtime, renewed

# The kubelet's waiting reasons for an image it will never get (pkg/kubelet/images/types.go):
# ErrImageNeverPull (Never, and the node lacks it) and InvalidImageName (the name cannot parse)
# hold whatever the pull policy.
NEVER_AVAILABLE = frozenset({"ErrImageNeverPull", "InvalidImageName"})
# A failed pull, then the backoff before the next one: for a node-local IfNotPresent image no
# registry holds it, so no retry helps. For Always the image is a registry's, left alone by default.
PULL_FAILED = frozenset({"ErrImagePull", "ImagePullBackOff"})
# Regular and init containers hold the Pod back; an ephemeral container never does.
_STATUSES = (("initContainerStatuses", "initContainers"), ("containerStatuses", "containers"))
# A Job with one of these conditions is finishing or finished (pkg/controller/job: FailureTarget and
# SuccessCriteriaMet precede Failed and Complete while pods terminate).
FINISHED_CONDITIONS = ("Failed", "Complete", "FailureTarget", "SuccessCriteriaMet")


@dataclass(frozen=True, slots=True)
class Stuck:
    container: str
    image: str  # as the spec writes it
    reference: str  # as the runtime looks it up (ParseDockerRef: docker.io/library/x:latest), or the spec text
    pull_policy: str
    reason: str  # the kubelet's waiting reason
    message: str  # the kubelet's waiting message


@dataclass(frozen=True, slots=True)
class Owner:
    api_version: str
    kind: str
    name: str
    uid: str

    @property
    def is_job(self) -> bool:
        return self.api_version == "batch/v1" and self.kind == "Job"


def reference_of(image: str) -> str:
    try:
        return docker_ref(image, allow_sha512=True)
    except (InvalidReference, TypeError):
        return image


def settled(pod: Mapping[str, Any]) -> bool:
    """Terminal or being deleted: nothing here will wait any longer."""
    return bool(as_mapping(pod.get("metadata")).get("deletionTimestamp")) or as_mapping(
        pod.get("status")).get("phase") in ("Succeeded", "Failed")


def stuck_containers(pod: Mapping[str, Any], *, include_always: bool = False) -> tuple[Stuck, ...]:
    """The Pod's containers that wait for an image their node will not get, init containers first."""
    if settled(pod):
        return ()
    waiting = _image_waits(as_mapping(pod.get("status")))
    if not waiting:
        return ()  # most Pods: the spec is not read at all
    try:
        declared = {(image.field, image.container): image for image in container_images(as_mapping(pod.get("spec")))}
    except WorkloadError:
        declared = {}
    found = []
    for field, name, status_image, reason, message in waiting:
        spec = declared.get((field, name))
        image = spec.image if spec else status_image
        policy = spec.pull_policy if spec else default_pull_policy(image)
        if reason in PULL_FAILED and policy == ALWAYS and not include_always:
            continue
        found.append(Stuck(name, image, reference_of(image), policy, reason, message))
    return tuple(found)


def _image_waits(status: Mapping[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(spec field, container, status image, reason, message) of each container waiting on its image."""
    found = []
    for statuses, field in _STATUSES:
        entries = status.get(statuses)
        for entry in entries if isinstance(entries, list) else ():
            entry = as_mapping(entry)
            waiting = as_mapping(as_mapping(entry.get("state")).get("waiting"))
            reason = waiting.get("reason")
            if reason in NEVER_AVAILABLE or reason in PULL_FAILED:
                found.append((field, as_text(entry.get("name")), as_text(entry.get("image")), reason,
                              as_text(waiting.get("message"))))
    return found


def controller_of(obj: Mapping[str, Any]) -> Owner | None:
    """The ownerReference marked controller (at most one is: apimachinery validation)."""
    references = as_mapping(obj.get("metadata")).get("ownerReferences")
    for reference in references if isinstance(references, list) else ():
        reference = as_mapping(reference)
        if reference.get("controller") is True:
            return Owner(as_text(reference.get("apiVersion")), as_text(reference.get("kind")),
                         as_text(reference.get("name")), as_text(reference.get("uid")))
    return None


# The labels the apiserver puts on a Job's Pod template and in its generated selector
# (pkg/registry/batch/job/strategy.go, generateSelector; pkg/apis/batch/types.go ControllerUidLabel,
# LegacyControllerUidLabel): the Job's uid, which no other Job of any name ever had.
CONTROLLER_UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")


def labels_of(obj: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """An object's labels, sorted, the ones that are not text left out (a Stall keeps them frozen)."""
    labels = as_mapping(as_mapping(obj.get("metadata")).get("labels"))
    return tuple(sorted((k, v) for k, v in labels.items() if isinstance(k, str) and isinstance(v, str)))


def _requirement_matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool | None:
    """One matchExpressions entry against `labels` (k8s.io/apimachinery/pkg/labels/selector.go,
    Requirement.Matches); None when NewRequirement would refuse it: an unknown operator, In and
    NotIn without values, Exists and DoesNotExist with some."""
    key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
    if not isinstance(key, str) or not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        return None
    if operator in ("In", "NotIn"):
        if not values:
            return None
        inside = key in labels and labels[key] in values
        return inside if operator == "In" else (key not in labels or labels[key] not in values)
    if operator in ("Exists", "DoesNotExist"):
        if values:
            return None
        return (key in labels) is (operator == "Exists")
    return None


def selects(selector: object, labels: Mapping[str, str]) -> bool:
    """Whether a metav1.LabelSelector selects `labels`, as k8s.io/apimachinery's
    LabelSelectorAsSelector (pkg/apis/meta/v1/helpers.go) and its Matches read it: null selects
    nothing, empty everything, else every matchLabels pair and every matchExpressions requirement
    (ANDed). A selector LabelSelectorAsSelector would refuse selects nothing. (The apiserver has
    already checked the keys' and values' syntax: ValidateLabelSelector on every Job.)"""
    if selector is None or not isinstance(selector, Mapping):
        return False
    match_labels, expressions = selector.get("matchLabels") or {}, selector.get("matchExpressions") or []
    if not isinstance(match_labels, Mapping) or not isinstance(expressions, list):
        return False
    if any(labels.get(k) != v or not isinstance(v, str) for k, v in match_labels.items()):
        return False
    return all(_requirement_matches(as_mapping(e), labels) is True for e in expressions)


def not_the_jobs_pod(job: Mapping[str, Any], pod_labels: Mapping[str, str]) -> str | None:
    """Why a Pod whose controller ownerReference names `job` is not that Job's Pod, or None when it
    is. Anyone who may create a Pod can write an ownerReference naming any Job of its namespace;
    the Job controller counts a Pod as its own only while its selector selects it
    (pkg/controller/controller_ref_manager.go, ClaimObject releases an owned Pod it no longer
    selects; pkg/controller/job/job_controller.go, getPodsForJob), and the apiserver gives each
    Job's Pods a label with the Job's uid (CONTROLLER_UID_LABELS). Both must hold. A Pod that
    passes both is one the Job controller counts as the Job's own (a failure of it counts against
    backoffLimit), so its creator gains nothing here they did not have. A Job with
    `manualSelector: true` gets no such label, so its Pods are never taken for its own."""
    uid = as_text(as_mapping(job.get("metadata")).get("uid"))
    label = next((pod_labels[k] for k in CONTROLLER_UID_LABELS if k in pod_labels), None)
    if label is None:
        return f"not its Job's Pod: no {CONTROLLER_UID_LABELS[0]} label"
    if label != uid:
        return f"not its Job's Pod: its controller-uid label is {label[:64]!r}, not the Job's uid {uid}"
    if not selects(as_mapping(job.get("spec")).get("selector"), pod_labels):
        return "not its Job's Pod: the Job's selector does not select it"
    return None


def finished(job: Mapping[str, Any]) -> str | None:
    """The condition that says the Job is finishing or finished, if one does."""
    conditions = as_mapping(job.get("status")).get("conditions")
    for condition in conditions if isinstance(conditions, list) else ():
        condition = as_mapping(condition)
        kind = condition.get("type")
        if isinstance(kind, str) and kind in FINISHED_CONDITIONS and condition.get("status") == "True":
            return kind
    return None


# How the Job controller reports a Pod it could not create (pkg/controller/controller_utils.go,
# RealPodControl.createPods: Eventf(..., FailedCreatePodReason, "Error creating: %v", err)) and how
# the apiserver words a webhook's denial (apiserver/pkg/admission/plugin/webhook/errors,
# ToStatusErr: `admission webhook "<name>" denied the request: <message>`).
_FAILED_CREATE = 'Error creating: admission webhook "'
_DENIED = '" denied the request: '


# Who writes the Events the watchdog acts on (client-go tools/record, generateEvent: the recorder's
# source.component is also the Event's reportingComponent): the Job controller's FailedCreate
# (pkg/controller/job/job_controller.go, EventSource{Component: "job-controller"}) and the kubelet's
# FailedCreatePodSandBox (pkg/kubelet/kubelet.go, "kubelet").
JOB_CONTROLLER = "job-controller"
KUBELET = "kubelet"


def untrusted(event: Mapping[str, Any]) -> str | None:
    """Why the watchdog may not take `event` at its word, or None.

    The Event must name an object in its own namespace: Kubernetes checks that only for Events
    without eventTime (pkg/apis/core/validation/events.go, legacyValidateEvent), so an
    events.k8s.io/v1 Event written in one namespace may name a Job in another. And it must say it
    comes from the component that writes such Events. Any writer can set both fields, so neither
    proves who wrote it: that is why a denial fails a Job only once a dry run of its Pod is denied
    again (watchdog/actions.py). What they do rule out is a writer in one namespace reaching
    another's Jobs."""
    involved = as_mapping(event.get("involvedObject"))
    namespace = as_text(as_mapping(event.get("metadata")).get("namespace"))
    named = as_text(involved.get("namespace"))
    if named != namespace:
        return (f"Event {namespace}/{as_text(as_mapping(event.get('metadata')).get('name'))} names "
                f"{as_text(involved.get('kind'))} {named}/{as_text(involved.get('name'))}, in another namespace")
    reporter = KUBELET if event.get("reason") == FAILED_SANDBOX else JOB_CONTROLLER
    said = {as_text(as_mapping(event.get("source")).get("component")), as_text(event.get("reportingComponent"))}
    if reporter not in said:
        return (f"Event {namespace}/{as_text(as_mapping(event.get('metadata')).get('name'))} says it comes from "
                f"{' and '.join(sorted(s for s in said if s)) or 'nobody'}, not from the {reporter}")
    return None


def webhook_denial(event: Mapping[str, Any], webhooks: frozenset[str]) -> str | None:
    """The denial text when `event` is a Job's FailedCreate carrying one of `webhooks`' denials."""
    if event.get("reason") != "FailedCreate" or as_mapping(event.get("involvedObject")).get("kind") != "Job":
        return None
    message = as_text(event.get("message"))
    if not message.startswith(_FAILED_CREATE):
        return None
    name, separator, denial = message[len(_FAILED_CREATE):].partition(_DENIED)
    return denial if separator and name in webhooks else None


# How the kubelet reports a Pod whose sandbox the runtime could not create
# (pkg/kubelet/kuberuntime/kuberuntime_manager.go, SyncPod: Eventf(ref, Warning,
# events.FailedCreatePodSandBox, "Failed to create pod sandbox: %v", err)), err being the CRI
# call's gRPC status, "rpc error: code = <code> desc = <containerd's words>".
FAILED_SANDBOX = "FailedCreatePodSandBox"
_SANDBOX_PREFIX = "Failed to create pod sandbox: "
# containerd's words when it lacks its sandbox (pause) image, before the image's name:
# - "failed to get sandbox image %q: %w": the podsandbox controller's Start (2.x
#   internal/cri/server/podsandbox/sandbox_run.go; 1.6/1.7 pkg/cri/server/sandbox_run.go
#   RunPodSandbox), wrapping the failed lookup (`image %q: not found`) or pull (`failed to pull
#   image %q: ...`, ensureImageExists, up to 2.2);
# - "failed to pull image %q: %w" first in the gRPC text: 2.3's criService.ensurePauseImageExists
#   (internal/cri/server/sandbox_run.go), the one image RunPodSandbox pulls.
_SANDBOX_IMAGE = ('failed to get sandbox image "', 'desc = failed to pull image "')
# Only "not found" means the image is not to be had (containerd's errdefs.ErrNotFound, which
# errgrpc.ToGRPC turns into code NotFound); a registry out of reach may answer the next attempt.
_NOT_FOUND = ("code = NotFound", ": not found")
_MAX_NAME = 1024  # a quoted reference longer than any valid one is not read as one


@dataclass(frozen=True, slots=True)
class SandboxFailure:
    pod_uid: str  # involvedObject.uid
    namespace: str  # the Event's own namespace: the one field its writer cannot choose freely
    pod: str  # involvedObject.name
    node: str  # the reporting kubelet's host as it says (any writer may say any), "" when it does not
    image: str  # the sandbox image, as containerd quotes it
    message: str  # the kubelet's words
    named_namespace: str = ""  # involvedObject.namespace


def sandbox_image_missing(event: Mapping[str, Any]) -> SandboxFailure | None:
    """The failure when `event` is a kubelet's FailedCreatePodSandBox saying the runtime lacks its
    sandbox image (not found); None for any other sandbox failure (network, runtime handler)."""
    pod = as_mapping(event.get("involvedObject"))
    if event.get("reason") != FAILED_SANDBOX or pod.get("kind") != "Pod" or not as_text(pod.get("uid")):
        return None
    message = as_text(event.get("message"))
    if not message.startswith(_SANDBOX_PREFIX) or not any(word in message for word in _NOT_FOUND):
        return None
    for marker in _SANDBOX_IMAGE:
        start = message.find(marker)
        if start < 0:
            continue
        start += len(marker)
        end = message.find('"', start, start + _MAX_NAME + 1)
        if end > start:
            namespace = as_text(as_mapping(event.get("metadata")).get("namespace"))
            return SandboxFailure(pod["uid"], namespace, as_text(pod.get("name")),
                                  as_text(as_mapping(event.get("source")).get("host")), message[start:end], message,
                                  as_text(pod.get("namespace")))
    return None


def not_about(failure: SandboxFailure, namespace: str, name: str, uid: str) -> str | None:
    """Why the report is not about the Pod `namespace`/`name` with `uid`, or None when it is: the
    Event's namespace, and its involvedObject's namespace, name and uid, all the Pod's. A Pod's uid
    is no secret (anyone who may list the Pods of its namespace reads it), and an Event written in
    one's own namespace may name any uid, so a uid alone would let any writer of Events anywhere
    speak for every Pod of the cluster."""
    said = (failure.namespace, failure.named_namespace, failure.pod, failure.pod_uid)
    if said == (namespace, namespace, name, uid):
        return None
    return (f"Event in {failure.namespace} names Pod {failure.named_namespace}/{failure.pod[:253]} uid "
            f"{failure.pod_uid[:64]}, which is Pod {namespace}/{name}")


def sandbox_unconfirmed(node_images: Mapping[str, Any], node: str, image: str, now: float, *,
                        renewed_at: float | None = None) -> str | None:
    """Why the node's own NodeImages object does not confirm that `node`'s runtime lacks the
    sandbox image `image` at `now` (epoch seconds), or None when it does: it speaks for that node,
    its lease runs, and its spec.sandboxImage says that image (compared as the runtime resolves
    names, ParseDockerRef, where both parse) is not present.

    Why this and not the Event: anyone who may write Events in the Pod's namespace can write the
    kubelet's words, its reporter and host included (the apiserver checks none of them,
    pkg/apis/core/validation/events.go), so a Pod that merely waits bound (for a volume, on a
    NotReady node) would fail its Job on a forged report. Nor does the Pod prove it: one that
    awaits its sandbox looks the same whatever it waits for. The NodeImages object is written by
    that node's agent alone, with its node-bound token (policy image-preflight-agent-own-node),
    from what the runtime itself answers over CRI. `renewed_at`: when that agent's Lease last
    renewed a hashed list (runtime_lists.renewed)."""
    try:
        listed = renewed(node_images_from_runtime(node_images), renewed_at)
    except ValueError as exc:
        return f"node {node}'s NodeImages cannot be read ({str(exc)[:200]})"
    name = as_text(as_mapping(node_images.get("metadata")).get("name"))
    if listed.node != node or name != node:
        return f"NodeImages {name[:253]} speaks for node {listed.node[:253]}, not {node}"
    if not listed.current(now):
        assert listed.observed_at is not None and listed.expires_at is not None  # as every runtime list has
        return (f"node {node}'s NodeImages is not current (observed {format_time(listed.observed_at)}, lease "
                f"until {format_time(listed.expires_at)})")
    if listed.sandbox_missing is None:
        said = as_mapping(as_mapping(node_images.get("spec")).get("sandboxImage"))
        if not said:
            return f"node {node}'s NodeImages does not say whether its runtime holds its sandbox image"
        return f"node {node}'s NodeImages says its runtime holds its sandbox image {as_text(said.get('name'))}"
    if reference_of(listed.sandbox_missing) != reference_of(image):
        return (f"node {node}'s NodeImages says its runtime lacks sandbox image {listed.sandbox_missing}, "
                f"not {image[:_MAX_NAME]}")
    return None


# Waiting reasons a container has before its Pod's sandbox exists (pkg/kubelet/kubelet_pods.go,
# convertToAPIContainerStatuses: ContainerCreating, or PodInitializing behind init containers);
# any other state means the kubelet got past RunPodSandbox.
_BEFORE_SANDBOX = frozenset({"ContainerCreating", "PodInitializing"})


def awaiting_sandbox(pod: Mapping[str, Any]) -> bool:
    """Bound to a node, not settled, and with no sign yet that its sandbox is up: no
    PodReadyToStartContainers condition True (pkg/kubelet/status/generate.go), no container
    past ContainerCreating/PodInitializing."""
    if settled(pod):
        return False
    spec, status = as_mapping(pod.get("spec")), as_mapping(pod.get("status"))
    if not spec.get("nodeName") or status.get("phase") not in (None, "", "Pending"):
        return False
    conditions = status.get("conditions")
    for condition in conditions if isinstance(conditions, list) else ():
        condition = as_mapping(condition)
        if condition.get("type") == "PodReadyToStartContainers" and condition.get("status") == "True":
            return False
    for statuses, _ in _STATUSES:
        entries = status.get(statuses)
        for entry in entries if isinstance(entries, list) else ():
            state = as_mapping(as_mapping(entry).get("state"))
            if state.get("running") is not None or state.get("terminated") is not None:
                return False
            reason = as_mapping(state.get("waiting")).get("reason")
            if reason and reason not in _BEFORE_SANDBOX:
                return False
    return True
