"""The test control plane: how long it takes to build and start, and how soon `serve` follows it.

    .venv/bin/python benchmarks/control_plane.py            # warm build, start-up, fault delays
    .venv/bin/python benchmarks/control_plane.py --cold     # also a cold build (empty Go caches)

The cold build downloads every module and compiles everything into empty GOMODCACHE and GOCACHE
folders, as on a new CI machine; the warm build is `tests/controlplane/build` run again with
nothing changed. The fault delays come from tests/cluster/test_cluster_faults.py, run --repeat times;
each figure is the median over the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "tests" / "controlplane" / "build"


def timed_build(env: dict[str, str]) -> tuple[float, str]:
    start = time.monotonic()
    done = subprocess.run([str(BUILD)], env=env, capture_output=True, text=True, check=True)
    return time.monotonic() - start, done.stdout.strip().splitlines()[-1]


def start_up(folder: str) -> float:
    sys.path.insert(0, str(ROOT))
    from tests.controlplane.cluster import ControlPlane

    plane = ControlPlane(Path(tempfile.mkdtemp()))
    start = time.monotonic()
    try:
        plane.start()
        return time.monotonic() - start
    finally:
        plane.stop()


def fault_delays(env: dict[str, str], repeat: int) -> dict[str, list[float]]:
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as figures:
        for _ in range(repeat):
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "tests/cluster/test_cluster_faults.py"], cwd=ROOT, check=True, capture_output=True,
                           env={**env, "IMAGE_PREFLIGHT_FIGURES": figures.name})
        runs = [json.loads(line) for line in figures.read().splitlines()]
    return {name: [run[name] for run in runs] for name in runs[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cold", action="store_true", help="also time a build with empty Go caches")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    env = dict(os.environ)
    if args.cold:
        with tempfile.TemporaryDirectory() as empty:
            cold_env = {**env, "GOMODCACHE": f"{empty}/mod", "GOCACHE": f"{empty}/cache",
                        "IMAGE_PREFLIGHT_CONTROLPLANE_CACHE": f"{empty}/out"}
            cold, _ = timed_build(cold_env)
            rebuilt, _ = timed_build(cold_env)
            subprocess.run(["go", "clean", "-modcache"], env=cold_env, check=False)
        print(f"| cold build (empty module and build caches) | {cold:.0f} s |")
        print(f"| the same, run again (folder reused) | {rebuilt:.2f} s |")
    warm, folder = timed_build(env)
    print(f"| warm build (folder reused) | {warm:.2f} s |")
    env["PATH"] = f"{folder}{os.pathsep}{env['PATH']}"
    os.environ["PATH"] = env["PATH"]
    print(f"| control plane start (etcd to a ready apiserver and controllers) | {start_up(folder):.1f} s |")
    for name, values in fault_delays(env, args.repeat).items():
        print(f"| {name} | {statistics.median(values) * 1000:.0f} ms (max {max(values) * 1000:.0f} ms) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
