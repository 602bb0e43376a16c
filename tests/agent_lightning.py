"""The Job agent-lightning's controller creates for a rollout: build_job_spec of
agentlightning/controller/k8s_reconciler.py (microsoft/agent-lightning c632d8dd), step for step,
with the settings examples/swe_smith uses, so that tests submit what agent-lightning submits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from jinja2 import Environment

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "tests" / "data" / "agent-lightning" / "job-template-openai.yaml"
EXAMPLE = ROOT / "examples" / "swe-smith"

JOB_NAME_PREFIX = "agl-rollout-"  # build_job_name
MANAGED_BY = ("app.kubernetes.io/managed-by", "agentlightning")
DEFAULT_ATTEMPT_ID = "0"  # agentlightning/schemas.py
# examples/swe_smith: run.sh starts the controller with k8s_runner.ttl_after_finished=600;
# train_smith_agent.py sets agentlightning.rollout_timeout_seconds 5400, the rollout's timeout_seconds.
TTL_AFTER_FINISHED = 600
TIMEOUT_SECONDS = 5400
# run.sh's defaults: AGL_KEY=dummy, the server at http://${AGL_SERVER_PUBLIC_HOST}:8080.
SERVER_URL = "http://agl-server.example:8080"
KEY = "dummy"


def build_job_spec(template: str, row: dict[str, Any], *, rollout_id: str, namespace: str | None,
                   is_train: bool = True) -> dict[str, Any]:
    """`namespace` None leaves metadata.namespace out (a file for `kubectl -n ... create -f`)."""
    env = Environment()
    env.filters["yaml_escape"] = lambda value: json.dumps(str(value), ensure_ascii=True)
    rendered = env.from_string(template).render(job_name=JOB_NAME_PREFIX + rollout_id, input=row)
    (job,) = [doc for doc in yaml.safe_load_all(rendered) if doc is not None]
    assert isinstance(job, dict) and job.get("kind") == "Job"

    metadata = job.setdefault("metadata", {})
    metadata["name"] = JOB_NAME_PREFIX + rollout_id
    if namespace is not None:
        metadata["namespace"] = namespace
    labels = metadata.setdefault("labels", {})
    labels[MANAGED_BY[0]] = MANAGED_BY[1]
    labels["agentlightning/rollout-id"] = rollout_id
    labels["agentlightning/attempt-id"] = DEFAULT_ATTEMPT_ID

    spec = job.setdefault("spec", {})
    spec["backoffLimit"] = 0
    spec["ttlSecondsAfterFinished"] = TTL_AFTER_FINISHED
    spec["activeDeadlineSeconds"] = TIMEOUT_SECONDS
    pod_spec = spec.setdefault("template", {}).setdefault("spec", {})
    pod_spec["restartPolicy"] = "Never"

    mode = "train" if is_train else "val"
    attempt = f"{rollout_id}/attempt/{DEFAULT_ATTEMPT_ID}"
    injected = {
        "AGL_OPENAI_BASE_URL": f"{SERVER_URL}/proxy/rollout/{attempt}/mode/{mode}/openai/v1",
        "AGL_EVENT_URL": f"{SERVER_URL}/api/rollouts/{attempt}/events",
        "AGL_KEY": KEY,
    }
    for container in pod_spec.get("containers", []):
        env_list = container.setdefault("env", [])
        for name, value in injected.items():
            existing = next((item for item in env_list if item.get("name") == name), None)
            if existing is None:
                env_list.append({"name": name, "value": value})
            else:
                existing.clear()
                existing.update({"name": name, "value": value})
    return job


def example_row(instance_id: str) -> dict[str, Any]:
    """The row of examples/swe-smith/train.jsonl with this instance_id."""
    for line in (EXAMPLE / "train.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if row["instance_id"] == instance_id:
            return row
    raise KeyError(instance_id)
