"""What a scan tells the user: the summary (a table on a terminal, one record a line otherwise),
the JSON report, the build list and the pin list.

Rows are numbered from 0 in every format, as filter_rows and pandas number them. Images in the
lists (and in the report's missing_images) are written as the runtime names them
(docker.io/library/...), one form that `docker build -t`, buildah, ctr and the node agent all take
without a registries.conf to resolve short names; a dropped row's `images` are as its Job wrote them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, TextIO

from image_preflight.core.decide.inventory import Inventory
from image_preflight.core.image_gc.pinning import needed_text
from image_preflight.core.rows.judge import DROP_REASONS, UNKNOWN
from image_preflight.core.rows.records import RowRecord, RowRecords
from image_preflight.scanner.scan import FileResult, ScanResult

MAX_IMAGES_SHOWN = 20
MAX_ROWS_SHOWN = 20
CAP_ADVICE_SHARE = 0.1  # past this share of rows unknown through caps, the scan says so loudly
NODES_SHOWN = 3
GAP = "  "  # between a table's columns


def summary_lines(result: ScanResult, inventory: Inventory | None = None, *, width: int | None = None) -> list[str]:
    """What `scan` prints. `width`: the terminal's columns, for tables; None (not a terminal):
    plain lines, one record each, without padding, each starting with what it is."""
    lines = _files_table(result, width) if width is not None else None
    if lines is None:
        lines = [f"scanned {_printable(str(f.path))}: {_counts(f)}" for f in result.files]
    lines += _missing_images(result, table=width is not None)
    lines += _rows("dropped", [f.dropped for f in result.files], result.dropped, "dropped rows (see --report)")
    lines += _rows("kept unconfirmed", [f.unconfirmed for f in result.files], result.unconfirmed,
                   "rows kept unconfirmed (see --report)")
    for file in result.files:
        for name, rows in sorted(file.lacking.items()):
            # agent-lightning's controller prints a missing field as "" (or "None" where the trainer
            # fills missing fields with None) and the Job runs: kept, but said.
            lines.append(f"kept {rows} row(s) of {_printable(str(file.path))} lacking {name}: printed only as text, "
                         "the Job still runs")
    for file in result.files:
        if file.output is not None:
            lines.append(f"wrote {file.kept} kept rows to {_printable(str(file.output))}")
    if inventory is not None:
        lines += cap_warnings(result, inventory)
    return lines


def _columns(result: ScanResult) -> list[tuple[str, list[int]]]:
    """(header, a count per file): rows, kept, kept unconfirmed and each drop reason that occurs."""
    counts = [f.dropped_by_reason() for f in result.files]
    columns = [("ROWS", [f.rows for f in result.files]), ("KEPT", [f.kept for f in result.files])]
    if result.unconfirmed:
        columns.append(("UNCONFIRMED", [len(f.unconfirmed) for f in result.files]))
    columns.append(("DROPPED", [len(f.dropped) for f in result.files]))
    for reason in DROP_REASONS:
        per_file = [c.get(reason, 0) for c in counts]
        if any(per_file):
            columns.append((reason.upper(), per_file))
    return columns


def _files_table(result: ScanResult, width: int) -> list[str] | None:
    """Counts right-aligned, then the file name last and whole; None when the counts alone would not
    leave a name room on the terminal (the plain lines wrap instead)."""
    columns = [(header, [str(n) for n in values]) for header, values in _columns(result)]
    widths = [max(len(header), *(len(v) for v in values)) for header, values in columns]
    counts_width = sum(widths) + len(GAP) * len(widths)
    if counts_width + len("FILE") > width:
        return None
    header = GAP.join(h.rjust(w) for (h, _), w in zip(columns, widths)) + GAP + "FILE"
    rows = [GAP.join(values[i].rjust(w) for (_, values), w in zip(columns, widths)) + GAP + _printable(str(f.path))
            for i, f in enumerate(result.files)]
    return [header, *rows]


def _counts(file: FileResult) -> str:
    kept = f"kept {file.kept}" + (f" ({len(file.unconfirmed)} unconfirmed)" if len(file.unconfirmed) else "")
    dropped = f"dropped {len(file.dropped)}"
    reasons = file.dropped_by_reason()
    if reasons:
        dropped += " (" + ", ".join(f"{reason} {reasons[reason]}" for reason in DROP_REASONS
                                    if reasons.get(reason)) + ")"
    return f"rows {file.rows}, {kept}, {dropped}"


def _missing_images(result: ScanResult, *, table: bool) -> list[str]:
    missing = result.missing_images()
    if not missing:
        return []
    shown = missing.most_common(MAX_IMAGES_SHOWN)
    if table:
        digits = max(len("ROWS"), len(str(shown[0][1])))
        lines = ["", f"{'ROWS'.rjust(digits)}{GAP}MISSING IMAGE (build or load it on the node)"]
        lines += [f"{str(rows).rjust(digits)}{GAP}{_printable(image)}" for image, rows in shown]
    else:
        lines = [f"missing image {_printable(image)}: {rows} rows" for image, rows in shown]
    if len(missing) > MAX_IMAGES_SHOWN:
        lines.append(f"... and {len(missing) - MAX_IMAGES_SHOWN} more missing images (see --missing-images)")
    return lines


def _rows(what: str, per_file: Iterable, total: int, more: str) -> list[str]:
    """The first rows of each kind, one line each (all of them are in --report)."""
    shown = [record for records in per_file for record in records[:MAX_ROWS_SHOWN]][:MAX_ROWS_SHOWN]
    lines = [f"{what} {row_line(record)}" for record in shown]
    if total > len(shown):
        lines.append(f"... and {total - len(shown)} more {more}")
    return lines


def row_line(record: RowRecord) -> str:
    """`FILE row N: REASON: WHAT (WHY)`, the row numbered from 0."""
    verdict = record.verdict
    what = ", ".join(verdict.images) or verdict.detail
    if verdict.reason == UNKNOWN and verdict.images:
        what += f" ({verdict.detail})"  # which nodes' lists prove nothing, and why
    elif verdict.nodes:
        more = " ..." if len(verdict.nodes) > NODES_SHOWN else ""
        what += f" (not on {', '.join(verdict.nodes[:NODES_SHOWN])}{more})"
    elif verdict.detail and verdict.images:
        what += f" ({verdict.detail})"
    return _printable(f"{record.file} row {record.row}: {verdict.reason}: {what}")


def cap_warnings(result: ScanResult, inventory: Inventory) -> list[str]:
    """What the node lists' caps cost this scan, and the way out."""
    lines = []
    for node in inventory.nodes:
        if node.over_cap is not None:
            lines.append(f"warning: node {node.node} lists more images than the cap of {node.over_cap} in force, so "
                         f"its kubelet's nodeStatusMaxImages is higher: pass --max-images with that value (-1: no cap)")
    capped = {node.node for node in inventory.nodes if node.capped}
    rows = sum(f.rows for f in result.files)
    unknown = sum(records.count(lambda v: v.reason == UNKNOWN and capped.intersection(v.nodes))
                  for f in result.files for records in (f.dropped, f.unconfirmed))
    if rows and unknown > CAP_ADVICE_SHARE * rows:
        lines.append(f"warning: {unknown} of {rows} rows ({unknown / rows:.0%}) are unknown because the kubelets list "
                     "at most nodeStatusMaxImages images per node (50 by default) and these nodes hold more: run the "
                     "node agent (the chart's agent.enabled), or set the kubelets' nodeStatusMaxImages: -1 and pass "
                     "--max-images -1")
    return lines


def _printable(text: str) -> str:
    """`text` with lone surrogates (from JSON escapes) shown as escapes: always valid UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _record(record: RowRecord) -> dict:
    verdict = record.verdict
    return {
        "file": record.file,
        "row": record.row,
        "reason": verdict.reason,
        "images": list(verdict.images),
        "nodes": list(verdict.nodes),
        **({"detail": verdict.detail} if verdict.detail else {}),
    }


def report_text(result: ScanResult) -> str:
    """The --report (and --output json) document as json.dumps(indent=2) writes it; its fields are
    documented in the README."""
    fields: dict[str, Any] = {
        "files": [
            {
                "file": str(f.path),
                "rows": f.rows,
                "kept": f.kept,
                "kept_unconfirmed": len(f.unconfirmed),
                "dropped": {reason: f.dropped_by_reason().get(reason, 0) for reason in DROP_REASONS},
                # Kept rows lacking a field the Job prints only as text (rendered empty, as
                # agent-lightning's controller renders it), by field.
                "kept_lacking": dict(sorted(f.lacking.items())),
                "output": str(f.output) if f.output else None,
            }
            for f in result.files
        ],
        "dropped": [f.dropped for f in result.files],
        "kept_unconfirmed": [f.unconfirmed for f in result.files],
        "missing_images": [{"image": image, "rows": rows} for image, rows in result.missing_images().most_common()],
    }
    # ASCII: an image or row text holding a lone surrogate still makes a valid UTF-8 file.
    texts = [_records_text(value) if name in _RECORD_LISTS else _nested(json.dumps(value, indent=2), 1)
             for name, value in fields.items()]
    return "{\n" + ",\n".join(f"  {json.dumps(name)}: {text}" for name, text in zip(fields, texts)) + "\n}\n"


_RECORD_LISTS = ("dropped", "kept_unconfirmed")


def _records_text(per_file: Iterable[RowRecords]) -> str:
    """The records of these rows, a list one level into the report. json's indented encoder is pure
    Python, some 15 µs a record, and a scan may drop most of a million rows: the records of one
    verdict differ only in their row, so each verdict's record is encoded once and every row
    written into it."""
    items = []
    for records in per_file:
        around: dict[int, tuple[str, str]] = {}  # verdict code -> the record's text before and after its row
        for row, code in zip(records.rows.tolist(), records.codes.tolist()):
            parts = around.get(code)
            if parts is None:
                text = _nested(json.dumps(_record(RowRecord(records.file, 0, records.verdicts[code])), indent=2), 2)
                # The row follows the file, a JSON string, in which every quote is escaped.
                head, tail = text.split(f"{_ROW}0,", 1)
                parts = around[code] = (head + _ROW, "," + tail)
            items.append(f"{parts[0]}{row}{parts[1]}")
    return "[\n    " + ",\n    ".join(items) + "\n  ]" if items else "[]"


_ROW = '"row": '


def _nested(text: str, levels: int) -> str:
    """JSON written with indent=2 as it reads `levels` deep into a document (strings hold no newline)."""
    return text.replace("\n", "\n" + "  " * levels)


def write_lines(lines: Iterable[str], out: TextIO) -> None:
    for line in lines:
        out.write(line + "\n")


def missing_images_text(result: ScanResult) -> str:
    return needed_text(result.missing_images())


def needed_images_text(result: ScanResult) -> str:
    """The images of the kept rows, one a line, as the node agent reads them (core/image_gc/pinning.py)."""
    return needed_text(result.needed_images())
