"""`image-preflight agent`: publish (or print) this node's complete image list from CRI."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from image_preflight.agent.cri import DEFAULT_ENDPOINT, CRIError, ImageClient
from image_preflight.agent.inventory import RENEW_WHEN_REMAINING, image_dicts, node_images_object, sandbox_image_report
from image_preflight.errors import UsageError
from image_preflight.kube.needed_images import split_source


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "agent",
        help="publish this node's complete image list (CRI ListImages) as a NodeImages object",
        description="List the container runtime's images over CRI and keep this node's NodeImages "
        "object current (--publish), or print it once (--print).",
    )
    parser.add_argument("--node", metavar="NAME", help="this node's name (default: $NODE_NAME)")
    parser.add_argument("--cri-endpoint", default=DEFAULT_ENDPOINT, metavar="ENDPOINT",
                        help="the runtime's CRI socket (default %(default)s)")
    parser.add_argument("--interval", type=float, default=30.0, metavar="SECONDS",
                        help="how often to list the images (default %(default)g)")
    parser.add_argument("--lease", type=int, default=300, metavar="SECONDS",
                        help="how long a published list counts as current (default %(default)s)")
    parser.add_argument("--kubeconfig", type=Path, metavar="FILE",
                        help="default: the service account in a pod, else ~/.kube/config")
    parser.add_argument("--exit-after-failures", type=int, default=3, metavar="N",
                        help="exit 1 after N cycles in a row without an answer from the runtime, so the "
                        "kubelet restarts the container with a fresh socket mount (0: never; default %(default)s)")
    parser.add_argument("--no-image-events", dest="image_events", action="store_false",
                        help="only list every --interval; by default containerd's image events also trigger a list"
                        " within about a second")
    parser.add_argument("--sandbox-image", metavar="IMAGE",
                        help="the runtime's sandbox (pause) image, reported when the runtime does not name it over CRI"
                        " (containerd 2.x: its pinned_images.sandbox); a name from the runtime wins")
    parser.add_argument("--pin-needed-images", metavar="NAMESPACE/NAME",
                        help="pin the images this ConfigMap lists (scan --needed-images) against the kubelet's"
                        " image GC, and unpin those it pinned once unlisted; needs containerd 1.6.25, 1.7.10 or 2.x"
                        " (docs/agent.md)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--publish", action="store_true", help="keep the NodeImages object current until SIGTERM")
    mode.add_argument("--print", action="store_true", help="print the NodeImages object as JSON once and exit")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    node = args.node or os.environ.get("NODE_NAME")
    if not node:
        raise UsageError("--node: not given and NODE_NAME is not set")
    if args.lease < 1:
        raise UsageError(f"--lease: must be at least 1 second, got {args.lease}")
    if args.publish and not 0 < args.interval < args.lease * RENEW_WHEN_REMAINING:
        raise UsageError(
            f"--interval: must be above 0 and below a third of --lease ({args.lease * RENEW_WHEN_REMAINING:g} s),"
            f" so the lease is renewed before it ends; got {args.interval:g}"
        )
    if args.pin_needed_images is not None:
        if not args.publish:
            raise UsageError("--pin-needed-images: pins only with --publish")
        try:
            split_source(args.pin_needed_images)
        except ValueError as exc:
            raise UsageError(f"--pin-needed-images: {exc}") from None
    if args.exit_after_failures < 0:
        raise UsageError(f"--exit-after-failures: must be 0 or more, got {args.exit_after_failures}")
    try:
        images = ImageClient(args.cri_endpoint)
    except CRIError as exc:
        raise UsageError(str(exc)) from None
    with images:
        if args.print:
            return _print(images, node, args.lease, args.sandbox_image)
        return _publish(images, node, args)


def _print(images: ImageClient, node: str, lease: int, sandbox_fallback: str | None) -> int:
    try:
        listed = image_dicts(images.list_images())
        sandbox = images.sandbox_image() or sandbox_fallback
    except CRIError as exc:
        raise UsageError(str(exc)) from None
    obj = node_images_object(node, listed, observed_at=time.time(), lease_seconds=lease,
                             sandbox_image=sandbox_image_report(sandbox, listed) if sandbox else None)
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _publish(images: ImageClient, node: str, args: argparse.Namespace) -> int:
    from image_preflight.kube.client import api_client
    from image_preflight.agent.publisher import Agent, Publisher

    logging.basicConfig(level=args.log_level.upper(), format="%(message)s", stream=sys.stderr)
    log = logging.getLogger("agent")
    api = api_client(args.kubeconfig)
    pinner = None
    if args.pin_needed_images:
        from image_preflight.agent.containerd_images import ImageRecords
        from image_preflight.agent.pinner import Pinner

        pinner = Pinner(ImageRecords(images.endpoint, timeout=images.timeout), args.pin_needed_images)
    agent = Agent(images, Publisher(api, node, lease_seconds=args.lease), interval=args.interval,
                  exit_after_failures=args.exit_after_failures, image_events=args.image_events,
                  sandbox_image=args.sandbox_image, pinner=pinner)
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
             args.interval, " and on image events" if args.image_events else "", args.lease)
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
