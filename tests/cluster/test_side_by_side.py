"""benchmarks/side_by_side.py as its reader runs it, less the two peers that take long to build
(Gatekeeper and Kyverno, benchmarks/peers/build): the decisions it prints and the apiserver's
own spans it reads (KEP-647 tracing to tests/controlplane/tracing.py's receiver).

The decisions are the claim docs/benchmarks.md and the README make; here they are held to it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.containerd import containerd2_binary
from tests.controlplane.cluster import require_control_plane

ROOT = Path(__file__).resolve().parents[2]
PEERS = ("none", "cel", "cel-best", "image-preflight")
CASES = 26
CUT_FROM_STATUS = {"held, beyond the 50-image cap", "held, its sixth name",
                   "agent down, capped status, held beyond the cap"}
WRONG = {
    # The first shape: every name node status lists, the Job's containers.
    "cel": CUT_FROM_STATUS | {"held by digest, named by tag and digest", "only on the tainted GPU node",
                              "on the GPU node, tolerated, affinity excludes it",
                              "on the GPU node, nodeName the worker", "only on the cordoned node",
                              "only on a not-ready node", "on one of two nodes it may land on",
                              "absent, Job suspended", "image volume absent", "absent, a Deployment's Pod"},
    # Its best user's: the scheduler's filters, Pods and image volumes, still node status's names.
    "cel-best": CUT_FROM_STATUS | {"held by digest, named by tag and digest"},
    # Admitted with a warning under --unknown allow, the chart's default: the watchdog fails its
    # Job within grace; --unknown deny denies it.
    "image-preflight": {"agent down, capped status, absent"},
}


def _table(output: str, heading: str) -> list[list[str]]:
    """The rows of the markdown table under the heading starting with `heading`, as cells."""
    lines = output.split("\n## " + heading, 1)[1].split("\n## ", 1)[0].splitlines()
    rows = [line.strip("|").split("|") for line in lines if line.startswith("|") and not line.startswith("|---")]
    return [[cell.strip() for cell in row] for row in rows]


def test_decisions_and_the_apiservers_spans_side_by_side():
    require_control_plane()
    containerd2_binary()
    # A short folder of its own: the control plane's unix sockets must fit AF_UNIX's 107 bytes.
    folder = tempfile.mkdtemp(prefix="sbs-", dir="/tmp")
    try:
        done = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "side_by_side.py"), "--peers", ",".join(PEERS),
             "--seconds", "3", "--rate", "10", "--clients", "2", "--runs", "2"],
            capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "TMPDIR": folder})
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    assert done.returncode == 0, done.stderr[-4000:]  # its logs are kept, in the folder it names last
    shutil.rmtree(folder, ignore_errors=True)

    decisions = _table(done.stdout, "Decisions")
    header, *cases, total = decisions
    assert header[3:] == list(PEERS[1:]) and len(cases) == CASES
    by_case = {row[0]: dict(zip(header[3:], row[3:])) for row in cases}
    # Each policy is wrong exactly where what it reads, or what it was written to read, differs
    # from what the kubelet does.
    for peer, wrong in WRONG.items():
        assert {case for case, answers in by_case.items() if answers[peer].startswith("✗")} == wrong, peer
        assert all(answers[peer][0] in "✓✗" for answers in by_case.values()), peer  # no error for an answer
    assert total[3:] == [f"**{CASES - len(WRONG[peer])}/{CASES}**" for peer in PEERS[1:]]

    for phase in ("Latency, fixed rate", "Latency, saturation"):
        header, *rows = _table(done.stdout, phase)
        by_peer = {row[0]: dict(zip(header, row)) for row in rows}
        assert set(by_peer) == set(PEERS)
        # The apiserver's "Create" span of every peer's Jobs, and its webhook call span of ours only.
        for peer in by_peer.values():
            assert peer["Create p50"] != "–" and int(peer["creations"]) > 0
        assert by_peer["image-preflight"]["webhook p50"] != "–"
        # one webhook call for each creation
        assert by_peer["image-preflight"]["webhook calls"] == by_peer["image-preflight"]["creations"]
        assert {by_peer[peer]["webhook p50"] for peer in ("none", "cel", "cel-best")} == {"–"}
        # A webhook call happens inside the request that makes it: the median of the runs, then their range.
        call, create = by_peer["image-preflight"]["webhook p50"], by_peer["image-preflight"]["Create p99"]
        assert float(call.split()[0]) < float(create.split()[0]) and re.fullmatch(r"[\d.]+ \([\d.]+–[\d.]+\)", call)
