"""The words the apiserver relays: the denial message and admission warnings.

agent-lightning fails a rollout at once only when the lower-cased error text contains "422",
"unprocessable" or "invalid"; the apiserver shows our message as
`admission webhook "<name>" denied the request: <message>`, so the message leads with "invalid".
"""

from __future__ import annotations

from image_preflight.core.decide.decision import (
    INVALID,
    MISSING,
    NOT_CHECKED,
    UNKNOWN,
    Decision,
    ImageStatus,
    ImageVerdict,
)
from image_preflight.core.decide.words import by_sandbox_image, sandbox_clauses
from image_preflight.core.decide.words import nodes_named as _nodes

MAX_MESSAGE = 1024  # bytes, so the relayed error stays readable in controller logs
MAX_WARNING = 120  # the apiserver truncates at 256; shorter reads well in kubectl
MAX_WARNINGS_TOTAL = 4096  # the apiserver ignores warnings past 4 KiB
ADVICE = "build or load the image on those nodes, or drop the row with `image-preflight scan`"


def denial_message(decision: Decision) -> str:
    """Name as many images as fit in MAX_MESSAGE and count the rest, so the advice survives the
    limit. Linear in the number of images: clauses are built only while they fit. Nodes that
    start no pod are named once, for their sandbox image, not under each image."""
    missing = decision.images(MISSING)
    flagged: list[str | tuple[ImageVerdict, tuple[str, ...]]] = [
        *sandbox_clauses(decision), *decision.images(INVALID), *missing]
    advice = f"; the pod would wait in ImagePullBackOff/ErrImageNeverPull: {ADVICE}" if missing else ""
    head, size = "invalid: ", len(b"invalid: ")
    shown: list[str] = []
    for index, flag in enumerate(flagged):
        clause = flag if isinstance(flag, str) else _clause(*flag)
        rest = len(flagged) - index - 1
        tail = (f"; and {rest} more image(s)" if rest else "") + advice
        added = len(_utf8(clause)) + (2 if shown else 0)
        if shown and size + added + len(_utf8(tail)) > MAX_MESSAGE:
            break
        shown.append(clause)
        size += added
    rest = len(flagged) - len(shown)
    tail = (f"; and {rest} more image(s)" if rest else "") + advice
    if not shown:
        return "invalid: " + advice
    return _clip(head + "; ".join(shown), MAX_MESSAGE - len(_utf8(tail))) + tail


def _clause(verdict: ImageVerdict, lacking: tuple[str, ...]) -> str:
    image = verdict.image
    if verdict.status == INVALID:
        return f"invalid image reference {image.image!r} in {image.label}"
    return (
        f"image {image.image!r} ({image.label}, imagePullPolicy {image.pull_policy}) "
        f"is absent from eligible node(s) {_nodes(lacking)}"
    )


def _unplaced(decision: Decision) -> str:
    """Why no node can be named for the pod: its own reason, the scheduler's first, or none."""
    if decision.unplaced:
        return decision.unplaced
    if not decision.ineligible:
        return "no node in the inventory can run this pod"
    reason, count = decision.ineligible[0]
    return f"no node in the inventory can run this pod ({count} {reason})"


def unconfirmed_message(decision: Decision) -> str:
    """The denial under `--unknown deny`: images no eligible node's list can confirm."""
    if not decision.eligible:
        return _clip(f"invalid: {_unplaced(decision)}, so its images cannot be confirmed (--unknown deny)", MAX_MESSAGE)
    clauses = [f"image {v.image.image!r} ({v.image.label}) is not confirmed on {_nodes(nodes)}"
               for v, nodes in decision.images(UNKNOWN)]
    return _clip(
        "invalid: " + "; ".join(clauses) + "; their image lists are partial or stale (--unknown deny): "
        "raise nodeStatusMaxImages or run the node agent",
        MAX_MESSAGE,
    )


def _warnings(decision: Decision, status: ImageStatus, text: str) -> list[str]:
    """One warning per image with `status`; `text` formats the image and its nodes (Decision.images)."""
    return [_clip("image-preflight: " + text.format(image=v.image.image, nodes=_nodes(nodes)), MAX_WARNING)
            for v, nodes in decision.images(status)]


def unknown_warnings(decision: Decision) -> list[str]:
    if not decision.eligible:
        return [_clip(f"image-preflight: {_unplaced(decision)}; images not checked", MAX_WARNING)]
    return _warnings(decision, UNKNOWN, "{image} not confirmed on {nodes} (partial or stale list)")


def missing_warnings(decision: Decision) -> list[str]:
    """What enforce mode would deny for: nodes that start no pod, missing images and invalid references."""
    sandbox = [_clip(f"image-preflight: node(s) {_nodes(nodes)} cannot start any pod: the runtime lacks its "
                     f"sandbox image {image}", MAX_WARNING) for image, nodes in by_sandbox_image(decision)]
    return (sandbox + _warnings(decision, INVALID, "invalid image reference {image}")
            + _warnings(decision, MISSING, "{image} absent from {nodes}"))


def not_checked_warnings(decision: Decision) -> list[str]:
    return _warnings(decision, NOT_CHECKED, "{image} not checked (imagePullPolicy Always pulls it)")


def limit_warnings(warnings: list[str]) -> list[str]:
    """Clip each, drop duplicates and stop before the apiserver's 4 KiB total."""
    kept, total = [], 0
    for warning in dict.fromkeys(_clip(w, MAX_WARNING) for w in warnings):
        size = len(_utf8(warning))
        if total + size > MAX_WARNINGS_TOTAL:
            break
        kept.append(warning)
        total += size
    return kept


def _utf8(text: str) -> bytes:
    # A lone surrogate (from a snapshot file's JSON escapes) becomes "?": the reply stays valid UTF-8.
    return text.encode("utf-8", "replace") if not text.isascii() else text.encode("ascii")


def _clip(text: str, limit: int) -> str:
    """`text` within `limit` UTF-8 bytes, always valid UTF-8."""
    data = _utf8(text)
    if len(data) <= limit and (text.isascii() or data.decode("utf-8", "replace") == text):
        return text
    if len(data) <= limit:
        return data.decode("utf-8", "replace")
    return data[: limit - 3].decode("utf-8", "ignore") + "..."
