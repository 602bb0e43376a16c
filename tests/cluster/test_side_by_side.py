"""benchmarks/side_by_side.py as its reader runs it, less the two peers that take long to build
(Gatekeeper and Kyverno, benchmarks/peers/build): the decisions it prints and the apiserver's
own spans it reads (KEP-647 tracing to tests/controlplane/tracing.py's receiver).

The decisions are the claim docs/benchmarks.md and the README make; here they are held to it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.containerd import containerd2_binary
from tests.controlplane.cluster import require_control_plane

ROOT = Path(__file__).resolve().parents[2]
CASES = 15


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
            [sys.executable, str(ROOT / "benchmarks" / "side_by_side.py"), "--peers", "none,cel,image-preflight",
             "--seconds", "3", "--rate", "10", "--clients", "2"],
            capture_output=True, text=True, timeout=600, cwd=ROOT, env={**os.environ, "TMPDIR": folder})
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    assert done.returncode == 0, done.stderr[-4000:]  # its logs are kept, in the folder it names last
    shutil.rmtree(folder, ignore_errors=True)

    decisions = _table(done.stdout, "Decisions")
    header, *cases, total = decisions
    assert header[3:] == ["cel", "image-preflight"] and len(cases) == CASES
    by_case = {row[0]: dict(zip(header[3:], row[3:])) for row in cases}
    # image-preflight decides every case as the kubelet then acts; the CEL policy, which sees only
    # node status, is wrong wherever status is cut or scheduling decides.
    assert total[3:] == [f"**10/{CASES}**", f"**{CASES}/{CASES}**"]
    assert all(answers["image-preflight"].startswith("✓") for answers in by_case.values())
    for wrong in ("held, beyond the 50-image cap", "held, its sixth name", "only on the tainted GPU node",
                  "only on the cordoned node", "absent, Job suspended"):
        assert by_case[wrong]["cel"].startswith("✗"), wrong

    for phase in ("Latency, fixed rate", "Latency, saturation"):
        header, *rows = _table(done.stdout, phase)
        by_peer = {row[0]: dict(zip(header, row)) for row in rows}
        assert set(by_peer) == {"none", "cel", "image-preflight"}
        # The apiserver's "Create" span of every peer's Jobs, and its webhook call span of ours only.
        for peer in by_peer.values():
            assert peer["Create p50"] != "–" and int(peer["creations"]) > 0
        assert by_peer["image-preflight"]["webhook p50"] != "–"
        assert by_peer["cel"]["webhook p50"] == by_peer["none"]["webhook p50"] == "–"
        # A webhook call happens inside the request that makes it.
        assert float(by_peer["image-preflight"]["webhook p50"]) < float(by_peer["image-preflight"]["Create p99"])
