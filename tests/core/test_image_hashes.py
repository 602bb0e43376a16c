"""NodeImages' spec.imageHashes: the coding round-trips, a lookup hashes the name as the runtime
resolves it (image_key, which follows distribution/reference's ParseDockerRef, normalize.go), and a
hostile field is refused in one line naming it before any of its lengths is used."""

from __future__ import annotations

import base64
import random

import numpy as np
import pytest

from image_preflight.core.decide.inventory import image_key
from image_preflight.core.sources.image_hashes import ALGORITHM, BITS, MAX_HASHES, decode, encode, key_hash, pack
from image_preflight.core.sources.runtime_lists import image_hashes, node_images_from_runtime, runtime_object
from image_preflight.image_set import compact

SWE = [f"docker.io/swebench/sweb.eval.x86_64.repo_{i}__task-{i * 7919 % 100003}:openai" for i in range(5000)]


def listed(names: list[str]) -> list[dict]:
    return [{"id": "sha256:" + f"{i:064x}", "repoTags": [name], "repoDigests": [], "size": 1, "pinned": False}
            for i, name in enumerate(names)]


@pytest.mark.parametrize("count", [0, 1, 2, 100, 5000])
def test_decode_gives_back_the_sorted_distinct_hashes(count):
    keys = SWE[:count]
    field = encode(keys + keys[: count // 2])  # repeats count once
    assert field["algorithm"] == ALGORITHM and field["count"] == count
    assert decode(field).tolist() == sorted({key_hash(key) for key in keys})


def test_equal_sets_give_equal_fields_in_any_order():
    shuffled = SWE[:300]
    random.Random(7).shuffle(shuffled)
    assert encode(shuffled) == encode(SWE[:300])
    assert encode(SWE[:300]) != encode(SWE[1:301])


def test_five_thousand_swe_images_take_about_six_bytes_each():
    field = encode(SWE)
    assert len(field["data"]) < 5000 * 6.5, len(field["data"])  # the listed form: about 190 bytes an image


@pytest.mark.parametrize(("asked", "held"), [
    ("busybox", True),  # docker.io/library/busybox:latest, as the runtime resolves it
    ("docker.io/library/busybox:latest", True),
    ("library/busybox", True),
    ("busybox:1.36", False),
    ("swebench/sweb.eval.x86_64.repo_3__task-23757:openai", True),
    ("swebench/sweb.eval.x86_64.repo_3__task-23757", False),  # :latest
])
def test_a_hashed_list_decides_as_the_listed_one(asked, held):
    names = ["busybox:latest", *SWE[:10]]
    as_listed = node_images_from_runtime(runtime_object("n", listed(names), observed_at=0, lease_seconds=300))
    hashes = image_hashes(listed(names))
    as_hashed = node_images_from_runtime(runtime_object("n", listed(names), observed_at=0, lease_seconds=300,
                                                        hashes=hashes))
    key = image_key(asked)
    assert as_listed.holds(key) is held
    assert as_hashed.holds(key) is held
    assert compact(as_hashed).holds(key) is held  # what serve keeps
    assert len(as_hashed.refs) == len(compact(as_hashed).refs) == len(names)
    assert compact(as_hashed) == compact(as_hashed)


def test_a_bare_image_id_finds_a_hashed_list_inconclusive():
    images = listed(["busybox:latest"])
    node = node_images_from_runtime(runtime_object("n", images, observed_at=0, lease_seconds=300,
                                                   hashes=image_hashes(images)))
    image_id = images[0]["id"]
    assert not node.conclusive(None, image_id)
    assert node.inconclusive_because(None, image_id) == "list names no image IDs"


def test_both_forms_at_once_are_refused():
    obj = runtime_object("n", listed(["busybox"]), observed_at=0, lease_seconds=300)
    obj["spec"]["imageHashes"] = encode(["docker.io/library/busybox:latest"])
    with pytest.raises(ValueError, match=r"^spec: both images and imageHashes"):
        node_images_from_runtime(obj)


def _raw(count: int, k: int, unary: bytes, low: bytes, length: int | None = None) -> dict:
    head = count.to_bytes(4, "big") + bytes([k]) + (len(unary) if length is None else length).to_bytes(4, "big")
    return {"algorithm": ALGORITHM, "count": count, "data": base64.b64encode(head + unary + low).decode()}


GOOD = encode(SWE[:50])


@pytest.mark.parametrize(("field", "message"), [
    (None, r"^spec\.imageHashes: not an object$"),
    ({**GOOD, "algorithm": "sha1"}, r"^spec\.imageHashes\.algorithm: not blake2b-48-rice$"),
    ({**GOOD, "count": -1}, r"^spec\.imageHashes\.count: "),
    ({**GOOD, "count": MAX_HASHES + 1}, r"^spec\.imageHashes\.count: "),
    ({**GOOD, "count": True}, r"^spec\.imageHashes\.count: "),
    ({**GOOD, "count": 49}, r"^spec\.imageHashes\.data: its header does not match count 49$"),
    ({**GOOD, "data": "not base64!"}, r"^spec\.imageHashes\.data: not base64$"),
    ({**GOOD, "data": "x" * 1_000_004}, r"^spec\.imageHashes\.data: missing or longer than"),
    ({**GOOD, "data": "AAAA"}, r"^spec\.imageHashes\.data: shorter than its header$"),
    ({**GOOD, "data": GOOD["data"][:40]}, r"^spec\.imageHashes\.data: "),
    (_raw(1, BITS, b"\x00", b""), r"^spec\.imageHashes\.data: its header"),  # k must stay below BITS
    (_raw(2, 0, b"\xff", b""), r"^spec\.imageHashes\.data: shorter than 2 hashes$"),
    (_raw(1, 8, b"\x00", b"", length=2**31), r"^spec\.imageHashes\.data: its header"),
    # Two zero-length quotients and equal remainders: one hash twice.
    (_raw(2, 8, b"\x3f", b"\x05\x00"), r"^spec\.imageHashes\.data: a hash repeated$"),
    # A quotient of 2**42 ones with k = 8 would pass 48 bits: refused before any shift.
    (_raw(1, 40, b"\xff" * 40 + b"\x00", b"\x00" * 5), r"^spec\.imageHashes\.data: a hash beyond 48 bits$"),
])
def test_a_hostile_field_is_refused_in_one_line(field, message):
    with pytest.raises(ValueError, match=message):
        decode(field)


@pytest.mark.parametrize("values", [[0], [2**BITS - 1], [0, 2**BITS - 1], [0, 1, 2, 2**BITS - 2, 2**BITS - 1]])
def test_the_extreme_hashes_round_trip(values):
    array = np.array(values, dtype=np.uint64)
    assert decode(pack(array)).tolist() == values
