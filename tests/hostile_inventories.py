"""Hostile inventories: one malformed file per format and field (HOSTILE), and a seeded,
structure-aware fuzz over every snapshot format; beside them, the good files they replace."""

from __future__ import annotations

import copy
import json
import os
import random
import time
from pathlib import Path

from image_preflight.api import decide
from image_preflight.core.decide.inventory import Inventory
from image_preflight.files.atomic import write_atomic
from tests.builders.inventories import NOW
from tests.builders.nodes import cri_image, docker_line, kube_node, node_list, runtime, sha, status_image
from tests.builders.reviews import pod_spec

ALPHA = "docker.io/library/alpha:v1"


BETA = "docker.io/library/beta:v1"


HUGE = "9" * 5000  # past Python's int() limit of 4300 digits


DEEP = "[" * 100_000 + "]" * 100_000


def holding(*images: str, name: str = "cpu-1") -> str:
    """A `kubectl get nodes -o json` snapshot of one node holding `images`."""
    return node_list(kube_node(name, [status_image(*image.rsplit(":", 1)) for image in images]))


def outcome(inventory: Inventory, image: str) -> str:
    return decide(pod_spec(image), inventory, now=NOW).outcome


def with_node(mutate) -> str:
    node = kube_node("cpu-1", [status_image("docker.io/library/alpha", "v1")], labels={"pool": "cpu"},
                     taints=[{"key": "gpu", "value": "true", "effect": "NoSchedule"}])
    mutate(node)
    return node_list(node)


def with_runtime(mutate, *, listed: bool = False) -> str:
    obj = runtime("cpu-1")
    mutate(obj)
    return node_list(kube_node("cpu-1"), obj) if listed else json.dumps(obj)


def with_crictl(mutate) -> str:
    document = {"images": [cri_image(sha("a"), ["docker.io/library/alpha:v1"])]}
    mutate(document["images"][0])
    return json.dumps(document, indent=2)


def set_in(path: str, value):
    """A mutation setting the dotted `path` (list indexes as numbers) to `value`."""

    def mutate(obj):
        *parents, last = [int(part) if part.isdigit() else part for part in path.split(".")]
        for part in parents:
            obj = obj[part]
        obj[last] = value

    return mutate


GVISOR = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "gvisor"}, "handler": "runsc",
          "scheduling": {"nodeSelector": {"sandbox": "gvisor"},
                         "tolerations": [{"key": "sandbox", "operator": "Exists"}]}}


def with_class(mutate) -> str:
    obj = copy.deepcopy(GVISOR)
    mutate(obj)
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [json.loads(holding(ALPHA))["items"][0], obj]})


# (id, file name, content, what the message says after "<path>")
HOSTILE = [
    ("huge-integer", "nodes.json", holding(ALPHA).replace('"sizeBytes": 100000000', f'"sizeBytes": {HUGE}'),
     r":\d+: not JSON as Kubernetes writes it \(an integer of 5000 digits\)"),
    ("huge-negative-integer", "nodes.json", json.dumps({"images": []}).replace("[]", f"[-{HUGE}]"),
     r":1: not JSON as Kubernetes writes it \(an integer of 5000 digits\)"),
    ("huge-integer-in-a-docker-line", "worker.json",
     docker_line("python", "3.11") + "\n" + docker_line("python", "3.12").replace('"N/A"', HUGE, 1),
     r":2: not JSON as Kubernetes writes it \(an integer of 5000 digits\)"),
    ("nesting-too-deep", "nodes.json", DEEP, r": JSON nested too deeply"),
    ("nesting-too-deep-in-items", "nodes.json", '{"kind": "List", "items": ' + DEEP + "}", r": JSON nested too deeply"),
    ("nesting-too-deep-in-a-docker-line", "worker.json", docker_line("a", "1") + '\n{"Repository": ' + DEEP + "}",
     r":2: JSON nested too deeply"),
    ("nan", "nodes.json", holding(ALPHA).replace('"sizeBytes": 100000000', '"sizeBytes": NaN'),
     r":\d+: not JSON as Kubernetes writes it \(NaN is not a JSON number\)"),
    ("infinity", "nodes.json",
     with_runtime(set_in("spec.leaseDurationSeconds", "LEASE")).replace('"LEASE"', "Infinity"),
     r":1: not JSON as Kubernetes writes it \(Infinity is not a JSON number\)"),
    ("minus-infinity-in-a-docker-line", "worker.json", docker_line("a", "1").replace('"N/A"', "-Infinity", 1),
     r":1: not JSON as Kubernetes writes it \(-Infinity is not a JSON number\)"),
    ("crictl-id-a-list", "worker.json", with_crictl(set_in("id", [sha("a")])),
     r": images\[0\]\.id: expected a string, got list"),
    ("crictl-id-a-dict", "worker.json", with_crictl(set_in("id", {"sha256": "a"})),
     r": images\[0\]\.id: expected a string, got dict"),
    ("crictl-id-a-number", "worker.json", with_crictl(set_in("id", 7)),
     r": images\[0\]\.id: expected a string, got int"),
    ("crictl-tags-numbers", "worker.json", with_crictl(set_in("repoTags", [1, 2])),
     r": images\[0\]\.repoTags\[0\]: expected a string, got int"),
    ("crictl-digests-an-object", "worker.json", with_crictl(set_in("repoDigests", {"a": "b"})),
     r": images\[0\]\.repoDigests: not a list"),
    ("crictl-images-strings", "worker.json", json.dumps({"images": ["python:3.11"]}), r": images\[0\]: not an object"),
    ("node-images-id-a-list", "nodes.json", with_runtime(set_in("spec.images.0.id", [sha("a")])),
     r": spec\.images\[0\]\.id: expected a string, got list"),
    ("node-images-id-a-dict-in-a-list", "nodes.json", with_runtime(set_in("spec.images.1.id", {}), listed=True),
     r": items\[1\]: spec\.images\[1\]\.id: expected a string, got dict"),
    ("node-images-name-a-number", "nodes.json", with_runtime(set_in("spec.nodeName", 5)),
     r": spec\.nodeName: expected a string, got int"),
    ("node-images-lease-huge", "nodes.json", with_runtime(set_in("spec.leaseDurationSeconds", 10**400)),
     r": spec\.leaseDurationSeconds: more than 3600 s, the longest a list may count$"),
    ("node-images-lease-over-an-hour", "nodes.json", with_runtime(set_in("spec.leaseDurationSeconds", 3601)),
     r": spec\.leaseDurationSeconds: more than 3600 s, the longest a list may count$"),
    ("node-images-time-a-number", "nodes.json", with_runtime(set_in("spec.observedAt", 1.5)),
     r": spec\.observedAt: missing or not an RFC 3339 time"),
    ("node-images-time-a-long-string", "nodes.json", with_runtime(set_in("spec.observedAt", "x" * 100_000)),
     r": spec\.observedAt: a string of 100000 characters is not an RFC 3339 time"),
    ("node-images-images-a-string", "nodes.json", with_runtime(set_in("spec.images", "python:3.11")),
     r": spec\.images: missing or not a list"),
    ("node-name-a-number", "nodes.json", with_node(set_in("metadata.name", 5)),
     r": items\[0\]: metadata\.name: expected a string, got int"),
    ("node-name-a-list", "nodes.json", with_node(set_in("metadata.name", ["cpu-1"])),
     r": items\[0\]: metadata\.name: expected a string, got list"),
    ("image-names-numbers", "nodes.json", with_node(set_in("status.images.0.names", [3, 4])),
     r": items\[0\]: node cpu-1: status\.images\[0\]\.names\[0\]: expected a string, got int"),
    ("image-names-a-string", "nodes.json", with_node(set_in("status.images.0.names", "alpha:v1")),
     r": items\[0\]: node cpu-1: status\.images\[0\]\.names: not a list"),
    ("images-strings", "nodes.json", with_node(set_in("status.images", ["alpha:v1"])),
     r": items\[0\]: node cpu-1: status\.images\[0\]: not an object"),
    ("images-a-string", "nodes.json", with_node(set_in("status.images", "alpha:v1")),
     r": items\[0\]: node cpu-1: status\.images: not a list"),
    ("labels-a-list", "nodes.json", with_node(set_in("metadata.labels", ["pool=cpu"])),
     r": items\[0\]: node cpu-1: metadata\.labels: expected a mapping, got list"),
    ("label-value-a-number", "nodes.json", with_node(set_in("metadata.labels.pool", 1)),
     r": items\[0\]: node cpu-1: metadata\.labels\.pool: expected a string, got int"),
    ("label-key-with-a-newline", "nodes.json", with_node(set_in("metadata.labels", {"a\nb": 1})),
     r": items\[0\]: node cpu-1: metadata\.labels\.a\\nb: expected a string, got int"),
    ("taints-a-string", "nodes.json", with_node(set_in("spec.taints", "gpu=true:NoSchedule")),
     r": items\[0\]: node cpu-1: spec\.taints: expected a list, got str"),
    ("taints-strings", "nodes.json", with_node(set_in("spec.taints", ["gpu"])),
     r": items\[0\]: node cpu-1: spec\.taints\[0\]: expected a mapping, got str"),
    ("taint-effect-a-list", "nodes.json", with_node(set_in("spec.taints.0.effect", ["NoSchedule"])),
     r": items\[0\]: node cpu-1: spec\.taints\[0\]\.effect: expected a string, got list"),
    ("unschedulable-a-string", "nodes.json", with_node(set_in("spec.unschedulable", "yes")),
     r": items\[0\]: node cpu-1: spec\.unschedulable: expected true or false, got str"),
    ("status-a-list", "nodes.json", with_node(set_in("status", ["Ready"])),
     r": items\[0\]: node cpu-1: status: not an object"),
    ("lone-surrogate-in-a-node-name", "nodes.json", with_node(set_in("metadata.name", "cpu-\ud800")),
     r": items\[0\]\.metadata\.name: not valid Unicode \(a lone surrogate escape\)"),
    ("lone-surrogate-in-an-image-name", "nodes.json", with_node(set_in("status.images.0.names.0", "alpha:\udfff")),
     r": items\[0\]\.status\.images\[0\]\.names\[0\]: not valid Unicode \(a lone surrogate escape\)"),
    ("lone-surrogate-in-a-label-key", "nodes.json", with_node(set_in("metadata.labels", {"\udc00": "x"})),
     r": items\[0\]\.metadata\.labels\.\\udc00: not valid Unicode \(a lone surrogate escape\)"),
    ("lone-surrogate-in-a-crictl-id", "worker.json", with_crictl(set_in("id", "sha256:\ud83d")),
     r": images\[0\]\.id: not valid Unicode \(a lone surrogate escape\)"),
    ("lone-surrogate-in-a-docker-tag", "worker.json",
     docker_line("a", "1") + "\n" + docker_line("python", "3.11\ud800"),
     r":2: Tag: not valid Unicode \(a lone surrogate escape\)"),
    ("docker-repository-a-number", "worker.json", docker_line("python", "3.11").replace('"python"', "7"),
     r":1: Repository: expected a string, got int"),
    ("kind-a-list", "nodes.json", json.dumps({"kind": "List", "items": [{"kind": ["Node"] * 10_000}]}),
     r": items\[0\]: kind a list is not Node, NodeImages, RuntimeClass or Lease"),
    ("kind-a-long-string", "nodes.json", json.dumps({"kind": "List", "items": [{"kind": "N" * 1_000_000}]}),
     r": items\[0\]: kind a string of 1000000 characters is not Node"),
    ("items-an-object", "nodes.json", json.dumps({"kind": "NodeList", "items": {"cpu-1": {}}}), r": items: not a list"),
    ("runtime-class-name-a-number", "nodes.json", with_class(set_in("metadata.name", 5)),
     r": items\[1\]: metadata\.name: missing or not a string"),
    ("runtime-class-tolerations-a-dict", "nodes.json", with_class(set_in("scheduling.tolerations", {"key": "a"})),
     r": items\[1\] gvisor: scheduling\.tolerations: expected a list, got dict"),
    ("reference-with-a-nul", "refs.txt", "python:3.11\nbusy\x00box\n", r":2: invalid image reference 'busy\\x00box'"),
    ("not-utf-8", "nodes.json", b'{"kind": "List", "items": ["\xff"]}', r": cannot read snapshot \("),
]


_last_write = [0]


def write(path: Path, content: str | bytes) -> Path:
    """Replace `path` as cert-manager or kubectl would, with a modification time of its own: two
    writes within one clock tick, of one size, on a recycled inode would otherwise look unchanged."""
    write_atomic(path, content if isinstance(content, bytes) else content.encode(), 0o644)
    _last_write[0] = max(time.time_ns(), _last_write[0] + 1_000_000)
    os.utime(path, ns=(_last_write[0], _last_write[0]))
    return path


SEED_NODE = kube_node("worker-1", [status_image("docker.io/library/python", "3.11", digest=sha("1"))],
                  labels={"pool": "rollout"}, taints=[{"key": "gpu", "value": "true", "effect": "NoSchedule"}])


SEEDS = {
    "List": {"apiVersion": "v1", "kind": "List", "items": [SEED_NODE, runtime("worker-1"), GVISOR]},
    "NodeList": {"apiVersion": "v1", "kind": "NodeList",
                 "items": [{k: v for k, v in SEED_NODE.items() if k != "kind"}]},
    "Node": SEED_NODE,
    "NodeImages": runtime("worker-2"),
    "NodeImagesList": {"kind": "NodeImagesList", "items": [runtime("a"), runtime("b")]},
    "RuntimeClassList": {"kind": "RuntimeClassList", "items": [GVISOR]},
    "crictl": {"images": [cri_image(sha("a"), ["docker.io/library/python:3.11"],
                                    ["docker.io/library/python@" + sha("1")]),
                          cri_image(sha("b"))]},
    "docker": json.loads(docker_line("python", "3.11", sha("1"))),
}


REFERENCES = ["python:3.11", "docker.io/library/busybox", "# a comment", "", sha("a"), "registry.example/x@" + sha("2")]


# Placeholders for what json.dumps cannot write, put in as raw text after dumping.
RAW = {"<<huge>>": HUGE, "<<-huge>>": "-" + HUGE, "<<nan>>": "NaN", "<<inf>>": "Infinity", "<<-inf>>": "-Infinity",
       "<<deep>>": DEEP, "<<shallow>>": "[" * 500 + "]" * 500}


SCALARS = [0, -1, 1.5, 10**30, True, False, None, "", "x", "python:3.11", sha("c"), "\ud800", "a\udfffb", "a\nb",
           "x" * 5000, *RAW]


SHAPES = [[], {}, ["a"], [5], [None], [[]], [{}], {"a": 1}, {"\udc00": "x"}, {"names": 5}, {"id": ["x"]}]


def mutate(document, rng: random.Random):
    """A copy of `document` with one to three structural changes: a value swapped for another type
    or a hostile one, a key removed, a value wrapped in a list or object, a subtree moved."""
    document = copy.deepcopy(document)
    for _ in range(rng.choice([1, 1, 2, 3])):
        slots = list(_slots(document))
        if not slots:
            break
        parent, key = rng.choice(slots)
        roll = rng.random()
        if roll < 0.15 and isinstance(parent, dict):
            del parent[key]
        elif roll < 0.25:
            parent[key] = [parent[key]]
        elif roll < 0.30:
            parent[key] = {"x": parent[key]}
        elif roll < 0.40:
            parent[key] = copy.deepcopy(rng.choice(slots)[0])
        else:
            parent[key] = copy.deepcopy(rng.choice(SCALARS + SHAPES))
    return document


def _slots(value):
    stack = [value]
    while stack:
        value = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
        for key, item in items:
            yield value, key
            stack.append(item)


def render(document, rng: random.Random) -> str:
    text = json.dumps(document, indent=rng.choice([None, 2]))
    for placeholder, raw in RAW.items():
        text = text.replace(json.dumps(placeholder), raw)
    return text


def hostile_texts(count: int, seed: int):
    rng = random.Random(seed)
    for _ in range(count):
        form = rng.choice([*SEEDS, "docker-lines", "references"])
        if form == "docker-lines":
            yield form, "\n".join(render(mutate(SEEDS["docker"], rng), rng).replace("\n", "")
                                  for _ in range(rng.randint(1, 3)))
        elif form == "references":
            lines = [rng.choice(REFERENCES + ["\x00", "NaN", "[", "{", HUGE, "a\udc00"])
                     for _ in range(rng.randint(1, 4))]
            yield form, "\n".join(lines)
        else:
            yield form, render(mutate(SEEDS[form], rng), rng)
