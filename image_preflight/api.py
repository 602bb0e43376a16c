"""The Python API: what a trainer calls before `ray.init()`, and what the webhook decides with.

    import image_preflight

    inventory = image_preflight.load_inventory("nodes.json")
    kept, dropped = image_preflight.filter_rows(rows, image="{{ input.image_name }}:openai",
                                                inventory=inventory)
    pin = image_preflight.needed_images(rows, image="{{ input.image_name }}:openai", inventory=inventory)

filter_rows, needed_images and judge_rows (all three in one pass) are image_preflight.scanner.rows'.

Bad input raises a ValueError subclass whose message names the file, row or field.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Union

from image_preflight.core.decide import decision
from image_preflight.core.decide.inventory import DEFAULT_MAX_IMAGES, Inventory
from image_preflight.core.decide.workloads import WORKLOAD_KINDS, pod_spec_of
from image_preflight.files.inventory import load_inventory_file

PathLike = Union[str, os.PathLike]


def load_inventory(path_or_paths: PathLike | Sequence[PathLike], *, max_images: int | None = DEFAULT_MAX_IMAGES
                   ) -> Inventory:
    """The nodes and their images from snapshot files (`kubectl get nodes -o json`, `crictl images
    -o json`, `image-preflight inventory dump`, ...); a later file's node replaces an earlier one's.

    `max_images` is the kubelets' nodeStatusMaxImages (-1 or None: uncapped). Raises
    image_preflight.errors.InputError (a ValueError) naming a file that cannot be read.
    """
    paths = [path_or_paths] if isinstance(path_or_paths, (str, os.PathLike)) else path_or_paths
    return load_inventory_file([Path(p) for p in paths], max_images=max_images)


def decide(workload_or_pod_spec: Mapping, inventory: Inventory, *, require: str = decision.REQUIRE_ALL,
           now: float | None = None) -> decision.Decision:
    """The webhook's verdict on a workload (a Job, Pod, CronJob, Deployment, ... as the API serves
    it) or a bare pod spec: can its IfNotPresent/Never images be found where its pods may land?

    `require` is "all" (every eligible node must hold them), "any" (each image on some eligible
    node) or "one-node" (one eligible node holds them all: what `serve --steer` asks of a Job).
    Leases of the node agents' lists are judged at `now` (default: the current time). Raises WorkloadError,
    SchedulingSpecError (ValueErrors) when the object cannot be read.
    """
    kind = workload_or_pod_spec.get("kind") if isinstance(workload_or_pod_spec, Mapping) else None
    spec = pod_spec_of(workload_or_pod_spec) if kind in WORKLOAD_KINDS else workload_or_pod_spec
    return decision.decide(spec, inventory, require=require, now=time.time() if now is None else now,
                       kind=kind if kind in WORKLOAD_KINDS else "Pod")
