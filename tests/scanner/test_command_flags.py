"""`scan`'s flags as its frozen config holds them, and how a bad flag is reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from image_preflight.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "swe-smith"


@pytest.mark.parametrize(("expression", "problem"), [
    ("{{ input.image_name", "unexpected end of template, expected 'end of print statement'."),
    ("{{ input.image_name | no_such_filter }}:openai", "No filter named 'no_such_filter'."),
    ('{{ input.image_name }}:{% include "tag" %}', "cannot load other templates (no template loader)"),
])
def test_a_bad_image_expression_is_reported_by_the_expression_not_a_generated_line(expression, problem, capsys):
    code = main(["scan", str(EXAMPLES / "train.jsonl"), "--image", expression,
                 "--inventory", str(EXAMPLES / "nodes.json")])
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"image-preflight scan: --image {expression!r}: {problem}"


def test_a_good_image_expression_still_scans(capsys):
    code = main(["scan", str(EXAMPLES / "train.jsonl"), "--image", "{{ input.image_name }}:openai",
                 "--inventory", str(EXAMPLES / "nodes.json")])
    assert code == 0, capsys.readouterr().err


def test_the_config_refuses_what_the_flags_cannot_mean_together():
    from image_preflight.errors import UsageError
    from image_preflight.kube.client import ClusterFlags
    from image_preflight.scanner.config import ScanConfig

    with pytest.raises(UsageError, match="^--steer decides by one node holding every image: it takes no --require$"):
        ScanConfig(datasets=(Path("d.jsonl"),), image="x", steer=True, require="any")
    with pytest.raises(UsageError, match="^--kubeconfig and --context read the cluster: give them or --inventory"):
        ScanConfig(datasets=(Path("d.jsonl"),), image="x", inventory=(Path("n.json"),),
                   cluster=ClusterFlags(context="c"))
    assert ScanConfig(datasets=(Path("d.jsonl"),), image="x", steer=True).rule == "one-node"
