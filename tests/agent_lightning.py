"""agent-lightning as our users run it: `agentlightning` 1.0.2 from PyPI, in a virtualenv of its own
(`.venv-agl`, Python >= 3.12, made by .ci/run with image-preflight installed beside it).

`build_job_spec` here is agent-lightning's own (agentlightning/controller/k8s_reconciler.py,
build_job_spec), called in that interpreter on a `Rollout` as its server stores it, with the
settings examples/swe_smith/run.sh gives its controller; nothing of its rendering is copied here.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "tests" / "data" / "agent-lightning" / "job-template-openai.yaml"
EXAMPLE = ROOT / "examples" / "swe-smith"
VENV = Path(os.environ.get("IMAGE_PREFLIGHT_AGL_VENV", ROOT / ".venv-agl"))
VERSION = "1.0.2"

JOB_NAME_PREFIX = "agl-rollout-"  # k8s_reconciler.py build_job_name
MANAGED_BY = ("app.kubernetes.io/managed-by", "agentlightning")
# examples/swe_smith: run.sh starts the controller with k8s_runner.ttl_after_finished=600;
# train_smith_agent.py sets agentlightning.rollout_timeout_seconds 5400, the rollout's timeout_seconds.
TTL_AFTER_FINISHED = 600
TIMEOUT_SECONDS = 5400
# run.sh's defaults: AGL_KEY=dummy, the server at http://${AGL_SERVER_PUBLIC_HOST}:8080.
SERVER_URL = "http://agl-server.example:8080"
KEY = "dummy"

# Runs in agent-lightning's interpreter: JSON lines in, one Job (or the error's text) out each.
_RENDER = """
import json, sys, time
from omegaconf import OmegaConf
from agentlightning.controller.k8s_reconciler import build_job_spec
from agentlightning.schemas import Rollout
for line in sys.stdin:
    ask = json.loads(line)
    now = time.time()
    rollout = Rollout(rollout_id=ask["rollout_id"], input=ask["input"], is_train=ask["is_train"],
                      config={"timeout_seconds": ask["timeout_seconds"], "k8s": {"job_template": ask["template"]}},
                      status={"created_at": now, "updated_at": now})
    config = OmegaConf.create({"agl_server": {"url": ask["server_url"], "agent_url": None, "key": ask["key"]},
                               "k8s_runner": {"namespace": ask["namespace"], "ttl_after_finished": ask["ttl"]}})
    try:
        print(json.dumps({"job": build_job_spec(rollout, config)}), flush=True)
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
"""


def python() -> Path:
    return VENV / "bin" / "python"


def missing() -> str | None:
    """Why agent-lightning cannot run here, or None."""
    if not python().exists():
        return (f"no agent-lightning virtualenv at {VENV}: python3.12 -m venv .venv-agl && "
                f".venv-agl/bin/pip install agentlightning=={VERSION} . (see .ci/run)")
    return None


def require_agent_lightning() -> None:
    reason = missing()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {reason}")
    pytest.skip(reason)


class RenderError(Exception):
    """agent-lightning's build_job_spec refused the rollout; the message is its own."""


@lru_cache(maxsize=1)
def _renderer() -> subprocess.Popen:
    return subprocess.Popen([str(python()), "-c", _RENDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, bufsize=1)


def build_job_spec(template: str, row: dict[str, Any], *, rollout_id: str, namespace: str | None,
                   is_train: bool = True) -> dict[str, Any]:
    """The Job agent-lightning's controller creates for this rollout. `namespace` None leaves
    metadata.namespace out (a file for `kubectl -n ... create -f`)."""
    require_agent_lightning()
    renderer = _renderer()
    assert renderer.stdin is not None and renderer.stdout is not None
    renderer.stdin.write(json.dumps({
        "rollout_id": rollout_id, "input": row, "is_train": is_train, "timeout_seconds": TIMEOUT_SECONDS,
        "template": template, "server_url": SERVER_URL, "key": KEY, "namespace": namespace or "default",
        "ttl": TTL_AFTER_FINISHED}) + "\n")
    answer = json.loads(renderer.stdout.readline())
    if "error" in answer:
        raise RenderError(answer["error"])
    job = answer["job"]
    if namespace is None:
        job["metadata"].pop("namespace", None)
    return job


def example_row(instance_id: str) -> dict[str, Any]:
    """The row of examples/swe-smith/train.jsonl with this instance_id."""
    for line in (EXAMPLE / "train.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["instance_id"] == instance_id:
            return row
    raise KeyError(instance_id)
