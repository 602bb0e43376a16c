"""Pin the needed images this node holds, each cycle of the agent (the pinning's I/O shell).

The needed list arrives from a watch of its ConfigMap (image_preflight.kube.needed_images) in a
thread of its own; `apply` runs in the agent's loop. What to change is image_preflight.core.image_gc.pinning's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence

from image_preflight.agent.containerd_images import ImageRecords
from image_preflight.agent.cri import CRIError, RuntimeVersion
from image_preflight.agent.inventory import fingerprint
from image_preflight.core.image_gc.pinning import NeededImages, parse_needed, pin_plan, pinning_refusal, pinning_report

log = logging.getLogger(__name__)


class Pinner:
    def __init__(self, records: ImageRecords, source: str, *, max_bytes: int | None = None) -> None:
        self.records = records
        self.source = source  # NAMESPACE/NAME of the ConfigMap
        self.max_bytes = max_bytes  # of images pinned at once (--pin-max-bytes)
        self._refused: tuple[str, ...] = ()  # what the last plan left unpinned for the budget
        self._lock = threading.Lock()
        self._needed: NeededImages | None = None  # None: not read yet
        self.refusal: str | None = None
        self.runtime_known = False
        self._said: str | None = None  # the problem last logged, so each is logged once
        self._settled: tuple | None = None  # (list, images fingerprint) of the last empty plan
        self._report: tuple | None = None  # (what it was made of, spec.pinning)
        self.pinned = 0  # records labelled since start
        self.unpinned = 0

    @property
    def needed(self) -> NeededImages | None:
        with self._lock:
            return self._needed

    def set_list(self, configmap: Mapping | None) -> None:
        """The ConfigMap as last listed or watched; None: it does not exist, so nothing is needed."""
        needed = parse_needed((configmap or {}).get("data") if configmap is not None else None, self.source)
        with self._lock:
            previous, self._needed = self._needed, needed
        if configmap is None:
            log.info("configmap %s does not exist: no image is needed, so nothing stays pinned by this agent",
                     self.source)
        elif previous is None or previous.keys != needed.keys:
            log.info("configmap %s lists %d needed images", self.source, len(needed.keys))
        if needed.errors:
            log.warning("%s; the other images are pinned, and none is unpinned until the list is mended",
                        needed.summary)

    def runtime(self, version: RuntimeVersion) -> None:
        """The runtime's CRI Version answer: whether it can pin at all, said once."""
        if self.runtime_known:
            return
        self.runtime_known = True
        self.refusal = pinning_refusal(version.runtime_name, version.runtime_version)
        if self.refusal:
            log.warning("cannot pin the needed images: %s; listing the images goes on", self.refusal)
        else:
            log.info("pinning the images configmap %s lists (%s %s)", self.source, version.runtime_name,
                     version.runtime_version)

    def apply(self, images: Sequence[Mapping], digest: str | None = None) -> dict:
        """Pin and unpin what the plan says for `images` (the runtime's list, whose fingerprint is
        `digest` where the caller has it); spec.pinning."""
        digest = fingerprint(images) if digest is None else digest
        needed = self.needed
        problem = None
        if not self.runtime_known:
            problem = "the runtime's version is not known yet"
        elif needed is None:
            problem = f"configmap {self.source} not read yet (see the agent's log)"
        elif self.refusal is None:
            try:
                self._carry_out(needed, images, digest)
            except CRIError as exc:
                problem = str(exc)
                if problem != self._said:
                    log.warning("pinning: %s; trying again next cycle", problem)
        self._said = problem
        key = (needed, digest, self.refusal, problem, self._refused)
        if self._report is None or self._report[0] != key:  # matching 10,000 names costs tens of ms
            self._report = (key, pinning_report(source=self.source, refusal=self.refusal, needed=needed,
                                                images=images, problem=problem, refused=self._refused,
                                                max_bytes=self.max_bytes))
        return dict(self._report[1])

    def _carry_out(self, needed: NeededImages, images: Sequence[Mapping], digest: str) -> None:
        # The plan is a function of the list, the images (their pinned flags included) and our
        # marks, which only we change: once a plan came out empty, the same list and images need
        # no List of the marks until either changes.
        settled = (needed, digest)
        if settled == self._settled:
            return
        plan = pin_plan(needed, images, self.records.marked(), self.max_bytes)
        if plan.refused != self._refused and plan.refused:
            log.warning("%d needed image(s) not pinned: pinning them would pass --pin-max-bytes %s (%s)",
                        len(plan.refused), self.max_bytes, ", ".join(plan.refused[:3]))
        self._refused = plan.refused
        if not plan.pin and not plan.unpin:
            self._settled = settled
        for name in plan.pin:
            if self.records.pin(name):
                self.pinned += 1
                log.info("pinned %s (needed by configmap %s)", name, self.source)
        for name in plan.unpin:
            if self.records.unpin(name):
                self.unpinned += 1
                log.info("unpinned %s (%s)", name, "over --pin-max-bytes" if name in plan.refused
                         else f"no longer in configmap {self.source}")
