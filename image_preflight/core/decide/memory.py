"""Remembering decisions: rollout Jobs differ in names, env and commands, rarely in what decides.

A decision reads only a pod spec's containers and image volumes (name, image, pull policy) and
its scheduling fields; the key is exactly those, so two specs with one key get one decision. What
it reads of the nodes (lists, traits, a missing sandbox image) is the inventory's: each
Inventory keeps its own (a new inventory starts empty), and an entry lasts until the next node
list lease in the inventory expires (or is asked about before the last one it saw expired), since
expiry alone can change a verdict (a list's images and its sandbox report alike).
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping

from image_preflight.core.decide.workloads import CONTAINER_FIELDS, SCHEDULING_FIELDS, VOLUMES

LIMIT = 4096  # entries per inventory
KEY_CHARACTERS = 4096  # a spec whose deciding text is longer is decided every time


def key_of(spec: Mapping, kind: str, require: str, timeless: bool) -> tuple | None:
    """The key for `spec`, or None when it is not worth or not safe to remember (malformed,
    unusual types, too long): then it is simply decided."""
    if type(spec) is not dict:
        return None
    parts: list = [kind, require, timeless]
    size = 0
    for field in CONTAINER_FIELDS:
        items = spec.get(field)
        if items is None:
            continue
        if type(items) is not list:
            return None
        for item in items:
            if type(item) is not dict:
                return None
            entry = (field, item.get("name"), item.get("image"), item.get("imagePullPolicy"))
            if not all(v is None or type(v) is str for v in entry):
                return None
            size += sum(len(v) for v in entry if v)
            parts.append(entry)
    volumes = spec.get(VOLUMES)
    if volumes is not None:
        if type(volumes) is not list:
            return None
        for volume in volumes:
            if type(volume) is not dict:
                return None
            if "image" in volume:
                parts.append((VOLUMES, _text(volume.get("name")), _text(volume["image"])))
                size += len(parts[-1][1]) + len(parts[-1][2])
    for field in CONTAINER_FIELDS + (VOLUMES,):
        parts.append(field in spec)  # null and absent read alike, but keep the shape exact
    for field in SCHEDULING_FIELDS:
        value = spec.get(field)
        if value is None:
            parts.append(None)
        else:
            text = _text(value)
            size += len(text)
            parts.append(text)
    if size > KEY_CHARACTERS:
        return None
    return tuple(parts)


def _text(value: object) -> str:
    # Canonical JSON: equal values, equal text. NaN and friends are refused with the rest.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def window(inventory, now: float | None) -> tuple[float, float]:
    """The times around `now` between which no lease in `inventory` ends, so a decision made at
    `now` holds for any time in [start, end)."""
    if now is None:
        return -math.inf, math.inf
    ends = inventory.lease_ends
    index = bisect.bisect_right(ends, now)
    return (ends[index - 1] if index else -math.inf), (ends[index] if index < len(ends) else math.inf)
