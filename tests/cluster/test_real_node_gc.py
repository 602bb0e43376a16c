"""The kubelet's own image GC on the real node, with the agent pinning what a scanned dataset needs.

One pass of the kubelet's image GC loop (pkg/kubelet/kubelet.go, StartGarbageCollection: every
ImageGCPeriod, 5 minutes, the first at start) on an image filesystem of the node's own
(tests/node/real_node.py, IMAGEFS_BYTES), filled past low thresholds. The GC deletes unused images
the runtime does not report pinned, oldest first, until the low threshold
(pkg/kubelet/images/image_gc_manager.go, GarbageCollect, imagesInEvictionOrder, freeSpace); an
image first seen less than imageMinimumGCAge (2 minutes) before is spared, so the pass that
deletes is the one 5 minutes after the kubelet's restart. The commands are docs/agent.md's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from image_preflight.core.image_gc.pinning import MARK_LABEL, NEEDED_NAME, NEEDED_NAMESPACE, PINNED_LABEL, PINNED_VALUE
from tests.agent_lightning import TEMPLATE, example_row
from tests.builders.rows import example_row_id
from tests.cluster.real_stack import delete_node_images, doctor, job_name, node_images, running_agent, stuck_job_fails
from tests.controlplane.cluster import wait_for
from tests.needs import record_figures
from tests.node.images import PAUSE_NAME, swe_smith_image
from tests.node.real_node import NODE_NAME

SOURCE = f"{NEEDED_NAMESPACE}/{NEEDED_NAME}"
RUN = uuid.uuid4().hex
KEEP = swe_smith_image("pinned", "kept", RUN)  # needed all along: pinned
DROP = swe_smith_image("listed", "dropped", RUN)  # needed, then no longer: unpinned
LOSE = swe_smith_image("never", "listed", RUN)  # never needed: never pinned
# Low thresholds, on a disk filled to FILL: freeing down to LOW takes more than every unused image
# holds, so the pass deletes all of them whatever else earlier tests left, in any order.
HIGH, LOW = 60, 10
FILL = 70
# The pass 5 minutes after the restart, plus the time it takes and the kubelet's image cache.
GC_PASS_DEADLINE_S = 300 + 120
FIGURES: dict[str, float] = {}


def scan_needed(stack, folder: Path, images: list[str]) -> Path:
    """`image-preflight scan … --needed-images` of a SWE-smith dataset naming `images`, against the cluster."""
    rows = [dict(example_row(example_row_id()), image_name=image.removesuffix(":openai")) for image in images]
    dataset = folder / f"train-{len(list(folder.iterdir()))}.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    needed = folder / "needed.txt"
    done = subprocess.run([sys.executable, "-m", "image_preflight", "scan", str(dataset), "--template", str(TEMPLATE),
                           "--kubeconfig", str(stack.plane.kubeconfig), "--out-dir", str(folder / "kept"),
                           "--needed-images", str(needed)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return needed


# docs/agent.md's and docs/agent-lightning.md's command: the list created or replaced in one
# server-side apply (test_the_docs_apply_the_list_as_this_module_does keeps them equal).
CREATE_LIST = ("kubectl -n image-preflight-agent create configmap needed-images --from-file=needed.txt"
               " --dry-run=client -o yaml")
APPLY_LIST = "kubectl apply --server-side -f -"


def apply_needed(stack, needed: Path) -> None:
    create = [word.replace("=needed.txt", f"={needed}") for word in CREATE_LIST.split()[1:]]
    rendered = stack.plane.kubectl(*create).stdout
    stack.plane.kubectl(*APPLY_LIST.split()[1:], input=rendered)


def test_the_docs_apply_the_list_as_this_module_does():
    for doc in ("agent.md", "agent-lightning.md"):
        text = (Path(__file__).resolve().parents[2] / "docs" / doc).read_text(encoding="utf-8")
        assert f"{CREATE_LIST} | {APPLY_LIST}" in " ".join(text.replace("\\\n", " ").split()), doc
        assert "--needed-images needed.txt" in text, doc


def pinned(stack) -> set[str]:
    spec = (node_images(stack) or {}).get("spec") or {}
    return {name for image in spec.get("images") or () if image.get("pinned") for name in image["repoTags"]}


def labels(stack, name: str) -> str:
    row = next((r for r in stack.node.ctr("images", "ls").splitlines() if r.split()[:1] == [name]), "")
    return row.split()[-1] if row else ""


def node_lines(report: str) -> list[str]:
    return [line for line in report.splitlines() if f"node {NODE_NAME}:" in line]


@pytest.fixture(scope="module")
def gc_stack(stack, tmp_path_factory):
    """The stack (the chart's pinning Role among its objects), and no NodeImages object an earlier
    module's agent left: once its lease ended, it would make every image of the node unknown to the
    scan."""
    plane = stack.plane
    delete_node_images(stack)
    stack.folder_gc = tmp_path_factory.mktemp("gc")
    yield stack
    plane.kubectl("-n", NEEDED_NAMESPACE, "delete", "configmap", NEEDED_NAME, "--ignore-not-found")
    (stack.node.imagefs / "filler").unlink(missing_ok=True)


def test_a_pinned_needed_image_survives_the_kubelets_image_gc_and_the_unpinned_ones_go(gc_stack):
    stack, folder = gc_stack, gc_stack.folder_gc
    node = stack.node
    node.import_images([KEEP, DROP, LOSE])
    for image in (KEEP, DROP, LOSE):
        node.wait_in_status(image)
    apply_needed(stack, scan_needed(stack, folder, [KEEP, DROP]))
    assert (folder / "needed.txt").read_text().split() == sorted([KEEP, DROP])
    # containerd 2.x pins its sandbox image itself, imported under the name its config gives
    # (internal/cri/server/images/image_pull.go: UpdateImage, on the image's event, with getLabels).
    assert f"{PINNED_LABEL}={PINNED_VALUE}" in labels(stack, PAUSE_NAME)

    start = time.monotonic()
    with running_agent(stack, folder, "--pin-needed-images", SOURCE, "--interval", "5", "--lease", "60"):
        wait_for(lambda: pinned(stack) >= {KEEP, DROP}, "the agent pins the needed images", timeout_s=30)
        FIGURES["needed list applied to pinned on the node"] = time.monotonic() - start
    assert pinned(stack) == {KEEP, DROP, PAUSE_NAME}
    marked = f"{MARK_LABEL}=image-preflight-agent"
    assert marked in labels(stack, KEEP) and marked not in labels(stack, PAUSE_NAME)

    log = folder / "agent.log"
    before = log.read_text()
    with running_agent(stack, folder, "--pin-needed-images", SOURCE, "--interval", "5", "--lease", "60"):
        # A restarted agent finds its marks in containerd: it pins and unpins nothing.
        wait_for(lambda: "lists 2 needed images" in log.read_text()[len(before):], "the restarted agent reads the list")
        time.sleep(6)  # a periodic cycle more
        again = log.read_text()[len(before):]
        said = [json.loads(line)["message"] for line in again.splitlines() if line.startswith('{"time"')]
        assert said and not [m for m in said if re.match(r"(un)?pinned ", m)], again
        assert pinned(stack) == {KEEP, DROP, PAUSE_NAME}
        report = doctor(stack)
        assert f"ok: node {NODE_NAME}: the 2 needed image(s) it holds are pinned" in report, report
        assert re.search(rf"^ok: node {NODE_NAME}: image filesystem \d+% used, under the image GC threshold "
                         r"\(imageGCHighThresholdPercent 85, imageGCLowThresholdPercent 80, ", report, re.M), report

        apply_needed(stack, scan_needed(stack, folder, [KEEP]))  # the run moves on: DROP no longer needed
        wait_for(lambda: DROP not in pinned(stack), "the agent unpins what is no longer listed", timeout_s=30)
        assert pinned(stack) == {KEEP, PAUSE_NAME} and marked not in labels(stack, DROP)

        node.fill_imagefs(FILL)
        node.restart_kubelet(imageGCHighThresholdPercent=HIGH, imageGCLowThresholdPercent=LOW)
        restarted = time.monotonic()
        try:
            # The kubelet's summary takes the filled disk in within its stats period.
            use = wait_for(lambda: next((line for line in node_lines(doctor(stack)) if "image filesystem" in line
                                         and "at or above" in line), None),
                           "doctor reads the disk past the threshold", timeout_s=120, interval_s=5)
            assert use.startswith(f"problem: node {NODE_NAME}: image filesystem ") and (
                f"at or above imageGCHighThresholdPercent {HIGH}: " in use and f"down to {LOW}%" in use), use
            wait_for(lambda: not {DROP, LOSE} & node.image_names(), "the kubelet's image GC takes the unpinned images",
                     timeout_s=GC_PASS_DEADLINE_S, interval_s=2)
            FIGURES["kubelet restart to the image GC pass that deletes"] = time.monotonic() - restarted
        finally:
            (node.imagefs / "filler").unlink(missing_ok=True)
            node.restart_kubelet(imageGCHighThresholdPercent=None, imageGCLowThresholdPercent=None)
        assert {KEEP, PAUSE_NAME} <= node.image_names()

        # The pinned image's rollout runs; the collected one's fails at once, the webhook down.
        namespace = stack.namespace()
        with stack.webhook_unreachable():
            kept = stack.create(namespace, stack.rollout(KEEP))
        wait_for(lambda: stack.job_condition(namespace, job_name(kept), "Complete"), "the KEEP rollout completes",
                 timeout_s=90)
        recorded, _ = stuck_job_fails(stack, namespace, stack.rollout(LOSE), {"ErrImagePull", "ImagePullBackOff"})
        assert recorded["image"] == LOSE
    delete_node_images(stack)  # once its lease ends, a stopped agent's list makes every image unknown


def test_doctor_names_needed_images_the_node_holds_unpinned(gc_stack):
    """With no agent pinning (the component not applied), a needed image is at the GC's mercy."""
    stack, folder = gc_stack, gc_stack.folder_gc
    image = swe_smith_image("held", "unpinned", RUN)
    stack.node.import_images([image])
    stack.node.wait_in_status(image)
    apply_needed(stack, scan_needed(stack, folder, [KEEP, image]))
    with running_agent(stack, folder, "--interval", "5", "--lease", "60"):
        wait_for(lambda: image in {n for i in (node_images(stack) or {}).get("spec", {}).get("images", ())
                                   for n in i["repoTags"]}, "the agent lists it")
        report = doctor(stack)
    delete_node_images(stack)
    line = next((line for line in node_lines(report) if "not pinned" in line), None)
    assert line is not None, report
    assert line.startswith(f"problem: node {NODE_NAME}: ") and f"not pinned ({image}): pinning is not enabled" in line
    assert "--set agent.pinning.enabled=true" in line, line


@pytest.fixture(scope="module", autouse=True)
def _figures():
    yield
    record_figures(FIGURES)
