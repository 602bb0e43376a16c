"""The pod spec inside a workload object, and the images its containers would pull."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from image_preflight.core.decide.references import InvalidReference, parse_normalized
from image_preflight.core.objects import as_mapping, is_mapping
from image_preflight.errors import InputError

ALWAYS, IF_NOT_PRESENT, NEVER = "Always", "IfNotPresent", "Never"
PULL_POLICIES = (ALWAYS, IF_NOT_PRESENT, NEVER)
CONTAINER_FIELDS = ("initContainers", "containers", "ephemeralContainers")
VOLUMES = "volumes"  # image volumes (volumes[].image, on by default from 1.35) are pulled like containers
# What image_preflight.core.decide.scheduling reads (hostNetwork: a DaemonSet's extra toleration).
SCHEDULING_FIELDS = ("nodeName", "nodeSelector", "affinity", "tolerations", "runtimeClassName", "hostNetwork")

# Where each kind keeps its pod spec (apps/v1, batch/v1, core/v1).
_POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": ("spec",),
    "PodTemplate": ("template", "spec"),
    "Job": ("spec", "template", "spec"),
    "Deployment": ("spec", "template", "spec"),
    "StatefulSet": ("spec", "template", "spec"),
    "DaemonSet": ("spec", "template", "spec"),
    "ReplicaSet": ("spec", "template", "spec"),
    "ReplicationController": ("spec", "template", "spec"),
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
}
WORKLOAD_KINDS = frozenset(_POD_SPEC_PATHS)


class WorkloadError(InputError):
    """The object cannot be read as a workload; the message names the field."""


@dataclass(frozen=True, slots=True)
class ContainerImage:
    container: str  # container name, or volume name for an image volume
    field: str  # "containers", "initContainers", "ephemeralContainers" or "volumes"
    image: str  # as written in the spec
    pull_policy: str  # effective policy: declared, or defaulted as the apiserver does

    @property
    def label(self) -> str:
        """How messages name where the image is used: "container 'agent'" or "volume 'tools'"."""
        return f"{'volume' if self.field == VOLUMES else 'container'} {self.container!r}"

    @property
    def node_dependent(self) -> bool:
        """Only IfNotPresent and Never consult what the node already holds."""
        return self.pull_policy != ALWAYS


def default_pull_policy(image: str) -> str:
    """The apiserver's defaulting: Always for ':latest' or no tag, else IfNotPresent.

    Mirrors pkg/apis/core/v1/defaults.go, which looks at the tag parsed by
    ParseNormalizedNamed ('img:latest@sha256:...' is Always; 'img@sha256:...' is not).
    It ignores parse errors: an unparseable image has tag "" and gets IfNotPresent.
    """
    try:
        ref = parse_normalized(image)
    except InvalidReference:
        return IF_NOT_PRESENT
    if ref.tag == "latest" or (ref.tag is None and ref.digest is None):
        return ALWAYS
    return IF_NOT_PRESENT


def pod_spec_of(obj: object) -> Mapping[str, Any]:
    """The pod spec of a workload object; WorkloadError names the missing field."""
    if not is_mapping(obj):
        raise WorkloadError("object: not a mapping")
    kind = obj.get("kind")
    path = _POD_SPEC_PATHS.get(kind) if isinstance(kind, str) else None
    if path is None:
        raise WorkloadError(f"kind: {kind!r} is not a workload kind")
    node = obj
    walked = []
    for key in path:
        walked.append(key)
        child = node.get(key)
        if not is_mapping(child):
            raise WorkloadError(f"{'.'.join(walked)}: missing or not a mapping in {kind}")
        node = child
    return node


def container_images(spec: Mapping[str, Any]) -> list[ContainerImage]:
    """Every image the pod pulls, with its effective pull policy: init, regular and ephemeral
    containers, then image volumes."""
    found: list[ContainerImage] = []
    for field in CONTAINER_FIELDS:
        for index, container in _entries(spec, field):
            if type(container) is not dict and not isinstance(container, Mapping):
                raise WorkloadError(f"spec.{field}[{index}]: not a mapping")
            found.append(_image(f"spec.{field}[{index}]", container, "image", "imagePullPolicy",
                                field, container.get("name"), index))
    # The kubelet pulls an image volume's reference as it pulls a container's image, with the same
    # pull-policy defaulting (pkg/apis/core/v1/defaults.go, SetDefaults_Volume). It pulls every one
    # before it starts a container, but a failed pull holds back only the containers that mount that
    # volume (pkg/kubelet/kuberuntime/kuberuntime_manager.go, getImageVolumes and
    # toKubeContainerImageVolumes): one no container mounts makes no pod wait.
    mounted: set[str] | None = None  # read at the first image volume: most pods have none
    for index, entry in _entries(spec, VOLUMES):
        volume = as_mapping(entry)
        source = volume.get("image")
        if source is None:
            continue
        where = f"spec.{VOLUMES}[{index}].image"
        if not isinstance(source, Mapping):
            raise WorkloadError(f"{where}: not a mapping")
        image = _image(where, source, "reference", "pullPolicy", VOLUMES, volume.get("name"), index)
        if mounted is None:
            mounted = _mounted(spec)
        if volume.get("name") in mounted:
            found.append(image)
    return found


def _mounted(spec: Mapping[str, Any]) -> set[str]:
    """The names of the volumes some container of the pod mounts."""
    names = set()
    for field in CONTAINER_FIELDS:
        for _, container in _entries(spec, field):
            mounts = container.get("volumeMounts") if isinstance(container, Mapping) else None
            for mount in mounts if isinstance(mounts, list) else ():
                if isinstance(mount, Mapping) and isinstance(mount.get("name"), str):
                    names.add(mount["name"])
    return names


def deciding_fields(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Exactly what a decision reads of a pod spec, as a pod spec: each container's name, image and
    pull policy; each volume's name and image source, a volume without one as {} (read as none,
    kept in its place: messages number volumes); the scheduling fields. Names are read: they label
    the decision's messages. Specs with equal deciding fields get equal decisions, messages
    included, and deciding this pod spec decides the whole one. Malformed values are kept as they
    are, to be decided as such."""
    fields: dict[str, Any] = {}
    volumes = spec.get(VOLUMES)
    if VOLUMES in spec:
        fields[VOLUMES] = [_image_volume(v) for v in volumes] if isinstance(volumes, list) else volumes
    # Which volumes the containers mount matters only when one of them is an image volume.
    mounts = VOLUMES in spec and (not isinstance(volumes, list) or any(fields[VOLUMES]))
    for field in CONTAINER_FIELDS:
        if field in spec:
            fields[field] = _only(spec[field], ("name", "image", "imagePullPolicy"), mounts=mounts)
    for field in SCHEDULING_FIELDS:
        if field in spec:
            fields[field] = spec[field]
    return fields


def _only(items: object, keys: tuple[str, ...], *, mounts: bool) -> object:
    """Each container's `keys`, and with `mounts` the names of the volumes it mounts."""
    if not isinstance(items, list):
        return items
    kept = [{k: item[k] for k in keys if k in item} if isinstance(item, Mapping) else item for item in items]
    if mounts:
        for item, only in zip(items, kept):
            if isinstance(item, Mapping) and "volumeMounts" in item:
                listed = item["volumeMounts"]
                only["volumeMounts"] = ([{"name": m.get("name")} if isinstance(m, Mapping) else m for m in listed]
                                        if isinstance(listed, list) else listed)
    return kept


def _image_volume(volume: object) -> dict[str, Any]:
    """What container_images reads of a volume: its name and image source, or nothing."""
    if not isinstance(volume, Mapping) or volume.get("image") is None:
        return {}
    return {k: volume[k] for k in ("name", "image") if k in volume}


def _entries(spec: Mapping[str, Any], field: str) -> list[tuple[int, object]]:
    items = spec.get(field) or []
    if not isinstance(items, list):
        raise WorkloadError(f"spec.{field}: not a list")
    return list(enumerate(items))


def _image(where: str, source: Mapping[str, Any], image_key: str, policy_key: str, field: str, name: object,
           index: int) -> ContainerImage:
    image = source.get(image_key)
    if not isinstance(image, str) or not image:
        raise WorkloadError(f"{where}.{image_key}: missing or not a string")
    policy = source.get(policy_key) or default_pull_policy(image)
    if policy not in PULL_POLICIES:
        raise WorkloadError(f"{where}.{policy_key}: {policy!r} is not one of {', '.join(PULL_POLICIES)}")
    return ContainerImage(str(name) if name else f"#{index}", field, image, policy)
