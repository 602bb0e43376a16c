"""How soon a rollout Job whose Pod cannot get its image is Failed: from the kubelet's first waiting
status (ErrImageNeverPull, written as the kubelet writes it) to the Job's Failed condition as
agent-lightning's client (kr8s) sees it, on the real control plane with the real Job controller.

    .venv/bin/python benchmarks/watchdog_latency.py --repeat 3

Runs tests/cluster/test_cluster_watchdog.py's ErrImageNeverPull test --repeat times (the watchdog with
--grace 3) and prints the median and the largest figure. Without the watchdog the Job would wait
for agent-lightning's deadline, 1,800 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = ("tests/cluster/test_cluster_watchdog.py::"
        "test_a_job_whose_pod_waits_with_err_image_never_pull_fails_and_kr8s_sees_it")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    env = dict(os.environ)
    folder = subprocess.run([str(ROOT / "tests" / "controlplane" / "build")], capture_output=True, text=True,
                            check=True).stdout.strip().splitlines()[-1]
    env["PATH"] = f"{folder}{os.pathsep}{env['PATH']}"
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as figures:
        for _ in range(args.repeat):
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TEST], cwd=ROOT,
                           check=True, capture_output=True, env={**env, "IMAGE_PREFLIGHT_FIGURES": figures.name})
        runs = [json.loads(line) for line in figures.read().splitlines()]
    for name in runs[0]:
        values = [run[name] for run in runs]
        grace = 3.0
        print(f"| {name} | {statistics.median(values):.2f} s (max {max(values):.2f} s; "
              f"grace + {statistics.median(values) - grace:.2f} s) | {len(values)} runs |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
