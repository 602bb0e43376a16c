"""The doctor's judgements: plain API objects in, one Finding per thing a user should know out.
No I/O here; image_preflight.doctor.cluster gathers what these read."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from image_preflight.core import write_policies
from image_preflight.core.decide.inventory import CLOCK_SKEW_S, NodeImages
from image_preflight.core.decide.scheduling import NodeTraits, PodPlacement, as_admitted, unschedulable_reason
from image_preflight.core.image_gc import pinning
from image_preflight.core.sources.node_status import node_images_from_node
from image_preflight.core.sources.runtime_lists import node_images_from_runtime, renewals, renewed
from image_preflight.core.watchdog.pull_failures import reference_of

# As the chart (deploy/chart/image-preflight) names them.
WEBHOOK_NAME = "validate.image-preflight.io"
ENFORCE_LABEL = "image-preflight.io/enforce"
OK, PROBLEM, SKIPPED = "ok", "problem", "skipped"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_LABEL = "nvidia.com/gpu.present"
EXPIRY_WARNING_S = 7 * 24 * 3600
RELEASE_NAMESPACE = "image-preflight"  # the chart's install (INSTALL)
# The chart's commands, from a clone of the repository (docs/quickstart.md).
INSTALL = ("helm install image-preflight deploy/chart/image-preflight --namespace image-preflight "
           "--create-namespace")


def helm_upgrade(namespace: str, *settings: str) -> str:
    """The upgrade that changes `settings` (chart values, KEY=VALUE) and keeps the rest."""
    return (f"helm upgrade image-preflight deploy/chart/image-preflight --namespace {namespace} --reuse-values"
            + "".join(f" --set {setting}" for setting in settings))


AGENT_APPLY = helm_upgrade("image-preflight", "agent.enabled=true")


@dataclass(frozen=True, slots=True)
class WritePolicy:
    """A face whose RBAC reaches further than its writes, and the chart's policy that narrows them."""

    face: str
    role: str  # its ClusterRole: there when the face is installed
    name: str  # the ValidatingAdmissionPolicy and its binding
    unguarded: str  # what its token could do without them
    settings: tuple[str, ...] = ()  # the chart's values that render them


# As the chart names them (templates/agent/policy.yaml, templates/watchdog/policy.yaml).
WRITE_POLICIES = (
    WritePolicy("the node agent", "image-preflight-agent", "image-preflight-agent-own-node",
                "any agent's token may write every node's NodeImages", ("agent.nodeRestriction.enabled=true",)),
    WritePolicy("the watchdog", "image-preflight-watchdog", "image-preflight-watchdog-writes",
                "its token may patch any Job and create Pods in any namespace (and it does not start)"),
)


@dataclass(frozen=True, slots=True)
class Finding:
    status: str  # OK, PROBLEM or SKIPPED
    text: str
    fix: str = ""  # the command that fixes it

    def line(self) -> str:
        return f"{self.status}: {self.text}" + (f"; fix: {self.fix}" if self.fix else "")


@dataclass(frozen=True, slots=True)
class WebhookTarget:
    """Where the apiserver sends reviews, from the ValidatingWebhookConfiguration."""

    configuration: str
    namespace: str
    service: str
    port: int
    ca_bundle: bytes  # PEM; empty when not set
    namespace_selector: Mapping[str, Any]
    failure_policy: str

    @property
    def server_name(self) -> str:
        """The name the apiserver verifies the serving certificate for."""
        return f"{self.service}.{self.namespace}.svc"


def webhook_configuration(configurations: Sequence[Mapping[str, Any]]) -> tuple[list[Finding], WebhookTarget | None]:
    for configuration in configurations:
        for webhook in configuration.get("webhooks") or ():
            if webhook.get("name") != WEBHOOK_NAME:
                continue
            name = (configuration.get("metadata") or {}).get("name", "?")
            client = webhook.get("clientConfig") or {}
            service = client.get("service") or {}
            if not service:
                return [Finding(PROBLEM, f"ValidatingWebhookConfiguration {name} calls a URL, not a Service: "
                                "the doctor checks the chart's deployment", INSTALL)], None
            try:
                ca_bundle = base64.b64decode(client.get("caBundle") or "", validate=True)
            except (binascii.Error, ValueError):
                ca_bundle = b""
            target = WebhookTarget(name, service.get("namespace", ""), service.get("name", ""),
                                   int(service.get("port") or 443), ca_bundle,
                                   webhook.get("namespaceSelector") or {}, webhook.get("failurePolicy") or "Fail")
            found = [Finding(OK, f"ValidatingWebhookConfiguration {name} sends reviews to Service "
                             f"{target.namespace}/{target.service}:{target.port} "
                             f"(failurePolicy {target.failure_policy})")]
            if target.failure_policy == "Fail":
                # Measured with agentlightning 1.0.2 (tests/cluster/test_real_node_agentlightning.py): its
                # controller retries a creation refused without "invalid" for ever, no Job exists.
                found.append(Finding(PROBLEM, f"ValidatingWebhookConfiguration {name} has failurePolicy Fail: while "
                                     "the webhook is away, agent-lightning's rollouts stay queuing with no Job, "
                                     "retried every poll, and training stalls",
                                     helm_upgrade(target.namespace, "webhook.failurePolicy=Ignore",
                                                  "watchdog.enabled=true")
                                     + " (the watchdog fails what an outage lets through)"))
            if not ca_bundle:
                found.append(Finding(PROBLEM, f"ValidatingWebhookConfiguration {name} has no caBundle: the apiserver "
                                     "cannot verify the webhook, so every call fails",
                                     helm_upgrade(target.namespace) + " (certificates.mode generate or cert-manager "
                                     "fills it; with mode secret, set certificates.secret.caBundle)"))
            return found, target
    return [Finding(PROBLEM, f"no ValidatingWebhookConfiguration holds the webhook {WEBHOOK_NAME}: nothing is checked",
                    INSTALL)], None


def write_policy(face: WritePolicy, installed: bool | None,
                 read: tuple[Mapping[str, Any] | None, Mapping[str, Any] | None] | str,
                 namespace: str) -> list[Finding]:
    """`installed`: whether the face's ClusterRole exists (None: not readable); `read`: its policy
    and binding (None where absent), or why they could not be read; `namespace`: the release's."""
    if installed is False:
        return []
    if isinstance(read, str):
        return [Finding(SKIPPED, f"{face.face}'s write policy ({read})")]
    missing = write_policies.problem(face.name, *read)
    if missing is None:
        return [Finding(OK, f"ValidatingAdmissionPolicy {face.name} and its binding (Deny) keep {face.face}'s "
                        "writes to its own")]
    if installed is None:
        return [Finding(SKIPPED, f"{face.face}'s write policy: {missing}, and ClusterRole {face.role} is not "
                        f"readable to tell whether {face.face} is installed")]
    return [Finding(PROBLEM, f"{face.face}'s writes are unguarded: {missing}, so {face.unguarded}",
                    helm_upgrade(namespace, *face.settings))]


# The kubelet's waiting reasons for an image it does not hold and cannot pull
# (pkg/kubelet/images/types.go): for our own image, built and loaded without a registry.
_IMAGE_WAITS = frozenset({"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull"})


def deployment(target: WebhookTarget, ready_endpoints: int | None, replicas: tuple[int, int] | None,
               replica_pods: Sequence[Mapping[str, Any]] = ()) -> list[Finding]:
    """`ready_endpoints`: ready addresses behind the Service (None: not readable); `replicas`:
    the Deployment's (ready, desired), None when absent or unreadable; `replica_pods`: its Pods, each
    not-ready one named with what its containers wait for."""
    pods = f"kubectl -n {target.namespace} describe pods -l app.kubernetes.io/name={target.service}"
    found = []
    if ready_endpoints is None:
        found.append(Finding(SKIPPED, f"the endpoints of Service {target.namespace}/{target.service} (not readable)"))
    elif ready_endpoints == 0:
        what = "admits every object unchecked" if target.failure_policy == "Ignore" else "rejects every checked object"
        found.append(Finding(PROBLEM, f"no ready webhook pod behind Service {target.namespace}/{target.service}: the "
                             f"apiserver cannot call it, and failurePolicy {target.failure_policy} {what}", pods))
    else:
        found.append(Finding(OK, f"{ready_endpoints} ready webhook endpoint(s) behind Service "
                             f"{target.namespace}/{target.service}"))
    if replicas is not None and replicas[0] < replicas[1]:
        found.append(Finding(PROBLEM, f"Deployment {target.namespace}/{target.service}: {replicas[0]} of "
                             f"{replicas[1]} replicas ready", pods))
    found += [f for f in map(_waiting_replica, replica_pods) if f is not None]
    return found


def _waiting_replica(pod: Mapping[str, Any]) -> Finding | None:
    metadata, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if metadata.get("deletionTimestamp") or any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()):
        return None
    where = f"Pod {metadata.get('namespace')}/{metadata.get('name')}"
    node = spec.get("nodeName")
    for container in status.get("containerStatuses") or ():
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if not reason:
            continue
        if reason in _IMAGE_WAITS and node:
            return Finding(PROBLEM, f"{where}: image {container.get('image')} is not on node {node} ({reason}): "
                           "load it there (docs/quickstart.md, step 2)",
                           f"ctr -n k8s.io images import image-preflight.tar   # on node {node}")
        return Finding(PROBLEM, f"{where}: container {container.get('name')} waits ({reason}: "
                       f"{waiting.get('message') or 'no message'})",
                       f"kubectl -n {metadata.get('namespace')} describe pod {metadata.get('name')}")
    return None


def served_certificate(target: WebhookTarget, outcome: tuple[str, str], not_after: float | None,
                       now: float) -> Finding:
    """`outcome`: ("verified", address), ("rejected", why) or ("unreachable", why), from a TLS
    handshake as the apiserver makes it (the caBundle, the Service's DNS name)."""
    kind, detail = outcome
    renew = (f"kubectl -n {target.namespace} get certificate,secret; "
             + helm_upgrade(target.namespace, "certificates.generate.renewBeforeDays=400")
             + " issues a new one (certificates.mode generate; cert-manager renews on its own)")
    if kind == "unreachable":
        return Finding(SKIPPED, f"the certificate the webhook serves was not read ({detail}): run the doctor in the "
                       "cluster, or `kubectl -n NS port-forward svc/NAME 8443:443` and pass --webhook-address "
                       "127.0.0.1:8443")
    if kind == "rejected":
        return Finding(PROBLEM, f"the caBundle of {target.configuration} does not verify the certificate the webhook "
                       f"serves for {target.server_name}: {detail}", renew)
    if not_after is not None and not_after - now < EXPIRY_WARNING_S:
        days = max(0.0, (not_after - now) / 86400)
        return Finding(PROBLEM, f"the webhook's certificate for {target.server_name} expires in {days:.1f} days", renew)
    return Finding(OK, f"the caBundle verifies the certificate served at {detail} for {target.server_name}")


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector against labels (matchLabels and the four operators)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or ():
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or ()
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def _labels(namespace: Mapping[str, Any]) -> dict[str, Any]:
    metadata = namespace.get("metadata") or {}
    # The apiserver sets this label on every namespace; a selector may use it.
    return {**(metadata.get("labels") or {}), "kubernetes.io/metadata.name": metadata.get("name", "")}


def opted_in(namespaces: Sequence[Mapping[str, Any]], target: WebhookTarget) -> list[str]:
    return sorted((n.get("metadata") or {}).get("name", "") for n in namespaces
                  if selects(target.namespace_selector, _labels(n)))


def namespaces(namespaces: Sequence[Mapping[str, Any]], target: WebhookTarget, rollouts: str) -> list[Finding]:
    """`rollouts`: the namespace agent-lightning creates its Jobs in (AGL_NAMESPACE)."""
    chosen = opted_in(namespaces, target)
    shown = ", ".join(chosen[:10]) + (f" and {len(chosen) - 10} more" if len(chosen) > 10 else "")
    found = [Finding(OK if chosen else PROBLEM,
                     f"{len(chosen)} namespace(s) opted in" + (f": {shown}" if chosen else ""),
                     "" if chosen else f"kubectl label namespace {rollouts} {ENFORCE_LABEL}=true")]
    if rollouts not in {(n.get("metadata") or {}).get("name") for n in namespaces}:
        found.append(Finding(PROBLEM, f"namespace {rollouts} (AGL_NAMESPACE) does not exist",
                             f"kubectl create namespace {rollouts}"))
    elif rollouts not in chosen:
        found.append(Finding(PROBLEM, f"namespace {rollouts} (AGL_NAMESPACE), where agent-lightning creates its Jobs, "
                             "is not opted in: its rollouts are not checked",
                             f"kubectl label namespace {rollouts} {ENFORCE_LABEL}=true"))
    elif chosen:
        found[0] = Finding(OK, found[0].text + f", {rollouts} (AGL_NAMESPACE) among them")
    return found


def probe(outcome: tuple[str, str], namespace: str | None) -> Finding:
    """`outcome` of a dry-run Job with an invalid image reference, which the webhook always
    denies: ("denied", message), ("warned", warning), ("admitted", ""), ("error", why)."""
    kind, detail = outcome
    if namespace is None:
        return Finding(SKIPPED, "the end-to-end check (no opted-in namespace to create a dry-run Job in)")
    if kind == "denied":
        return Finding(OK, f"the apiserver calls the webhook: a dry-run Job in {namespace} was denied "
                       f"({detail[:80]}...)")
    if kind == "warned":
        return Finding(OK, f"the apiserver calls the webhook, which only warns (mode warn or audit): {detail[:80]}")
    if kind == "admitted":
        return Finding(PROBLEM, f"a dry-run Job in {namespace} that the webhook must deny was admitted: the apiserver "
                       "did not reach it (Service, pods, or a caBundle that does not verify its certificate)",
                       "kubectl get --raw /metrics | grep apiserver_admission_webhook_request_total")
    return Finding(SKIPPED, f"the end-to-end check in {namespace}: {detail}")


def node_lists(nodes: Sequence[Mapping[str, Any]], published: Sequence[Mapping[str, Any]], caps: Mapping[str, int],
               max_images: int | None, now: float, leases: Sequence[Mapping[str, Any]] = ()) -> list[Finding]:
    """One finding per node: how much its image list proves. `caps`: the kubelets' own
    nodeStatusMaxImages (configz); `max_images`: what is assumed elsewhere; `leases`: the agents'
    Leases, which renew hashed lists."""
    renewed_at = renewals(leases)
    runtime = {}
    found = []
    for obj in published:
        try:
            listed = node_images_from_runtime(obj)
            listed = renewed(listed, renewed_at.get(listed.node))
        except ValueError as exc:
            found.append(Finding(PROBLEM, f"a NodeImages object cannot be read: {exc}"))
            continue
        runtime[listed.node] = listed
    for node in nodes:
        name = (node.get("metadata") or {}).get("name", "?")
        agent = runtime.get(name)
        if agent is not None and agent.conclusive(now):
            count = len(agent.refs)
            found.append(Finding(OK, f"node {name}: complete list from the node agent ({count:,} "
                                     f"name{'' if count == 1 else 's'})"))
        else:
            found.append(_node_list(node, name, agent, caps.get(name), max_images, now))
        missing = agent.lacks_sandbox(now) if agent is not None else None
        if missing is not None:
            found.append(sandbox_image(name, missing))
    return found


# Beyond this many nodes with the same finding that needs nothing done (ok, skipped), doctor says
# so in one line: a fleet's thousands of nodes would otherwise bury its problems. A node with
# anything to fix always has a line of its own.
NODES_LISTED = 20
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def summarized(found: Sequence[Finding]) -> list[Finding]:
    """`found` with each set of more than NODES_LISTED ok or skipped findings that read the same
    but for their node's name and their numbers as one line, where the first of them stood; a
    number that differs among them is given as its range."""
    keys = [_summary_key(finding) for finding in found]
    groups: dict[tuple[str, str, str], list[Finding]] = {}
    for finding, key in zip(found, keys):
        if key is not None:
            groups.setdefault(key, []).append(finding)
    out = []
    for finding, key in zip(found, keys):
        same = groups[key] if key is not None else [finding]
        if len(same) <= NODES_LISTED:
            out.append(finding)
        elif same[0] is finding:
            out.append(_one_line(same))
    return out


def _summary_key(finding: Finding) -> tuple[str, str, str] | None:
    node = _per_node(finding) if finding.status != PROBLEM else None
    return None if node is None else (finding.status, _NUMBER.sub("#", node[1]), finding.fix)


def _one_line(same: Sequence[Finding]) -> Finding:
    nodes = [_per_node(finding) or ("", "") for finding in same]
    names, texts = [name for name, _ in nodes], [text for _, text in nodes]
    ranges = [_range(values) for values in zip(*map(_NUMBER.findall, texts))]
    between = _NUMBER.split(texts[0])
    text = between[0] + "".join(number + after for number, after in zip(ranges, between[1:]))
    return Finding(same[0].status, f"{len(names):,} nodes: {text}: {', '.join(names[:3])} and {len(names) - 3:,} more",
                   same[0].fix)


def _range(values: Sequence[str]) -> str:
    numbers = sorted(set(values), key=lambda value: float(value.replace(",", "")))
    return numbers[0] if len(numbers) == 1 else f"{numbers[0]}-{numbers[-1]}"


def _per_node(finding: Finding) -> tuple[str, str] | None:
    """(node, the rest) of a finding that reads "node NAME: ...", else None."""
    if not finding.text.startswith("node "):
        return None
    name, sep, rest = finding.text[len("node "):].partition(": ")
    return (name, rest) if sep and name and " " not in name else None


# The label containerd's CRI plugin reads as "pinned", which the kubelet's image GC leaves alone.
PINNED_LABEL = f"{pinning.PINNED_LABEL}={pinning.PINNED_VALUE}"


def sandbox_image(node: str, image: str) -> Finding:
    """A node whose runtime lacks its sandbox image, as its node agent reports (spec.sandboxImage).
    containerd labels pinned the image named as its sandbox (2.x `pinned_images.sandbox`, 1.x
    `sandbox_image`: internal/cri/server/images/image_pull.go, getLabels) when it pulls it, and
    when it is imported under that name only since 2.0, 1.7.14 and 1.6.29 (UpdateImage); 1.6
    before .22 never pins it. The label in the fix makes the import safe from the kubelet's image
    GC on every runtime that can pin."""
    ref = reference_of(image)
    return Finding(PROBLEM, f"node {node}: its container runtime lacks its sandbox image {image!r}: no pod can "
                   "start there (each waits in ContainerCreating, Event FailedCreatePodSandBox)",
                   f"on node {node}, ctr -n k8s.io images import pause.tar (the image saved with `ctr -n k8s.io "
                   f"images export pause.tar {ref}` where it is held), then ctr -n k8s.io images label {ref} "
                   f"{PINNED_LABEL} so that image garbage collection keeps it")


def _node_list(node: Mapping[str, Any], name: str, agent: NodeImages | None, cap: int | None, max_images: int | None,
               now: float) -> Finding:
    """A node whose agent's list does not prove all: what its Node status does prove."""
    stale = ""
    if agent is not None and agent.observed_at is not None and agent.observed_at - CLOCK_SKEW_S > now:
        ahead = agent.observed_at - now
        stale = (f"the node agent's list says it was observed {ahead:.0f} s from now (its node's clock runs "
                 "ahead), which proves nothing, and ")
    elif agent is not None:
        ago = now - (agent.expires_at or now)
        stale = f"the node agent's list went stale {ago:.0f} s ago, and "
    in_force = cap if cap is not None else max_images
    source = "from its configz" if cap is not None else "assumed; its configz is not readable"
    try:
        listed = node_images_from_node(node, max_images=in_force)
    except ValueError as exc:
        return Finding(PROBLEM, f"node {name}: {exc}")
    count = len((node.get("status") or {}).get("images") or ())
    fix = (f"kubectl -n image-preflight-agent get pods -o wide --field-selector spec.nodeName={name}" if stale
           else f"{AGENT_APPLY}, or set nodeStatusMaxImages: -1 in the kubelet configuration and pass --max-images -1")
    if listed.over_cap is not None:
        return Finding(PROBLEM, f"node {name}: {stale}node status lists {count} images, more than the cap of "
                       f"{in_force} assumed: its kubelet's nodeStatusMaxImages is higher",
                       "pass the kubelets' value to serve, scan and doctor with --max-images (-1: no cap)")
    if not count:
        return Finding(PROBLEM, f"node {name}: {stale}its kubelet reports no images (it could not list them): "
                       "every image there is unknown", f"kubectl describe node {name}")
    if listed.capped:
        return Finding(PROBLEM, f"node {name}: {stale}node status lists {count} images, at the kubelet's cap of "
                       f"{in_force} ({source}): an image absent from it is unknown, not missing", fix)
    if stale:
        return Finding(PROBLEM, f"node {name}: {stale}node status lists {count} images (complete, under the cap of "
                       f"{'none' if in_force in (None, -1) else in_force}, {source})", fix)
    cap_text = "no cap" if in_force is None or in_force < 0 else f"under the cap of {in_force}"
    if not listed.complete:
        return Finding(PROBLEM, f"node {name}: node status names an image by 5 names or more, so others may be "
                       "cut: absent images are unknown there", AGENT_APPLY)
    return Finding(OK, f"node {name}: complete list in node status ({count} images, {cap_text}, {source})")


def landing(nodes: Sequence[Mapping[str, Any]], node_selector: Mapping[str, str]) -> list[Finding]:
    """Where a rollout pod may land. agent-lightning's template has no nodeSelector and no
    tolerations, so every untainted, schedulable node takes rollouts, GPU nodes too."""
    eligible = eligible_nodes(nodes, node_selector)
    chosen = set(eligible)
    found = [Finding(PROBLEM, f"rollout pods may land on GPU node {name}: no taint keeps them off, "
                     "and it does not build the rollout images",
                     f"kubectl taint node {name} {GPU_RESOURCE}=present:NoSchedule")
             for node, name in zip(nodes, _names(nodes)) if name in chosen and _is_gpu(node)]
    if not eligible:
        return [Finding(PROBLEM, "no node can take a rollout pod (every node is tainted, cordoned or unselected)",
                        "kubectl get nodes -o custom-columns=NAME:.metadata.name,TAINTS:.spec.taints")]
    shown = ", ".join(eligible[:10]) + (f" and {len(eligible) - 10} more" if len(eligible) > 10 else "")
    return [Finding(OK, f"rollout pods may land on {len(eligible)} node(s): {shown}"), *found]


def eligible_nodes(nodes: Sequence[Mapping[str, Any]], node_selector: Mapping[str, str]) -> list[str]:
    """The names of the nodes a rollout pod may land on, in the nodes' order."""
    placement = as_admitted(PodPlacement(node_selector=dict(node_selector)))
    return [traits.name for traits in map(NodeTraits.from_node, nodes)
            if unschedulable_reason(placement, traits) is None]


def _names(nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    return [(node.get("metadata") or {}).get("name", "") for node in nodes]


def _is_gpu(node: Mapping[str, Any]) -> bool:
    status = node.get("status") or {}
    for field in ("capacity", "allocatable"):
        amount = (status.get(field) or {}).get(GPU_RESOURCE)
        if amount not in (None, "0", 0):
            return True
    return ((node.get("metadata") or {}).get("labels") or {}).get(GPU_LABEL) == "true"
