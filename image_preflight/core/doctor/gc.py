"""The kubelet's image garbage collection against the needed images, per node (pure).

The kubelet deletes unused images that its runtime does not report pinned, every 5 minutes
(pkg/kubelet/kubelet.go, ImageGCPeriod): by disk use once the image filesystem reaches
imageGCHighThresholdPercent, down to the low threshold, and, with imageMaximumGCAge set, by age
whatever the disk use (pkg/kubelet/images/image_gc_manager.go, GarbageCollect and freeOldImages).
The node agent pins the needed images (image_preflight.core.image_gc.pinning); these findings say where
the GC can still take one. image_preflight.doctor.cluster reads what they judge.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from image_preflight.core.doctor.findings import AGENT_APPLY, OK, PROBLEM, SKIPPED, Finding, helm_upgrade
from image_preflight.core.image_gc import pinning
from image_preflight.core.sources.runtime_lists import node_images_from_runtime


class KubeletUnread(Protocol):
    """A kubelet endpoint the node proxy did not answer, as the shell that read it tells it
    (image_preflight.kube.cluster_inventory.KubeletUnread): the HTTP status (None: no answer, or
    not JSON) and one line of why."""

    @property
    def status(self) -> int | None: ...

    @property
    def why(self) -> str: ...


# A node this many points under the high threshold is one long run's pulls away from it.
NEAR_POINTS = 10
SHOWN = 3
ENABLE_PINNING = "enable pinning: " + helm_upgrade("image-preflight", "agent.pinning.enabled=true")
AGENT_LOGS = f"kubectl -n {pinning.NEEDED_NAMESPACE} logs ds/image-preflight-agent"
# From pinning's rules, so that the advice follows them: "... 2.0 or later (or 1.7.10, 1.6.25 or later ...)".
UPGRADE = (f"upgrade containerd to {pinning.FIRST_PINNING_MAJOR}.0 or later (or "
           + ", ".join(".".join(map(str, v)) for v in sorted(pinning.PINNING_SINCE.values(), reverse=True))
           + " or later in their series)")
CREATE_LIST = (f"kubectl -n {pinning.NEEDED_NAMESPACE} create configmap {pinning.NEEDED_NAME} "
               "--from-file=needed.txt")
def grant_proxy(node: str) -> str:
    """Read access to one node's kubelet through the apiserver's node proxy, and no other's. The
    proxy is authorised as get on nodes/proxy however fine the kubelet's own authorisation is
    (pkg/kubelet/server/auth.go, GetRequestAttributes, applies to direct callers), and it opens the
    whole kubelet API of that node: so it is named, never granted for every node."""
    role = f"image-preflight-read-kubelet-{node}"[:253]
    return (f"kubectl create clusterrole {role} --verb=get --resource=nodes/proxy --resource-name={node} && "
            f"kubectl create clusterrolebinding {role} --clusterrole={role} --user=YOU")


@dataclass(frozen=True, slots=True)
class GCPolicy:
    """The kubelet's image GC settings as configz serves them; absent fields take the kubelet's
    defaults (pkg/kubelet/apis/config/v1beta1/defaults.go, SetDefaults_KubeletConfiguration)."""

    high: int = 85
    low: int = 80
    min_age: str = "2m0s"
    max_age: str = "0s"
    max_age_s: float = 0.0

    @property
    def off(self) -> bool:
        # pkg/kubelet/kubelet.go, StartGarbageCollection: high 100 and no maximum age stubs image GC out.
        return self.high == 100 and self.max_age_s == 0

    def text(self) -> str:
        return (f"imageGCHighThresholdPercent {self.high}, imageGCLowThresholdPercent {self.low}, "
                f"imageMinimumGCAge {self.min_age}, imageMaximumGCAge {self.max_age}")


def gc_policy(config: Mapping[str, Any]) -> GCPolicy:
    """From configz `kubeletconfig`; ValueError naming a field that is not what the kubelet writes."""
    high, low = _percent(config, "imageGCHighThresholdPercent", 85), _percent(config, "imageGCLowThresholdPercent", 80)
    min_age = _duration_text(config, "imageMinimumGCAge", "2m0s")
    max_age = _duration_text(config, "imageMaximumGCAge", "0s")
    return GCPolicy(high, low, min_age, max_age, go_duration(max_age))


def _percent(config: Mapping[str, Any], field: str, default: int) -> int:
    value = config.get(field, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"configz {field}: {value!r} is not an integer")
    return value


def _duration_text(config: Mapping[str, Any], field: str, default: str) -> str:
    value = config.get(field, default)
    if not isinstance(value, str):
        raise ValueError(f"configz {field}: {value!r} is not a duration")
    try:
        go_duration(value)
    except ValueError as exc:
        raise ValueError(f"configz {field}: {exc}") from None
    return value


# Go's time.ParseDuration: a sign, then decimal numbers each with a unit ("2m0s", "1h30m0s", "1.5h").
_UNITS = {"ns": 1e-9, "us": 1e-6, "\u00b5s": 1e-6, "\u03bcs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def go_duration(text: str) -> float:
    """A Go duration string (metav1.Duration in JSON) in seconds; ValueError when it is not one."""
    body = text[1:] if text[:1] in "+-" else text
    if body == "0":
        return 0.0
    seconds, at = 0.0, 0
    while at < len(body):
        part = _PART.match(body, at)
        if part is None:
            break
        seconds += float(part.group(1)) * _UNITS[part.group(2)]
        at = part.end()
    if not body or at != len(body):
        raise ValueError(f"{text!r} is not a Go duration")
    return -seconds if text.startswith("-") else seconds


def image_fs_use(summary: Mapping[str, Any]) -> int:
    """The image filesystem's use in percent, as the kubelet's GC computes it
    (pkg/kubelet/images/image_gc_manager.go, GarbageCollect): absent fields read 0, available is
    capped at capacity, `usagePercent := 100 - int(available*100/capacity)` in integer division.
    ValueError when the kubelet's GC would fail there (no capacity) or the summary has no imageFs."""
    image_fs = ((summary.get("node") or {}).get("runtime") or {}).get("imageFs")
    if not isinstance(image_fs, Mapping):
        raise ValueError("stats/summary has no node.runtime.imageFs")
    capacity, available = _bytes(image_fs, "capacityBytes"), _bytes(image_fs, "availableBytes")
    if capacity == 0:
        raise ValueError("its image filesystem reports capacity 0, so the kubelet's image GC fails there "
                         "(Event InvalidDiskCapacity)")
    return 100 - min(available, capacity) * 100 // capacity


def _bytes(image_fs: Mapping[str, Any], field: str) -> int:
    value = image_fs.get(field) or 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"stats/summary imageFs.{field}: {value!r} is not a byte count")
    return value


@dataclass(frozen=True, slots=True)
class Pins:
    """What a node's agent reports of the needed images there (NodeImages spec.images and spec.pinning)."""

    reported: bool  # a readable NodeImages object exists for the node
    pinning: Mapping[str, Any] | None = None  # spec.pinning; None: pinning is not enabled on that agent
    held: int | None = None  # needed images held there; None: no needed list, or no report
    unpinned: tuple[str, ...] | None = None  # of those, the ones not pinned; None: not known

    @property
    def fix(self) -> str:
        if self.pinning is None:
            return ENABLE_PINNING
        return UPGRADE if self.pinning.get("supported") is False else AGENT_LOGS

    def among(self) -> str:
        """', among them N needed image(s) not pinned (...)', or '' when none is known unpinned."""
        return f", among them {_count(self.unpinned)} not pinned ({_shown(self.unpinned)})" if self.unpinned else ""


def node_pins(obj: Mapping[str, Any] | None, needed: pinning.NeededImages | None) -> Pins:
    """`obj`: the node's NodeImages object, None when it has none (or none readable)."""
    if obj is None:
        return Pins(False)
    spec = obj.get("spec") or {}
    report = spec.get("pinning")
    report = report if isinstance(report, Mapping) else None
    if needed is None:
        return Pins(True, report)
    images = spec.get("images") or []
    held = len(pinning.held_needed(needed.keys, images))
    return Pins(True, report, held, tuple(pinning.needed_unpinned(needed.keys, images)))


def _count(keys: Sequence[str]) -> str:
    return f"{len(keys)} needed image(s)"


def _shown(keys: Sequence[str]) -> str:
    more = len(keys) - SHOWN
    return ", ".join(keys[:SHOWN]) + (f" and {more} more" if more > 0 else "")


def by_node(published: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The readable NodeImages objects by node (node_lists names the unreadable ones)."""
    found = {}
    for obj in published:
        try:
            found[node_images_from_runtime(obj).node] = obj
        except ValueError:
            continue
    return found


def gc_nodes(nodes: Sequence[Mapping[str, Any]], reported: Mapping[str, Mapping[str, Any]],
             eligible: Sequence[str]) -> list[str]:
    """The nodes whose image GC matters: those running the agent and those rollout pods may land
    on, in the nodes' order. A GPU node that takes no rollouts and runs no agent is left out."""
    wanted = set(reported) | set(eligible)
    return [name for name in ((n.get("metadata") or {}).get("name") for n in nodes) if name in wanted]


def needed_list(data: Mapping[str, Any] | None) -> tuple[list[Finding], pinning.NeededImages | None]:
    """The needed-images ConfigMap's `data`, None when the ConfigMap does not exist."""
    where = pinning.NEEDED_CONFIGMAP
    if data is None:
        return [Finding(SKIPPED, f"no needed list (ConfigMap {where} does not exist): whether the kubelet's image "
                        "GC may delete a needed image is not checked, and the agent pins nothing", CREATE_LIST)], None
    needed = pinning.parse_needed(data, where)
    found = [Finding(OK, f"ConfigMap {where} lists {len(needed.keys)} needed image(s)")]
    if needed.summary:
        found.append(Finding(PROBLEM, f"the needed list has lines that are not image references, which nothing "
                             f"pins: {needed.summary}", f"kubectl -n {pinning.NEEDED_NAMESPACE} edit configmap "
                             f"{pinning.NEEDED_NAME} (or re-create it from `image-preflight scan --needed-images`)"))
    return found, needed


def image_gc(names: Sequence[str], configs: Mapping[str, Mapping[str, Any] | KubeletUnread],
             summaries: Mapping[str, Mapping[str, Any] | KubeletUnread], reported: Mapping[str, Mapping[str, Any]],
             needed: pinning.NeededImages | None) -> list[Finding]:
    """Per node in `names`: its runtime's pinning, its needed images left unpinned, its image
    filesystem's use against the GC threshold and its maximum age. `configs`: configz
    `kubeletconfig` of each; `summaries`: stats/summary, absent where not read; `reported`: by_node()."""
    found = []
    for name in names:
        pins = node_pins(reported.get(name), needed)
        found += pinned(name, pins, needed is not None)
        found += kubelet_gc(name, configs.get(name), summaries.get(name), pins)
    return found


def pinned(name: str, pins: Pins, listed: bool) -> list[Finding]:
    """Whether this node's runtime can pin and whether its needed images are. `listed`: a needed list exists."""
    report = pins.pinning
    if report is not None and report.get("supported") is False:
        why = report.get("message") or "not containerd, or a containerd that ignores the pinned label"
        return [Finding(PROBLEM, f"node {name}: its container runtime cannot pin ({why}): the kubelet's image GC may "
                        f"delete any unused image there{pins.among()}", UPGRADE)]
    if not listed:
        return []
    if not pins.reported:
        return [Finding(SKIPPED, f"node {name}: no node agent reports its images: whether its needed images are "
                        "pinned is not known", AGENT_APPLY)]
    if pins.unpinned:
        if report is None:
            how = ": pinning is not enabled on its node agent"
        else:
            how = " although its node agent pins" + (f" ({report['message']})" if report.get("message") else "")
        return [Finding(PROBLEM, f"node {name}: {_count(pins.unpinned)} not pinned ({_shown(pins.unpinned)}){how}, "
                        "so the kubelet's image GC may delete them", pins.fix)]
    if not pins.held:
        return [Finding(OK, f"node {name}: holds none of the needed images")]
    return [Finding(OK, f"node {name}: the {pins.held} needed image(s) it holds are pinned")]


def kubelet_gc(name: str, config: Mapping[str, Any] | KubeletUnread | None,
               summary: Mapping[str, Any] | KubeletUnread | None, pins: Pins) -> list[Finding]:
    """The node's image GC settings and its image filesystem's use against them."""
    if not isinstance(config, Mapping):
        return [_unread(name, "its kubelet's image GC settings and disk use (configz", config)]
    try:
        policy = gc_policy(config)
    except ValueError as exc:
        return [Finding(SKIPPED, f"node {name}: its kubelet's image GC settings ({exc})")]
    if policy.off:
        return [Finding(OK, f"node {name}: the kubelet's image GC is off ({policy.text()})")]
    found = [disk(name, policy, summary, pins)]
    if policy.max_age_s > 0:
        found.append(maximum_age(name, policy, pins))
    return found


def disk(name: str, policy: GCPolicy, summary: Mapping[str, Any] | KubeletUnread | None, pins: Pins) -> Finding:
    if not isinstance(summary, Mapping):
        return _unread(name, f"its image filesystem's use ({policy.text()}; stats/summary", summary)
    try:
        use = image_fs_use(summary)
    except ValueError as exc:
        return Finding(SKIPPED, f"node {name}: its image filesystem's use ({exc})")
    if use >= policy.high:
        fix = pins.fix if pins.unpinned else (f"grow node {name}'s image filesystem or free it of what is not "
                                              f"images (kubectl describe node {name}: Events FreeDiskSpaceFailed)")
        return Finding(PROBLEM, f"node {name}: image filesystem {use}% used, at or above imageGCHighThresholdPercent "
                       f"{policy.high}: the kubelet's image GC is deleting unused unpinned images there now, every 5 "
                       f"minutes, down to {policy.low}%{pins.among()}", fix)
    # Near the threshold is a problem only with a needed image known unpinned: then a long run's pulls
    # may cross it and take that image mid-run. With every needed image pinned, what the GC would
    # delete is what no rollout asks for; where pins are not known, the lines above say why.
    if use >= policy.high - NEAR_POINTS and pins.unpinned:
        return Finding(PROBLEM, f"node {name}: image filesystem {use}% used, {policy.high - use} point(s) under "
                       f"imageGCHighThresholdPercent {policy.high}: a long run's pulls may cross it, and the kubelet's "
                       f"image GC then deletes unused unpinned images{pins.among()}", pins.fix)
    where = "under" if use < policy.high - NEAR_POINTS else f"{policy.high - use} point(s) under"
    return Finding(OK, f"node {name}: image filesystem {use}% used, {where} the image GC threshold ({policy.text()})")


def maximum_age(name: str, policy: GCPolicy, pins: Pins) -> Finding:
    """freeOldImages deletes images unused for longer than imageMaximumGCAge, whatever the disk use."""
    text = (f"node {name}: imageMaximumGCAge {policy.max_age}: the kubelet deletes images unused for longer than "
            "that, whatever the disk use")
    if pins.unpinned:
        return Finding(PROBLEM, text + pins.among(), pins.fix)
    return Finding(OK, text + ("; the needed images there are pinned" if pins.unpinned == () else ""))


def _unread(name: str, what: str, unread: KubeletUnread | None) -> Finding:
    """One line for a kubelet endpoint the node proxy did not answer; `what` opens a parenthesis."""
    if unread is None:
        return Finding(SKIPPED, f"node {name}: {what} not read)")
    if unread.status == 403:
        return Finding(SKIPPED, f"node {name}: {what}: HTTP 403; reading it needs get on nodes/proxy)",
                       grant_proxy(name))
    why = unread.why if len(unread.why) <= 200 else unread.why[:200] + "..."
    if unread.status is not None and unread.status >= 500:
        why += ": the apiserver cannot reach its kubelet (node down?)"
    return Finding(SKIPPED, f"node {name}: {what}: {why})")
