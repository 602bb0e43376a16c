"""agent-lightning as our users run it: `agentlightning` 1.0.2 from PyPI, in a virtualenv of its own
(`.venv-agl`, Python >= 3.12, made by .ci/run with image-preflight installed beside it).

`build_job_spec` here is agent-lightning's own (agentlightning/controller/k8s_reconciler.py,
build_job_spec), called in that interpreter on a `Rollout` as its server stores it, with the
settings examples/swe_smith/run.sh gives its controller; `fails_at_once` runs its reconciler's
`_create_job` on a refused creation. Nothing of its rendering or error handling is copied here.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

from tests.needs import unavailable

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

# Runs in agent-lightning's interpreter: JSON lines in, one answer out each. "render" is
# build_job_spec; "create" is K8sReconciler._create_job with the apiserver's refusal raised as kr8s
# raises it (ServerError, its text the Status message), and the state the reconciler then gives.
_AGENT_LIGHTNING = """
import asyncio, json, logging, sys, time
import structlog
from omegaconf import OmegaConf
from kr8s import ServerError
from agentlightning.controller import k8s_reconciler
from agentlightning.controller.k8s_reconciler import K8sReconciler, build_job_spec
from agentlightning.schemas import Rollout
structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))

def rollout_and_config(ask):
    now = time.time()
    rollout = Rollout(rollout_id=ask["rollout_id"], input=ask["input"], is_train=ask["is_train"],
                      config={"timeout_seconds": ask["timeout_seconds"], "k8s": {"job_template": ask["template"]}},
                      status={"created_at": now, "updated_at": now})
    config = OmegaConf.create({"agl_server": {"url": ask["server_url"], "agent_url": None, "key": ask["key"]},
                               "k8s_runner": {"namespace": ask["namespace"], "ttl_after_finished": ask["ttl"],
                                              "max_jobs_per_minute": 100, "poll_interval": 5}})
    return rollout, config

async def create(ask):
    rollout, config = rollout_and_config(ask)
    reconciler = K8sReconciler(api=None, config=config)
    patched = []
    async def patch_status(rollout_id, **fields):
        patched.append({k: str(getattr(v, "value", v)) for k, v in fields.items()})
    async def refuse(self):
        raise ServerError(ask["error"])
    async def no_api():
        return None
    reconciler._patch_status = patch_status
    reconciler._get_k8s_api = no_api
    k8s_reconciler.k8s_objects.Job.async_create = refuse
    await reconciler._create_job(rollout)
    return patched

for line in sys.stdin:
    ask = json.loads(line)
    try:
        if ask["kind"] == "render":
            rollout, config = rollout_and_config(ask)
            answer = {"job": build_job_spec(rollout, config)}
        else:
            answer = {"patched": asyncio.run(create(ask))}
    except Exception as exc:
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(answer), flush=True)
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
    if (reason := missing()) is not None:
        unavailable(reason)


class RenderError(Exception):
    """agent-lightning's build_job_spec refused the rollout; the message is its own."""


@lru_cache(maxsize=1)
def _agent_lightning() -> subprocess.Popen:
    return subprocess.Popen([str(python()), "-c", _AGENT_LIGHTNING], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, bufsize=1)


def _ask(kind: str, *, template: str, row: dict[str, Any], rollout_id: str, namespace: str | None,
         is_train: bool = True, **extra: str) -> dict:
    require_agent_lightning()
    process = _agent_lightning()
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(json.dumps({
        "kind": kind, "rollout_id": rollout_id, "input": row, "is_train": is_train, "timeout_seconds": TIMEOUT_SECONDS,
        "template": template, "server_url": SERVER_URL, "key": KEY, "namespace": namespace or "default",
        "ttl": TTL_AFTER_FINISHED, **extra}) + "\n")
    answer = json.loads(process.stdout.readline())
    if "error" in answer:
        raise RenderError(answer["error"])
    return answer


def build_job_spec(template: str, row: dict[str, Any], *, rollout_id: str, namespace: str | None,
                   is_train: bool = True) -> dict[str, Any]:
    """The Job agent-lightning's controller creates for this rollout. `namespace` None leaves
    metadata.namespace out (a file for `kubectl -n ... create -f`)."""
    job = _ask("render", template=template, row=row, rollout_id=rollout_id, namespace=namespace,
               is_train=is_train)["job"]
    if namespace is None:
        job["metadata"].pop("namespace", None)
    return job


def fails_at_once(error_text: str) -> bool:
    """Whether agent-lightning's controller fails a rollout at once when its Job's creation is
    refused with this text (as kr8s gives it: the apiserver's message), rather than retrying it."""
    template = TEMPLATE.read_text()
    patched = _ask("create", template=template, row={"image_name": "x", "problem_statement": "p"},
                   rollout_id="probe", namespace="default", error=error_text)["patched"]
    return any(p.get("state") == "failed" for p in patched)


def example_row(instance_id: str) -> dict[str, Any]:
    """The row of examples/swe-smith/train.jsonl with this instance_id."""
    for line in (EXAMPLE / "train.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["instance_id"] == instance_id:
            return row
    raise KeyError(instance_id)
