"""Steering: restrict a Pod to the eligible nodes that hold all its node-local images.

Pure. `plan` reads a REQUIRE_ALL decision (core/decide/decision.py) and says whom to steer to, or why
not; `encoded_patch` writes the JSONPatch that ANDs "one of those nodes" into the Pod's required node
affinity, and nothing else.

The requirement is `matchFields: metadata.name In [node]`, one term per node: the apiserver
allows exactly one value for a node field selector (pkg/apis/core/validation/validation.go,
ValidateNodeFieldSelectorRequirement), so "In the holders" is written as one term per holder.
Terms are ORed and requirements within a term ANDed (k8s.io/component-helpers/scheduling/corev1/
nodeaffinity), so (T1 or T2) and (h1 or h2) becomes T1&h1, T1&h2, T2&h1, T2&h2.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from image_preflight.core.decide.decision import INVALID, MISSING, UNKNOWN, Decision, Outcome, holding_nodes
from image_preflight.core.objects import as_mapping, is_mapping

STEERED_TO = "image-preflight.io/steered-to"
# Node names a patch may write. Each is one term of at most ~300 bytes (a 253-character name in
# JSON), so 100 keep the patch near 30 KiB per existing term: far below the apiserver's 3 MiB
# request limit and etcd's 1.5 MiB object limit, and cheap for the scheduler to evaluate.
DEFAULT_MAX_NODES = 100
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
_NAME = "metadata.name"



class NotSteered(StrEnum):
    """Why a Pod is not steered: the decision log line's detail (docs/deploy.md's table)."""

    NODE_NAME = "node-name"
    DAEMON_SET = "daemonset-pod"
    GATED = "scheduling-gates"
    ALL_HOLD = "all-eligible-nodes-hold"
    NONE_HOLD = "no-eligible-node-holds"
    INCOMPLETE = "incomplete-lists"
    NO_ELIGIBLE = "no-eligible-node"
    INVALID_IMAGE = "invalid-image"
    TOO_MANY = "too-many-nodes"


NODE_NAME, DAEMON_SET, GATED = NotSteered.NODE_NAME, NotSteered.DAEMON_SET, NotSteered.GATED
ALL_HOLD, NONE_HOLD, INCOMPLETE = NotSteered.ALL_HOLD, NotSteered.NONE_HOLD, NotSteered.INCOMPLETE
NO_ELIGIBLE, INVALID_IMAGE, TOO_MANY = NotSteered.NO_ELIGIBLE, NotSteered.INVALID_IMAGE, NotSteered.TOO_MANY


@dataclass(frozen=True, slots=True)
class Plan:
    nodes: tuple[str, ...] = ()  # steer to these; empty when not steered
    reason: NotSteered | None = None  # why not, when not

    @property
    def steered(self) -> bool:
        return bool(self.nodes)


def not_steerable(pod: Mapping[str, Any]) -> NotSteered | None:
    """Why a Pod must not be steered whatever the nodes hold, or None."""
    spec = as_mapping(pod.get("spec"))
    if spec.get("nodeName"):
        return NODE_NAME  # placed already: the kubelet admits it, the scheduler never sees it
    if spec.get("schedulingGates"):
        return GATED  # narrowed and released later (Kueue): decided on that UPDATE instead
    metadata = as_mapping(pod.get("metadata"))
    owners = metadata.get("ownerReferences")
    for owner in owners if isinstance(owners, list) else ():
        if is_mapping(owner) and owner.get("controller") is True and owner.get("kind") == "DaemonSet":
            return DAEMON_SET  # pinned to its node by its controller
    return None


def plan(decision: Decision, *, max_nodes: int = DEFAULT_MAX_NODES, terms: int = 1) -> Plan:
    """Whom to steer a Pod decided by `decision` (REQUIRE_ALL) to. `terms` is how many required
    node selector terms it has: each is repeated per node, and the bound counts what is written."""
    statuses = {v.status for v in decision.verdicts}
    if INVALID in statuses:
        return Plan(reason=INVALID_IMAGE)
    if decision.outcome == Outcome.ALLOW:
        return Plan(reason=ALL_HOLD)
    if not decision.eligible:
        return Plan(reason=NO_ELIGIBLE)
    if UNKNOWN in statuses or any(v.unknown_on for v in decision.verdicts):
        return Plan(reason=INCOMPLETE)  # an unconfirmed node is never ruled out
    if MISSING not in statuses and not decision.sandbox_missing:
        return Plan(reason=ALL_HOLD)
    # A node whose runtime lacks its sandbox image starts no pod, whatever the pod's images.
    holders = holding_nodes(decision.verdicts, decision.runnable)
    if not holders:
        return Plan(reason=NONE_HOLD)  # the validating webhook denies it
    if len(holders) * max(terms, 1) > max_nodes:
        return Plan(reason=TOO_MANY)
    return Plan(tuple(holders))


def required_terms(pod: Mapping[str, Any]) -> list[Any] | None:
    """The Pod's required node selector terms, or None when it has none."""
    node_affinity = _path(pod, "spec", "affinity", "nodeAffinity", _REQUIRED)
    terms = node_affinity.get("nodeSelectorTerms") if is_mapping(node_affinity) else None
    return terms if isinstance(terms, list) and terms else None


def encoded_patch(pod: Mapping[str, Any], nodes: tuple[str, ...]) -> str:
    """The JSONPatch, as JSON, restricting `pod` to `nodes` and annotating it. It depends only on
    `nodes` and the shape of the Pod's affinity and annotations, which rollout Pods share:
    remembered by that, it costs a lookup per Pod."""
    existing = required_terms(pod)
    terms_json = None if existing is None else json.dumps(existing, sort_keys=True, default=str)
    affinity_depth = _depth(pod, _AFFINITY_PATH)
    annotated = is_mapping(_path(pod, "metadata", "annotations"))
    if terms_json is not None and len(terms_json) > _REMEMBERED_TERMS:
        return _encoded.__wrapped__(nodes, terms_json, affinity_depth, annotated)  # too big to keep
    return _encoded(nodes, terms_json, affinity_depth, annotated)


_REMEMBERED_TERMS = 4096  # characters of existing terms a remembered patch may be keyed by


_AFFINITY_PATH = ("spec", "affinity", "nodeAffinity", _REQUIRED, "nodeSelectorTerms")


@functools.lru_cache(maxsize=256)
def _encoded(nodes: tuple[str, ...], terms_json: str | None, affinity_depth: int, annotated: bool) -> str:
    pins = [{"key": _NAME, "operator": "In", "values": [node]} for node in nodes]
    if terms_json is None:
        terms = [{"matchFields": [pin]} for pin in pins]
    else:
        existing = json.loads(terms_json)
        terms = [_and(term, pin) for term in existing for pin in pins if _may_match(term, pin["values"][0])]
    ops = [_add(_AFFINITY_PATH, affinity_depth, terms)]
    note = f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"
    ops.append(_add(("metadata", "annotations", STEERED_TO), 3 if annotated else 1, note))
    return json.dumps(ops, separators=(",", ":"))


def _and(term: Mapping[str, Any], pin: dict[str, Any]) -> dict[str, Any]:
    listed = term.get("matchFields")
    fields = listed if isinstance(listed, list) else []
    if pin in fields:
        return dict(term)
    return {**term, "matchFields": [*fields, pin]}


def _may_match(term: object, node: str) -> bool:
    """False when `term` can match no node, or only other nodes than `node`: that pair is dropped.
    An empty term matches nothing (nodeaffinity: "a null or empty term matches no objects")."""
    if not isinstance(term, Mapping) or not (term.get("matchExpressions") or term.get("matchFields")):
        return False
    for requirement in term.get("matchFields") or ():
        if not isinstance(requirement, Mapping) or requirement.get("key") != _NAME:
            continue
        listed = requirement.get("values")
        values = listed if isinstance(listed, list) else []
        if requirement.get("operator") == "In" and node not in values:
            return False
        if requirement.get("operator") == "NotIn" and node in values:
            return False
    return True


def _path(obj: object, *keys: str) -> object:
    for key in keys:
        if not is_mapping(obj):
            return None
        obj = obj.get(key)
    return obj


def _depth(obj: object, keys: tuple[str, ...]) -> int:
    """How many leading `keys` lead to objects, up to the parent of the last."""
    for depth, key in enumerate(keys[:-1]):
        obj = obj.get(key) if is_mapping(obj) else None
        if not is_mapping(obj):
            return depth
    return len(keys) - 1


def _add(keys: tuple[str, ...], present: int, value: object) -> dict[str, Any]:
    """One `add` at the first absent level (`present` levels are objects), carrying the rest nested."""
    last = min(present, len(keys) - 1)
    for inner in reversed(keys[last + 1:]):
        value = {inner: value}
    pointer = "/" + "/".join(key.replace("~", "~0").replace("/", "~1") for key in keys[:last + 1])
    return {"op": "add", "path": pointer, "value": value}
