"""Words a decision is told in, by the webhook's answers and the scanner's lines alike."""

from __future__ import annotations

from image_preflight.core.decide.decision import Decision

NODES_NAMED = 5
# Into the namespace the CRI plugin reads (containerd's k8s.io), as `ctr` reads an image tarball.
SANDBOX_ADVICE = "import it: ctr -n k8s.io images import pause.tar"


def nodes_named(names: tuple[str, ...]) -> str:
    shown = ", ".join(names[:NODES_NAMED])
    more = len(names) - NODES_NAMED
    return f"{shown} and {more} more" if more > 0 else shown


def by_sandbox_image(decision: Decision) -> list[tuple[str, tuple[str, ...]]]:
    """(sandbox image, nodes lacking it), in the order the nodes come."""
    grouped: dict[str, list[str]] = {}
    for node, image in decision.sandbox_missing:
        grouped.setdefault(image, []).append(node)
    return [(image, tuple(nodes)) for image, nodes in grouped.items()]


def sandbox_clauses(decision: Decision) -> list[str]:
    """One clause per sandbox image that eligible nodes' runtimes lack (core/decide/decision.py, decide_images)."""
    return [f"eligible node(s) {nodes_named(nodes)} cannot start any pod: the container runtime lacks its sandbox "
            f"image {image!r}, so the pod would wait in ContainerCreating (FailedCreatePodSandBox); {SANDBOX_ADVICE}"
            for image, nodes in by_sandbox_image(decision)]
