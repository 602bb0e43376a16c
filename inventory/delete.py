"""`image-preflight inventory delete`: the node agents' NodeImages objects deleted once the agents
are gone, as the Helm chart's uninstall hook runs it. The runner: inventory/config.py holds the
flags and the config they map onto."""

from __future__ import annotations

import sys
import time

from image_preflight.inventory.config import DeleteConfig
from image_preflight.kube.cluster_inventory import delete_node_images


def run(config: DeleteConfig) -> int:
    api = config.cluster.client()
    try:
        deleted = delete_node_images(api, settle_s=config.settle, sleep=time.sleep)
    finally:
        api.close()
    print(f"image-preflight inventory delete: {len(deleted)} NodeImages deleted"
          + (f" ({', '.join(sorted(deleted))})" if deleted else ""), file=sys.stderr)
    return 0
