"""`image_preflight.agent_lightning.filter_datasets` where trainers call it: in agent-lightning's
own virtualenv (agentlightning 1.0.2, .venv-agl), on its own VERL config (agentlightning/verl/
config.yaml, loaded with OmegaConf as its entry point does), with the rows as the trainer sends them."""

from __future__ import annotations

import json
import subprocess

from tests.agent_lightning import ROOT, python, require_agent_lightning

CALL = """
import json, logging, sys
from importlib.resources import files
from omegaconf import OmegaConf
import image_preflight.agent_lightning as agl
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s")
config = OmegaConf.load(files("agentlightning.verl") / "config.yaml")
config.agentlightning.k8s.job_template_path = sys.argv[1]
rows = lambda path: [json.loads(line) for line in open(path, encoding="utf-8")]
try:
    train, val = agl.filter_datasets(config, rows(sys.argv[2]), rows(sys.argv[3]), inventory=sys.argv[4])
except ValueError as exc:
    print(json.dumps({"error": str(exc)}))
else:
    print(json.dumps({"train": [r["instance_id"] for r in train], "val": [r["instance_id"] for r in val]}))
"""
EXAMPLE = ROOT / "examples" / "swe-smith"


def _filter(tmp_path, train: str, val: str, template=EXAMPLE / "job.yaml") -> tuple[dict, str]:
    require_agent_lightning()
    done = subprocess.run([str(python()), "-c", CALL, str(template), train, val, str(EXAMPLE / "nodes.json")],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_both_splits_are_filtered_as_the_scanner_filters_them(tmp_path):
    answer, log = _filter(tmp_path, str(EXAMPLE / "train.jsonl"), str(EXAMPLE / "val.jsonl"))
    # examples/swe-smith: the CPU node lacks three images (as `image-preflight scan` reports).
    assert (len(answer["train"]), len(answer["val"])) == (23, 8)
    assert "train: kept 23 of 40 rows (0 unconfirmed)" in log and "val row 1 dropped: missing" in log


def test_a_split_left_empty_fails_with_one_line(tmp_path):
    bad = tmp_path / "val.jsonl"
    row = json.loads((EXAMPLE / "val.jsonl").read_text().splitlines()[0])
    bad.write_text(json.dumps(dict(row, image_name="jyangballin/not-built")) + "\n")
    answer, _ = _filter(tmp_path, str(EXAMPLE / "train.jsonl"), str(bad))
    assert answer["error"].startswith("val: every one of its 1 rows was dropped") and "\n" not in answer["error"]


def test_a_config_without_the_template_path_is_named(tmp_path):
    answer, _ = _filter(tmp_path, str(EXAMPLE / "train.jsonl"), str(EXAMPLE / "val.jsonl"), template="")
    assert "agentlightning.k8s.job_template_path" in answer["error"]
