"""What each node holds: its image names, whether that list is complete, and how fresh it is."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from image_preflight.core.decide.memory import DecisionKey, Memory
from image_preflight.core.decide.references import InvalidReference, docker_ref, is_valid_digest
from image_preflight.core.decide.runtime_classes import RuntimeClassScheduling
from image_preflight.core.decide.scheduling import NodeTraits

if TYPE_CHECKING:  # holders.py needs numpy, which the faces that only read flags should not load
    from image_preflight.core.decide.holders import HolderIndex

DEFAULT_MAX_IMAGES = 50  # KubeletConfiguration.nodeStatusMaxImages
# How far ahead of a reader's clock a node's list may say it was observed and still count: node
# clocks are kept in sync to well within a lease (docs/agent.md).
CLOCK_SKEW_S = 60.0
NAMES_PER_IMAGE = 5  # the kubelet lists at most this many names per image in node status
_ID_PREFIXES = ("sha256:", "sha384:", "sha512:")


def image_key(image: str) -> str:
    """The name a runtime resolves `image` by (ParseDockerRef): what node names are compared on.

    A digest-shaped image ("sha256:<hex>") is returned as is: containerd's CRI looks it up as an
    image ID before trying it as a name. Raises InvalidReference, as the kubelet would leave the
    container in InvalidImageName.
    """
    if isinstance(image, str) and image.startswith(_ID_PREFIXES) and is_valid_digest(image):
        return image
    return docker_ref(image)


def is_image_id(key: str) -> bool:
    """Whether image_key() gave an image ID (a bare digest) rather than a name."""
    return key.startswith(_ID_PREFIXES)


def image_keys(names: Iterable[str]) -> frozenset[str]:
    """image_key() of each name a runtime can resolve."""
    keys = set()
    for name in names:
        try:
            keys.add(image_key(name))
        except InvalidReference:
            continue  # a runtime name such as "<none>:<none>"; no container can ask for it
    return frozenset(keys)


class Names(Protocol):
    """What a node's names are asked: whether one is among them, and how many there are. A set of
    names, or of their hashes (image_preflight.core.sources.image_hashes)."""

    def __contains__(self, key: object, /) -> bool: ...

    def __len__(self) -> int: ...


@dataclass(frozen=True, slots=True)
class NodeImages:
    """One node's images as last observed."""

    node: str
    traits: NodeTraits | None  # None: scheduling traits unknown, so every pod may land here
    # Plain frozensets (or ImageHashes) here; image_preflight.image_set.compact() stores them in a
    # few bytes a name.
    refs: Names  # image_key() of every tag and repo digest
    ids: Set[str] = frozenset()  # image IDs ("sha256:...")
    complete: bool = True  # False: an absent name proves nothing
    observed_at: float | None = None  # epoch seconds
    expires_at: float | None = None  # after this the list is stale and proves nothing
    source: str = "snapshot"
    capped: bool = False  # node status at the kubelet's nodeStatusMaxImages: why it is not complete
    # Longer than the cap we were told: proof that the cap given (--max-images) is not the kubelet's.
    over_cap: int | None = None  # the cap in force when that happened
    # The sandbox (pause) image its runtime lacks, from the node agent's spec.sandboxImage: every
    # RunPodSandbox there fails, so no pod starts. None: present, or not reported. One interned
    # string shared by every node that lacks the same image.
    sandbox_missing: str | None = None

    @classmethod
    def from_names(
        cls,
        node: str,
        names: Iterable[str],
        *,
        ids: Iterable[str] = (),
        traits: NodeTraits | None = None,
        **kwargs: Any,  # the rest of NodeImages' fields
    ) -> NodeImages:
        return cls(node, traits, image_keys(names), frozenset(ids), **kwargs)

    def holds(self, key: str) -> bool:
        return key in self.refs or key in self.ids

    def current(self, now: float | None) -> bool:
        """Whether the list proves anything at `now` (None: no clock, as for a snapshot): its lease
        still runs, and it was not observed ahead of `now` by more than CLOCK_SKEW_S, since a node
        whose clock runs ahead (or that lies) would otherwise keep its list current long after it
        stopped. A list without a lease (node status, a snapshot) is as current as its source."""
        if now is None or self.expires_at is None:
            return True
        if now >= self.expires_at:
            return False
        return self.observed_at is None or self.observed_at - CLOCK_SKEW_S <= now

    def proving(self) -> tuple[float, float]:
        """When the list proves anything, as current() tells: from the first time, before the second."""
        if self.expires_at is None:
            return -math.inf, math.inf
        return (-math.inf if self.observed_at is None else self.observed_at - CLOCK_SKEW_S), self.expires_at

    def renews(self, earlier: NodeImages) -> bool:
        """Whether this list is `earlier` with only its lease moved (its agent's Lease renewed it)."""
        return self == earlier or replace(self, observed_at=earlier.observed_at,
                                          expires_at=earlier.expires_at) == earlier

    def places_as(self, earlier: NodeImages) -> bool:
        """Whether a placement finds this list where it found `earlier` (decision.Eligible): the same
        node, traits and sandbox report."""
        return (self.node, self.traits, self.sandbox_missing) == (earlier.node, earlier.traits, earlier.sandbox_missing)

    def lacks_sandbox(self, now: float | None) -> str | None:
        """The sandbox image this node's runtime lacks while its list is current; a stale report
        proves nothing (the image may have been imported since)."""
        return self.sandbox_missing if self.sandbox_missing is not None and self.current(now) else None

    def inconclusive_because(self, now: float | None, key: str = "") -> str:
        """Why `key` absent here proves nothing, in a few words ("" when it proves the node lacks it)."""
        if self.capped:
            return "list capped by nodeStatusMaxImages"
        if not self.complete:
            return "list partial"
        if is_image_id(key) and not self.ids:
            return "list names no image IDs"
        if not self.current(now):
            ahead = self.observed_at is not None and now is not None and self.observed_at - CLOCK_SKEW_S > now
            return "list observed ahead of this clock" if ahead else "list's lease ran out"
        return ""

    def conclusive(self, now: float | None, key: str = "") -> bool:
        """Whether `key` absent here means the node lacks the image. Node status lists names only
        (pkg/kubelet/nodestatus/setters.go, Images: RepoDigests and RepoTags), so an image ID is
        proven absent only by a list that carries IDs, such as the runtime's."""
        if not self.complete or (is_image_id(key) and not self.ids):
            return False
        return self.current(now)


def overriding(old: NodeImages | None, node: NodeImages) -> NodeImages:
    """`node`'s list in the place of `old`'s (the runtime's complete list over node status' capped
    one), keeping `old`'s scheduling traits when it carries none of its own."""
    if old is not None and node.traits is None:
        return replace(node, traits=old.traits)
    return node


class Inventory:
    """The nodes and what they hold, and the RuntimeClasses pods may name; read-only once made.

    `memory` is what decisions about this inventory remember (image_preflight.core.decide.memory):
    it starts empty for every new inventory (a renewal's carries what still holds, see updated),
    so nothing remembered outlives the view it was decided on.
    """

    __slots__ = ("nodes", "runtime_classes", "_by_name", "memory", "_index")
    __hash__ = None  # type: ignore[assignment]  # compared by content, remembered by identity

    def __init__(self, nodes: Iterable[NodeImages] = (),
                 runtime_classes: Mapping[str, RuntimeClassScheduling] | None = None) -> None:
        self.nodes: tuple[NodeImages, ...] = tuple(nodes)
        # The cluster's RuntimeClasses by name; a pod naming one not here is undecidable.
        self.runtime_classes: Mapping[str, RuntimeClassScheduling] = dict(runtime_classes or {})
        self._by_name: Mapping[str, NodeImages] = {n.node: n for n in self.nodes}
        # decision.py's Decisions and Eligibles, typed where it reads them (decision.memory_of):
        # what it decides on this inventory, which the inventory does not know of.
        self.memory: Memory[Any, Any] = Memory()
        self._index: HolderIndex | None = None

    def holder_index(self) -> HolderIndex | None:
        """The index of which nodes hold each name (image_preflight.core.decide.holders), built on
        first use; None for an inventory too small to need one."""
        from image_preflight.core.decide import holders

        if len(self.nodes) < holders.INDEXED_FROM:
            return None
        if self._index is None or self._index.stale:
            self._index = holders.build(self.nodes)
        return self._index

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Inventory):
            return NotImplemented
        return (self.nodes, dict(self.runtime_classes)) == (other.nodes, dict(other.runtime_classes))

    def __repr__(self) -> str:
        return f"Inventory(nodes={self.nodes!r}, runtime_classes={dict(self.runtime_classes)!r})"

    @property
    def decisions(self) -> dict[DecisionKey, tuple[Any, float, float]]:
        """The decisions remembered about this inventory."""
        return self.memory.decisions

    def get(self, node: str) -> NodeImages | None:
        return self._by_name.get(node)

    def __len__(self) -> int:
        return len(self.nodes)

    def merged(self, overrides: Iterable[NodeImages]) -> Inventory:
        """This inventory with `overrides` taking the place of same-named nodes.

        A complete list (from the runtime) replaces node status' capped one, but keeps the
        node's scheduling traits when it carries none of its own.
        """
        by_name = dict(self._by_name)
        for node in overrides:
            by_name[node.node] = overriding(by_name.get(node.node), node)
        return Inventory(tuple(by_name.values()), self.runtime_classes)

    def updated(self, changed: Mapping[str, NodeImages | None]) -> Inventory:
        """This inventory with each named node's list in its place (None: the node is gone).

        What it remembers carries over when the lists changed only by their leases (the agents'
        Leases renew them once a renewal period each): forgotten, every renewal would cost the
        next decisions a look at every node again. When no node left, the placements carry over, to
        be found again at the nodes whose traits changed (Memory.moved).
        """
        by_name = dict(self._by_name)
        renewed: list[tuple[NodeImages, NodeImages]] | None = []
        relisted, removed = [], False  # nodes whose names changed; whether any node left
        moved: list[str] = []  # nodes added, or whose traits or sandbox report changed
        for name, node in changed.items():
            old = by_name.pop(name, None) if node is None else by_name.get(name)
            if node is not None:
                by_name[name] = node
            if old is node:
                continue
            removed = removed or (node is None and old is not None)
            if node is not None and (old is None or not node.places_as(old)):
                moved.append(name)
            if old is not None and node is not None and node.refs is not old.refs:
                relisted.append(name)
            if renewed is not None and old is not None and node is not None and node.renews(old):
                renewed.append((old, node))
            else:
                renewed = None
        inventory = Inventory(tuple(by_name.values()), self.runtime_classes)
        # Nodes keep their places unless one leaves (a new one comes last).
        places = {name: place for place, name in enumerate(by_name)} if relisted or moved else {}
        if renewed is not None:
            inventory.memory = self.memory.renewed((old.proving(), new.proving()) for old, new in renewed)
        elif not removed:
            inventory.memory = self.memory.moved(places[name] for name in moved) if moved else self.memory.placed()
        # The index carries over with the relisted places marked; a renewal keeps every list's
        # names, and marks none.
        if self._index is not None and not removed:
            inventory._index = self._index.carried(len(inventory.nodes), (places[name] for name in relisted))
        return inventory

    def with_runtime_classes(self, runtime_classes: Mapping[str, RuntimeClassScheduling]) -> Inventory:
        """This inventory with these RuntimeClasses added (a same-named one replaced)."""
        return Inventory(self.nodes, {**self.runtime_classes, **runtime_classes})

    @property
    def image_count(self) -> int:
        return sum(len(n.refs) for n in self.nodes)

