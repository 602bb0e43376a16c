"""`image-preflight agent`: publish (or print) this node's complete image list from CRI.

The runner: agent/config.py holds the flags and the config they map onto."""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time

from image_preflight.agent.config import AgentConfig
from image_preflight.agent.cri import ImageClient
from image_preflight.agent.inventory import image_dicts, node_images_object, sandbox_image_report


def run(config: AgentConfig) -> int:
    images = ImageClient(config.cri_endpoint)  # CRIError: the runtime cannot be reached
    with images:
        if not config.publish:
            return _print(images, config.node, config.lease, config.sandbox_image)
        return _publish(images, config)


def _print(images: ImageClient, node: str, lease: int, sandbox_fallback: str | None) -> int:
    listed = image_dicts(images.list_images())
    sandbox = images.sandbox_image() or sandbox_fallback
    obj = node_images_object(node, listed, observed_at=time.time(), lease_seconds=lease,
                             sandbox_image=sandbox_image_report(sandbox, listed) if sandbox else None)
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _publish(images: ImageClient, config: AgentConfig) -> int:
    from image_preflight.agent.publisher import Agent, Publisher

    logging.basicConfig(level=config.log_level.upper(), format="%(message)s", stream=sys.stderr)
    log = logging.getLogger("agent")
    api = config.cluster.client()
    pinner = None
    if config.pin_needed_images:
        from image_preflight.agent.containerd_images import ImageRecords
        from image_preflight.agent.pinner import Pinner

        pinner = Pinner(ImageRecords(images.endpoint, timeout=images.timeout), config.pin_needed_images,
                        max_bytes=config.pin_max_bytes)
    agent = Agent(images, Publisher(api, config.node, lease_seconds=config.lease), interval=config.interval,
                  exit_after_failures=config.exit_after_failures, image_events=config.image_events,
                  sandbox_image=config.sandbox_image, pinner=pinner)
    watcher = None
    if pinner is not None:
        from image_preflight.kube.needed_images import needed_images_watcher

        def needed_changed(configmap) -> None:
            pinner.set_list(configmap)
            agent.wake()

        watcher = needed_images_watcher(api, pinner.source, needed_changed)
        watcher.start()
    stop = threading.Event()
    finished: list[bool] = []
    # The loop runs in a thread and the main thread only joins it, so the signal handler never
    # interrupts code holding the event's lock.
    worker = threading.Thread(target=lambda: finished.append(agent.run(stop)), name="agent", daemon=True)
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    log.info("publishing %s from %s every %g s%s, lease %d s", agent.publisher.where, images.endpoint,
             config.interval, " and on image events" if config.image_events else "", config.lease)
    try:
        worker.start()
        while worker.is_alive():
            worker.join(1.0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if watcher is not None:
            watcher.stop()
        if pinner is not None:
            pinner.records.close()
        api.close()
    if finished == [True]:
        log.info("stopped")
        return 0
    if not finished:
        log.error("the agent loop ended unexpectedly (see above)")
        return 1
    log.error("CRI endpoint %s failed %d cycles in a row; exiting so the container is restarted",
              images.endpoint, agent.cri_failures)
    return 1
