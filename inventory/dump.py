"""`image-preflight inventory dump`: the cluster's inventory as one snapshot for offline scans.

A `kind: List` holding every Node (scheduling traits, node status' capped image list, and the
kubelet's nodeStatusMaxImages where configz may be read), every current NodeImages object (the
agents' complete lists) and every RuntimeClass (the scheduling a pod naming one gains), which
`scan --inventory` and `serve --inventory` read as they are (see image_preflight.kube.cluster_inventory).
The runner: inventory/config.py holds the flags and the config they map onto.
"""

from __future__ import annotations

import json
import sys
import time

from image_preflight.core.sources.runtime_lists import RUNTIME_KIND
from image_preflight.files.atomic import write_atomic
from image_preflight.inventory.config import DumpConfig
from image_preflight.kube.cluster_inventory import read_cluster


def run(config: DumpConfig) -> int:
    api = config.cluster.client()
    try:
        document = read_cluster(api, now=time.time(), note=_note, agent_namespace=config.cluster.agent_namespace)
    finally:
        api.close()
    text = json.dumps(document, separators=(",", ":")) + "\n"
    if config.out is None:
        sys.stdout.write(text)
    else:
        write_atomic(config.out, text)
    kinds = [item["kind"] for item in document["items"]]
    renewed = f" ({kinds.count('Lease')} renewed by their Lease)" if "Lease" in kinds else ""
    _note(f"{kinds.count('Node')} nodes, {kinds.count(RUNTIME_KIND)} NodeImages{renewed}, "
          f"{kinds.count('RuntimeClass')} RuntimeClasses" + (f" written to {config.out}" if config.out else ""))
    return 0


def _note(message: str) -> None:
    print(f"image-preflight inventory dump: {message}", file=sys.stderr)
