"""The Python API: what a trainer calls before `ray.init()`, and what the webhook decides with.

    import image_preflight

    inventory = image_preflight.load_inventory("nodes.json")
    kept, dropped = image_preflight.filter_rows(rows, image="{{ input.image_name }}:openai",
                                                inventory=inventory)
    pin = image_preflight.needed_images(rows, image="{{ input.image_name }}:openai", inventory=inventory)

filter_rows and needed_images are views of judge_rows, which gives all three in one pass.

Bad input raises a ValueError subclass whose message names the file, row or field.
"""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Union

from image_preflight.core.decide import decision
from image_preflight.core.decide.inventory import DEFAULT_MAX_IMAGES, Inventory
from image_preflight.core.decide.workloads import WORKLOAD_KINDS, pod_spec_of
from image_preflight.core.rows.judge import RowJudge, RowVerdict, make_template
from image_preflight.core.rows.judged import Filtered, filtered
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


def judge_rows(rows: Iterable[Mapping], *, template: str | None = None, image: str | None = None,
               inventory: Inventory, require: str = decision.REQUIRE_ALL, keep_unknown: bool = False,
               now: float | None = None) -> Filtered:
    """Render the rollout Job for every row, as agent-lightning renders it, and judge its images
    against `inventory`: the kept rows, the dropped ones with their verdicts (and with `keep_unknown`
    those kept unconfirmed), and the images the kept rows need, in one pass.

    `template` is the Job template text, or `image` a one-container shortcut such as
    '{{ input.image_name }}:openai'. `require`: "all" (every eligible node holds the images), "any"
    or "one-node". Leases of the node agents' lists are judged at `now` (default: the current time).
    Raises TemplateError (a ValueError) when the template cannot yield a Job at all."""
    job_template = make_template(template, image)
    job_template.check()
    judge = RowJudge(job_template, inventory, require=require, keep_unknown=keep_unknown,
                     now=time.time() if now is None else now)
    return filtered(rows, judge)


def filter_rows(rows: Iterable[Mapping], **rules) -> tuple[list[Mapping], list[tuple[int, Mapping, RowVerdict]]]:
    """judge_rows(rows, **rules)'s kept rows and [(index, row, RowVerdict), ...], each index
    counted from 0 as `image-preflight scan` numbers rows."""
    result = judge_rows(rows, **rules)
    return result.kept, result.dropped


def needed_images(rows: Iterable[Mapping], **rules) -> list[str]:
    """judge_rows(rows, **rules)'s needed list: the IfNotPresent/Never images of the kept rows'
    Jobs, each as the runtime names it ('docker.io/library/foo:openai'), sorted: the lines of
    `image-preflight scan --needed-images`, for the node agent to pin (docs/agent.md)."""
    return judge_rows(rows, **rules).needed


# help() shows judge_rows' keywords on its two views: they are defined once, there.
for _view, _returns in ((filter_rows, "tuple[list[Mapping], list[tuple[int, Mapping, RowVerdict]]]"),
                        (needed_images, "list[str]")):
    setattr(_view, "__signature__", inspect.signature(judge_rows).replace(return_annotation=_returns))
del _view, _returns
