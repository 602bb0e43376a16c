"""Which nodes a pod can land on, decided as kube-scheduler's filter plugins decide it.

Covers NodeUnschedulable, NodeName, TaintToleration and NodeAffinity, checked in the
scheduler's default plugin order; the first plugin that rejects a node gives the reason,
worded as kube-scheduler words it. A pod that names its node is admitted by the kubelet instead.
Matching follows k8s.io/component-helpers (scheduling/corev1 and its nodeaffinity package) and
k8s.io/apimachinery labels.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from image_preflight.errors import InputError

NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"
TAINT_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"

REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_NODE_NAME = "node(s) didn't match the requested node name"
REASON_AFFINITY = "node(s) didn't match Pod's node affinity/selector"

_REQUIRED_PATH = ".affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"


class SchedulingSpecError(InputError):
    """A pod spec or node object whose scheduling fields cannot be read (wrong types)."""


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = ""  # NoSchedule | PreferNoSchedule | NoExecute


_UNSCHEDULABLE_TAINT = Taint(TAINT_UNSCHEDULABLE, "", NO_SCHEDULE)


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""  # empty: every key
    operator: str = ""  # empty means Equal
    value: str = ""
    effect: str = ""  # empty: every effect

    def tolerates(self, taint: Taint) -> bool:
        """Toleration.ToleratesTaint from k8s.io/api/core/v1."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator in ("", "Equal"):
            return self.value == taint.value
        # Exists ignores the value (the apiserver rejects Exists with a value). Lt/Gt sit behind an
        # alpha feature gate that is off by default, so like any other operator they tolerate nothing.
        return self.operator == "Exists"


def _tolerated(tolerations: tuple[Toleration, ...], taint: Taint) -> bool:
    for toleration in tolerations:
        if toleration.tolerates(taint):
            return True
    return False


@dataclass(frozen=True, slots=True)
class NodeTraits:
    """The parts of a Node the filters read."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict, hash=False)  # read-only copy
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", MappingProxyType(dict(self.labels)))
        object.__setattr__(self, "taints", tuple(self.taints))

    @classmethod
    def from_node(cls, node: Mapping[str, Any]) -> NodeTraits:
        """From a Node object as the API serves it; absent or null fields take their zero value."""
        if not isinstance(node, Mapping):
            raise SchedulingSpecError(f"node: expected a mapping, got {type(node).__name__}")
        meta = _get(node, "metadata", Mapping, "node: metadata", {})
        name = _get(meta, "name", str, "node: metadata.name", "")
        where = f"node {name}: " if name else "node: "
        labels = parse_string_map(meta, "labels", where + "metadata.labels")
        spec = _get(node, "spec", Mapping, where + "spec", {})
        taints = tuple(
            Taint(
                _get(item, "key", str, path + ".key", ""),
                _get(item, "value", str, path + ".value", ""),
                _get(item, "effect", str, path + ".effect", ""),
            )
            for path, item in _items(spec, "taints", where + "spec.taints")
        )
        unschedulable = _get(spec, "unschedulable", bool, where + "spec.unschedulable", False)
        return cls(name, labels, taints, unschedulable)


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    """One valid matchExpressions entry."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: frozenset[str] = frozenset()  # In, NotIn
    bound: int = 0  # Gt, Lt

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        if op == "Exists":
            return self.key in labels
        if op == "DoesNotExist":
            return self.key not in labels
        value = labels.get(self.key)
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        number = None if value is None else _parse_int64(value)
        if number is None:  # absent or not an integer: Gt/Lt never match
            return False
        return number > self.bound if op == "Gt" else number < self.bound


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    """One valid matchFields entry: In or NotIn with exactly one value."""

    key: str
    operator: str  # In | NotIn
    value: str

    def matches(self, node_name: str) -> bool:
        # The scheduler exposes only metadata.name; any other key reads as "" (the apiserver
        # rejects other keys, so they do not occur in admitted objects).
        got = node_name if self.key == "metadata.name" else ""
        return (got == self.value) == (self.operator == "In")


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """A valid, non-empty nodeSelectorTerm: all its requirements must hold."""

    match_expressions: tuple[LabelRequirement, ...] = ()
    match_fields: tuple[FieldRequirement, ...] = ()

    def matches(self, node: NodeTraits) -> bool:
        labels = node.labels
        for requirement in self.match_expressions:
            if not requirement.matches(labels):
                return False
        # Upstream skips matchFields for a node without a name.
        if node.name:
            for field in self.match_fields:
                if not field.matches(node.name):
                    return False
        return True


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """The scheduling-relevant part of a pod spec, parsed once."""

    node_name: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)  # read-only copy
    # None: no required node affinity. Otherwise the valid non-empty terms, ORed; () matches nothing.
    required_terms: tuple[NodeSelectorTerm, ...] | None = None
    tolerations: tuple[Toleration, ...] = ()
    # Why terms were dropped: kube-scheduler treats a term with an invalid requirement
    # (LazyErrorNodeSelector parse error) as matching no node instead of failing the pod.
    term_errors: tuple[str, ...] = ()
    host_network: bool = False
    daemon: bool = False  # a DaemonSet's template: its controller places the pods (see as_daemon)
    runtime_class: str | None = None  # spec.runtimeClassName (see core.runtime_classes)

    def __post_init__(self) -> None:
        object.__setattr__(self, "node_selector", MappingProxyType(dict(self.node_selector)))
        object.__setattr__(self, "tolerations", tuple(self.tolerations))
        if self.required_terms is not None:
            object.__setattr__(self, "required_terms", tuple(self.required_terms))

    @classmethod
    def from_pod_spec(cls, spec: Mapping[str, Any], *, path: str = "spec", admitted: bool = False) -> PodPlacement:
        """Parse a PodSpec; `path` names it in errors (e.g. "spec.template.spec" for a Job).

        Raises SchedulingSpecError only for fields of the wrong type, which the apiserver
        could not decode either. Invalid but readable selectors are kept as upstream keeps
        them: the affected term matches no node, and its problems land in term_errors.
        """
        if not isinstance(spec, Mapping):
            raise SchedulingSpecError(f"{path}: expected a mapping, got {type(spec).__name__}")
        node_name = _get(spec, "nodeName", str, path + ".nodeName", "") or None
        node_selector = parse_string_map(spec, "nodeSelector", path + ".nodeSelector")
        tolerations = parse_tolerations(spec, path + ".tolerations")
        if admitted:  # as_admitted, without building the placement twice
            tolerations += ADMISSION_TOLERATIONS
        affinity = _get(spec, "affinity", Mapping, path + ".affinity", {})
        node_affinity = _get(affinity, "nodeAffinity", Mapping, path + ".affinity.nodeAffinity", {})
        required = _get(
            node_affinity, "requiredDuringSchedulingIgnoredDuringExecution", Mapping, path + _REQUIRED_PATH, None
        )
        terms: tuple[NodeSelectorTerm, ...] | None = None
        errors: list[str] = []
        if required is not None:
            terms = _compile_terms(required, path + _REQUIRED_PATH, errors)
        host_network = _get(spec, "hostNetwork", bool, path + ".hostNetwork", False)
        runtime_class = _get(spec, "runtimeClassName", str, path + ".runtimeClassName", "") or None
        return cls(node_name, node_selector, terms, tolerations, tuple(errors), host_network,
                   runtime_class=runtime_class)


# plugin/pkg/admission/defaulttolerationseconds/admission.go (on by default): every Pod is admitted
# tolerating these NoExecute taints for 300 s, so a node that carries only them still takes it.
ADMISSION_TOLERATIONS = (
    Toleration("node.kubernetes.io/not-ready", "Exists", "", NO_EXECUTE),
    Toleration("node.kubernetes.io/unreachable", "Exists", "", NO_EXECUTE),
)


def as_admitted(placement: PodPlacement) -> PodPlacement:
    """The placement of the Pod the apiserver will store: a workload's template, or a Pod seen
    before admission, gains the default tolerations (a duplicate tolerates nothing new)."""
    return replace(placement, tolerations=placement.tolerations + ADMISSION_TOLERATIONS)


# pkg/controller/daemon/util/daemonset_util.go, AddOrUpdateDaemonPodTolerations: every daemon pod.
DAEMON_TOLERATIONS = (
    Toleration("node.kubernetes.io/not-ready", "Exists", "", NO_EXECUTE),
    Toleration("node.kubernetes.io/unreachable", "Exists", "", NO_EXECUTE),
    Toleration("node.kubernetes.io/disk-pressure", "Exists", "", NO_SCHEDULE),
    Toleration("node.kubernetes.io/memory-pressure", "Exists", "", NO_SCHEDULE),
    Toleration("node.kubernetes.io/pid-pressure", "Exists", "", NO_SCHEDULE),
    Toleration(TAINT_UNSCHEDULABLE, "Exists", "", NO_SCHEDULE),
)
# ... and, with hostNetwork, this one.
DAEMON_HOST_NETWORK_TOLERATION = Toleration("node.kubernetes.io/network-unavailable", "Exists", "", NO_SCHEDULE)


def as_daemon(placement: PodPlacement) -> PodPlacement:
    """The placement of a DaemonSet's pods: its controller puts one on every node it should run
    on (see unschedulable_reason), whatever the scheduler would say."""
    return replace(placement, daemon=True)


def unschedulable_reason(placement: PodPlacement, node: NodeTraits) -> str | None:
    """None when the pod can land on the node, else kube-scheduler's reason for the first failing filter."""
    if placement.daemon:
        return _daemon_reason(placement, node)
    if placement.node_name is not None:
        return _kubelet_admission_reason(placement, node)
    tolerations = placement.tolerations
    # NodeUnschedulable: a pod tolerating the unschedulable taint also tolerates spec.unschedulable.
    if node.unschedulable and not _tolerated(tolerations, _UNSCHEDULABLE_TAINT):
        return REASON_UNSCHEDULABLE
    # PreferNoSchedule only lowers a node's score; it never filters.
    reason = _untolerated_taint(node, tolerations, _FILTERED_EFFECTS)
    if reason is None and not _affinity_matches(placement, node):
        return REASON_AFFINITY
    return reason


def _daemon_reason(placement: PodPlacement, node: NodeTraits) -> str | None:
    """pkg/controller/daemon/daemon_controller.go, NodeShouldRunDaemonPod: the template's node name,
    node affinity and selector, and NoSchedule/NoExecute taints against the template's tolerations
    plus the daemon defaults (which tolerate a cordon)."""
    if placement.node_name is not None and placement.node_name != node.name:
        return REASON_NODE_NAME
    if not _affinity_matches(placement, node):
        return REASON_AFFINITY
    tolerations = placement.tolerations + DAEMON_TOLERATIONS
    if placement.host_network:
        tolerations += (DAEMON_HOST_NETWORK_TOLERATION,)
    return _untolerated_taint(node, tolerations, _FILTERED_EFFECTS)


def _kubelet_admission_reason(placement: PodPlacement, node: NodeTraits) -> str | None:
    """A pod with spec.nodeName skips the scheduler: the kubelet admits it (pkg/kubelet/lifecycle/
    predicate.go, generalFilter: scheduler.AdmissionCheck, then NoExecute taints). A cordon or a
    NoSchedule taint does not keep it off the node, so the node's images still decide."""
    if not _affinity_matches(placement, node):
        return REASON_AFFINITY
    if placement.node_name != node.name:
        return REASON_NODE_NAME
    return _untolerated_taint(node, placement.tolerations, (NO_EXECUTE,))


_FILTERED_EFFECTS = (NO_SCHEDULE, NO_EXECUTE)


def _untolerated_taint(node: NodeTraits, tolerations: tuple[Toleration, ...], effects: tuple[str, ...]) -> str | None:
    """The reason for the node's first taint of these effects that no toleration tolerates."""
    for taint in node.taints:
        if taint.effect in effects and not _tolerated(tolerations, taint):
            return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"
    return None


def _affinity_matches(placement: PodPlacement, node: NodeTraits) -> bool:
    labels = node.labels
    for key, value in placement.node_selector.items():
        if labels.get(key) != value:
            return False
    terms = placement.required_terms
    if terms is None:
        return True
    for term in terms:
        if term.matches(node):
            return True
    return False


# --- parsing -------------------------------------------------------------------------------------

_LABEL_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})
# k8s.io/apimachinery/pkg/util/validation: IsQualifiedName, IsDNS1123Subdomain, IsValidLabelValue.
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_DECIMAL = re.compile(r"[+-]?[0-9]+")  # what Go's strconv.ParseInt(s, 10, 64) accepts
_KINDS = {str: "a string", Mapping: "a mapping", bool: "true or false", (list, tuple): "a list"}
_PLAIN = {str: (str,), Mapping: (dict,), bool: (bool,), (list, tuple): (list, tuple)}


def _check(value: Any, kind: Any, path: str, default: Any) -> Any:
    """`value` if of `kind`; null reads as `default`, the zero value the apiserver decodes it to."""
    if value is None:
        return default
    # JSON gives plain dicts and lists: the exact type test spares the ABC check on the hot path.
    if type(value) not in _PLAIN.get(kind, ()) and not isinstance(value, kind):
        raise SchedulingSpecError(f"{path}: expected {_KINDS[kind]}, got {type(value).__name__}")
    return value


def _get(obj: Mapping[str, Any], key: str, kind: Any, path: str, default: Any) -> Any:
    return _check(obj.get(key), kind, path, default)


def parse_string_map(obj: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
    """`obj[key]` as a map of strings (a nodeSelector, labels); null or absent is empty."""
    found = _get(obj, key, Mapping, path, {})
    for k, v in found.items():
        if not isinstance(k, str):
            raise SchedulingSpecError(f"{path}: key {k!r}: expected a string, got {type(k).__name__}")
        if not isinstance(v, str):
            raise SchedulingSpecError(f"{path}.{k}: expected a string, got {type(v).__name__}")
    return dict(found)


def _string_list(obj: Mapping[str, Any], key: str, path: str) -> list[str]:
    found = _get(obj, key, (list, tuple), path, ())
    for i, item in enumerate(found):
        if not isinstance(item, str):
            raise SchedulingSpecError(f"{path}[{i}]: expected a string, got {type(item).__name__}")
    return list(found)


def _items(obj: Mapping[str, Any], key: str, path: str) -> list[tuple[str, Mapping[str, Any]]]:
    """List entries with their paths."""
    found = _get(obj, key, (list, tuple), path, ())
    return [(f"{path}[{i}]", _check(item, Mapping, f"{path}[{i}]", {})) for i, item in enumerate(found)]


def parse_tolerations(obj: Mapping[str, Any], path: str) -> tuple[Toleration, ...]:
    """The `tolerations` list of `obj` (a pod spec, a RuntimeClass's scheduling); `path` names it."""
    return tuple(_toleration(item, p) for p, item in _items(obj, "tolerations", path))


def _toleration(item: Mapping[str, Any], path: str) -> Toleration:
    return Toleration(
        _get(item, "key", str, path + ".key", ""),
        _get(item, "operator", str, path + ".operator", ""),
        _get(item, "value", str, path + ".value", ""),
        _get(item, "effect", str, path + ".effect", ""),
    )


def _parse_int64(text: str) -> int | None:
    if not _DECIMAL.fullmatch(text):
        return None
    # Leading zeros are fine for ParseInt; past 19 significant digits no int64 fits (and int()
    # would refuse thousands of them).
    digits = text.lstrip("+-").lstrip("0") or "0"
    if len(digits) > 19:
        return None
    number = -int(digits) if text.startswith("-") else int(digits)
    return number if -(2**63) <= number < 2**63 else None


def _is_label_key(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or "/" in prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return False
    return 0 < len(name) <= 63 and _QUALIFIED_NAME.fullmatch(name) is not None


def _is_label_value(value: str) -> bool:
    return len(value) <= 63 and _LABEL_VALUE.fullmatch(value) is not None


def _compile_terms(required: Mapping[str, Any], path: str, errors: list[str]) -> tuple[NodeSelectorTerm, ...]:
    terms = []
    for term_path, term in _items(required, "nodeSelectorTerms", path + ".nodeSelectorTerms"):
        expressions = _items(term, "matchExpressions", term_path + ".matchExpressions")
        fields = _items(term, "matchFields", term_path + ".matchFields")
        if not expressions and not fields:
            continue  # an empty term selects no node
        term_errors: list[str] = []
        labels = [_label_requirement(e, p, term_errors) for p, e in expressions]
        field_reqs = [_field_requirement(e, p, term_errors) for p, e in fields]
        if term_errors:
            errors.extend(term_errors)
            continue  # one invalid requirement makes the whole term match nothing
        # Without errors, every requirement is there.
        terms.append(NodeSelectorTerm(tuple(r for r in labels if r is not None),
                                      tuple(r for r in field_reqs if r is not None)))
    return tuple(terms)


def _label_requirement(expr: Mapping[str, Any], path: str, errors: list[str]) -> LabelRequirement | None:
    """labels.NewRequirement's checks; problems go to `errors`."""
    key = _get(expr, "key", str, path + ".key", "")
    op = _get(expr, "operator", str, path + ".operator", "")
    values = _string_list(expr, "values", path + ".values")
    if op not in _LABEL_OPERATORS:
        errors.append(f"{path}.operator: {op!r} is not supported")
        return None
    found = len(errors)
    if not _is_label_key(key):
        errors.append(f"{path}.key: {key!r} is not a valid label key")
    if op in ("In", "NotIn") and not values:
        errors.append(f"{path}.values: must not be empty for '{op}'")
    elif op in ("Exists", "DoesNotExist") and values:
        errors.append(f"{path}.values: must be empty for '{op}'")
    elif op in ("Gt", "Lt"):
        if len(values) != 1:
            errors.append(f"{path}.values: '{op}' takes exactly one value, got {len(values)}")
        for i, value in enumerate(values):
            if _parse_int64(value) is None:
                errors.append(f"{path}.values[{i}]: {value!r} is not an integer")
    for i, value in enumerate(values):
        if not _is_label_value(value):
            errors.append(f"{path}.values[{i}]: {value!r} is not a valid label value")
    if len(errors) > found:
        return None
    if op in ("Gt", "Lt"):
        return LabelRequirement(key, op, bound=int(values[0]))
    return LabelRequirement(key, op, frozenset(values))


def _field_requirement(expr: Mapping[str, Any], path: str, errors: list[str]) -> FieldRequirement | None:
    key = _get(expr, "key", str, path + ".key", "")
    op = _get(expr, "operator", str, path + ".operator", "")
    values = _string_list(expr, "values", path + ".values")
    if op not in ("In", "NotIn"):
        errors.append(f"{path}.operator: {op!r} is not supported for matchFields")
        return None
    if len(values) != 1:
        errors.append(f"{path}.values: must have one element, got {len(values)}")
        return None
    return FieldRequirement(key, op, values[0])
