"""What a decision remembers, and for how long: every limit, key and eviction rule of it.

Rollout Jobs differ in names, env and commands, rarely in what decides. Each Inventory holds one
Memory (a new inventory starts empty) of two kinds:

- placements: the nodes a placement may land on, by their places among the inventory's nodes.
  Rollout Jobs share one placement, so the scheduler filters run once per placement and inventory
  instead of once per request.
- decisions: whole decisions by what decides them. A decision reads only a pod spec's deciding
  fields (workloads.deciding_fields: names, images and pull policies, the scheduling fields); the
  key is exactly those, so two specs with one key get one decision. What it reads of the nodes (lists, traits, a
  missing sandbox image) is the inventory's, and an entry lasts while the clock reads the same on
  every list it consulted: until one of those starts or stops proving anything (its lease ends; a
  list observed ahead of the clock comes due), or it is asked about before such a time it saw
  (window). A decision that found the images on every node it may land on read no clock and lasts
  as long as the inventory: at 5,000 nodes some lease ends every few tenths of a second, so a
  window taken over every list would keep nothing.

A renewal of some lists' leases (Inventory.updated) keeps both, each decision for as long as it
still holds (Memory.renewed); a change of names alone keeps the placements (Memory.placed); a
change of some nodes' traits keeps them to be found again at those nodes alone (Memory.moved); any
other change starts a new memory.

Each kind is cleared whole when full: cheap, and a working set that fits stays remembered.
Parsing an image reference has its own process-wide cache (references.CACHE_SIZE): it depends on
the text alone, never on an inventory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from image_preflight.core.decide.scheduling import PodPlacement
from image_preflight.core.decide.workloads import deciding_fields

# What is remembered, as decision.py makes it: a Decision, and what a placement finds (Eligible).
# Each Inventory holds a Memory and decision.py fills it, so the memory names neither.
D = TypeVar("D")
E = TypeVar("E")

PLACEMENTS = 1024  # distinct placements remembered per inventory
PLACEMENT_CHARACTERS = 4096  # ... each of at most this many characters: they stay under ~8 MiB
MOVED_PLACES = 256  # changed places beyond which a placement is found afresh rather than again
DECISIONS = 4096  # decisions remembered per inventory
KEY_CHARACTERS = 4096  # a spec whose deciding fields' repr is longer is decided every time

# A decision's key (key_of): kind, requirement, whether it read no clock, the deciding fields' repr.
DecisionKey = tuple[str, str, bool, str]


class Proving(Protocol):
    """A node list, as far as a window reads it (inventory.NodeImages)."""

    def proving(self) -> tuple[float, float]: ...


class Memory(Generic[D, E]):
    """One inventory's remembered placements (E) and decisions (D)."""

    __slots__ = ("placements", "decisions", "earlier")

    def __init__(self) -> None:
        self.placements: dict[PodPlacement, E] = {}  # placement -> what find() gave
        # key_of() -> (decision, start, end): holds for now in [start, end)
        self.decisions: dict[DecisionKey, tuple[D, float, float]] = {}
        # placement -> (what find() gave on an earlier inventory of the same places, the places
        # whose nodes changed their traits or sandbox report since, or came after them): found
        # again by looking at those places alone (moved).
        self.earlier: dict[PodPlacement, tuple[E, frozenset[int]]] = {}

    def placement(self, placement: PodPlacement, find: Callable[[], E],
                  refind: Callable[[E, frozenset[int]], E] | None = None) -> E:
        """What find() gives for `placement`, found once per placement, or by refind() from what an
        earlier inventory found and the places changed since; a freak placement (more than
        PLACEMENT_CHARACTERS of text) is found every time without being remembered."""
        found = self.placements.get(placement)
        if found is None:
            earlier = self.earlier.get(placement) if refind is not None else None
            found = find() if earlier is None or refind is None else refind(*earlier)
            if _characters(placement) <= PLACEMENT_CHARACTERS:
                if len(self.placements) >= PLACEMENTS:
                    self.placements.clear()
                self.placements[placement] = found
        return found

    def decision(self, spec: Mapping[str, Any], kind: str, require: str, now: float | None,
                 decide: Callable[[], tuple[D, tuple[float, float]]]) -> D:
        """What decide() gives for `spec`, remembered while it holds: decide() returns it with the
        times between which it holds (window)."""
        try:
            key = key_of(spec, kind, require, now is None)
        except (TypeError, ValueError, RecursionError):  # too deep to write out: decide it afresh
            key = None
        if key is None:
            return decide()[0]
        found = self.decisions.get(key)
        if found is not None and (now is None or found[1] <= now < found[2]):
            return found[0]
        decision, (start, end) = decide()
        if len(self.decisions) >= DECISIONS:
            self.decisions.clear()
        self.decisions[key] = (decision, start, end)
        return decision

    def placed(self) -> Memory[D, E]:
        """A memory of these placements alone: for an inventory whose lists changed their names
        but not where any placement finds them (NodeImages.places_as)."""
        memory: Memory[D, E] = Memory()
        memory.placements, memory.earlier = dict(self.placements), dict(self.earlier)
        return memory

    def moved(self, places: Iterable[int]) -> Memory[D, E]:
        """A memory for an inventory whose nodes at `places` changed where a placement may find
        them (their traits or sandbox report), or were added there, and no node left: each
        placement is found again by looking at the places changed since it was found (a Node's
        taint added or lifted at 5,000 nodes costs the next review one node's filters, not 5,000)."""
        changed = frozenset(places)
        memory: Memory[D, E] = Memory()
        # Copies to walk: requests still find placements on the inventory being replaced, adding to them.
        placements = dict(self.placements)
        for placement, (found, before) in list(self.earlier.items()):
            if placement not in placements and len(before) + len(changed) <= MOVED_PLACES:
                memory.earlier[placement] = (found, before | changed)
        if len(changed) <= MOVED_PLACES:
            for placement, found in placements.items():
                memory.earlier[placement] = (found, changed)
        return memory

    def renewed(self, leases: Iterable[tuple[tuple[float, float], tuple[float, float]]]) -> Memory[D, E]:
        """The decisions still true once some node lists had their leases renewed, and nothing else
        changed: `leases` gives, for each such list, when it proved anything before and after
        (NodeImages.proving).

        A remembered decision's window lies inside a list's time proving, or before or after it,
        when the decision read that list's clock (window). Inside: the decision stays true wherever
        both leases agree, so its window shrinks to the new lease. Before or after: the list proved
        nothing and may prove something now, so the decision is forgotten. Across its start or end:
        the decision never read that clock, and the renewal leaves it as it was. Placements stay: a
        renewal changes no node's traits, and moves none from its place among the inventory's nodes.
        """
        memory: Memory[D, E] = Memory()
        memory.placements, memory.earlier = dict(self.placements), dict(self.earlier)
        leases = list(leases)
        # A copy to walk: requests still decide on the inventory being replaced, adding to it.
        for key, (decision, start, end) in list(self.decisions.items()):
            for (was_from, was_until), (now_from, now_until) in leases:
                if was_from <= start and end <= was_until:
                    start, end = max(start, now_from), min(end, now_until)
                elif end <= was_from or was_until <= start:
                    break
            else:
                if start < end:
                    memory.decisions[key] = (decision, start, end)
        return memory


def window(nodes: Iterable[Proving], now: float | None) -> tuple[float, float]:
    """The times around `now` in which each of `nodes` proves something throughout or nothing
    throughout (NodeImages.current), so a decision made at `now` that read only their clocks
    holds for any time in [start, end). No clock (None): for ever."""
    start, end = -math.inf, math.inf
    if now is None:
        return start, end
    for node in nodes:
        for change in node.proving():
            if change <= now:
                start = max(start, change)
            else:
                end = min(end, change)
    return start, end


def _characters(placement: PodPlacement) -> int:
    """About how much text `placement` holds."""
    total = sum(len(k) + len(v) for k, v in placement.node_selector.items())
    total += sum(len(t.key) + len(t.value) + len(t.operator) + len(t.effect) for t in placement.tolerations)
    total += len(placement.node_name or "") + len(placement.runtime_class or "")
    total += sum(map(len, placement.term_errors))
    for term in placement.required_terms or ():
        total += sum(len(r.key) + sum(map(len, r.values)) for r in term.match_expressions)
        total += sum(len(r.key) + len(r.value) for r in term.match_fields)
    return total


def key_of(spec: Mapping[str, Any], kind: str, require: str, timeless: bool) -> DecisionKey | None:
    """The key for `spec`: the repr of its deciding fields (workloads.deciding_fields), or None when
    it is not worth or not safe to remember (not a dict, too long): then it is simply decided.
    Values that differ, in type or value, differ in repr; the same fields written in another order
    only miss (the apiserver writes a spec's fields in one order). repr, not canonical JSON
    (json.dumps with sorted keys): on every review, the longer of the two by a half."""
    if type(spec) is not dict:
        return None
    text = repr(deciding_fields(spec))
    return None if len(text) > KEY_CHARACTERS else (kind, require, timeless, text)
