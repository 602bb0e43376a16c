"""Reviews nested deep, as a hostile client sends them."""

from __future__ import annotations

import json

NEAR_THE_PARSER_LIMIT = 1010  # orjson refuses past 1,024; the deepest field below is 9 levels in
DEEP = "deep"  # where body() writes the nesting: as text, as no encoder goes that deep


def nested_text(depth: int) -> str:
    opening = "".join("[" if level % 2 else '{"k":' for level in reversed(range(depth)))
    return opening + '"x"' + "".join("]" if level % 2 else "}" for level in range(depth))


def deep_workload(kind: str = "Job", **changes) -> dict:
    spec = {"containers": [{"name": "c", "image": "swe/task:openai", "imagePullPolicy": "IfNotPresent"}]}
    obj = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": "ns"},
           "spec": {"template": {"spec": spec}}}
    if kind == "Pod":
        obj = {"apiVersion": "v1", "kind": "Pod", "metadata": obj["metadata"], "spec": spec}
    for path, value in changes.items():
        target = obj
        *parents, last = path.split("__")
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[last] = value
    return obj


def body(obj: dict, depth: int, where: str = "") -> bytes:
    # Without request.name and request.namespace, the answer's log line reads the object's.
    group = "" if obj["kind"] == "Pod" else "batch"
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u1", "kind": {"group": group, "version": "v1", "kind": obj["kind"]}, "operation": "CREATE",
        "object": obj}}
    if where == "request.dryRun":
        review["request"]["dryRun"] = DEEP
    return json.dumps(review).replace(json.dumps(DEEP), nested_text(depth)).encode()


# Shown in the log line or a message: answering overflows.
SHOWN = {
    "request.object.metadata.namespace": lambda kind: deep_workload(kind, metadata__namespace=DEEP),
    "request.object.metadata.name": lambda kind: deep_workload(kind, metadata__name=DEEP),
}
SHOWN_IN_JOBS = {
    "request.object.spec.template.spec.containers[0].imagePullPolicy":
        lambda kind: deep_workload(kind, spec__template__spec__containers__0__imagePullPolicy=DEEP),
}
# Read by type, not shown: answered as any malformed object is.
READ = {
    "request.object.metadata.labels": lambda kind: deep_workload(kind, metadata__labels={"a": DEEP}),
    "request.object.spec.template.spec.containers":
        lambda kind: deep_workload(kind, spec__template__spec__containers=[DEEP]),
    "request.object.spec.template.spec.containers[0].image":
        lambda kind: deep_workload(kind, spec__template__spec__containers__0__image=DEEP),
    "request.object.spec.template.spec.nodeSelector":
        lambda kind: deep_workload(kind, spec__template__spec__nodeSelector=DEEP),
    "request.object.spec.template.spec.affinity": lambda kind: deep_workload(kind, spec__template__spec__affinity=DEEP),
    "request.dryRun": lambda kind: deep_workload(kind),
}
FIELDS = {**SHOWN, **SHOWN_IN_JOBS, **READ}


# A Pod's own spec, for /mutate.
POD_FIELDS = {
    "request.object.spec.containers[0].imagePullPolicy":
        lambda kind: deep_workload(kind, spec__containers__0__imagePullPolicy=DEEP),
    "request.object.spec.containers[0].image": lambda kind: deep_workload(kind, spec__containers__0__image=DEEP),
    "request.object.spec.nodeSelector": lambda kind: deep_workload(kind, spec__nodeSelector=DEEP),
    "request.object.spec.affinity": lambda kind: deep_workload(kind, spec__affinity=DEEP),
    "request.object.spec.tolerations": lambda kind: deep_workload(kind, spec__tolerations=[DEEP]),
}
