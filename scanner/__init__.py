"""Drop dataset rows whose rendered rollout Job names an image the nodes do not hold.

    from image_preflight.scanner import filter_rows
    kept, dropped = filter_rows(rows, image="{{ input.image_name }}:openai", inventory=inventory)
"""

from image_preflight.scanner.judge import RowVerdict, filter_rows

__all__ = ["RowVerdict", "filter_rows"]
