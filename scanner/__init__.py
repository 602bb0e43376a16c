"""Drop dataset rows whose rendered rollout Job names an image the nodes do not hold.

    from image_preflight.scanner import filter_rows
    kept, dropped = filter_rows(rows, image="{{ input.image_name }}:openai", inventory=inventory)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__all__ = ["RowVerdict", "filter_rows", "judge_rows", "needed_images"]

if TYPE_CHECKING:
    from image_preflight.scanner.judge import RowVerdict
    from image_preflight.scanner.rows import filter_rows, judge_rows, needed_images


def __getattr__(name: str):
    # On first use: `scan`'s parser (scanner.config) is built without loading Jinja2.
    if name not in __all__:
        raise AttributeError(f"module 'image_preflight.scanner' has no attribute {name!r}")
    from image_preflight.scanner import judge, rows

    return getattr(judge if name == "RowVerdict" else rows, name)
