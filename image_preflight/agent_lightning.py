"""The trainer's side: filter agent-lightning's datasets before `run_ppo` (and its `ray.init()`).

    train, val = image_preflight.agent_lightning.filter_datasets(config, train, val,
                                                                  inventory="cluster.json")

`config` is the trainer's agent-lightning config (an OmegaConf DictConfig or a dict): its
`agentlightning.k8s.job_template_path` names the Job template the controller will render for every
row, exactly as the trainer sends it (agentlightning/verl/agl_rollout_manager.py reads that file's
text into each rollout's `config.k8s.job_template`). Rows whose Job would wait for an absent image
are dropped and logged; a split left empty raises, as agent-lightning asserts non-empty datasets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from os import PathLike
from pathlib import Path

from image_preflight.core.decide.inventory import DEFAULT_MAX_IMAGES, Inventory
from image_preflight.errors import InputError

TEMPLATE_KEY = "agentlightning.k8s.job_template_path"

log = logging.getLogger("image_preflight.agent_lightning")


def template_path(config: object) -> Path:
    """`agentlightning.k8s.job_template_path` of a DictConfig, a dict or an object with attributes."""
    node = config
    for part in TEMPLATE_KEY.split("."):
        if isinstance(node, Mapping):
            node = node.get(part)
        else:
            node = getattr(node, part, None)
        if node is None:
            raise InputError(f"{TEMPLATE_KEY}: not set in the trainer's config")
    if not isinstance(node, (str, PathLike)):
        raise InputError(f"{TEMPLATE_KEY}: expected a file path, got {type(node).__name__}")
    return Path(node)


def cluster_inventory(*, kubeconfig: str | None = None, context: str | None = None,
                      max_images: int | None = DEFAULT_MAX_IMAGES) -> Inventory:
    """The cluster of the kubeconfig's context, read once as `image-preflight scan` reads it
    (needs the kube extra)."""
    try:
        from image_preflight.kube.client import api_client
        from image_preflight.kube.cluster_inventory import read_cluster
    except ImportError:
        raise InputError("reading the cluster needs the Kubernetes client: pip install 'image-preflight[kube]', "
                         "or pass inventory= (an `image-preflight inventory dump` file)") from None
    from image_preflight.core.sources.snapshots import SnapshotError, load_document

    now = time.time()
    api = api_client(Path(kubeconfig) if kubeconfig else None, context=context)
    try:
        document = read_cluster(api, now=now, note=log.info)
    finally:
        api.close()
    try:
        return load_document(document, source="the cluster", observed_at=now, max_images=max_images)
    except SnapshotError as exc:
        raise InputError(str(exc)) from None


def filter_datasets(config: object, train: Sequence[Mapping], val: Sequence[Mapping], *,
                    inventory: str | PathLike | Sequence[str | PathLike] | Inventory | None = None,
                    kubeconfig: str | None = None, context: str | None = None, keep_unknown: bool = False,
                    max_images: int | None = DEFAULT_MAX_IMAGES) -> tuple[list, list]:
    """The rows of `train` and `val` (as the trainer sends them) whose rollout Jobs find their
    images. `inventory`: an Inventory, snapshot file(s) (`image-preflight inventory dump` output),
    or None to read the cluster. InputError (a ValueError, one line) for a missing template or
    inventory, or a split left with no row."""
    from image_preflight.api import judge_rows, load_inventory

    path = template_path(config)
    try:
        template = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{TEMPLATE_KEY} {path}: cannot read: {exc.strerror or exc}") from None
    if inventory is None:
        nodes = cluster_inventory(kubeconfig=kubeconfig, context=context, max_images=max_images)
    elif isinstance(inventory, Inventory):
        nodes = inventory
    else:
        nodes = load_inventory(inventory, max_images=max_images)
    kept_splits = []
    for split, rows in (("train", train), ("val", val)):
        result = judge_rows(rows, template=template, inventory=nodes, keep_unknown=keep_unknown)
        kept = result.kept
        for what, judged in (("dropped", result.dropped), ("kept unconfirmed", result.unconfirmed)):
            for index, _row, verdict in judged:
                log.warning("%s row %d %s: %s %s%s", split, index, what, verdict.reason, ", ".join(verdict.images),
                            f" ({verdict.detail})" if verdict.detail else "")
        log.info("%s: kept %d of %d rows (%d unconfirmed)", split, len(kept), len(rows), len(result.unconfirmed))
        if not kept:
            raise InputError(f"{split}: every one of its {len(rows)} rows was dropped (their images are not on the "
                             "nodes rollouts land on); agent-lightning needs a non-empty dataset: see the log above")
        kept_splits.append(kept)
    return kept_splits[0], kept_splits[1]
