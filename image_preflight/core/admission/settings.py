"""What `serve`'s answers depend on: the mode, what an unconfirmed image does, where images must be."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from image_preflight.core.admission.steering import DEFAULT_MAX_NODES
from image_preflight.core.decide.decision import REQUIREMENTS, Outcome, Requirement


class Mode(StrEnum):
    """What `serve --mode` does with a pod the decision denies."""

    ENFORCE = "enforce"  # deny it
    WARN = "warn"  # allow it with warnings that say why enforce would deny it
    AUDIT = "audit"  # allow it; only the decision log line and metrics say so


MODES = tuple(Mode)
ENFORCE, WARN, AUDIT = MODES
# What `serve --unknown` does with an unknown outcome (partial or stale inventory, no eligible node).
UNKNOWN_POLICIES = (Outcome.ALLOW, Outcome.DENY)


@dataclass(frozen=True, slots=True)
class Settings:
    mode: Mode = Mode.ENFORCE
    unknown: Outcome = Outcome.ALLOW  # what an unknown outcome does: one of UNKNOWN_POLICIES
    require: Requirement = Requirement.ALL  # for Pods; and for templates unless steering
    # Steering on (`serve --steer`): Pods are restricted to the nodes holding their images at
    # /mutate, so Jobs and other templates need only one eligible node holding every image.
    steer: bool = False
    max_steer_nodes: int = DEFAULT_MAX_NODES

    def __post_init__(self) -> None:
        # Words from flags or files become members here, or a ValueError naming the field.
        for name, words, allowed in (("mode", Mode, MODES), ("unknown", Outcome, UNKNOWN_POLICIES),
                                     ("require", Requirement, REQUIREMENTS)):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"{name}: {value!r} is not one of {', '.join(allowed)}")
            if type(value) is not words:
                object.__setattr__(self, name, words(value))

    def require_for(self, kind: str) -> Requirement:
        return Requirement.ONE_NODE if self.steer and kind != "Pod" else self.require
