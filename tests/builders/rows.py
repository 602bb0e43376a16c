"""Dataset rows and their Job templates."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import yaml

JOB_HEAD = """apiVersion: batch/v1
kind: Job
metadata:
  name: {{ job_name }}
  labels:
    app.kubernetes.io/managed-by: agentlightning
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: rollout
        imagePullPolicy: IfNotPresent
"""


def job_template(image_line: str, extra: str = "") -> str:
    """A Job template whose only container's image is `image_line` (template text); `extra` is
    more of the Job's spec."""
    return JOB_HEAD + f"        image: {image_line}\n" + extra


# The SWE-smith rollout's Job as agent-lightning's template writes its image.
SWE_TEMPLATE = job_template('{{ (input.image_name ~ ":openai") | yaml_escape }}')


def controller_render(source: str, row: dict) -> dict:
    """What agent-lightning's controller creates for `row` (plain Environment + yaml_escape)."""
    env = jinja2.Environment()
    env.filters["yaml_escape"] = lambda v: json.dumps(str(v), ensure_ascii=True)
    (document,) = list(yaml.safe_load_all(env.from_string(source).render(input=row, job_name="job-1")))
    return document


def example_row_id() -> str:
    first = Path(__file__).resolve().parents[2] / "examples" / "swe-smith" / "train.jsonl"
    return json.loads(first.read_text(encoding="utf-8").splitlines()[0])["instance_id"]
