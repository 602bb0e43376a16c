"""The verdict on one dataset row: render its Job once per distinct input, decide with the core."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from image_preflight.core.decide.decision import REQUIRE_ALL, Decision, ImageGroup, ImageStatus, Outcome, decide
from image_preflight.core.decide.inventory import Inventory
from image_preflight.core.decide.scheduling import SchedulingSpecError
from image_preflight.core.decide.words import sandbox_clauses
from image_preflight.core.decide.workloads import WorkloadError, pod_spec_of
from image_preflight.core.rows.render import (
    MISSING,
    JobTemplate,
    RowError,
    TemplateError,
    as_sent,
    image_template,
    lookup,
    reach,
)
from image_preflight.core.rows.slots import Path, Shape, SlotPlan, shape_of, substitute, survives_yaml


class RowReason(StrEnum):
    """Why a row is kept or dropped: the summary's columns and the dropped rows' `reason`."""

    KEPT = "kept"
    MISSING_IMAGE = "missing"
    UNKNOWN = "unknown"
    UNRENDERABLE = "unrenderable"
    INVALID = "invalid"
    NO_ELIGIBLE_NODE = "no-eligible-node"
    NO_SANDBOX = "no-sandbox-image"  # a node it may land on starts no pod: its runtime lacks the pause image


KEPT, MISSING_IMAGE, UNKNOWN, UNRENDERABLE, INVALID, NO_ELIGIBLE_NODE, NO_SANDBOX = RowReason
DROP_REASONS = tuple(reason for reason in RowReason if reason is not KEPT)
Key = tuple[object, ...]  # what rows sharing a verdict (or a rendered shape) have alike


@dataclass(frozen=True, slots=True)
class RowVerdict:
    reason: RowReason
    images: tuple[str, ...] = ()  # the images that decided it (missing, unknown or invalid ones), as written
    nodes: tuple[str, ...] = ()  # nodes lacking them, or whose lists prove nothing
    detail: str = ""  # why: the invalid reference, the unrenderable field, why the lists prove nothing
    # Fields the row lacks that the Job prints as empty text, as agent-lightning renders them.
    missing_fields: tuple[str, ...] = ()
    # Kept: the IfNotPresent/Never images its pod asks the nodes for (init containers and image
    # volumes included), each as image_key() gives it; what `scan --needed-images` lists.
    needed: tuple[str, ...] = ()

    # With --keep-unknown an UNKNOWN row is kept, and counted and reported as kept unconfirmed.
    unconfirmed: bool = False

    @property
    def kept(self) -> bool:
        return self.reason == KEPT or self.unconfirmed


class RowJudge:
    """Judges rows against one template and inventory, sharing work between rows.

    Rows that agree on the fields the verdict can depend on share one verdict. With slots (see
    core.rows.slots) those are the steering fields and the slots' fields, except that a slot
    printing a bare field outside the pod's image and scheduling fields only needs the field to
    be there; the Job's shape is rendered once per steering values and each slot evaluated on its
    own. Without slots every field the template reads counts, and each key gets a full render.
    """

    def __init__(
        self,
        template: JobTemplate,
        inventory: Inventory,
        *,
        require: str = REQUIRE_ALL,
        keep_unknown: bool = False,
        now: float | None = None,
    ) -> None:
        self.template = template
        self.inventory = inventory
        self.require = require
        self.keep_unknown = keep_unknown
        self.now = now
        self.plan = template.plan
        self._shapes: dict[Key, Shape | None] = {}
        self._shared: dict[Key, RowVerdict | None] = {}  # None: judge each row on its own
        self._exact: dict[Key, RowVerdict] = {}
        self.value_paths, self.presence_paths = self._key_paths()

    def _key_paths(self) -> tuple[tuple[Path, ...] | None, tuple[Path, ...]]:
        """(fields keyed by value, fields keyed by presence only)."""
        if self.plan is None:
            return self.template.paths, ()
        deciding = self._deciding_markers(self.template.probe_row(), self.plan)
        by_value = set(self.plan.steering)
        by_presence = set()
        for slot in self.plan.slots:
            if slot.bare is not None and deciding is not None and slot.marker not in deciding:
                by_presence.add(slot.bare)
            else:
                by_value.update(slot.paths)
        by_presence -= by_value
        order = self.template.paths or ()
        return tuple(p for p in order if p in by_value), tuple(p for p in order if p in by_presence)

    @property
    def renders(self) -> int:
        """Verdicts worked out: each a full render, or slot texts on a shared shape."""
        return len(self._shared) + len(self._exact)

    def _key(self, row: Mapping[str, Any]) -> Key:
        if self.value_paths is None:
            return (_freeze(row),)
        # How far each path goes matters as much as the value: `input.a.b` is Undefined when `a`
        # lacks `b` but an error when `a` is absent; and `input.name.lower` reads `name` whole.
        values = tuple((depth, _freeze(value)) for depth, value in (reach(row, p) for p in self.value_paths))
        return values + tuple(_presence(reach(row, p), len(p)) for p in self.presence_paths)

    def shared_verdict(self, row: Mapping[str, Any], key: Key | None = None) -> RowVerdict | None:
        """The verdict for every row with this key, or None when each needs its own render."""
        return self._shared_verdict(as_sent(row), key)

    def _shared_verdict(self, row: Mapping[str, Any], key: Key | None) -> RowVerdict | None:
        # `row` as sent (see as_sent): converted once per row, not once per step.
        key = self._key(row) if key is None else key
        if key not in self._shared:
            self._shared[key] = (self._judge_by_slots(row, self.plan) if self.plan is not None
                                 else self._judge_uncached(row))
        return self._shared[key]

    def judge(self, row: Mapping[str, Any], key: Key | None = None) -> RowVerdict:
        row = as_sent(row)
        key = self._key(row) if key is None else key
        verdict = self._shared_verdict(row, key)
        if verdict is not None:
            return verdict
        exact = (key, tuple(_freeze(reach(row, p)[1]) for p in self.presence_paths))
        verdict = self._exact.get(exact)
        if verdict is None:
            verdict = self._exact[exact] = self._judge_uncached(row)
        return verdict

    def _shape(self, row: Mapping[str, Any], plan: SlotPlan) -> Shape | None:
        key = tuple((d, _freeze(v)) for d, v in (reach(row, p) for p in plan.steering))
        if key not in self._shapes:
            try:
                text, missing = self.template.render_shape(row)
                job = self.template.load(text)
                spec = pod_spec_of(job)
            except (RowError, WorkloadError):
                self._shapes[key] = None  # the full render names the problem
            else:
                if missing:  # a missing field printed outside the slots: the full render judges it
                    self._shapes[key] = None
                    return None
                self._shapes[key] = shape_of(text, spec, job, [s.marker for s in plan.slots])
        return self._shapes[key]

    def _deciding_markers(self, row: Mapping[str, Any], plan: SlotPlan) -> frozenset[str] | None:
        shape = self._shape(row, plan)
        return None if shape is None else shape.deciding

    def _judge_by_slots(self, row: Mapping[str, Any], plan: SlotPlan) -> RowVerdict | None:
        shape = self._shape(row, plan)
        if shape is None:
            return None
        texts: dict[str, str] = {}
        missing_fields: list[str] = []
        for slot in plan.slots:
            presence_only = slot.bare in self.presence_paths
            if presence_only and slot.marker in shape.deciding:
                return None  # this shape puts a presence-keyed field where the decision reads it
            if presence_only and slot.bare is not None and lookup(row, slot.bare) is not MISSING:
                continue  # prints whatever it holds, somewhere the decision does not read
            try:
                text, missing = self.template.render_slot(slot, row)
            except RowError as exc:
                return RowVerdict(UNRENDERABLE, detail=str(exc))
            if missing and slot.marker in shape.deciding:
                return RowVerdict(UNRENDERABLE, detail=f"field {missing[0]}: missing")
            if not survives_yaml(text):
                return None
            texts[slot.marker] = text
            missing_fields += missing
        return self._decide(substitute(shape.fields, texts), tuple(dict.fromkeys(missing_fields)))

    def _judge_uncached(self, row: Mapping[str, Any]) -> RowVerdict:
        try:
            job, missing_fields = self.template.render_job(row)
            spec = pod_spec_of(job)
        except (RowError, WorkloadError) as exc:
            return RowVerdict(UNRENDERABLE, detail=str(exc))
        return self._decide(spec, missing_fields)

    def _decide(self, spec: Mapping[str, Any], missing_fields: tuple[str, ...] = ()) -> RowVerdict:
        try:
            decision = decide(spec, self.inventory, require=self.require, now=self.now)
        except (WorkloadError, SchedulingSpecError) as exc:
            return RowVerdict(UNRENDERABLE, detail=str(exc))
        verdict = verdict_of(decision, self.inventory, now=self.now, keep_unknown=self.keep_unknown)
        return replace(verdict, missing_fields=missing_fields) if missing_fields else verdict


def _presence(reached: tuple[int, object], length: int) -> object:
    depth, value = reached
    return True if depth == length else (depth, _freeze(value))


def verdict_of(decision: Decision, inventory: Inventory, *, now: float | None = None,
               keep_unknown: bool = False) -> RowVerdict:
    invalid = decision.images(ImageStatus.INVALID)
    if invalid:
        return RowVerdict(INVALID, invalid.images, detail=invalid.verdicts[0].detail)
    if decision.outcome == Outcome.NO_ELIGIBLE_NODE:
        reasons = "; ".join(f"{count} {reason}" for reason, count in decision.ineligible) or "no nodes in the inventory"
        return RowVerdict(NO_ELIGIBLE_NODE, detail=reasons)
    if decision.outcome == Outcome.DENY:
        # Only images some node really lacks go to the build list; a node without its sandbox
        # image is named once, for that (core/decide/decision.py, Decision.images).
        missing = decision.images(ImageStatus.MISSING)
        if missing:
            return RowVerdict(MISSING_IMAGE, missing.images, missing.nodes)
        # Denied with no image missing on a node that runs pods: the denial is the sandbox's.
        return RowVerdict(NO_SANDBOX, nodes=decision.halted, detail="; ".join(sandbox_clauses(decision)))
    if decision.outcome == Outcome.UNKNOWN:
        unknown = decision.images(ImageStatus.UNKNOWN)
        return RowVerdict(UNKNOWN, unknown.images, unknown.nodes,
                          decision.unplaced or _unconfirmed_because(unknown, inventory, now),
                          unconfirmed=keep_unknown, needed=_needed(decision) if keep_unknown else ())
    return RowVerdict(KEPT, needed=_needed(decision))


def _unconfirmed_because(unknown: ImageGroup, inventory: Inventory, now: float | None) -> str:
    """Why each node's list cannot confirm the images: "cpu-1, cpu-2: list capped by nodeStatusMaxImages"."""
    by_reason: dict[str, list[str]] = {}
    for verdict, names in unknown:
        for name in names:
            node = inventory.get(name)
            because = node.inconclusive_because(now, verdict.key or "") if node is not None else ""
            nodes = by_reason.setdefault(because or "list unconfirmed", [])
            if name not in nodes:
                nodes.append(name)
    if not by_reason:
        return "no eligible node's list to confirm it"
    return "; ".join(f"{', '.join(nodes)}: {because}" for because, nodes in by_reason.items())


def _needed(decision: Decision) -> tuple[str, ...]:
    """The names the kubelet asks the node for: every judged image not pulled Always."""
    return tuple(dict.fromkeys(v.key for v in decision.verdicts if v.image.node_dependent and v.key is not None))


def _freeze(value: object) -> object:
    """A hashable stand-in equal only for values the template prints alike. Python equality is not
    that: 0.0 == -0.0, {1: "a"} == {1.0: "a"}, and equal dicts may differ in order. Jinja prints
    str(value), which for numbers and containers is repr(value)."""
    if value is MISSING or value is None or isinstance(value, (str, bool)):
        return value
    return (type(value).__name__, repr(value))


def make_template(template: str | None, image: str | None, *, name: str = "<template>") -> JobTemplate:
    """A JobTemplate from a template text or from an `--image` expression (exactly one)."""
    if template is not None and image is None:
        return JobTemplate(template, name=name)
    if image is not None and template is None:
        return JobTemplate(image_template(image), name="--image")
    raise TemplateError("give exactly one of a template or an image expression")
