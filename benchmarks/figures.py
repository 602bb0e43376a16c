"""What the benchmarks read off samples and processes: percentiles, RSS and CPU time (/proc)."""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    """The sample at quantile q (nearest rank below); NaN for no samples."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def hwm_mib(pid: int) -> float:
    """The process's peak RSS (VmHWM); NaN once it has gone."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def process_tree(pids: list[int]) -> list[int]:
    """`pids` and their descendants (serve's workers, say)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def tree_cpu_seconds(pids: list[int]) -> float:
    """User and system CPU time of `pids` and their descendants so far."""
    total = 0
    for pid in process_tree(pids):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICK


def tree_rss_mib(pids: list[int]) -> float:
    """VmRSS of `pids` and their descendants, those that are gone counting nothing."""
    total = 0.0
    for pid in process_tree(pids):
        try:
            total += rss_mib(pid)
        except (OSError, RuntimeError):
            continue
    return total
