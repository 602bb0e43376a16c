"""The verdict: can a pod spec's node-local images be found where the pod may land?"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from image_preflight.core.decide.inventory import Inventory, NodeImages, image_key, is_image_id
from image_preflight.core.decide.memory import Memory, window
from image_preflight.core.decide.references import InvalidReference
from image_preflight.core.decide.runtime_classes import RuntimeClassConflict, with_runtime_class
from image_preflight.core.decide.scheduling import PodPlacement, as_daemon, unschedulable_reason
from image_preflight.core.decide.workloads import ContainerImage, container_images

if TYPE_CHECKING:  # numpy is loaded by the first placement found, not by the faces that only parse flags
    import numpy as np



class ImageStatus(StrEnum):
    """What one node-local image is on the nodes the pod may land on."""

    PRESENT = "present"
    MISSING = "missing"
    UNKNOWN = "unknown"
    NOT_CHECKED = "not-checked"
    INVALID = "invalid"


class Outcome(StrEnum):
    """A decision's outcome for the whole pod. Written Outcome.X everywhere: the bare names (UNKNOWN,
    MISSING, ...) are an image's statuses."""

    ALLOW = "allow"
    DENY = "deny"
    UNKNOWN = "unknown"
    NO_ELIGIBLE_NODE = "no-eligible-node"


class Requirement(StrEnum):
    """Where the images must be."""

    ALL = "all"  # every eligible node holds every image (where the pod lands is the scheduler's choice)
    ANY = "any"  # each image is held by some eligible node
    # Some eligible node holds every image: what steering (core/admission/steering.py) can make true,
    # so `serve --steer` decides Jobs and other templates by it, and `scan --steer` rows.
    ONE_NODE = "one-node"

    def __repr__(self) -> str:
        # As the API's signatures show their default: require='all', the value a caller passes.
        return repr(self.value)


# The members under the names the rules read (module globals: the decision's hot path).
PRESENT, MISSING, UNKNOWN, NOT_CHECKED, INVALID = ImageStatus
REQUIRE_ALL, REQUIRE_ANY, REQUIRE_ONE_NODE = Requirement
REQUIREMENTS = tuple(Requirement)
FOR_EVER = (-math.inf, math.inf)  # when a decision that read no clock holds


@dataclass(frozen=True, slots=True)
class ImageVerdict:
    image: ContainerImage
    status: ImageStatus
    key: str | None = None  # the name compared against node inventories
    missing_on: tuple[str, ...] = ()  # eligible nodes known to lack it
    unknown_on: tuple[str, ...] = ()  # eligible nodes whose list proves nothing
    detail: str = ""  # why it is invalid


@dataclass(frozen=True, slots=True)
class ImageGroup:
    """A decision's images of one status, each with the nodes it has that status on (Decision.images):
    what a denial or warning names image by image, and a scanner row lists whole."""

    verdicts: tuple[ImageVerdict, ...] = ()
    on: tuple[tuple[str, ...], ...] = ()  # each verdict's nodes

    def __iter__(self) -> Iterator[tuple[ImageVerdict, tuple[str, ...]]]:
        return zip(self.verdicts, self.on)

    def __len__(self) -> int:
        return len(self.verdicts)

    @property
    def images(self) -> tuple[str, ...]:
        """The images as written, each once."""
        return tuple(dict.fromkeys(v.image.image for v in self.verdicts))

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes of all the images, each once."""
        return tuple(dict.fromkeys(n for nodes in self.on for n in nodes))


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: Outcome
    verdicts: tuple[ImageVerdict, ...]
    eligible: tuple[str, ...]  # nodes the pod may land on
    ineligible: tuple[tuple[str, int], ...] = ()  # (scheduler reason, node count)
    unplaced: str = ""  # why no node can be named for the pod at all (its RuntimeClass)
    # (node, sandbox image) of each eligible node whose runtime lacks its sandbox image: no pod
    # starts there (see decide_images).
    sandbox_missing: tuple[tuple[str, str], ...] = ()
    # images() by status, each made when first asked for: a remembered decision (memory.py) answers
    # every later review that shares it without building them again.
    _groups: dict[ImageStatus, ImageGroup] = field(default_factory=dict, init=False, repr=False, compare=False)

    def images(self, status: ImageStatus) -> ImageGroup:
        """The images with `status`, each with the nodes it has it on: for MISSING the eligible
        nodes that can start pods and lack it (one that starts no pod is named for its sandbox
        image instead, and an image missing only there is left out); for UNKNOWN those whose lists
        prove nothing; for the other statuses none."""
        group = self._groups.get(status)
        if group is None:
            group = self._groups[status] = self._group(status)
        return group

    def _group(self, status: ImageStatus) -> ImageGroup:
        verdicts = tuple(v for v in self.verdicts if v.status == status)
        if status == UNKNOWN:
            return ImageGroup(verdicts, tuple(v.unknown_on for v in verdicts))
        if status != MISSING:
            return ImageGroup(verdicts, ((),) * len(verdicts))
        if not self.sandbox_missing:  # every eligible node starts pods: nothing to leave out
            lacking = [(v, v.missing_on) for v in verdicts if v.missing_on]
        else:
            halted = frozenset(self.halted)
            lacking = [(v, nodes) for v in verdicts if (nodes := tuple(n for n in v.missing_on if n not in halted))]
        return ImageGroup(tuple(v for v, _ in lacking), tuple(nodes for _, nodes in lacking))

    @property
    def halted(self) -> tuple[str, ...]:
        """The eligible nodes that start no pod: their runtime lacks its sandbox image."""
        return tuple(dict.fromkeys(node for node, _ in self.sandbox_missing))

    @property
    def runnable(self) -> tuple[str, ...]:
        """The eligible nodes that can start a pod at all."""
        if not self.sandbox_missing:
            return self.eligible
        halted = frozenset(self.halted)
        return tuple(n for n in self.eligible if n not in halted)


@dataclass(frozen=True, slots=True, eq=False)
class Eligible:
    """Where a placement may land in one inventory, as places in Inventory.nodes: what a renewal
    leaves as it is (it moves no node and changes no traits, names or sandbox reports)."""

    places: np.ndarray  # ascending
    names: tuple[str, ...]  # the nodes at those places
    reporting: tuple[int, ...]  # the places among them whose list reports a missing sandbox image
    reasons: Counter[str]  # why the other nodes are out: scheduler reason -> node count
    # Each place's reason, as an index into `said` (-1: eligible): what finding it again at a few
    # changed places starts from (Memory.moved).
    codes: np.ndarray
    said: tuple[str, ...]


def eligible_nodes(placement: PodPlacement, inventory: Inventory) -> tuple[list[NodeImages], Counter[str]]:
    """The nodes `placement` may land on, and why the others are out."""
    eligible = _eligible(placement, inventory)
    nodes = inventory.nodes
    return [nodes[place] for place in eligible.places.tolist()], eligible.reasons


def _eligible(placement: PodPlacement, inventory: Inventory) -> Eligible:
    """Remembered per inventory and placement: the scheduler's filters run once for all the pods
    that share a placement (rollout Jobs do), and again only where nodes changed."""
    return memory_of(inventory).placement(placement, lambda: _eligible_at(placement, inventory, None, ()),
                                      lambda earlier, changed: _eligible_at(placement, inventory, earlier, changed))


def _eligible_at(placement: PodPlacement, inventory: Inventory, earlier: Eligible | None,
                 changed: Collection[int]) -> Eligible:
    """The placement's Eligible: `earlier`'s with the nodes at `changed` filtered again, or every
    node filtered (earlier None)."""
    import numpy as np

    nodes = inventory.nodes
    codes = np.full(len(nodes), -1, dtype=np.int32)
    said: list[str] = []
    if earlier is None:
        changed = range(len(nodes))
    else:
        codes[:earlier.codes.size] = earlier.codes
        said = list(earlier.said)
    for place in changed:
        node = nodes[place]
        # Traits unknown (a single-node snapshot): the pod may land there.
        reason = None if node.traits is None else unschedulable_reason(placement, node.traits)
        if reason is None:
            codes[place] = -1
        else:
            if reason not in said:
                said.append(reason)
            codes[place] = said.index(reason)
    places = np.flatnonzero(codes < 0)
    counts = np.bincount(codes[codes >= 0], minlength=len(said))
    reasons = Counter({reason: int(count) for reason, count in zip(said, counts) if count})
    if earlier is None:
        at = places.tolist()
        return Eligible(places, tuple(nodes[place].node for place in at),
                        tuple(place for place in at if nodes[place].sandbox_missing is not None), reasons, codes,
                        tuple(said))
    # Names and reports carried from `earlier`, edited at the places that changed: a node keeps its
    # name in its place, so only those that came in or went out of eligibility move in the tuple.
    names, was = earlier.names, earlier.codes
    for place in sorted(changed, reverse=True):  # from the end: earlier's places before it stay put
        now_in, was_in = codes[place] < 0, place < was.size and was[place] < 0
        if now_in != was_in:
            index = int(np.searchsorted(earlier.places, place))
            names = (names[:index] + (nodes[place].node,) + names[index:] if now_in
                     else names[:index] + names[index + 1:])
    reporting = set(earlier.reporting).difference(changed)
    reporting.update(place for place in changed if codes[place] < 0 and nodes[place].sandbox_missing is not None)
    return Eligible(places, names, tuple(sorted(reporting)), reasons, codes, tuple(said))


def decide(
    spec: Mapping[str, Any], inventory: Inventory, *, require: str = REQUIRE_ALL, now: float | None = None,
    kind: str = "Pod",
) -> Decision:
    """`spec` is the pod spec of a `kind` object. Raises WorkloadError or SchedulingSpecError when
    the spec cannot be read. Remembered per inventory (see image_preflight.core.decide.memory)."""
    return memory_of(inventory).decision(spec, kind, require, now, lambda: _decide(spec, inventory, require, now, kind))


def memory_of(inventory: Inventory) -> Memory[Decision, Eligible]:
    """What decisions on `inventory` remember (image_preflight.core.decide.memory)."""
    return inventory.memory


def _decide(spec: Mapping[str, Any], inventory: Inventory, require: str, now: float | None,
            kind: str) -> tuple[Decision, tuple[float, float]]:
    """The decision, and when it holds (memory.window)."""
    placement = PodPlacement.from_pod_spec(spec, admitted=True)  # as_admitted
    if kind == "DaemonSet":
        placement = as_daemon(placement)
    images = container_images(spec)
    if placement.runtime_class is not None:
        runtime_class = inventory.runtime_classes.get(placement.runtime_class)
        if runtime_class is None:
            # Absent from a live view: the apiserver forbids the pod (or our view lags); absent from
            # a snapshot: it may not list RuntimeClasses. Either way placement is not known.
            reason = f"RuntimeClass {placement.runtime_class!r} is not in the inventory"
            return _unplaced(images, reason, len(inventory), Outcome.UNKNOWN), FOR_EVER
        try:
            placement = with_runtime_class(placement, runtime_class)
        except RuntimeClassConflict as exc:
            return _unplaced(images, f"pod rejected: {exc}", len(inventory), Outcome.NO_ELIGIBLE_NODE), FOR_EVER
    return _decide_images(images, placement, inventory, require, now)


def _unplaced(images: Sequence[ContainerImage], reason: str, nodes: int, outcome: Outcome) -> Decision:
    """A decision for a pod no node can be named for: only invalid references are certain."""
    verdicts = tuple(_verdict(image, None, None, REQUIRE_ALL, None) for image in images)
    decided = _outcome(verdicts, False)
    return Decision(outcome if decided == Outcome.NO_ELIGIBLE_NODE else decided, verdicts, (), ((reason, nodes),),
                    reason)


def decide_images(
    images: Sequence[ContainerImage],
    placement: PodPlacement,
    inventory: Inventory,
    *,
    require: str = REQUIRE_ALL,
    now: float | None = None,
) -> Decision:
    """A node whose runtime lacks its sandbox (pause) image starts no pod: the kubelet's first step,
    RunPodSandbox, fails (pkg/kubelet/kuberuntime/kuberuntime_manager.go, SyncPod: Event
    FailedCreatePodSandBox) before any image of the pod is looked at, whatever its pull policy. So
    such a node counts as lacking every checked image, and under REQUIRE_ALL it denies the pod even
    when every image is Always (the pod may land there and wait in ContainerCreating); under
    REQUIRE_ANY and REQUIRE_ONE_NODE it denies only when no eligible node can start the pod."""
    return _decide_images(images, placement, inventory, require, now)[0]


def _decide_images(images: Sequence[ContainerImage], placement: PodPlacement, inventory: Inventory, require: str,
                   now: float | None) -> tuple[Decision, tuple[float, float]]:
    """decide_images, and when its decision holds: the clock was read only on the eligible nodes
    that report a missing sandbox image and on those without a checked image (_verdict)."""
    if require not in REQUIREMENTS:
        raise ValueError(f"require: {require!r} is not one of {', '.join(REQUIREMENTS)}")
    eligible = _eligible(placement, inventory)
    nodes = inventory.nodes
    reporting = [nodes[place] for place in eligible.reporting]
    lacking = [(place, image) for place in eligible.reporting if (image := nodes[place].lacks_sandbox(now)) is not None]
    blocked = tuple((nodes[place].node, image) for place, image in lacking)
    halted = frozenset(place for place, _ in lacking)
    per_image = REQUIRE_ALL if require == REQUIRE_ONE_NODE else require
    consulted = list(reporting)
    verdicts = tuple(_verdict(image, inventory, eligible, per_image, now, halted, consulted) for image in images)
    if require == REQUIRE_ONE_NODE:
        halted_names = {node for node, _ in blocked}
        verdicts = _on_one_node(verdicts, [name for name in eligible.names if name not in halted_names])
    stranded = bool(blocked) if require == REQUIRE_ALL else bool(eligible.names) and len(blocked) == len(eligible.names)
    decision = Decision(
        _outcome(verdicts, bool(eligible.names), stranded),
        verdicts,
        eligible.names,
        tuple(sorted(eligible.reasons.items())),
        sandbox_missing=blocked,
    )
    return decision, window(consulted, now)


def _verdict(image: ContainerImage, inventory: Inventory | None, eligible: Eligible | None, require: str,
             now: float | None, halted: frozenset[int] = frozenset(),
             consulted: list[NodeImages] | None = None) -> ImageVerdict:
    """`halted`: the eligible places that start no pod; the lists whose clock was read are added to
    `consulted`. The eligible nodes the index (holders.py) shows holding the image are not asked."""
    try:
        key = image_key(image.image)
    except InvalidReference as exc:
        # Whatever the policy, the kubelet leaves such a container in InvalidImageName.
        return ImageVerdict(image, INVALID, detail=str(exc))
    if not image.node_dependent:
        return ImageVerdict(image, NOT_CHECKED, key)
    if inventory is None or eligible is None or not eligible.names:
        return ImageVerdict(image, UNKNOWN, key)
    nodes = inventory.nodes
    index = None if is_image_id(key) else inventory.holder_index()
    if index is None:
        asked = eligible.places.tolist()
    else:
        asked = eligible.places[~index.held(nodes, key)[eligible.places]].tolist()
        if halted:
            asked = sorted(halted.union(asked))
    holders, missing, unknown = len(eligible.names) - len(asked), [], []
    for place in asked:
        node = nodes[place]
        if place in halted:
            missing.append(node.node)  # it holds the image, maybe, but can start no container
            continue
        if index is None and node.holds(key):  # the index asked every list it holds no names of
            holders += 1
            continue
        if node.conclusive(now, key):
            missing.append(node.node)
        else:
            unknown.append(node.node)
        if consulted is not None:
            consulted.append(node)
    if require == REQUIRE_ALL:
        # The pod may land on any eligible node, so one that lacks the image is enough to fail.
        status = MISSING if missing else UNKNOWN if unknown else PRESENT
    else:
        status = PRESENT if holders else UNKNOWN if unknown else MISSING
    return ImageVerdict(image, status, key, tuple(missing), tuple(unknown))


def holding_nodes(verdicts: Sequence[ImageVerdict], eligible: Sequence[str]) -> list[str]:
    """The eligible nodes known to hold every checked image. From verdicts decided with REQUIRE_ALL,
    whose missing_on and unknown_on name every eligible node that lacks or may lack each image.
    Pass Decision.runnable as `eligible`: a pod without checked images holds nothing to rule out
    a node that can start no pod."""
    lacking: set[str] = set()
    for verdict in verdicts:
        lacking.update(verdict.missing_on)
        lacking.update(verdict.unknown_on)
    return [n for n in eligible if n not in lacking]


def _on_one_node(verdicts: tuple[ImageVerdict, ...], eligible: list[str]) -> tuple[ImageVerdict, ...]:
    """REQUIRE_ALL verdicts restated for "some eligible node holds every image", as steering makes
    it true: only when every eligible node's list is conclusive (steering never rules out a node
    on a guess, core/admission/steering.py). Otherwise its Pods are not steered and are decided as under
    REQUIRE_ALL, and so is the template."""
    checked = (PRESENT, MISSING, UNKNOWN)
    if any(v.unknown_on for v in verdicts) or not holding_nodes(verdicts, eligible):
        return verdicts
    return tuple(replace(v, status=PRESENT) if v.status in checked else v for v in verdicts)


def _outcome(verdicts: tuple[ImageVerdict, ...], any_eligible: bool, stranded: bool = False) -> Outcome:
    """`stranded`: the pod may land, or can only land, where no pod starts (decide_images)."""
    statuses = {v.status for v in verdicts}
    if INVALID in statuses:
        return Outcome.DENY
    if not any_eligible and statuses - {NOT_CHECKED}:
        return Outcome.NO_ELIGIBLE_NODE
    if MISSING in statuses or stranded:
        return Outcome.DENY
    return Outcome.UNKNOWN if UNKNOWN in statuses else Outcome.ALLOW
