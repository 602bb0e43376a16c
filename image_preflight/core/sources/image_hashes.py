"""A node's image names as 48-bit hashes, Golomb-Rice coded: NodeImages' `spec.imageHashes`.

A list of 5,000 images takes about 31 KiB this way instead of about 1 MiB of names, so 5,000 nodes
fit in about 150 MiB of etcd (docs/benchmarks.md, "At fleet scale"). Readers ask only whether a
node holds a name, never which names it holds: a hash of each name the runtime resolves
(image_key) answers that. Two names share a hash with odds of about n / 2**48 a lookup (2e-11 for
5,000 images): the admission of a missing image that rare.

    imageHashes:
      algorithm: blake2b-48-rice
      count: <distinct hashes>
      data: <base64 of: count (4 bytes, big-endian), k (1 byte), the unary part's length in bytes
             (4 bytes), the quotients of the sorted hashes' gaps in unary (a 1 per unit, a 0 to end
             each), then each gap's k low bits>

The image IDs are left out (5,000 more hashes): a pod naming its image by a bare ID finds such a
list inconclusive, as it finds node status.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

ALGORITHM = "blake2b-48-rice"
BITS = 48
# Far above any runtime's list (the CRD's bound too): 20,000 images of five names each.
MAX_HASHES = 100_000
# The longest `data` MAX_HASHES can need (about 34 bits each), with room; the CRD's maxLength.
MAX_DATA = 1_000_000
_HEADER = 9


def key_hash(key: str, bits: int = BITS) -> int:
    """The first `bits` bits of BLAKE2b of an image_key() (other widths: benchmarks/published_forms.py)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") >> (64 - bits)


def _rice_bits(count: int, bits: int) -> int:
    """The Golomb-Rice parameter near the optimum for `count` values spread over 2**bits."""
    return max(0, int(math.log2(max(1.0, 2.0**bits / max(count, 1) * math.log(2)))))


def hashes_of(keys: Iterable[str], bits: int = BITS) -> np.ndarray:
    """The sorted, distinct key_hash() of `keys`."""
    return np.unique(np.fromiter((key_hash(key, bits) for key in keys), dtype=np.uint64))


def encode(keys: Iterable[str]) -> dict[str, Any]:
    """`spec.imageHashes` for these image keys; equal sets give equal fields."""
    return pack(hashes_of(keys))


def pack(values: np.ndarray, bits: int = BITS) -> dict[str, Any]:
    """`spec.imageHashes` for sorted, distinct values below 2**bits (at most BITS to be read back)."""
    count = int(values.size)
    k = _rice_bits(count, bits)
    gaps = np.diff(values, prepend=np.uint64(0))
    quotients = (gaps >> np.uint64(k)).astype(np.int64)
    unary = np.ones(int(quotients.sum()) + count, dtype=np.uint8)
    unary[np.cumsum(quotients + 1) - 1] = 0
    shifts = np.arange(k - 1, -1, -1, dtype=np.uint64)
    remainders = ((gaps[:, None] >> shifts) & np.uint64(1)).astype(np.uint8)
    packed_unary = np.packbits(unary).tobytes()
    head = count.to_bytes(4, "big") + bytes([k]) + len(packed_unary).to_bytes(4, "big")
    data = base64.b64encode(head + packed_unary + np.packbits(remainders).tobytes()).decode()
    return {"algorithm": ALGORITHM, "count": count, "data": data}


def decode(field: object, where: str = "spec.imageHashes", bits: int = BITS) -> np.ndarray:
    """The sorted, distinct hashes of a `spec.imageHashes` (of `bits` bits, at most 64); ValueError
    names what is wrong. Nothing in the field is trusted: every length is checked before it is used."""
    if not isinstance(field, Mapping):
        raise ValueError(f"{where}: not an object")
    if field.get("algorithm") != ALGORITHM:
        raise ValueError(f"{where}.algorithm: not {ALGORITHM}")
    count = field.get("count")
    if type(count) is not int or not 0 <= count <= MAX_HASHES:
        raise ValueError(f"{where}.count: missing or not an integer from 0 to {MAX_HASHES}")
    data = field.get("data")
    if not isinstance(data, str) or len(data) > MAX_DATA:
        raise ValueError(f"{where}.data: missing or longer than {MAX_DATA} characters")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}.data: not base64") from None
    if len(raw) < _HEADER:
        raise ValueError(f"{where}.data: shorter than its header")
    stored, k, length = int.from_bytes(raw[:4], "big"), raw[4], int.from_bytes(raw[5:9], "big")
    if stored != count or k >= bits or length > len(raw) - _HEADER:
        raise ValueError(f"{where}.data: its header does not match count {count}")
    ends = np.flatnonzero(np.unpackbits(np.frombuffer(raw, np.uint8, length, _HEADER)) == 0)
    low = np.unpackbits(np.frombuffer(raw, np.uint8, offset=_HEADER + length))
    if ends.size < count or low.size < count * k:
        raise ValueError(f"{where}.data: shorter than {count} hashes")
    quotients = np.diff(ends[:count], prepend=-1) - 1
    # A gap below 2**bits has a quotient below 2**(bits - k); checked before the shift can overflow.
    if count and int(quotients.max()) >= 1 << (bits - k):
        raise ValueError(f"{where}.data: a hash beyond {bits} bits")
    columns = low[:count * k].reshape(count, k)
    remainders = np.zeros(count, dtype=np.uint64)
    for column in range(k):
        remainders = (remainders << np.uint64(1)) | columns[:, column]
    gaps = (quotients.astype(np.uint64) << np.uint64(k)) | remainders
    if count > 1 and not gaps[1:].all():
        raise ValueError(f"{where}.data: a hash repeated")
    values = np.cumsum(gaps, dtype=np.uint64)
    if count and (int(values[-1]) >= 1 << bits or (values[1:] <= values[:-1]).any()):  # the sum wrapped
        raise ValueError(f"{where}.data: a hash beyond {bits} bits")
    return values


class ImageHashes:
    """A node's names as hashes: answers `key in hashes` for an image_key(), and len()."""

    __slots__ = ("values",)

    def __init__(self, values: np.ndarray) -> None:
        self.values = values  # sorted, distinct, below 2**BITS

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        value = np.uint64(key_hash(key))
        index = int(np.searchsorted(self.values, value))
        return index < self.values.size and self.values[index] == value

    def __len__(self) -> int:
        return int(self.values.size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ImageHashes):
            return NotImplemented
        return np.array_equal(self.values, other.values)

    def __hash__(self) -> int:
        return hash(self.values.tobytes())

    def __repr__(self) -> str:
        return f"ImageHashes({self.values.size} hashes)"
