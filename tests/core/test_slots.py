"""Shared shapes and slot texts must give the verdict a full render of each row gives."""

from __future__ import annotations

import pytest

from image_preflight.core.decide.inventory import Inventory, NodeImages
from image_preflight.core.decide.scheduling import NodeTraits
from image_preflight.core.rows.judge import KEPT, MISSING_IMAGE, UNRENDERABLE, RowJudge
from image_preflight.core.rows.render import JobTemplate

HEADER = """apiVersion: batch/v1
kind: Job
metadata:
  name: {{ job_name }}
  labels:
    swe.instance: {{ input.instance_id | yaml_escape }}
spec:
  template:
    spec:
      restartPolicy: Never
"""

TEMPLATES = {
    "agent-lightning style": HEADER + """      containers:
      - name: rollout
        image: {{ (input.image_name ~ ":openai") | yaml_escape }}
        imagePullPolicy: IfNotPresent
        env:
        - {name: ID, value: {{ input.instance_id | yaml_escape }}}
""",
    "bare field as image": HEADER + """      containers:
      - name: rollout
        image: {{ input.image | yaml_escape }}
        imagePullPolicy: IfNotPresent
""",
    "image chosen by a steering field": HEADER + """      containers:
      - name: rollout
{% if input.custom %}
        image: {{ input.instance_id | yaml_escape }}
{% else %}
        image: {{ input.image | yaml_escape }}
{% endif %}
        imagePullPolicy: IfNotPresent
""",
    "slot in a plain scalar": HEADER + """      containers:
      - name: rollout
        image: {{ input.image | yaml_escape }}
        imagePullPolicy: IfNotPresent
        args: [run {{ input.instance_id | yaml_escape }}]
""",
    "slot in a comment and a block scalar": HEADER + """      # {{ input.instance_id | yaml_escape }}
      containers:
      - name: rollout
        image: {{ input.image | yaml_escape }}
        imagePullPolicy: IfNotPresent
        command:
        - |
          echo {{ input.instance_id | yaml_escape }}
""",
    "slot as a mapping key": HEADER + """      nodeSelector:
        {{ input.instance_id | yaml_escape }}: "yes"
      containers:
      - name: rollout
        image: {{ input.image | yaml_escape }}
        imagePullPolicy: IfNotPresent
""",
    "slot in the node selector": HEADER + """      nodeSelector:
        pool: {{ input.pool | yaml_escape }}
      containers:
      - name: rollout
        image: {{ input.image | yaml_escape }}
        imagePullPolicy: IfNotPresent
""",
    "slot in an image volume": HEADER + """      containers:
      - name: rollout
        image: app:openai
        imagePullPolicy: IfNotPresent
      volumes:
      - name: scratch
        emptyDir: {}
      - name: tools
        image:
          reference: {{ input.image | yaml_escape }}
          pullPolicy: IfNotPresent
""",
    "slot in a container's name": HEADER + """      containers:
      - name: {{ input.instance_id | yaml_escape }}
        image: {{ input.image | yaml_escape }}
        imagePullPolicy: IfNotPresent
""",
    "loop variable in an escaped expression": HEADER + """      containers:
{% for c in input.containers %}
      - name: {{ c | yaml_escape }}
        image: {{ (c ~ ":openai") | yaml_escape }}
        imagePullPolicy: IfNotPresent
{% endfor %}
""",
}

ROWS = [
    {"instance_id": "i-1", "image_name": "app", "image": "app:openai", "pool": "cpu", "custom": False,
     "containers": ["app"]},
    {"instance_id": "i-2", "image_name": "gone", "image": "gone:openai", "pool": "cpu", "custom": False,
     "containers": ["gone"]},
    {"instance_id": "app:openai", "image_name": "app", "image": "gone:openai", "pool": "cpu", "custom": True,
     "containers": []},
    {"instance_id": "gone:openai", "image_name": "app", "image": "app:openai", "pool": "cpu", "custom": True,
     "containers": ["app", "gone"]},
    {"instance_id": "with: colon # and hash", "image_name": "app", "image": "app:openai", "pool": "gpu",
     "custom": False, "containers": ["app"]},
    {"instance_id": "delete \x7f char", "image_name": "app", "image": "app:openai", "pool": "cpu", "custom": False,
     "containers": ["app"]},
    {"instance_id": "astral \U0001f600", "image_name": "app", "image": "app:openai", "pool": "cpu", "custom": False,
     "containers": ["app"]},
    {"image_name": "app", "image": "app:openai", "pool": "cpu", "custom": False, "containers": ["app"]},
    {"instance_id": "i-9", "image_name": "App", "image": "App:openai", "pool": "cpu", "custom": False,
     "containers": ["App"]},
    {"instance_id": "i-10", "image_name": "app", "pool": "cpu", "custom": False, "containers": ["app"]},
    {"instance_id": None, "image_name": "app", "image": "app:openai", "pool": "cpu", "custom": False,
     "containers": ["app"]},
    {"instance_id": "i-12", "image_name": "app", "image": "app:openai", "pool": "gpu", "custom": False,
     "containers": ["app"]},
    {"instance_id": "i-13", "image_name": "app", "image": "app:openai", "custom": False, "containers": ["app"]},
    {"instance_id": "i-14", "image": "app:openai", "pool": "cpu", "custom": True, "containers": ["app"]},
]


def _inventory() -> Inventory:
    cpu = NodeTraits("cpu-1", {"pool": "cpu"})
    gpu = NodeTraits("gpu-1", {"pool": "gpu"})
    return Inventory(
        (
            NodeImages.from_names("cpu-1", ["app:openai"], traits=cpu),
            NodeImages.from_names("gpu-1", ["app:openai", "gone:openai"], traits=gpu),
        )
    )


@pytest.mark.parametrize("name", TEMPLATES)
def test_shared_verdicts_equal_a_full_render_of_each_row(name):
    template = JobTemplate(TEMPLATES[name])
    shared = RowJudge(template, _inventory())
    for row in ROWS + ROWS[::-1]:  # both orders: whichever row a group meets first
        reference = RowJudge(template, _inventory())._judge_uncached(row)
        got = shared.judge(row)
        assert (got.reason, got.images, got.missing_fields) == (
            reference.reason, reference.images, reference.missing_fields), row


def test_the_example_renders_its_shape_once_and_keys_rows_by_image_only():
    template = JobTemplate(TEMPLATES["agent-lightning style"])
    judge = RowJudge(template, _inventory())
    assert judge.value_paths == (("image_name",),)
    assert judge.presence_paths == (("instance_id",),)
    rows = [{"instance_id": f"i-{n}", "image_name": ("app", "gone")[n % 2]} for n in range(100)]
    verdicts = [judge.judge(row).reason for row in rows]
    assert verdicts == [KEPT, MISSING_IMAGE] * 50
    assert judge.renders == 2
    assert len(judge._shapes) == 1


def test_a_bare_field_that_lands_in_the_image_is_keyed_by_value():
    judge = RowJudge(JobTemplate(TEMPLATES["bare field as image"]), _inventory())
    assert ("image",) in judge.value_paths
    assert judge.judge({"instance_id": "a", "image": "gone:openai"}).reason == MISSING_IMAGE
    assert judge.judge({"instance_id": "b", "image": "app:openai"}).reason == KEPT


def test_a_missing_text_field_is_kept_with_a_warning_and_a_missing_image_field_is_unrenderable():
    judge = RowJudge(JobTemplate(TEMPLATES["agent-lightning style"]), _inventory())
    assert judge.judge({"instance_id": "x", "image_name": "app"}).reason == KEPT
    verdict = judge.judge({"image_name": "app"})
    assert (verdict.reason, verdict.missing_fields) == (KEPT, ("input.instance_id",))
    verdict = judge.judge({"instance_id": "x"})
    assert (verdict.reason, verdict.detail) == (UNRENDERABLE, "field input.image_name: missing")


def test_an_image_past_u_ffff_gets_its_own_render():
    # json.dumps escapes it as a surrogate pair that YAML reads back as two lone surrogates.
    judge = RowJudge(JobTemplate(TEMPLATES["bare field as image"]), _inventory())
    verdict = judge.judge({"instance_id": "x", "image": "app\U0001f600:openai"})
    assert verdict.reason == "invalid"
    assert len(judge._exact) == 1
