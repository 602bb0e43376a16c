"""Which images a node's agent pins against the kubelet's image GC, and which it unpins (pure).

The kubelet's image GC skips an image its runtime reports as pinned
(pkg/kubelet/images/image_gc_manager.go, freeSpace: `if image.pinned`). containerd (2.0, 1.7.10,
1.6.25 and later) reports an image as pinned when one of its image records carries the label
`io.cri-containerd.pinned=pinned` (internal/cri/store/image/image.go, labels.PinnedImageLabelKey).
The agent sets that label, with a mark of its own beside it, on the records of the needed images
its node holds, and removes both only from records that carry its mark: it never touches a pin
it did not make (the sandbox image's, an operator's).

The needed list is a ConfigMap (NEEDED_CONFIGMAP): each data key is one file of references,
one per line, as `image-preflight scan --needed-images` writes them; the union of all keys is
what is needed. Whoever writes it could keep the image GC from freeing anything and fill the
disk, so an agent pins at most a byte budget's worth (`--pin-max-bytes`) and reports the rest as
refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from image_preflight.core.decide.inventory import image_key, is_image_id
from image_preflight.core.decide.references import InvalidReference

PINNED_LABEL = "io.cri-containerd.pinned"  # containerd: pkg/labels.PinnedImageLabelKey
PINNED_VALUE = "pinned"  # containerd: pkg/labels.PinnedImageLabelValue
MARK_LABEL = "image-preflight.io/pinned-by"
MARK_VALUE = "image-preflight-agent"
NEEDED_NAMESPACE = "image-preflight-agent"
NEEDED_NAME = "needed-images"
NEEDED_CONFIGMAP = f"{NEEDED_NAMESPACE}/{NEEDED_NAME}"
# The first containerd releases whose CRI plugin takes in a label set on an image it already holds
# (internal/cri/store/image/image.go, Store.update with store.pin/unpin: containerd#9338, in 2.0,
# backported as #9381 in v1.7.10 and #9382 in v1.6.25). Pinning came in v1.7.3 (#8718) and
# v1.6.22 (#8720), but there a label set after the image was loaded is ignored until a restart.
PINNING_SINCE: dict[tuple[int, ...], tuple[int, ...]] = {(1, 6): (1, 6, 25), (1, 7): (1, 7, 10)}
FIRST_PINNING_MAJOR = 2
_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")
MAX_ERRORS_SHOWN = 3
MAX_MESSAGE = 4096  # the NodeImages CRD's spec.pinning.message maxLength
DEFAULT_MAX_BYTES = 200 * 2**30  # the agent's --pin-max-bytes


@dataclass(frozen=True, slots=True)
class NeededImages:
    """The images a ConfigMap lists (image_key() of each) and the lines it could not read."""

    keys: frozenset[str]
    errors: tuple[str, ...] = ()  # one line each, naming the key and line

    @property
    def summary(self) -> str | None:
        """The errors in one line, or None."""
        if not self.errors:
            return None
        shown = "; ".join(self.errors[:MAX_ERRORS_SHOWN])
        more = len(self.errors) - MAX_ERRORS_SHOWN
        return shown + (f"; and {more} more" if more > 0 else "")


def parse_needed(data: Mapping[str, object] | None, where: str = NEEDED_CONFIGMAP) -> NeededImages:
    """A ConfigMap's `data` as the needed images: every key a file of references, one per line;
    blank lines and lines starting with '#' are skipped. `where` names the ConfigMap in errors."""
    keys: set[str] = set()
    errors: list[str] = []
    for name in sorted(data or {}):
        text = (data or {})[name]
        if not isinstance(text, str):
            errors.append(f"configmap {where} key {name}: not text")
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            reference = line.strip()
            if not reference or reference.startswith("#"):
                continue
            try:
                keys.add(image_key(reference))
            except InvalidReference as exc:
                errors.append(f"configmap {where} key {name} line {number}: {exc}")
    return NeededImages(frozenset(keys), tuple(errors))


def needed_text(images: Iterable[str]) -> str:
    """The file `scan --needed-images` writes: image_key() of each, sorted, one per line."""
    return "".join(f"{key}\n" for key in sorted({image_key(image) for image in images}))


def pinning_refusal(runtime_name: str, runtime_version: str) -> str | None:
    """Why this runtime cannot pin (one line), or None when it can (PINNING_SINCE)."""
    if runtime_name != "containerd":
        return (f"runtime {runtime_name or '(unnamed)'} {runtime_version}".rstrip()
                + " is not containerd: the pinned label means nothing to it")
    found = _VERSION.match(runtime_version)
    if found is None:
        return f"containerd version {runtime_version!r} is not a version this agent can read"
    version = tuple(int(part) for part in found.groups())
    if version[0] >= FIRST_PINNING_MAJOR or version >= PINNING_SINCE.get(version[:2], (FIRST_PINNING_MAJOR,)):
        return None
    return (f"containerd {runtime_version} does not take in a pinned label set on an image it holds"
            " (1.6.25, 1.7.10 and 2.0 do): the kubelet's image GC may delete any unused image")


@dataclass(frozen=True, slots=True)
class PinPlan:
    pin: tuple[str, ...]  # image record names to label pinned (and marked)
    unpin: tuple[str, ...]  # marked record names to clear
    refused: tuple[str, ...] = ()  # needed records left unpinned: they would pass the byte budget


def _names(image: Mapping[str, Any]) -> list[str]:
    return [*(image.get("repoTags") or ()), *(image.get("repoDigests") or ())]


def _key(name: str) -> str | None:
    try:
        return image_key(name)
    except InvalidReference:  # "<none>:<none>" and the like: nothing can ask for it
        return None


def held_needed(needed: frozenset[str],
                images: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str, Mapping[str, Any]]]:
    """For each needed key this node holds: the record name it resolves to and the image.

    containerd's CRI names its records as the runtime resolves them, so the record name is the
    listed name whose key is the needed one; a needed image ID resolves to its `sha256:` record.
    """
    held: dict[str, tuple[str, Mapping[str, Any]]] = {}
    for image in images:
        for name in _names(image):
            key = _key(name)
            if key in needed and key not in held:
                held[key] = (name, image)
        image_id = image.get("id")
        if isinstance(image_id, str) and image_id in needed and is_image_id(image_id):
            held.setdefault(image_id, (image_id, image))
    return held


def pin_plan(needed: NeededImages, images: Sequence[Mapping[str, Any]], marked: Mapping[str, Mapping[str, str]],
             max_bytes: int | None = None) -> PinPlan:
    """What to change so the needed images held here are pinned, within `max_bytes` of image
    sizes (None: no budget), and nothing else carries our pin.

    `images` are the runtime's (CRI ListImages, as agent.inventory.image_dicts gives them);
    `marked` the image records carrying MARK_LABEL, with their labels. An image the runtime already
    reports pinned by someone else is left alone and spends none of the budget. Our own pins keep
    their place in the budget first, then the others by name: a new list never churns what is
    pinned. While the list has errors nothing is unpinned: a mangled list must not release what a
    good one kept.
    """
    held = sorted(held_needed(needed.keys, images).items())
    order = ([(name, image) for _, (name, image) in held if name in marked]
             + [(name, image) for _, (name, image) in held if name not in marked and not image.get("pinned")])
    pin, refused, spent = [], [], 0
    for name, image in order:
        listed = image.get("size")
        size = listed if isinstance(listed, int) else 0
        if max_bytes is not None and spent + size > max_bytes:
            refused.append(name)
            continue
        spent += size
        if (marked.get(name) or {}).get(PINNED_LABEL) != PINNED_VALUE:  # not ours yet, or our mark lost its pin
            pin.append(name)
    unpin = [] if needed.errors else sorted(
        name for name in marked if _key(name) not in needed.keys or name in refused)
    return PinPlan(tuple(sorted(pin)), tuple(unpin), tuple(sorted(refused)))


def needed_unpinned(needed: frozenset[str], images: Sequence[Mapping[str, Any]]) -> list[str]:
    """The needed keys this node holds whose image the runtime does not report pinned (what the
    kubelet's GC may still delete), sorted."""
    return sorted(key for key, (_, image) in held_needed(needed, images).items() if not image.get("pinned"))


def pinning_report(*, source: str, refusal: str | None, needed: NeededImages | None,
                   images: Sequence[Mapping[str, Any]], problem: str | None = None, refused: Sequence[str] = (),
                   max_bytes: int | None = None) -> dict[str, Any]:
    """NodeImages `spec.pinning`: the list it follows (NAMESPACE/NAME), whether this runtime can pin,
    how many needed images the node holds, how many of them the runtime reports pinned and how many
    the byte budget `max_bytes` left unpinned (`refused`, the plan's), and the one-line problem if
    any. `needed` None: the list has not been read yet."""
    report: dict[str, Any] = {"list": source, "supported": refusal is None}
    if needed is not None:
        held = held_needed(needed.keys, images)
        report["needed"] = len(held)
        report["pinned"] = sum(1 for _, image in held.values() if image.get("pinned"))
    if refused:
        report["refused"] = len(refused)
        shown = ", ".join(refused[:MAX_ERRORS_SHOWN]) + (f" and {len(refused) - MAX_ERRORS_SHOWN} more"
                                                         if len(refused) > MAX_ERRORS_SHOWN else "")
        problem = problem or (f"{len(refused)} needed image(s) not pinned ({shown}): pinning them would pass "
                              f"--pin-max-bytes {max_bytes}")
    message = refusal or problem or (needed.summary if needed is not None else None)
    if message:
        report["message"] = message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE - 1] + "…"
    return report
