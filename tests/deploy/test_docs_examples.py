"""The walkthrough's example (examples/swe-smith/) and the pages that show it: the example Job is
what agent-lightning's template renders and what the example node would deny, the docs quote the
denial it gets, and docs/agent-lightning.md, docs/deploy.md and docs/quickstart.md name only paths
that exist."""

from __future__ import annotations

import re

import kubernetes_validate
import yaml

from image_preflight.core.decide.decision import Outcome, decide
from image_preflight.core.decide.workloads import pod_spec_of
from image_preflight.files.inventory import load_inventory_file
from tests.agent_lightning import build_job_spec, example_row
from tests.builders.reviews import EXAMPLES
from tests.deploy.rendered import K8S_VERSION, WEBHOOK
from tests.release import ROOT


def test_the_example_job_template_is_agent_lightnings_own():
    own = ROOT / "tests" / "data" / "agent-lightning" / "job-template-openai.yaml"
    assert (EXAMPLES / "job.yaml").read_text(encoding="utf-8") == own.read_text(encoding="utf-8")


def test_missing_image_job_is_what_agent_lightning_creates_and_the_example_node_would_deny():
    job = yaml.safe_load((EXAMPLES / "missing-image-job.yaml").read_text(encoding="utf-8"))
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    row = example_row("getmoto__moto.694ce1f4.func_pm_remove_cond__658cda14")
    rollout_id = job["metadata"]["labels"]["agentlightning/rollout-id"]
    rendered = build_job_spec((EXAMPLES / "job.yaml").read_text(), row, rollout_id=rollout_id, namespace=None)
    assert job == rendered
    decision = decide(pod_spec_of(job), load_inventory_file(EXAMPLES / "nodes.json"))
    assert decision.outcome == Outcome.DENY
    # gpu-node-1 holds no rollout image but does not count: nvidia.com/gpu:NoSchedule keeps the Pod off.
    assert [v.missing_on for v in decision.verdicts] == [("cpu-node-1",)]


def _text_blocks(document: str) -> list[str]:
    return [" ".join(block.split()) for block in re.findall(r"```text\n(.*?)```", document, re.S)]


def test_the_docs_show_the_denial_the_example_job_gets():
    from image_preflight.core.admission.body import parse_review
    from image_preflight.core.admission.review import admit
    from image_preflight.core.admission.settings import Settings

    review = parse_review((EXAMPLES / "admission-review.json").read_bytes())
    answer = admit(review, load_inventory_file(EXAMPLES / "nodes.json"), Settings()).review["response"]
    message = answer["status"]["message"]
    denial = f'admission webhook "{WEBHOOK}" denied the request: {message}'
    assert denial in _text_blocks((ROOT / "docs" / "agent-lightning.md").read_text(encoding="utf-8"))
    # The walkthrough's kind cluster has one node, preflight-control-plane.
    # kubectl words a Status of reason Invalid without details "The request is invalid: <message>"
    # (k8s.io/kubectl pkg/cmd/util/helpers.go, checkErr), as the quickstart's run on the real node shows.
    kind = 'The request is invalid: error when creating "examples/swe-smith/missing-image-job.yaml": ' + denial.replace(
        "cpu-node-1", "preflight-control-plane")
    assert kind in _text_blocks((ROOT / "docs" / "deploy.md").read_text(encoding="utf-8"))


def test_agent_lightning_doc_names_only_paths_that_exist():
    text = (ROOT / "docs" / "agent-lightning.md").read_text(encoding="utf-8")
    # examples/swe_smith/ and docs/NN-*.md are agent-lightning's own files; its links are to ours.
    named = {m.rstrip(".,:;)`") for m in re.findall(r"\b(?:deploy|examples/swe-smith)/[\w./-]*\w", text)}
    named |= {f"docs/{m}" for m in re.findall(r"\]\(([\w-]+\.md)", text)}
    assert "docs/quickstart.md" in named and "docs/agent.md" in named
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/agent-lightning.md names paths that do not exist: {missing}"


def test_deploy_doc_names_only_paths_that_exist():
    text = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    assert "## The node agent" in text
    named = {m.rstrip(".,:;)`") for m in re.findall(r"\b(?:deploy|examples)/[\w./-]*\w", text)}
    assert "deploy/chart/image-preflight" in named, "docs/deploy.md names no chart"
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/deploy.md names paths that do not exist: {missing}"


def test_the_quickstart_names_only_paths_that_exist_and_skips_only_lines_it_shows():
    """tests/cluster/test_real_node_chart.py runs the page; here, what it can check without a cluster:
    every line the run leaves out (tests/node/quickstart.py SUBSTITUTED) is on the page, and
    every path it names exists."""
    from tests.node import quickstart

    lines = {line.split("#")[0].strip() for block in quickstart.blocks() for line in block.text.splitlines()}
    assert set(quickstart.SUBSTITUTED) <= lines
    exported = {re.match(r"export (\w+)=", line)[1] for line in lines if line.startswith("export ")}
    assert set(quickstart.PLACEHOLDERS) <= exported
    text = quickstart.PAGE.read_text(encoding="utf-8")
    named = {m.rstrip(".,:;)`") for m in re.findall(r"\b(?:deploy|examples/swe-smith|docs)/[\w./-]*\w", text)}
    named |= {f"docs/{m}" for m in re.findall(r"\]\(([\w-]+\.md)", text)}
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert not missing, f"docs/quickstart.md names paths that do not exist: {missing}"
    # Its publishing and install are the chart's README's (tests/deploy/test_oci_chart.py runs
    # those), and its release the one the chart's NOTES and doctor name.
    from tests.oci_registry import readme_block

    for line in readme_block().replace("\\\n", " ").splitlines():
        assert " ".join(line.split()[:4]) in " ".join(text.split()), line
    readme_top = (ROOT / "README.md").read_text(encoding="utf-8")[:600]
    assert "(docs/quickstart.md)" in readme_top
