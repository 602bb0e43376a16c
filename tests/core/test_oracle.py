"""The Python core against Kubernetes' own Go code, on generated cases.

`preflight-oracle` (tests/controlplane/cmd/preflight-oracle, built by tests/controlplane/build)
links what kube-scheduler and the kubelet run:
- node eligibility: kube-scheduler's filter plugins NodeUnschedulable, NodeName, TaintToleration and
  NodeAffinity (pkg/scheduler/framework/plugins/*, Filter), in the default profile's order, with
  the 1.37 feature defaults. They call k8s.io/component-helpers/scheduling/corev1
  (FindMatchingUntoleratedTaint, nodeaffinity.GetRequiredNodeAffinity) for the matching itself.
  A pod with spec.nodeName never meets the scheduler: for it the kubelet's admission decides,
  pkg/kubelet/lifecycle/predicate.go generalFilter (scheduler.AdmissionCheck, then NoExecute
  taints; resource fit left out);
- image references: github.com/distribution/reference v0.6.0 (Parse, ParseNormalizedNamed,
  FamiliarString, FamiliarName, TagNameOnly, ParseDockerRef, ParseAnyReference), with
  crypto/sha512 linked as in the kubelet and containerd.
Every case is fed to both; any disagreement fails with the cases that differ.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import string
import subprocess
from pathlib import Path

import pytest

from image_preflight.core.decide import references as images
from image_preflight.core.decide.references import InvalidReference
from image_preflight.core.decide.scheduling import (
    DAEMON_TOLERATIONS,
    REASON_AFFINITY,
    REASON_NODE_NAME,
    REASON_UNSCHEDULABLE,
    NodeTraits,
    PodPlacement,
    as_daemon,
    unschedulable_reason,
)

CASES = 12_000
ORACLE = "preflight-oracle"
CONFORMANCE = Path(__file__).resolve().parents[1] / "data" / "conformance" / "image-references.json"


@pytest.fixture(scope="module")
def oracle():
    path = shutil.which(ORACLE)
    if path is None:
        reason = f"{ORACLE} not on PATH: run tests/controlplane/build and put the folder it prints on PATH"
        if os.environ.get("CI"):
            pytest.fail(reason + "; CI requires it")
        pytest.skip(reason)

    def ask(questions: list[dict]) -> list[dict]:
        lines = "".join(json.dumps(q, ensure_ascii=False) + "\n" for q in questions)
        done = subprocess.run([path], input=lines.encode(), capture_output=True, check=True, timeout=600)
        answers = [json.loads(line) for line in done.stdout.decode().splitlines()]
        assert len(answers) == len(questions), done.stderr.decode()[-2000:]
        faults = [a for a in answers if "fault" in a]
        assert not faults, faults[:3]
        return answers

    return ask


def _disagreements(cases: list, ours: list, theirs: list) -> str:
    differ = [(c, o, t) for c, o, t in zip(cases, ours, theirs) if o != t]
    shown = "\n".join(f"case {json.dumps(c)}\n  python {o}\n  go     {t}" for c, o, t in differ[:8])
    return f"{len(differ)} of {len(cases)} cases differ:\n{shown}" if differ else ""


# --- node eligibility ----------------------------------------------------------------------------

_KEYS = ["pool", "zone", "gpu", "example.com/tier", "kubernetes.io/hostname", "n", "Bad Key", ""]
_VALUES = ["cpu", "gpu", "a", "b", "", "1", "5", "10", "-3", "007", "+4", "x1", "9223372036854775808", "a b"]
_NODE_NAMES = ["node-a", "node-b", "node-c"]
_EFFECTS = ["NoSchedule", "PreferNoSchedule", "NoExecute"]
_TAINT_KEYS = ["pool", "gpu", "dedicated", "node.kubernetes.io/unschedulable", "node.kubernetes.io/not-ready",
               "node.kubernetes.io/network-unavailable"] + [t.key for t in DAEMON_TOLERATIONS]
_LABEL_OPERATORS = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Equals"]
_FIELD_OPERATORS = ["In", "NotIn", "Exists"]


def _sample(rng: random.Random, pool: list, most: int) -> list:
    return [rng.choice(pool) for _ in range(rng.randint(0, most))]


def _node(rng: random.Random) -> dict:
    node: dict = {"metadata": {"name": rng.choice(_NODE_NAMES + [""] * (rng.random() < 0.03)),
                               "labels": {k: rng.choice(_VALUES) for k in _sample(rng, _KEYS[:-1], 4)}},
                  "spec": {}}
    taints = [{"key": rng.choice(_TAINT_KEYS), "value": rng.choice(["", "true", "a", "5"]),
               "effect": rng.choice(_EFFECTS)} for _ in range(rng.choice([0, 0, 1, 1, 2, 3]))]
    if taints:
        node["spec"]["taints"] = taints
    if rng.random() < 0.3:
        node["spec"]["unschedulable"] = True
    return node


def _toleration(rng: random.Random) -> dict:
    toleration = {}
    if rng.random() < 0.8:
        toleration["key"] = rng.choice(_TAINT_KEYS)
    operator = rng.choice(["", "Equal", "Exists", "Exists", "Gt", "Lt"])
    if operator:
        toleration["operator"] = operator
    if operator != "Exists" or rng.random() < 0.1:
        toleration["value"] = rng.choice(["", "true", "a", "5", "3"])
    effect = rng.choice(["", ""] + _EFFECTS)
    if effect:
        toleration["effect"] = effect
    return toleration


def _requirement(rng: random.Random) -> dict:
    operator = rng.choice(_LABEL_OPERATORS)
    requirement = {"key": rng.choice(_KEYS), "operator": operator}
    count = rng.choice([0, 1, 1, 2, 3]) if operator in ("In", "NotIn", "Equals") else rng.choice([0, 0, 0, 1, 1, 2])
    if operator in ("Gt", "Lt"):
        count = rng.choice([1, 1, 1, 0, 2])
    if count:
        requirement["values"] = [rng.choice(_VALUES) for _ in range(count)]
    return requirement


def _field_requirement(rng: random.Random) -> dict:
    requirement = {"key": "metadata.name" if rng.random() < 0.9 else "metadata.uid",
                   "operator": rng.choice(_FIELD_OPERATORS)}
    count = rng.choice([1, 1, 1, 0, 2])
    if count:
        requirement["values"] = [rng.choice(_NODE_NAMES) for _ in range(count)]
    return requirement


def _pod_spec(rng: random.Random) -> dict:
    spec: dict = {}
    if rng.random() < 0.2:
        spec["nodeName"] = rng.choice(_NODE_NAMES)
    if rng.random() < 0.2:
        spec["hostNetwork"] = True
    if rng.random() < 0.4:
        spec["nodeSelector"] = {k: rng.choice(_VALUES) for k in _sample(rng, _KEYS[:-1], 2)}
    if rng.random() < 0.6:
        spec["tolerations"] = [_toleration(rng) for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.6:
        terms = []
        for _ in range(rng.choice([0, 1, 1, 2, 3])):
            term: dict = {}
            if rng.random() < 0.8:
                term["matchExpressions"] = [_requirement(rng) for _ in range(rng.randint(0, 3))]
            if rng.random() < 0.3:
                term["matchFields"] = [_field_requirement(rng) for _ in range(rng.randint(0, 2))]
            terms.append(term)
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": terms}}}
    return spec


def _plugin(reason: str | None) -> dict:
    """Our first failing filter, as the name of the kube-scheduler plugin it mirrors."""
    if reason is None:
        return {"eligible": True}
    if reason == REASON_UNSCHEDULABLE:
        plugin = "NodeUnschedulable"
    elif reason == REASON_NODE_NAME:
        plugin = "NodeName"
    elif reason == REASON_AFFINITY:
        plugin = "NodeAffinity"
    else:
        assert reason.startswith("node(s) had untolerated taint"), reason
        plugin = "TaintToleration"
    return {"eligible": False, "plugin": plugin}


def test_node_eligibility_agrees_with_kube_scheduler_filters(oracle):
    rng = random.Random(20261130)
    cases = [{"pod": _pod_spec(rng), "node": _node(rng)} for _ in range(CASES)]
    theirs = [{k: v for k, v in a.items() if k != "reasons"}
              for a in oracle([{"kind": "eligible", **case} for case in cases])]
    ours = [_plugin(unschedulable_reason(PodPlacement.from_pod_spec(c["pod"]), NodeTraits.from_node(c["node"])))
            for c in cases]
    # The generator must reach every filter, both ways, or agreement proves little.
    reached = {(bool(c["pod"].get("nodeName")), t["eligible"], t.get("plugin")) for c, t in zip(cases, theirs)}
    assert reached >= {(False, True, None), (False, False, "NodeUnschedulable"),
                       (False, False, "TaintToleration"), (False, False, "NodeAffinity"),
                       (True, True, None), (True, False, "NodeName"), (True, False, "TaintToleration"),
                       (True, False, "NodeAffinity")}, reached
    # The kubelet admits a named pod onto a cordoned node the scheduler would have filtered out.
    assert any(c["pod"].get("nodeName") and c["node"]["spec"].get("unschedulable") and t["eligible"]
               for c, t in zip(cases, theirs))
    assert not (report := _disagreements(cases, ours, theirs)), report


def test_daemonset_placement_agrees_with_the_daemonset_controller(oracle):
    """pkg/controller/daemon/daemon_controller.go, NodeShouldRunDaemonPod (with the tolerations of
    pkg/controller/daemon/util AddOrUpdateDaemonPodTolerations): where a new daemon pod goes."""
    rng = random.Random(20261201)
    cases = [{"pod": _pod_spec(rng), "node": _node(rng)} for _ in range(CASES)]
    theirs = [a["eligible"] for a in oracle([{"kind": "daemonset", **case} for case in cases])]
    ours = [unschedulable_reason(as_daemon(PodPlacement.from_pod_spec(c["pod"])), NodeTraits.from_node(c["node"]))
            is None for c in cases]
    # Both ways, and on cordoned and pressure-tainted nodes the scheduler alone would refuse.
    assert 0.1 * CASES < sum(theirs) < 0.9 * CASES
    assert any(t and c["node"]["spec"].get("unschedulable") for c, t in zip(cases, theirs))
    assert not (report := _disagreements(cases, ours, theirs)), report


# --- image references ----------------------------------------------------------------------------

_HEX = "0123456789abcdef"
# Each pool: mostly valid parts, then the near misses (first entry of the second list onwards).
_DOMAINS = (["", "", "docker.io", "index.docker.io", "localhost", "localhost:5000", "registry.example.com",
             "Registry.Example.com", "[::1]:5000", "10.0.0.1:5000", "a.b-c.d", "xn--bcher-kva.example"],
            ["[fe80::1%eth0]:5000", "example.com:", "-bad.example", "registry_1.example", "[::1]"])
_COMPONENTS = (["library", "ubuntu", "swe-smith", "task_1", "a__b", "a--b", "x.y", "0",
                "sweb.eval.x86_64.owner_1776__repo.abc123"],
               ["a___b", "A", "-bad", "bad-", "a..b", "ab.", ""])
_TAGS = ([None, None, "latest", "openai", "v1.0", "A_b-C.1", "_x", "t" * 128],
         ["-bad", ".x", "t" * 129, "", "a:b"])
_ALPHABET = string.ascii_letters[:6] + "Z09/:@._-+ é\t"


def _digest(rng: random.Random) -> str:
    algorithm, length = rng.choice([("sha256", 64), ("sha256", 64), ("sha512", 128), ("sha384", 96),
                                    ("sha256", 63), ("md5", 32), ("SHA256", 64), ("sha256+b64", 64)])
    hexes = "".join(rng.choice(_HEX) for _ in range(length))
    return f"{algorithm}:{hexes.upper() if rng.random() < 0.05 else hexes}"


def _pick(rng: random.Random, pools: tuple[list, list]):
    return rng.choice(pools[1] if rng.random() < 0.08 else pools[0])


def _composed(rng: random.Random) -> str:
    path = "/".join(_pick(rng, _COMPONENTS) for _ in range(rng.choice([1, 1, 2, 2, 3, 4])))
    if rng.random() < 0.05:
        path = "/".join(["a" * rng.randint(50, 130)] * rng.randint(1, 3))
    if rng.random() < 0.04:
        path = "".join(rng.choice(_HEX) for _ in range(64))
    domain = _pick(rng, _DOMAINS)
    ref = f"{domain}/{path}" if domain else path
    tag = _pick(rng, _TAGS)
    if tag is not None:
        ref += ":" + tag
    if rng.random() < 0.25:
        ref += "@" + _digest(rng)
    if rng.random() < 0.03:
        ref = _digest(rng) if rng.random() < 0.5 else "".join(rng.choice(_HEX) for _ in range(64))
    return ref


def _mutated(rng: random.Random, ref: str) -> str:
    chars = list(ref)
    for _ in range(rng.randint(1, 3)):
        where = rng.randint(0, len(chars))
        action = rng.random()
        if action < 0.4 or not chars:
            chars.insert(where, rng.choice(_ALPHABET))
        elif action < 0.7:
            del chars[min(where, len(chars) - 1)]
        else:
            chars[min(where, len(chars) - 1)] = rng.choice(_ALPHABET)
    return "".join(chars)


def _reference_inputs() -> list[str]:
    rng = random.Random(5_000_000)
    seeds = [e["input"] for e in json.loads(CONFORMANCE.read_text(encoding="utf-8"))["normalize"]]
    inputs = list(seeds)
    while len(inputs) < CASES:
        ref = _composed(rng)
        inputs.append(ref if rng.random() < 0.75 else _mutated(rng, ref))
        if rng.random() < 0.2:
            inputs.append(_mutated(rng, rng.choice(seeds)))
    return inputs


def _ours(ref: str) -> dict:
    functions = {
        "parse": lambda r: str(images.parse(r)),
        "normalized": lambda r: images.normalize(r, allow_sha512=True),
        "familiar": images.familiar,
        "docker_ref": lambda r: images.docker_ref(r, allow_sha512=True),
    }
    answers = {}
    for name, function in functions.items():
        try:
            answers[name] = {"value": function(ref)}
        except InvalidReference as exc:
            answers[name] = {"error": exc.error}
    return answers


def test_image_references_agree_with_distribution_reference(oracle):
    inputs = _reference_inputs()
    ours = [_ours(ref) for ref in inputs]
    # The oracle answers for more of distribution/reference than the project uses: those it uses.
    theirs = [{name: answer[name] for name in mine}
              for answer, mine in zip(oracle([{"kind": "reference", "ref": ref} for ref in inputs]), ours)]
    valid = sum("value" in t["normalized"] for t in theirs)
    # Both valid and near-valid strings, in earnest numbers.
    assert 0.2 * len(inputs) < valid < 0.8 * len(inputs), valid
    assert not (report := _disagreements(inputs, ours, theirs)), report
