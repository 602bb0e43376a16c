"""Inventories and pod specs for the decision."""

from __future__ import annotations

from image_preflight.core.decide.inventory import Inventory, NodeImages
from image_preflight.core.decide.scheduling import NodeTraits
from tests.builders.nodes import OBSERVED

NOW = OBSERVED  # decisions' clock: the moment the lists were observed
SWE = "swebench/swesmith.x86_64.owner_1776_repo.abcdef12:openai"


def node(name, *names, traits=True, complete=True, ids=(), labels=None, taints=(), **listed):
    """NodeImages with scheduling traits (traits=False: unknown, as for a single-node snapshot);
    `listed` is what else the list says (expires_at, observed_at, source, sandbox_missing)."""
    node_traits = NodeTraits(name, labels or {}, tuple(taints)) if traits else None
    return NodeImages.from_names(name, names, ids=ids, traits=node_traits, complete=complete, **listed)


def inv(*nodes):
    return Inventory(tuple(nodes))


def pod(*images, policy="IfNotPresent", **spec):
    """A pod spec, one container per image; an image may be (image, policy)."""
    containers = []
    for index, image in enumerate(images):
        image, pull = image if isinstance(image, tuple) else (image, policy)
        container = {"name": f"c{index}", "image": image}
        if pull:
            container["imagePullPolicy"] = pull
        containers.append(container)
    return {"restartPolicy": "Never", "containers": containers, **spec}
