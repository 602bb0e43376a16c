"""`image-preflight doctor`: check the cluster end to end, one line per finding with its fix.

Exit 0 when nothing is wrong, 1 with problems, 2 when the cluster cannot be checked at all.
"""

from __future__ import annotations

import argparse
import os
import time

from image_preflight.cli import add_cluster_arguments
from image_preflight.core.decide.inventory import DEFAULT_MAX_IMAGES
from image_preflight.doctor import cluster, findings, gc
from image_preflight.doctor.findings import PROBLEM, SKIPPED, Finding
from image_preflight.errors import UsageError
from image_preflight.kube.client import api_client  # the kube extra: the CLI names it when absent
from image_preflight.kube.cluster_inventory import (
    NotServed,
    kubelet_caps,
    kubelet_configs,
    list_node_images,
    list_nodes,
    node_names,
)

DEFAULT_ROLLOUT_NAMESPACE = "default"  # agent-lightning's examples/swe_smith/run.sh: AGL_NAMESPACE


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check the cluster end to end: webhook, certificate, namespaces, node lists, image GC",
        description="Check that the webhook is configured, reachable and trusted, which namespaces it "
        "checks, how much each node's image list proves, where rollout pods may land, and where the kubelet's "
        "image GC may delete a needed image. One line per finding with the command that fixes it; exit 0 "
        "healthy, 1 with problems, 2 cannot check.",
    )
    add_cluster_arguments(parser)
    parser.add_argument("--namespace", metavar="NS", default=os.environ.get("AGL_NAMESPACE") or DEFAULT_ROLLOUT_NAMESPACE,
                        help="where agent-lightning creates its Jobs (default: $AGL_NAMESPACE, else %(default)s)")
    parser.add_argument("--webhook-address", metavar="HOST:PORT",
                        help="read the served certificate here (default: the Service's DNS name, in-cluster)")
    parser.add_argument("--max-images", type=int, default=DEFAULT_MAX_IMAGES, metavar="N",
                        help="the kubelets' nodeStatusMaxImages where configz is not readable (default %(default)s)")
    parser.add_argument("--node-selector", action="append", default=[], metavar="KEY=VALUE",
                        help="the rollout template's nodeSelector (agent-lightning's has none; repeatable)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    selector = dict(_pair(item) for item in args.node_selector)
    api = api_client(args.kubeconfig, context=args.context)
    try:
        found = check(api, rollouts=args.namespace, webhook_address=args.webhook_address,
                      max_images=args.max_images, node_selector=selector, now=time.time())
    finally:
        api.close()
    for finding in found:
        print(finding.line())
    problems = sum(1 for f in found if f.status == PROBLEM)
    print(f"{problems} problem(s)" if problems else "no problems found")
    return 1 if problems else 0


def check(api, *, rollouts: str, webhook_address: str | None, max_images: int | None,
          node_selector: dict[str, str], now: float) -> list[Finding]:
    """Every finding, in the order a user fixes them. UsageError when the cluster cannot be read."""
    nodes = list_nodes(api)  # unreadable: exit 2
    found: list[Finding] = []
    try:
        found_config, target = findings.webhook_configuration(cluster.webhook_configurations(api))
        found += found_config
    except cluster.Unreadable as exc:
        found.append(Finding(SKIPPED, f"the webhook's configuration ({exc})"))
        target = None
    if target is not None:
        found += findings.deployment(target, cluster.ready_endpoints(api, target), cluster.replicas(api, target),
                                     cluster.replica_pods(api, target))
        if target.ca_bundle:
            outcome, not_after = cluster.served_certificate(target, webhook_address)
            found.append(findings.served_certificate(target, outcome, not_after, now))
        try:
            all_namespaces = cluster.namespaces(api)
        except cluster.Unreadable as exc:
            found.append(Finding(SKIPPED, f"the opted-in namespaces ({exc})"))
        else:
            found += findings.namespaces(all_namespaces, target, rollouts)
            chosen = findings.opted_in(all_namespaces, target)
            where = rollouts if rollouts in chosen else (chosen[0] if chosen else None)
            found.append(findings.probe(cluster.probe(api, where) if where else ("", ""), where))
    try:
        published = list_node_images(api)
    except NotServed:
        published = []
    except UsageError as exc:
        found.append(Finding(SKIPPED, f"the node agent's lists ({exc})"))
        published = []
    notes: list[str] = []
    configs = kubelet_configs(api, node_names(nodes))  # once, for the caps and the image GC
    caps = kubelet_caps(api, node_names(nodes), notes.append, configs=configs)
    found += [Finding(SKIPPED, note) for note in notes]
    found += findings.node_lists(nodes, published, caps, max_images, now)
    found += findings.landing(nodes, node_selector)
    found += _image_gc(api, nodes, published, configs, node_selector)
    return found


def _image_gc(api, nodes: list[dict], published: list[dict], configs: dict, node_selector: dict[str, str]
              ) -> list[Finding]:
    """The needed list, then per node what the kubelet's image GC may take."""
    try:
        found, needed = gc.needed_list(cluster.needed_list(api))
    except cluster.Unreadable as exc:
        found, needed = [Finding(SKIPPED, f"the needed list ({exc})")], None
    reported = gc.by_node(published)
    names = gc.gc_nodes(nodes, reported, findings.eligible_nodes(nodes, node_selector))
    # Without configz the threshold is not known: the disk use alone would say nothing.
    summaries = cluster.kubelet_summaries(api, [n for n in names if isinstance(configs.get(n), dict)])
    return found + gc.image_gc(names, configs, summaries, reported, needed)


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise UsageError(f"--node-selector {text!r}: expected KEY=VALUE")
    return key, value
