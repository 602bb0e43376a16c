"""`image-preflight agent`: publish (or print) this node's complete image list from CRI.

The runner: agent/config.py holds the flags and the config they map onto."""

from __future__ import annotations

import json
import logging
import sys
import time

from image_preflight.agent.config import AgentConfig
from image_preflight.agent.cri import ImageClient
from image_preflight.agent.inventory import image_dicts, node_images_object, sandbox_image_report
from image_preflight.core.sources.runtime_lists import image_hashes
from image_preflight.service import Signals, Stops, configure_logging, serve_metrics

log = logging.getLogger("image_preflight.agent")


def run(config: AgentConfig) -> int:
    images = ImageClient(config.cri_endpoint)  # CRIError: the runtime cannot be reached
    with images:
        if not config.publish:
            return _print(images, config)
        return _publish(images, config)


def _print(images: ImageClient, config: AgentConfig) -> int:
    listed = image_dicts(images.list_images())
    sandbox = images.sandbox_image() or config.sandbox_image
    obj = node_images_object(config.node, listed, observed_at=time.time(), lease_seconds=config.lease,
                             spec={"sandboxImage": sandbox_image_report(sandbox, listed) if sandbox else None},
                             hashes=image_hashes(listed) if config.list_form == "hashes" else None)
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _publish(images: ImageClient, config: AgentConfig) -> int:
    configure_logging(config.log_level)
    stops = Stops()
    with Signals() as signals:
        try:
            agent = _start(images, config, stops)
            log.info("publishing %s from %s every %g s%s, lease %d s", agent.publisher.where, images.endpoint,
                     config.interval, " and on image events" if config.image_events else "", config.lease)
            signals.on_stop(agent.wake)
            stopped = signals.run(agent.run, "agent")  # BrokenLoopError: the CLI says it
        finally:
            stops.close()
    if stopped:
        log.info("stopped")
        return 0
    log.error("CRI endpoint %s failed %d cycles in a row; exiting so the container is restarted",
              images.endpoint, agent.cri_failures)
    return 1


def _start(images: ImageClient, config: AgentConfig, stops: Stops):
    """The agent, and the needed list's watch when pinning (what stops them, in `stops`)."""
    from image_preflight.agent.metrics import Metrics
    from image_preflight.agent.publisher import Publisher
    from image_preflight.agent.runner import Agent

    api = config.cluster.client()
    stops.add(api.close)  # last: after every watch on it
    if config.write_policy is not None:
        from image_preflight.kube.write_policies import require

        # RBAC cannot tell one node's agent from another's; only the policy keeps each to its own.
        require(api, config.write_policy, "any agent's token may write every node's NodeImages")
    pinner = None
    if config.pin_needed_images:
        from image_preflight.agent.containerd_images import ImageRecords
        from image_preflight.agent.pinner import Pinner

        pinner = Pinner(ImageRecords(images.endpoint, timeout=images.timeout), config.pin_needed_images,
                        max_bytes=config.pin_max_bytes)
        stops.add(pinner.records.close)
    agent = Agent(images, Publisher(api, config.node, lease_seconds=config.lease,
                                           hashed=config.list_form == "hashes",
                                           namespace=config.cluster.agent_namespace), interval=config.interval,
                  exit_after_failures=config.exit_after_failures, image_events=config.image_events,
                  sandbox_image=config.sandbox_image, pinner=pinner, metrics=Metrics())
    serve_metrics(config.metrics_port, config.host, agent.metrics.registry, stops)
    if pinner is not None:
        from image_preflight.kube.needed_images import needed_images_watcher

        def needed_changed(configmap) -> None:
            pinner.set_list(configmap)
            agent.wake()

        watcher = needed_images_watcher(api, pinner.source, needed_changed)
        watcher.start()
        stops.add(watcher.stop)
    return agent
