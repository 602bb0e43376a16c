"""Drop dataset rows whose rendered rollout Job names an image the nodes do not hold.

    from scanner import filter_rows
    kept, dropped = filter_rows(rows, image="{{ input.image_name }}:openai", inventory=inventory)
"""

from scanner.judge import RowVerdict, filter_rows

__all__ = ["RowVerdict", "filter_rows"]
