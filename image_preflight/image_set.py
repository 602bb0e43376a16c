"""A compact set of image names, for hundreds of nodes holding thousands of images each.

A frozenset of 10,000 names costs about 512 KiB of table; 200 nodes would need 100 MiB. Here each
distinct name is stored once, process-wide, under a small integer, and a node keeps a sorted
array of those integers (4 bytes a name). Membership is a dict lookup and a binary search.
The table only grows: it holds each name ever seen, which is bounded by the images that exist.
"""

from __future__ import annotations

import functools
import threading
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Set
from dataclasses import replace
from typing import cast

import numpy as np

from image_preflight.core.decide.inventory import Inventory, NodeImages
from image_preflight.core.sources.image_hashes import ImageHashes, key_hash

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


def _among(members: array, found: int | None) -> bool:
    """Whether the sorted `members` hold `found` (None: not in the table, so in no set)."""
    if found is None:
        return False
    index = bisect_left(members, found)
    return index < len(members) and members[index] == found


class ImageSet(Set):
    __slots__ = ("_members",)

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._members = array("I", sorted({_id_of(name) for name in names}))

    def __contains__(self, name: object) -> bool:
        return _among(self._members, _ids.get(name) if isinstance(name, str) else None)

    def __len__(self) -> int:
        return len(self._members)

    def __iter__(self) -> Iterator[str]:
        return (_names[i] for i in self._members)

    # Tokenized (image_preflight.core.decide.holders): a name's token is its place in the table.
    def tokens(self) -> np.ndarray:
        return np.frombuffer(self._members, dtype=np.uint32)

    def token_of(self, key: str) -> int | None:
        return _ids.get(key)

    def __hash__(self) -> int:
        return self._hash()

    def __repr__(self) -> str:
        return f"ImageSet({sorted(self)!r})"


# The hashes of published lists (image_hashes), each stored once under a small integer as names are.
_hash_ids: dict[int, int] = {}
_hashed_key = functools.lru_cache(maxsize=1 << 16)(key_hash)  # a review asks every node for the same keys


def _hash_id(value: int) -> int:
    found = _hash_ids.get(value)
    if found is not None:
        return found
    with _lock:
        return _hash_ids.setdefault(value, len(_hash_ids))


class HashSet:
    """ImageHashes in 4 bytes a hash: `key in hashes` for an image_key(), and len()."""

    __slots__ = ("_members",)

    def __init__(self, hashes: ImageHashes) -> None:
        self._members = array("I", sorted(map(_hash_id, hashes.values.tolist())))

    def __contains__(self, key: object) -> bool:
        return _among(self._members, _hash_ids.get(_hashed_key(key)) if isinstance(key, str) else None)

    def __len__(self) -> int:
        return len(self._members)

    # Tokenized (image_preflight.core.decide.holders): a key's token is its hash's place in the table.
    def tokens(self) -> np.ndarray:
        return np.frombuffer(self._members, dtype=np.uint32)

    def token_of(self, key: str) -> int | None:
        return _hash_ids.get(_hashed_key(key))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HashSet) and self._members == other._members

    def __hash__(self) -> int:
        return hash(self._members.tobytes())


def compact(node: NodeImages) -> NodeImages:
    """`node` with its name sets held as ImageSets (or HashSets): what the shells keep of every list
    they read."""
    # A node's refs are its names as a set, or their hashes.
    refs = HashSet(node.refs) if isinstance(node.refs, ImageHashes) else ImageSet(cast("Set[str]", node.refs))
    return replace(node, refs=refs, ids=ImageSet(node.ids))


def compact_inventory(inventory: Inventory) -> Inventory:
    return Inventory(tuple(compact(node) for node in inventory.nodes), inventory.runtime_classes)
