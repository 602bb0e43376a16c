"""Inventories from snapshot files (the shell around image_preflight.core.sources.snapshots)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from image_preflight.core.decide.inventory import DEFAULT_MAX_IMAGES, Inventory
from image_preflight.core.sources.snapshots import SnapshotError, load_snapshot
from image_preflight.errors import InputError
from image_preflight.image_set import compact


def load_inventory_file(paths: Path | Sequence[Path], *, max_images: int | None = DEFAULT_MAX_IMAGES) -> Inventory:
    """One inventory from one or more snapshot files; a later file's node replaces an earlier one's.
    Raises InputError naming the file that cannot be read."""
    inventory = Inventory()
    for path in [paths] if isinstance(paths, Path) else paths:
        try:
            text = path.read_text(encoding="utf-8")
            observed_at = path.stat().st_mtime
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read snapshot ({getattr(exc, 'strerror', None) or exc})") from None
        head = text.lstrip()[:1]
        if path.suffix.lower() == ".json" and head and head not in "{[":
            # The format is told by content, but a file named .json that is not JSON is a mistake,
            # not a text file of references.
            raise InputError(f"{path}: not JSON (a .json snapshot starts with {{ or [), "
                             f"found {text.lstrip().splitlines()[0][:20]!r}")
        try:
            snapshot = load_snapshot(
                text, source=str(path), observed_at=observed_at, max_images=max_images, node_name=path.stem
            )
        except SnapshotError as exc:
            raise InputError(str(exc)) from None
        inventory = inventory.merged(compact(node) for node in snapshot.nodes)
        inventory = inventory.with_runtime_classes(snapshot.runtime_classes)
    return inventory
