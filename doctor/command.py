"""`image-preflight doctor`: check the cluster end to end, one line per finding with its fix.

Exit 0 when nothing is wrong, 1 with problems, 2 when the cluster cannot be checked at all.
The runner: doctor/config.py holds the flags and the config they map onto.
"""

from __future__ import annotations

import time

from image_preflight.core.doctor import findings, gc
from image_preflight.core.doctor.findings import PROBLEM, SKIPPED, Finding
from image_preflight.core.sources.runtime_lists import AGENT_NAMESPACE
from image_preflight.doctor import cluster
from image_preflight.doctor.config import DoctorConfig
from image_preflight.errors import PreflightError
from image_preflight.kube.cluster_inventory import (
    NotServed,
    kubelet_caps,
    kubelet_configs,
    list_node_images,
    list_nodes,
    list_renewals,
)


def run(config: DoctorConfig) -> int:
    api = config.cluster.client()
    try:
        found = check(api, rollouts=config.namespace, webhook_address=config.webhook_address,
                      max_images=config.max_images, node_selector=config.node_selector, now=time.time(),
                      agent_namespace=config.cluster.agent_namespace)
    finally:
        api.close()
    for finding in findings.summarized(found):
        print(finding.line())
    problems = sum(1 for f in found if f.status == PROBLEM)
    print(f"{problems} problem(s)" if problems else "no problems found")
    return 1 if problems else 0


def check(api, *, rollouts: str, webhook_address: str | None, max_images: int | None,
          node_selector: dict[str, str], now: float, agent_namespace: str = AGENT_NAMESPACE) -> list[Finding]:
    """Every finding, in the order a user fixes them. A PreflightError when the cluster cannot be read."""
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
    release = target.namespace if target is not None else findings.RELEASE_NAMESPACE
    for face in findings.WRITE_POLICIES:
        found += findings.write_policy(face, cluster.cluster_role_exists(api, face.role),
                                       cluster.write_policy(api, face.name), release)
    try:
        published = list_node_images(api)
    except NotServed:
        published = []
    except PreflightError as exc:  # the lists cannot be read (NotServed is caught above)
        found.append(Finding(SKIPPED, f"the node agent's lists ({exc})"))
        published = []
    # The nodes whose lists matter: where rollout pods may land, and where an agent reports. A
    # tainted GPU node that takes no rollouts is no node to judge.
    names = gc.gc_nodes(nodes, gc.by_node(published), findings.eligible_nodes(nodes, node_selector))
    checked = [n for n in nodes if (n.get("metadata") or {}).get("name") in names]
    notes: list[str] = []
    configs = kubelet_configs(api, names)  # once, for the caps and the image GC
    caps = kubelet_caps(api, names, notes.append, configs=configs)
    found += [Finding(SKIPPED, note) for note in notes]
    leases = list_renewals(api, agent_namespace, lambda text: found.append(Finding(SKIPPED, text))) if published else []
    found += findings.node_lists(checked, published, caps, max_images, now, leases)
    found += findings.landing(nodes, node_selector)
    found += _image_gc(api, names, published, configs)
    return found


def _image_gc(api, names: list[str], published: list[dict], configs: dict) -> list[Finding]:
    """The needed list, then per node in `names` what the kubelet's image GC may take."""
    try:
        found, needed = gc.needed_list(cluster.needed_list(api))
    except cluster.Unreadable as exc:
        found, needed = [Finding(SKIPPED, f"the needed list ({exc})")], None
    # Without configz the threshold is not known: the disk use alone would say nothing.
    summaries = cluster.kubelet_summaries(api, [n for n in names if isinstance(configs.get(n), dict)])
    return found + gc.image_gc(names, configs, summaries, gc.by_node(published), needed)
