"""The figures the real-node tests record: from `ctr images import` to the first admitted Job (node
status alone, and the node agent on containerd's events), and from a rollout's enqueue to its
`failed` state through agent-lightning's own agl-server and agl-controller (the webhook, and the
watchdog with the webhook unreachable); and of the chart installed there by docs/quickstart.md:
the image's build from the Dockerfile and its size, the whole quickstart, the agent Pod's import →
NodeImages, the creations streamed while a webhook replica is deleted and while `helm upgrade`
moves to a new tag, a renewed certificate → served, and `helm uninstall`.

    .venv/bin/python benchmarks/real_node_figures.py --repeat 2

Runs those tests of tests/cluster/test_real_node.py, tests/cluster/test_real_node_agentlightning.py and
tests/cluster/test_real_node_chart.py --repeat times with IMAGE_PREFLIGHT_FIGURES set, and prints each
figure's runs, median first.
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
TESTS = [
    "tests/cluster/test_real_node.py::test_an_image_imported_after_a_denial_is_admitted_once_the_kubelet_reports_it",
    "tests/cluster/test_real_node.py::test_with_the_agent_an_import_is_admitted_within_seconds",
    "tests/cluster/test_real_node_agentlightning.py::test_an_absent_image_fails_the_rollout_within_one_poll_with_our_words_and_no_job",
    "tests/cluster/test_real_node_agentlightning.py::test_with_the_webhook_unreachable_the_watchdog_fails_the_job_and_the_rollout",
    "tests/cluster/test_real_node_chart.py::test_the_agent_pod_publishes_the_nodes_images_and_pins_the_needed_ones",
    "tests/cluster/test_real_node_chart.py::test_a_replica_deleted_under_a_stream_of_creations_fails_none_and_admits_none_unchecked",
    "tests/cluster/test_real_node_chart.py::test_helm_upgrade_to_a_new_tag_under_a_stream_fails_no_creation_and_keeps_the_certificates",
    "tests/cluster/test_real_node_chart.py::test_an_upgrade_within_renew_before_days_issues_a_new_certificate_served_without_a_restart",
    "tests/cluster/test_real_node_chart.py::test_helm_uninstall_leaves_nothing_that_blocks_and_job_creation_works_right_after",
]


def shown(name: str, value: float) -> str:
    if name.endswith("_bytes"):
        return f"{value / 1e6:.1f} MB"
    return f"{value:.2f} s" if name.endswith("_s") else f"{value:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    folder = subprocess.run([str(ROOT / "tests" / "controlplane" / "build")], capture_output=True, text=True,
                            check=True).stdout.strip().splitlines()[-1]
    inputs = subprocess.run([str(ROOT / "tests" / "node" / "image_inputs")], capture_output=True, text=True,
                            check=True).stdout.strip().splitlines()[-1]
    env = {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "IMAGE_PREFLIGHT_IMAGE_INPUTS": inputs}
    with tempfile.NamedTemporaryFile("r", suffix=".jsonl") as figures:
        for _ in range(args.repeat):
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS], cwd=ROOT,
                           check=True, capture_output=True, env={**env, "IMAGE_PREFLIGHT_FIGURES": figures.name})
        runs: dict[str, list[float]] = {}
        for line in figures.read().splitlines():
            for name, value in json.loads(line).items():
                runs.setdefault(name, []).append(value)
    for name, values in runs.items():
        print(f"| {name} | {shown(name, statistics.median(values))} ({', '.join(shown(name, v) for v in values)}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
