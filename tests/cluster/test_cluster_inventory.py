"""The cluster as inventory: `scan` without --inventory reads it as kubectl would,
`inventory dump` records each kubelet's nodeStatusMaxImages from its configz, through the real
apiserver's node proxy, and `inventory delete` removes the agents' lists."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s

from image_preflight.cli import main
from image_preflight.core.sources.node_status import CAP_ANNOTATION
from image_preflight.core.sources.runtime_lists import GROUP, PLURAL, VERSION
from tests.controlplane.cluster import kubelet_configz

NODEIMAGES = (GROUP, VERSION, PLURAL)

TEMPLATE = """apiVersion: batch/v1
kind: Job
metadata:
  name: {{ job_name }}
spec:
  template:
    spec:
      restartPolicy: Never
      nodeSelector: {"image-preflight.test/case": "%s"}
      containers:
      - name: agent
        image: {{ (input.image_name ~ ":openai") | yaml_escape }}
        imagePullPolicy: IfNotPresent
"""


def _images(*names: str, filler: int = 0) -> list[list[str]]:
    return [[f"docker.io/library/{n}:openai"] for n in names] + [[f"docker.io/library/filler-{i}:v1"]
                                                                 for i in range(filler)]


@pytest.fixture
def work(tmp_path, case, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.yaml").write_text(TEMPLATE % case.id)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"instance_id": f"i{n}", "image_name": image}) + "\n"
                                                  for n, image in enumerate(["held", "lost"])))
    return tmp_path


def _report(path: Path) -> dict:
    return {d["row"]: d["reason"] for d in json.loads(path.read_text())["dropped"]}


def test_scan_without_an_inventory_reads_the_cluster_of_the_kubeconfig(control_plane, case, work, capsys):
    case.node("cpu", images=_images("held", filler=3), taints=[])
    args = ["scan", "train.jsonl", "--template", "job.yaml", "--kubeconfig", str(control_plane.kubeconfig),
            "--report", "report.json", "--out-dir", "out"]
    assert main(args) == 0
    assert _report(work / "report.json") == {1: "missing"}
    assert [json.loads(line)["image_name"] for line in (work / "out/train.jsonl").read_text().splitlines()] == ["held"]


def test_scan_takes_the_context_as_kubectl_names_it(control_plane, case, work, capsys):
    case.node("cpu", images=_images("held", filler=3), taints=[])
    config = yaml.safe_load(control_plane.kubeconfig.read_text())
    current = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    config["contexts"].append({"name": "other", "context": current["context"]})
    config["current-context"] = "nowhere"  # only --context can make this file work
    (work / "kubeconfig").write_text(yaml.safe_dump(config))
    base = ["scan", "train.jsonl", "--template", "job.yaml", "--kubeconfig", "kubeconfig", "--report", "report.json"]
    assert main(base) == 2
    assert "kubeconfig" in capsys.readouterr().err
    assert main([*base, "--context", "other"]) == 0
    assert _report(work / "report.json") == {1: "missing"}


def test_scan_refuses_cluster_options_with_an_inventory_file(work, capsys):
    (work / "nodes.txt").write_text("held:openai\n")
    assert main(["scan", "train.jsonl", "--template", "job.yaml", "--inventory", "nodes.txt", "--context", "x"]) == 2
    assert "not both" in capsys.readouterr().err


def test_dump_records_each_kubelets_cap_from_its_configz(control_plane, case, tmp_path, capsys):
    uncapped = case.node("uncapped", images=_images("held", filler=70), taints=[])["metadata"]["name"]
    default = case.node("default", images=_images("held", filler=49), taints=[])["metadata"]["name"]
    silent = case.node("silent", images=_images("held", filler=3), taints=[])["metadata"]["name"]
    out = tmp_path / "dump.json"
    with kubelet_configz(control_plane, uncapped, "10.250.0.1", max_images=-1), \
            kubelet_configz(control_plane, default, "10.250.0.2"):
        assert main(["inventory", "dump", "--kubeconfig", str(control_plane.kubeconfig), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    items = {i["metadata"]["name"]: i for i in json.loads(out.read_text())["items"] if i["kind"] == "Node"}
    caps = {name: (items[name]["metadata"].get("annotations") or {}).get(CAP_ANNOTATION)
            for name in (uncapped, default, silent)}
    # The kubelet's own default (50) as configz reports it; nothing for the node whose kubelet
    # does not answer, with a note naming it.
    assert caps == {uncapped: "-1", default: "50", silent: None}
    assert "kubelet configz unreadable on" in err and "caps from --max-images" in err

    # With the recorded cap the 71-image list is complete, so an absent image is missing there; the
    # default node's 50 images sit at its cap and prove nothing.
    (tmp_path / "job.yaml").write_text(TEMPLATE % case.id)
    (tmp_path / "train.jsonl").write_text(json.dumps({"image_name": "lost"}) + "\n")
    assert main(["scan", str(tmp_path / "train.jsonl"), "--template", str(tmp_path / "job.yaml"),
                 "--inventory", str(out), "--report", str(tmp_path / "r.json"), "--keep-unknown"]) == 0
    (dropped,) = json.loads((tmp_path / "r.json").read_text())["dropped"]
    assert (dropped["reason"], sorted(dropped["nodes"])) == ("missing", sorted([silent, uncapped]))


def test_dump_without_nodes_proxy_says_the_caps_come_from_the_flag(service_accounts, case, tmp_path, capsys):
    name = case.node("capped", images=_images("held"), taints=[])["metadata"]["name"]
    reader = service_accounts.service_account_kubeconfig("image-preflight", "image-preflight", tmp_path / "r.kc")
    with kubelet_configz(service_accounts, name, "10.250.0.3", max_images=-1):
        assert main(["inventory", "dump", "--kubeconfig", str(reader), "--out", str(tmp_path / "d.json")]) == 0
    assert "cannot read the kubelets' configz (nodes/proxy is forbidden)" in capsys.readouterr().err


# --- inventory delete: what the chart's uninstall hook runs -----------------------------------------


def _node_images(name: str) -> dict:
    from image_preflight.core.sources.runtime_lists import runtime_object

    return runtime_object(name, [], observed_at=1_000_000_000, lease_seconds=300)


def test_delete_removes_every_node_images_object(service_accounts, case, capsys):
    custom = k8s.CustomObjectsApi(service_accounts.core().api_client)
    names = sorted(case.name(n) for n in ("gone-a", "gone-b"))
    for name in names:
        custom.create_cluster_custom_object(*NODEIMAGES, _node_images(name))
    assert main(["inventory", "delete", "--kubeconfig", str(service_accounts.kubeconfig), "--settle", "0.2"]) == 0
    assert not custom.list_cluster_custom_object(*NODEIMAGES)["items"]
    err = capsys.readouterr().err
    assert err.startswith("image-preflight inventory delete: ") and all(name in err for name in names), err


def test_delete_fails_naming_an_object_an_agent_still_writes(service_accounts, case, capsys):
    custom = k8s.CustomObjectsApi(service_accounts.core().api_client)
    name = case.name("still-written")
    stop = threading.Event()

    def agent() -> None:  # what a node agent still running does: write its list again
        while not stop.is_set():
            try:
                custom.create_cluster_custom_object(*NODEIMAGES, _node_images(name))
            except k8s.ApiException:
                pass
            stop.wait(0.05)

    writer = threading.Thread(target=agent, daemon=True)
    writer.start()
    try:
        code = main(["inventory", "delete", "--kubeconfig", str(service_accounts.kubeconfig), "--settle", "0.5"])
    finally:
        stop.set()
        writer.join()
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{name} came back after each delete: a node agent still runs" in err, err
