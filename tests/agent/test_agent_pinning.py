"""The agent's pinning: the plan (pure), containerd's images API (real containerd 2.x and 1.6) and
the pinning flags; tests/cluster/test_cluster_agent_pinning.py has the agent following a real
ConfigMap through a real apiserver as its own ServiceAccount.

Upstream: the kubelet's image GC skips what CRI reports pinned (pkg/kubelet/images/
image_gc_manager.go, imagesInEvictionOrder); containerd's CRI reports an image pinned when any of
its records carries io.cri-containerd.pinned=pinned (internal/cri/store/image/image.go,
Store.getImage and store.add), and takes in a label change from the /images/update event
(internal/cri/server/events.go, Store.update with store.pin/unpin).
"""

from __future__ import annotations

import subprocess

import pytest

from image_preflight.agent.containerd_images import ImageRecords
from image_preflight.agent.cri import ImageClient
from image_preflight.agent.inventory import image_dicts
from image_preflight.cli import main
from image_preflight.core.image_gc.pinning import (
    MARK_LABEL,
    MARK_VALUE,
    PINNED_LABEL,
    PINNED_VALUE,
    NeededImages,
    PinPlan,
    needed_text,
    needed_unpinned,
    parse_needed,
    pin_plan,
    pinning_refusal,
    pinning_report,
)
from tests.agent_cluster import ALPHA, wait_until
from tests.agent_helpers import BETA, GAMMA, SOURCE, import_images, labels_of
from tests.containerd import SANDBOX_IMAGE, Containerd

A_ID, B_ID = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def image(image_id: str, *tags: str, digests: tuple[str, ...] = (), pinned: bool = False) -> dict:
    return {"id": image_id, "repoTags": list(tags), "repoDigests": list(digests), "size": 1, "pinned": pinned}


def needed(*refs: str) -> NeededImages:
    return parse_needed({"needed.txt": "".join(f"{ref}\n" for ref in refs)})


# -- the list and the plan (pure) -----------------------------------------------------------


def test_the_list_is_every_key_of_the_configmap_normalised_without_comments_or_blank_lines():
    found = parse_needed({"train.txt": "alpha:v1\n\n# validation rows below\nbeta:v1\n",
                          "val.txt": "docker.io/library/beta:v1\n  gamma:v1  \n"})
    assert found == NeededImages(frozenset({ALPHA, BETA, GAMMA}))
    assert parse_needed(None) == NeededImages(frozenset())


def test_a_bad_line_is_named_by_configmap_key_and_line_and_the_rest_is_kept():
    found = parse_needed({"val.txt": "alpha:v1\nNot/A:Valid:Ref\n", "bin": 7}, "ns/list")
    assert found.keys == {ALPHA}
    assert found.errors[0] == "configmap ns/list key bin: not text"
    assert found.errors[1].startswith("configmap ns/list key val.txt line 2: ")
    assert "\n" not in found.summary


def test_the_needed_file_is_sorted_distinct_runtime_names():
    assert needed_text(["beta:v1", "alpha:v1", "docker.io/library/alpha:v1", "alpha"]) == (
        "docker.io/library/alpha:latest\n" f"{ALPHA}\n{BETA}\n")


@pytest.mark.parametrize(("name", "version", "can"), [
    ("containerd", "v2.4.2", True),
    ("containerd", "2.0.0", True),
    ("containerd", "v1.7.10", True),
    ("containerd", "1.6.25", True),
    ("containerd", "1.6.20~ds1", False),  # Debian bookworm's: pinned support came in 1.6.22
    ("containerd", "v1.6.24", False),  # labels set after load ignored until 1.6.25 (containerd#9382)
    ("containerd", "v1.7.3", False),  # likewise until 1.7.10 (containerd#9381)
    ("containerd", "v1.5.18", False),
    ("containerd", "dev", False),
    ("cri-o", "1.30.0", False),
])
def test_which_runtimes_can_pin(name, version, can):
    refusal = pinning_refusal(name, version)
    assert (refusal is None) == can
    if refusal is not None:
        assert version in refusal and "\n" not in refusal


def test_needed_images_held_here_and_not_pinned_are_pinned_by_the_name_the_runtime_lists():
    images = [image(A_ID, ALPHA), image(B_ID, BETA, pinned=True)]
    plan = pin_plan(needed("alpha:v1", "beta:v1", "gamma:v1"), images, {})
    assert plan.pin == (ALPHA,)  # beta is pinned already (by someone else); gamma is not here
    assert plan.unpin == ()


def test_a_needed_digest_or_image_id_pins_that_record():
    digest = "docker.io/library/alpha@sha256:" + "c" * 64
    images = [image(A_ID, ALPHA, digests=(digest,)), image(B_ID)]
    assert pin_plan(needed(digest, B_ID), images, {}).pin == (digest, B_ID)


def test_what_we_pinned_stays_while_needed_and_is_unpinned_once_unlisted_and_nothing_else_is():
    ours = {PINNED_LABEL: PINNED_VALUE, MARK_LABEL: MARK_VALUE}
    images = [image(A_ID, ALPHA, pinned=True), image(B_ID, BETA, pinned=True)]
    plan = pin_plan(needed("alpha:v1"), images, {ALPHA: ours, BETA: ours})
    assert plan == pin_plan(needed("alpha:v1"), images, {ALPHA: ours, BETA: ours})
    assert (plan.pin, plan.unpin) == ((), (BETA,))
    # An image pinned by another (no mark) and no longer listed is left alone.
    assert pin_plan(needed(), [image(A_ID, ALPHA, pinned=True)], {}).unpin == ()


def test_our_mark_without_the_pin_label_is_pinned_again():
    assert pin_plan(needed("alpha:v1"), [image(A_ID, ALPHA)], {ALPHA: {MARK_LABEL: MARK_VALUE}}).pin == (ALPHA,)


def test_a_list_with_bad_lines_pins_its_good_ones_and_unpins_nothing():
    broken = parse_needed({"needed.txt": "alpha:v1\nNot/A:Valid:Ref\n"})
    ours = {PINNED_LABEL: PINNED_VALUE, MARK_LABEL: MARK_VALUE}
    plan = pin_plan(broken, [image(A_ID, ALPHA), image(B_ID, BETA, pinned=True)], {BETA: ours})
    assert (plan.pin, plan.unpin) == ((ALPHA,), ())


def test_the_report_counts_the_needed_images_held_and_pinned():
    images = [image(A_ID, ALPHA, pinned=True), image(B_ID, BETA)]
    report = pinning_report(source=SOURCE, refusal=None, needed=needed("alpha:v1", "beta:v1", "gamma:v1"),
                            images=images)
    assert report == {"list": SOURCE, "supported": True, "needed": 2, "pinned": 1}
    assert needed_unpinned(needed("alpha:v1", "beta:v1").keys, images) == [BETA]
    refused = pinning_report(source=SOURCE, refusal="containerd 1.6.20 ...", needed=None, images=images)
    assert refused == {"list": SOURCE, "supported": False, "message": "containerd 1.6.20 ..."}


def sized(image_id: str, tag: str, size: int, pinned: bool = False) -> dict:
    return {**image(image_id, tag, pinned=pinned), "size": size}


C_ID = "sha256:" + "c" * 64


def test_a_byte_budget_pins_the_first_needed_images_that_fit_and_refuses_the_rest():
    """Whoever writes the list could otherwise pin the whole disk past the image GC's reach."""
    images = [sized(A_ID, ALPHA, 40), sized(B_ID, BETA, 50), sized(C_ID, GAMMA, 30)]
    plan = pin_plan(needed("alpha:v1", "beta:v1", "gamma:v1"), images, {}, max_bytes=75)
    assert (plan.pin, plan.refused) == ((ALPHA, GAMMA), (BETA,))  # by name: alpha 40, then beta no, gamma 30
    assert pin_plan(needed("alpha:v1", "beta:v1", "gamma:v1"), images, {}).refused == ()  # no budget
    # What another pinned spends none of it.
    theirs = [sized(A_ID, ALPHA, 40, pinned=True), sized(B_ID, BETA, 50), sized(C_ID, GAMMA, 30)]
    assert pin_plan(needed("alpha:v1", "beta:v1", "gamma:v1"), theirs, {}, max_bytes=75).pin == (BETA,)


def test_our_pins_keep_their_place_and_a_smaller_budget_unpins_what_no_longer_fits():
    ours = {PINNED_LABEL: PINNED_VALUE, MARK_LABEL: MARK_VALUE}
    images = [sized(A_ID, ALPHA, 40), sized(B_ID, BETA, 50, pinned=True), sized(C_ID, GAMMA, 30)]
    plan = pin_plan(needed("alpha:v1", "beta:v1", "gamma:v1"), images, {BETA: ours}, max_bytes=85)
    assert (plan.pin, plan.unpin, plan.refused) == ((GAMMA,), (), (ALPHA,))  # beta first: it is ours
    smaller = pin_plan(needed("alpha:v1", "beta:v1", "gamma:v1"), images, {BETA: ours}, max_bytes=45)
    assert (smaller.pin, smaller.unpin, smaller.refused) == ((ALPHA,), (BETA,), (BETA, GAMMA))


def test_the_report_says_what_the_budget_refused():
    images = [sized(A_ID, ALPHA, 40), sized(B_ID, BETA, 50)]
    report = pinning_report(source=SOURCE, refusal=None, needed=needed("alpha:v1", "beta:v1"), images=images,
                            refused=(BETA,), max_bytes=75)
    assert report["refused"] == 1
    assert report["message"] == f"1 needed image(s) not pinned ({BETA}): pinning them would pass --pin-max-bytes 75"
    long = pinning_report(source=SOURCE, refusal=None, needed=needed(), images=[], problem="x" * 10_000)
    assert len(long["message"]) == 4096 and long["message"].endswith("…")


# -- containerd's images API ------------------------------------------------------------------


def pinned_names(runtime: Containerd) -> set[str]:
    with ImageClient(runtime.endpoint) as cri:
        return {name for i in cri.list_images() if i.pinned for name in i.repo_tags}


def test_pin_and_unpin_change_what_cri_reports_and_only_our_labels(containerd2, tmp_path):
    import_images(containerd2, tmp_path, [ALPHA, BETA])
    with ImageRecords(containerd2.endpoint) as records:
        assert records.pin(ALPHA) is True
        # containerd 2.4 crashes on an Update without a target: the runtime still answering is the proof.
        wait_until(lambda: pinned_names(containerd2) == {ALPHA}, "CRI reports alpha pinned")
        assert labels_of(containerd2, ALPHA) == {"io.cri-containerd.image": "managed", PINNED_LABEL: PINNED_VALUE,
                                                 MARK_LABEL: MARK_VALUE}
        assert records.marked() == {ALPHA: labels_of(containerd2, ALPHA)}
        assert records.pin("docker.io/library/absent:v1") is False
        assert records.unpin(ALPHA) is True
        wait_until(lambda: pinned_names(containerd2) == set(), "CRI reports nothing pinned")
        assert labels_of(containerd2, ALPHA) == {"io.cri-containerd.image": "managed"}
        assert records.marked() == {}


def test_a_pin_without_our_mark_is_never_removed(containerd2, tmp_path):
    import_images(containerd2, tmp_path, [ALPHA])
    subprocess.run([containerd2.ctr, "-a", containerd2.socket, "-n", "k8s.io", "images", "label", ALPHA,
                    f"{PINNED_LABEL}={PINNED_VALUE}"], check=True, capture_output=True)
    with ImageRecords(containerd2.endpoint) as records:
        assert records.marked() == {}
        assert records.unpin(ALPHA) is False
    assert labels_of(containerd2, ALPHA)[PINNED_LABEL] == PINNED_VALUE


def test_containerd_pins_its_sandbox_image_itself_and_the_plan_leaves_that_pin_alone(containerd2, tmp_path):
    """containerd 2.x labels the image its config names as the sandbox, imported too
    (internal/cri/server/images/image_pull.go: UpdateImage with getLabels, on the image event)."""
    import_images(containerd2, tmp_path, [SANDBOX_IMAGE, ALPHA])
    wait_until(lambda: pinned_names(containerd2) == {SANDBOX_IMAGE}, "CRI reports the sandbox image pinned")
    with ImageClient(containerd2.endpoint) as cri, ImageRecords(containerd2.endpoint) as records:
        listed = image_dicts(cri.list_images())
        plan = pin_plan(needed(SANDBOX_IMAGE, ALPHA), listed, records.marked())
        assert (plan.pin, plan.unpin) == ((ALPHA,), ())
        assert pin_plan(needed(), listed, records.marked()) == PinPlan((), ())
    assert MARK_LABEL not in labels_of(containerd2, SANDBOX_IMAGE)


@pytest.mark.parametrize(("argv", "message"), [
    (["--print", "--pin-needed-images", SOURCE], "--pin-needed-images: pins only with --publish"),
    (["--publish", "--pin-needed-images", "needed-images"],
     "--pin-needed-images: 'needed-images' is not NAMESPACE/NAME"),
])
def test_bad_pinning_flags_are_named(argv, message, capsys):
    assert main(["agent", "--node", "n", *argv]) == 2
    assert capsys.readouterr().err.strip().endswith(message)
