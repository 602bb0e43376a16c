"""A compact set of image names, for hundreds of nodes holding thousands of images each.

A frozenset of 10,000 names costs about 512 KiB of table; 200 nodes would need 100 MiB. Here each
distinct name is stored once, process-wide, under a small integer, and a node keeps a sorted
array of those integers (4 bytes a name). Membership is a dict lookup and a binary search.
The table only grows: it holds each name ever seen, which is bounded by the images that exist.
"""

from __future__ import annotations

import threading
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Set
from dataclasses import replace

from image_preflight.core.decide.inventory import Inventory, NodeImages

_ids: dict[str, int] = {}
_names: list[str] = []
_lock = threading.Lock()  # writers only; readers use dict.get, which is atomic


def _id_of(name: str) -> int:
    found = _ids.get(name)
    if found is not None:
        return found
    with _lock:
        found = _ids.get(name)
        if found is None:
            found = _ids[name] = len(_names)
            _names.append(name)
        return found


class ImageSet(Set):
    __slots__ = ("_members",)

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._members = array("I", sorted({_id_of(name) for name in names}))

    def __contains__(self, name: object) -> bool:
        found = _ids.get(name) if isinstance(name, str) else None
        if found is None:
            return False
        index = bisect_left(self._members, found)
        return index < len(self._members) and self._members[index] == found

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[str]:
        return (_names[i] for i in self._members)

    def __hash__(self) -> int:
        return self._hash()

    def __repr__(self) -> str:
        return f"ImageSet({sorted(self)!r})"


def compact(node: NodeImages) -> NodeImages:
    """`node` with its name sets held as ImageSets: what the shells keep of every list they read."""
    return replace(node, refs=ImageSet(node.refs), ids=ImageSet(node.ids))


def compact_inventory(inventory: Inventory) -> Inventory:
    return Inventory(tuple(compact(node) for node in inventory.nodes), inventory.runtime_classes)
