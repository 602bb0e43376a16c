"""Inventories from snapshot files (the shell around image_preflight.core.snapshots)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from image_preflight.errors import UsageError
from image_preflight.core.inventory import DEFAULT_MAX_IMAGES, Inventory
from image_preflight.core.snapshots import SnapshotError, load_snapshot


def load_inventory_file(paths: Path | Sequence[Path], *, max_images: int | None = DEFAULT_MAX_IMAGES) -> Inventory:
    """One inventory from one or more snapshot files; a later file's node replaces an earlier one's."""
    inventory = Inventory()
    for path in [paths] if isinstance(paths, Path) else paths:
        try:
            text = path.read_text(encoding="utf-8")
            observed_at = path.stat().st_mtime
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"{path}: cannot read snapshot ({getattr(exc, 'strerror', None) or exc})") from None
        try:
            snapshot = load_snapshot(
                text, source=str(path), observed_at=observed_at, max_images=max_images, node_name=path.stem
            )
        except SnapshotError as exc:
            raise UsageError(str(exc)) from None
        inventory = inventory.merged(snapshot.nodes)
    return inventory
