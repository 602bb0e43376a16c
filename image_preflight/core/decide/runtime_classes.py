"""RuntimeClasses: a pod naming one gains its scheduling constraints at admission.

plugin/pkg/admission/runtimeclass/admission.go (on by default), setScheduling: the RuntimeClass's
`scheduling.nodeSelector` is merged into the pod's (a key with another value forbids the pod) and
its tolerations are appended (pkg/util/tolerations.MergeTolerations drops only redundant ones, so
what the pod tolerates is the union). A pod naming a RuntimeClass that does not exist is
forbidden (prepareObjects). The plugin acts on Pods only: a workload's template is merged when
its controller creates the pods.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from image_preflight.core.decide.scheduling import (
    PodPlacement,
    SchedulingSpecError,
    Toleration,
    parse_string_map,
    parse_tolerations,
)
from image_preflight.errors import InputError

KIND = "RuntimeClass"  # node.k8s.io/v1


@dataclass(frozen=True, slots=True)
class RuntimeClassScheduling:
    node_selector: Mapping[str, str] = field(default_factory=dict, hash=False)
    tolerations: tuple[Toleration, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "node_selector", MappingProxyType(dict(self.node_selector)))
        object.__setattr__(self, "tolerations", tuple(self.tolerations))


class RuntimeClassConflict(InputError):
    """The apiserver forbids the pod; the message is the plugin's own."""


def runtime_class_from_object(obj: object, where: str = "RuntimeClass") -> tuple[str, RuntimeClassScheduling]:
    """(name, scheduling) of a RuntimeClass as the API serves it. Raises SchedulingSpecError
    naming the field when it cannot be read."""
    if not isinstance(obj, Mapping):
        raise SchedulingSpecError(f"{where}: expected a mapping, got {type(obj).__name__}")
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        raise SchedulingSpecError(f"{where}: metadata.name: missing or not a string")
    scheduling = obj.get("scheduling")
    if scheduling is None:
        return name, RuntimeClassScheduling()
    path = f"{where} {name}: scheduling"
    if not isinstance(scheduling, Mapping):
        raise SchedulingSpecError(f"{path}: expected a mapping, got {type(scheduling).__name__}")
    return name, RuntimeClassScheduling(
        parse_string_map(scheduling, "nodeSelector", path + ".nodeSelector"),
        parse_tolerations(scheduling, path + ".tolerations"),
    )


def with_runtime_class(placement: PodPlacement, runtime_class: RuntimeClassScheduling) -> PodPlacement:
    """`placement` as admission leaves it (setScheduling). A DaemonSet's controller decides its
    nodes from the template alone (NodeShouldRunDaemonPod), so there the RuntimeClass's tolerations
    add nothing, while its selector still keeps the pod off other nodes at scheduling."""
    selector = dict(placement.node_selector)
    for key, value in runtime_class.node_selector.items():
        if key in selector and selector[key] != value:
            raise RuntimeClassConflict(
                f"conflict: runtimeClass.scheduling.nodeSelector[{key}] = {value}; "
                f"pod.spec.nodeSelector[{key}] = {selector[key]}"
            )
        selector[key] = value
    tolerations = placement.tolerations
    if not placement.daemon:
        tolerations += tuple(t for t in runtime_class.tolerations if t not in tolerations)
    return replace(placement, node_selector=selector, tolerations=tolerations)
