"""What a scan tells the user: a summary table, the JSON report, the build list, the pin list."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from image_preflight.core.decide.inventory import Inventory
from image_preflight.core.image_gc.pinning import needed_text
from image_preflight.scanner.judge import DROP_REASONS, UNKNOWN
from image_preflight.scanner.scan import ScanResult

MAX_IMAGES_SHOWN = 20
MAX_ROWS_SHOWN = 20


CAP_ADVICE_SHARE = 0.1  # past this share of rows unknown through caps, the scan says so loudly


def print_summary(result: ScanResult, console: Console, inventory: Inventory | None = None) -> None:
    table = Table(title="image-preflight scan", title_justify="left")
    table.add_column("file")
    for header in ("rows", "kept", *DROP_REASONS):
        table.add_column(header, justify="right")
    for file in result.files:
        counts = file.dropped_by_reason()
        table.add_row(str(file.path), str(file.rows), str(file.kept), *(str(counts.get(r, 0)) for r in DROP_REASONS))
    console.print(table)
    missing = result.missing_images()
    if missing:
        images = Table(title="missing images (build or load these on the node)", title_justify="left")
        images.add_column("image")
        images.add_column("rows", justify="right")
        for image, rows in missing.most_common(MAX_IMAGES_SHOWN):
            images.add_row(image, str(rows))
        console.print(images)
        if len(missing) > MAX_IMAGES_SHOWN:
            console.print(f"... and {len(missing) - MAX_IMAGES_SHOWN} more (see --missing-images)")
    _print_dropped_rows(result, console)
    for file in result.files:
        for name, rows in sorted(file.lacking.items()):
            # agent-lightning's controller prints a missing field as "" (or "None" where the trainer
            # fills missing fields with None) and the Job runs: kept, but said.
            console.print(f"kept {rows} row(s) of {file.path} lacking {name}: printed only as text, the Job still runs",
                          markup=False, highlight=False)
    for file in result.files:
        if file.output is not None:
            console.print(f"wrote {file.kept} kept rows to {_printable(str(file.output))}")
    if inventory is not None:
        for line in cap_warnings(result, inventory):
            console.print(line, markup=False, highlight=False, style="bold")


def cap_warnings(result: ScanResult, inventory: Inventory) -> list[str]:
    """What the node lists' caps cost this scan, and the way out."""
    lines = []
    for node in inventory.nodes:
        if node.over_cap is not None:
            lines.append(f"warning: node {node.node} lists more images than the cap of {node.over_cap} in force, so "
                         f"its kubelet's nodeStatusMaxImages is higher: pass --max-images with that value (-1: no cap)")
    capped = {node.node for node in inventory.nodes if node.capped}
    rows = sum(f.rows for f in result.files)
    unknown = sum(f.dropped.count(lambda v: v.reason == UNKNOWN and capped.intersection(v.nodes)) for f in result.files)
    if rows and unknown > CAP_ADVICE_SHARE * rows:
        lines.append(f"{unknown} of {rows} rows ({unknown / rows:.0%}) are unknown because the kubelets list at most "
                     "nodeStatusMaxImages images per node (50 by default) and these nodes hold more: run the node "
                     "agent (the chart's agent.enabled), or set the kubelets' nodeStatusMaxImages: -1 and pass --max-images -1")
    return lines


def _printable(text: str) -> str:
    """`text` with lone surrogates (from JSON escapes) shown as escapes: always valid UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _print_dropped_rows(result: ScanResult, console: Console) -> None:
    """The first dropped rows, one line each (all of them are in --report)."""
    rows = [row for file in result.files for row in file.dropped[:MAX_ROWS_SHOWN]][:MAX_ROWS_SHOWN]
    for row in rows:
        where = f"{row.file}:{row.line}" if row.line else f"{row.file} row {row.row}"
        what = ", ".join(row.verdict.images) or row.verdict.detail
        if row.verdict.nodes:
            what += f" (not on {', '.join(row.verdict.nodes[:3])}{' ...' if len(row.verdict.nodes) > 3 else ''})"
        elif row.verdict.detail and row.verdict.images:
            what += f" ({row.verdict.detail})"
        console.print(f"dropped {where}: {row.verdict.reason}: {what}", markup=False, highlight=False)
    if result.dropped > len(rows):
        console.print(f"... and {result.dropped - len(rows)} more dropped rows (see --report)")


def report_document(result: ScanResult) -> dict:
    return {
        "files": [
            {
                "file": str(f.path),
                "rows": f.rows,
                "kept": f.kept,
                "dropped": {reason: f.dropped_by_reason().get(reason, 0) for reason in DROP_REASONS},
                # Kept rows lacking a field the Job prints only as text (rendered empty, as
                # agent-lightning's controller renders it), by field.
                "kept_lacking": dict(sorted(f.lacking.items())),
                "output": str(f.output) if f.output else None,
            }
            for f in result.files
        ],
        "dropped": [
            {
                "file": row.file,
                "row": row.row,
                **({"line": row.line} if row.line else {}),
                "reason": row.verdict.reason,
                "images": list(row.verdict.images),
                "nodes": list(row.verdict.nodes),
                **({"detail": row.verdict.detail} if row.verdict.detail else {}),
            }
            for f in result.files
            for row in f.dropped
        ],
        "missing_images": [{"image": image, "rows": rows} for image, rows in result.missing_images().most_common()],
    }


def report_text(result: ScanResult) -> str:
    # ASCII: an image or row text holding a lone surrogate still makes a valid UTF-8 file.
    return json.dumps(report_document(result), indent=2) + "\n"


def missing_images_text(result: ScanResult) -> str:
    return "".join(f"{_printable(image)}\n" for image in sorted(result.missing_images()))


def needed_images_text(result: ScanResult) -> str:
    """The images of the kept rows, one a line, as the node agent reads them (core/image_gc/pinning.py)."""
    return needed_text(result.needed_images())
