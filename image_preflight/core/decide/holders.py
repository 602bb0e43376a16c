"""Which of an inventory's nodes hold a name, without asking each node's list: an index from each
name to the places (in Inventory.nodes) of the nodes whose lists hold it.

A decision on a name no decision asked before looks at every eligible node's list: 1.4 µs a node
with 5,000 hashed names, 7 ms at 5,000 nodes, on every review that is not remembered. With the index
it costs a slice of the name's row, and a look only at the nodes that lack it.

Lists are indexed by the tokens they store their names as (image_preflight.image_set: a small
integer per distinct name or hash, process-wide), one index per kind of list, since a name's token
differs by kind. A list of another kind (a plain frozenset: snapshots, tests) is asked on its own,
as are the lists changed since the index was built: a change carries the index to the next
inventory with the changed places marked (`carried`), so a change costs nothing here, and a lease
renewal, which keeps each list's names, marks nothing. Once many places are marked the index is
built afresh (`stale`). Image IDs ("sha256:...") are not indexed: a pod naming one is decided by
asking every list, as before.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

INDEXED_FROM = 64  # nodes: below this, asking each list is as fast as the index
# Places asked on their own before the index is rebuilt: a rebuild costs about 0.1 µs a name held.
MAX_MARKED_SHARE = 1 / 64
MIN_MARKED = 32


@runtime_checkable
class Tokenized(Protocol):
    """A list that stores its names as tokens: `tokens()` gives them (sorted, distinct, below
    2**32), `token_of(key)` the token `key` would have among lists of its kind (None: no list of
    that kind holds it)."""

    def tokens(self) -> np.ndarray: ...

    def token_of(self, key: str) -> int | None: ...


class Listed(Protocol):
    """A node's list, as far as the index reads it (inventory.NodeImages): its names."""

    @property
    def refs(self) -> Container[str]: ...


class Rows:
    """One kind of list's index: the places holding token t are places[starts[t]:starts[t + 1]]."""

    __slots__ = ("probe", "starts", "places")

    def __init__(self, probe: Tokenized, starts: np.ndarray, places: np.ndarray) -> None:
        self.probe = probe  # a list of this kind, to ask for a key's token
        self.starts = starts
        self.places = places

    def holders(self, key: str) -> np.ndarray:
        token = self.probe.token_of(key)
        if token is None or token >= self.starts.size - 1:
            return self.places[:0]
        return self.places[self.starts[token]:self.starts[token + 1]]


class HolderIndex:
    """An index over one inventory's nodes, read-only once made."""

    __slots__ = ("size", "kinds", "asked", "unindexed")

    def __init__(self, size: int, kinds: Sequence[Rows], asked: frozenset[int], unindexed: int) -> None:
        self.size = size  # places indexed (the inventory's length)
        self.kinds = tuple(kinds)
        # Places whose lists the index does not hold (another kind, or changed since it was built):
        # each is asked on its own.
        self.asked = asked
        self.unindexed = unindexed  # how many of them were of another kind when it was built

    @property
    def stale(self) -> bool:
        """Whether asking the places changed since it was built costs more than building it afresh."""
        return len(self.asked) - self.unindexed > max(MIN_MARKED, self.size * MAX_MARKED_SHARE)

    def held(self, nodes: Sequence[Listed], key: str) -> np.ndarray:
        """A mask over `nodes` (the inventory's, in their places): which lists hold `key`. `key` is
        an image_key() other than an image ID."""
        mask = np.zeros(self.size, dtype=bool)
        for rows in self.kinds:
            mask[rows.holders(key)] = True
        for place in self.asked:
            mask[place] = key in nodes[place].refs
        return mask

    def carried(self, size: int, changed: Iterable[int]) -> HolderIndex:
        """This index for an inventory of `size` places, the same lists in the same places but for
        `changed` (and any place beyond this index's size)."""
        return HolderIndex(size, self.kinds, self.asked.union(changed, range(self.size, size)), self.unindexed)


def build(nodes: Sequence[Listed]) -> HolderIndex:
    """The index of these lists (Inventory.nodes)."""
    by_kind: dict[type, list[tuple[int, np.ndarray]]] = {}
    probes: dict[type, Tokenized] = {}
    asked = []
    for place, node in enumerate(nodes):
        refs = node.refs
        if isinstance(refs, Tokenized):
            by_kind.setdefault(type(refs), []).append((place, refs.tokens()))
            probes.setdefault(type(refs), refs)
        else:
            asked.append(place)
    dtype = np.uint16 if len(nodes) <= 1 << 16 else np.uint32
    kinds = [_rows(probes[kind], lists, dtype) for kind, lists in by_kind.items()]
    return HolderIndex(len(nodes), kinds, frozenset(asked), len(asked))


def _rows(probe: Tokenized, lists: list[tuple[int, np.ndarray]], dtype: type) -> Rows:
    """A counting sort of (token, place) pairs by token, a list at a time: every list's tokens are
    distinct, so each fancy-indexed step touches a token once."""
    size = max((int(tokens[-1]) + 1 for _, tokens in lists if tokens.size), default=0)
    counts = np.zeros(size, dtype=np.int64)
    for _, tokens in lists:
        counts[tokens] += 1
    starts = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    places: np.ndarray = np.empty(int(starts[-1]), dtype=dtype)
    cursor = starts[:-1].copy()
    for place, tokens in lists:
        at = cursor[tokens]
        places[at] = place
        cursor[tokens] = at + 1
    return Rows(probe, starts, places)
