"""The verdict on one dataset row: render its Job once per distinct input, decide with the core."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scanner.render import MISSING, JobTemplate, RowError, image_template, lookup
from webhook import decision as core
from webhook.inventory import Inventory
from webhook.scheduling import SchedulingSpecError
from webhook.workloads import WorkloadError, pod_spec_of

# Why a row is dropped (or kept).
KEPT = "kept"
MISSING_IMAGE, UNKNOWN, UNRENDERABLE, INVALID, NO_ELIGIBLE_NODE = (
    "missing",
    "unknown",
    "unrenderable",
    "invalid",
    "no-eligible-node",
)
DROP_REASONS = (MISSING_IMAGE, UNKNOWN, UNRENDERABLE, INVALID, NO_ELIGIBLE_NODE)


@dataclass(frozen=True, slots=True)
class RowVerdict:
    reason: str  # KEPT or one of DROP_REASONS
    images: tuple[str, ...] = ()  # the images that decided it (missing, unknown or invalid ones)
    nodes: tuple[str, ...] = ()  # nodes lacking them, or whose lists prove nothing
    detail: str = ""

    @property
    def kept(self) -> bool:
        return self.reason == KEPT


class RowJudge:
    """Judges rows against one template and inventory, rendering once per distinct key."""

    def __init__(
        self,
        template: JobTemplate,
        inventory: Inventory,
        *,
        require: str = core.REQUIRE_ALL,
        keep_unknown: bool = False,
        now: float | None = None,
    ) -> None:
        self.template = template
        self.inventory = inventory
        self.require = require
        self.keep_unknown = keep_unknown
        self.now = now
        self._cache: dict[tuple, RowVerdict] = {}

    @property
    def renders(self) -> int:
        return len(self._cache)

    def key(self, row: Mapping) -> tuple:
        paths = self.template.paths
        if paths is None:
            return (_freeze(row),)
        return tuple(_freeze(lookup(row, path)) for path in paths)

    def judge(self, row: Mapping, key: tuple | None = None) -> RowVerdict:
        key = self.key(row) if key is None else key
        verdict = self._cache.get(key)
        if verdict is None:
            verdict = self._cache[key] = self._judge_uncached(row)
        return verdict

    def _judge_uncached(self, row: Mapping) -> RowVerdict:
        try:
            job = self.template.render(row)
            decision = core.decide(pod_spec_of(job), self.inventory, require=self.require, now=self.now)
        except (RowError, WorkloadError, SchedulingSpecError) as exc:
            return RowVerdict(UNRENDERABLE, detail=str(exc))
        return verdict_of(decision, keep_unknown=self.keep_unknown)


def verdict_of(decision: core.Decision, *, keep_unknown: bool = False) -> RowVerdict:
    invalid = decision.with_status(core.INVALID)
    if invalid:
        return RowVerdict(INVALID, _images(invalid), detail=invalid[0].detail)
    if decision.outcome == core.NO_ELIGIBLE_NODE:
        reasons = "; ".join(f"{count} {reason}" for reason, count in decision.ineligible) or "no nodes in the inventory"
        return RowVerdict(NO_ELIGIBLE_NODE, detail=reasons)
    if decision.outcome == core.DENY:
        missing = decision.with_status(core.MISSING)
        return RowVerdict(MISSING_IMAGE, _images(missing), _nodes(v.missing_on for v in missing))
    if decision.outcome == core.UNKNOWN and not keep_unknown:
        unknown = decision.with_status(core.UNKNOWN)
        return RowVerdict(UNKNOWN, _images(unknown), _nodes(v.unknown_on for v in unknown))
    return RowVerdict(KEPT)


def _images(verdicts: Iterable[core.ImageVerdict]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v.image.image for v in verdicts))


def _nodes(groups: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n for group in groups for n in group))


def _freeze(value: object) -> object:
    """A hashable stand-in that renders identically only when `value` does (types matter)."""
    if value is MISSING or value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, (int, float)):
        return (type(value).__name__, value)
    return (type(value).__name__, json.dumps(value, default=repr))


def make_template(template: str | None, image: str | None, *, name: str = "<template>") -> JobTemplate:
    """A JobTemplate from a template text or from an `--image` expression (exactly one)."""
    if (template is None) == (image is None):
        raise ValueError("give exactly one of a template or an image expression")
    if image is not None:
        return JobTemplate(image_template(image), name="--image")
    return JobTemplate(template, name=name)  # type: ignore[arg-type]


def filter_rows(
    rows: Iterable[Mapping],
    *,
    template: str | None = None,
    image: str | None = None,
    inventory: Inventory,
    require: str = core.REQUIRE_ALL,
    keep_unknown: bool = False,
    now: float | None = None,
) -> tuple[list[Mapping], list[tuple[int, Mapping, RowVerdict]]]:
    """Split rows into those whose rollout Job would find its images and those that would not.

    `template` is the Job template text, or `image` a one-container shortcut such as
    '{{ input.image_name }}:openai'. Returns (kept rows, [(index, row, verdict), ...]).
    Raises scanner.render.TemplateError when the template cannot yield a Job at all.
    """
    job_template = make_template(template, image)
    job_template.check()
    judge = RowJudge(job_template, inventory, require=require, keep_unknown=keep_unknown, now=now)
    kept, dropped = [], []
    for index, row in enumerate(rows):
        verdict = judge.judge(row)
        if verdict.kept:
            kept.append(row)
        else:
            dropped.append((index, row, verdict))
    return kept, dropped
