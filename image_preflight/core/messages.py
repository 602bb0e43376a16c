"""The words the apiserver relays: the denial message and admission warnings.

agent-lightning fails a rollout at once only when the lower-cased error text contains "422",
"unprocessable" or "invalid"; the apiserver shows our message as
`admission webhook "<name>" denied the request: <message>`, so the message leads with "invalid".
"""

from __future__ import annotations

from image_preflight.core.decision import INVALID, MISSING, NOT_CHECKED, UNKNOWN, Decision, ImageVerdict

MAX_MESSAGE = 1024  # bytes, so the relayed error stays readable in controller logs
MAX_WARNING = 120  # the apiserver truncates at 256; shorter reads well in kubectl
MAX_WARNINGS_TOTAL = 4096  # the apiserver ignores warnings past 4 KiB
NODES_NAMED = 5
ADVICE = "build or load the image on those nodes, or drop the row with `image-preflight scan`"


def _nodes(names: tuple[str, ...]) -> str:
    shown = ", ".join(names[:NODES_NAMED])
    more = len(names) - NODES_NAMED
    return f"{shown} and {more} more" if more > 0 else shown


def _missing_clause(verdict: ImageVerdict) -> str:
    image = verdict.image
    return (
        f"image {image.image!r} ({image.label}, imagePullPolicy {image.pull_policy}) "
        f"is absent from eligible node(s) {_nodes(verdict.missing_on)}"
    )


def denial_message(decision: Decision) -> str:
    invalid = [v for v in decision.verdicts if v.status == INVALID]
    parts = [f"invalid image reference {v.image.image!r} in {v.image.label}" for v in invalid]
    parts += [_missing_clause(v) for v in decision.verdicts if v.status == MISSING]
    advice = ""
    if any(v.status == MISSING for v in decision.verdicts):
        advice = f"; the pod would wait in ImagePullBackOff/ErrImageNeverPull: {ADVICE}"
    # Name as many images as fit and count the rest, so the advice survives the size limit.
    for shown in range(len(parts), 0, -1):
        rest = len(parts) - shown
        head = "invalid: " + "; ".join(parts[:shown])
        tail = (f"; and {rest} more image(s)" if rest else "") + advice
        if len((head + tail).encode()) <= MAX_MESSAGE or shown == 1:
            return _clip(head, MAX_MESSAGE - len(tail.encode())) + tail
    return "invalid: " + advice


def _unplaced(decision: Decision) -> str:
    """Why no node can be named for the pod: the first reason, or an empty inventory."""
    if not decision.ineligible:
        return "no node in the inventory can run this pod"
    reason, count = decision.ineligible[0]
    if reason.startswith(("RuntimeClass", "pod rejected")):
        return reason
    return f"no node in the inventory can run this pod ({count} {reason})"


def unconfirmed_message(decision: Decision) -> str:
    """The denial under `--unknown deny`: images no eligible node's list can confirm."""
    if not decision.eligible:
        return _clip(f"invalid: {_unplaced(decision)}, so its images cannot be confirmed (--unknown deny)", MAX_MESSAGE)
    clauses = [
        f"image {v.image.image!r} ({v.image.label}) is not confirmed on {_nodes(v.unknown_on)}"
        for v in decision.verdicts
        if v.status == UNKNOWN
    ]
    return _clip(
        "invalid: " + "; ".join(clauses) + "; their image lists are partial or stale (--unknown deny): "
        "raise nodeStatusMaxImages or run the node agent",
        MAX_MESSAGE,
    )


def _warnings(decision: Decision, status: str, text: str) -> list[str]:
    """One warning per image with `status`; `text` formats image and nodes."""
    return [
        _clip("image-preflight: " + text.format(image=v.image.image, missing=_nodes(v.missing_on),
                                                 unknown=_nodes(v.unknown_on)), MAX_WARNING)
        for v in decision.verdicts
        if v.status == status
    ]


def unknown_warnings(decision: Decision) -> list[str]:
    if not decision.eligible:
        return [_clip(f"image-preflight: {_unplaced(decision)}; images not checked", MAX_WARNING)]
    return _warnings(decision, UNKNOWN, "{image} not confirmed on {unknown} (partial or stale list)")


def missing_warnings(decision: Decision) -> list[str]:
    """What enforce mode would deny for: missing images and invalid references."""
    return _warnings(decision, INVALID, "invalid image reference {image}") + _warnings(
        decision, MISSING, "{image} absent from {missing}"
    )


def not_checked_warnings(decision: Decision) -> list[str]:
    return _warnings(decision, NOT_CHECKED, "{image} not checked (imagePullPolicy Always pulls it)")


def limit_warnings(warnings: list[str]) -> list[str]:
    """Clip each, drop duplicates and stop before the apiserver's 4 KiB total."""
    kept, total = [], 0
    for warning in dict.fromkeys(_clip(w, MAX_WARNING) for w in warnings):
        size = len(warning.encode())
        if total + size > MAX_WARNINGS_TOTAL:
            break
        kept.append(warning)
        total += size
    return kept


def _clip(text: str, limit: int) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode(errors="ignore") + "..."
