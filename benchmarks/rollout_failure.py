"""The headline figure: from a rollout Job's creation to the moment its creator knows it failed,
on the real node (tests/node/real_node.py: kubelet 1.37.2, containerd 2.4.2), for each path:

  (a) without image-preflight: the Pod waits in ErrImagePull/ImagePullBackOff until the Job's
      activeDeadlineSeconds (60 s here; the seed's setup has 1,800 s);
  (b) the webhook: the create call itself fails (its latency);
  (c) the watchdog, the webhook unreachable (failurePolicy Ignore): create -> Failed, and the
      kubelet's first waiting status -> Failed;
  (d) the image removed after admission (as image GC does) -> Failed.

And the webhook's latency as the apiserver measures it over --creations dry-run Job creations
(`apiserver_admission_webhook_admission_duration_seconds`, read from /metrics before and after),
beside the Job-create latency seen by the client with and without the webhook called (an opted-in
namespace and one outside the webhook's namespaceSelector, alternating). Dry runs go through
every admission step the apiserver takes for a real create but start no Pods, so a thousand of
them measure admission, not the kubelet.

    .venv/bin/python benchmarks/rollout_failure.py [--creations 1000] [--deadline 60]

Needs what the real-node tests need (root, tests/controlplane/build on PATH); prints markdown rows.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes.client.rest import ApiException

from benchmarks.figures import percentile
from tests.chart import write_webhook_certs
from tests.cluster.real_stack import ABSENT, GRACE_S, HELD, Stack, running_stack
from tests.controlplane.cluster import wait_for
from tests.node.images import swe_smith_image
from tests.node.real_node import missing_parts, running_real_node

METRIC = "apiserver_admission_webhook_admission_duration_seconds"


def _failed_at(stack: Stack, namespace: str, name: str, timeout_s: float, seen_waiting: list[float]) -> float:
    def failed():
        if not seen_waiting and stack.waiting_reasons(namespace, name) & {"ErrImagePull", "ImagePullBackOff"}:
            seen_waiting.append(time.monotonic())
        return stack.job_condition(namespace, name, "Failed")

    wait_for(failed, f"{name} Failed", timeout_s=timeout_s, interval_s=0.05)
    return time.monotonic()


def _histogram(stack: Stack) -> dict[float, float]:
    """Cumulative bucket counts of the validating webhook's admission duration."""
    text = stack.plane.kubectl("get", "--raw", "/metrics").stdout
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(METRIC + "_bucket{") and 'name="validate.image-preflight.io"' in line \
                and 'type="validating"' in line and 'operation="CREATE"' in line:
            le = float(line.split('le="', 1)[1].split('"', 1)[0])  # float() reads "+Inf" too
            buckets[le] = buckets.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return buckets


def _quantile(buckets: dict[float, float], q: float) -> str:
    """The bucket upper bound holding quantile q (what a histogram can tell)."""
    total = buckets.get(float("inf"), 0.0)
    if not total:
        return "n/a"
    for le in sorted(buckets):
        if buckets[le] >= q * total:
            return f"≤ {le * 1000:g} ms" if le != float("inf") else "> largest bucket"
    return "n/a"


def measure(stack: Stack, creations: int, deadline: int) -> list[str]:
    """The figures' markdown rows."""
    rows: list[str] = []
    # (a) no image-preflight: a namespace outside both the webhook's and the watchdog's reach.
    plain = stack.namespace(opted_in=False)
    job = stack.rollout(ABSENT)
    job["spec"]["activeDeadlineSeconds"] = deadline
    start = time.monotonic()
    stack.create(plain, job)
    waited: list[float] = []
    end = _failed_at(stack, plain, job["metadata"]["name"], deadline + 60, waited)
    rows.append(f"| (a) without image-preflight, activeDeadlineSeconds {deadline} | create → Failed "
                f"{end - start:.1f} s (first ErrImagePull after {waited[0] - start:.1f} s) | with the seed's "
                f"1,800 s: 1,800 s per rollout |")

    # (b) the webhook: the create call fails.
    enforced = stack.namespace()
    latencies = []
    for _ in range(20):
        start = time.monotonic()
        try:
            stack.create(enforced, stack.rollout(ABSENT))
        except ApiException as exc:
            assert exc.status == 422
        else:
            raise AssertionError("admitted")
        latencies.append(time.monotonic() - start)
    rows.append(f"| (b) the webhook | the create call fails in {statistics.median(latencies) * 1000:.1f} ms "
                f"(median of 20, max {max(latencies) * 1000:.1f} ms) | |")

    # (c) the watchdog with the webhook unreachable.
    job = stack.rollout(ABSENT)
    waited = []
    with stack.webhook_unreachable():
        start = time.monotonic()
        stack.create(enforced, job)
        end = _failed_at(stack, enforced, job["metadata"]["name"], GRACE_S + 60, waited)
    rows.append(f"| (c) the watchdog (grace {GRACE_S:g} s), webhook unreachable | create → Failed {end - start:.1f} s; "
                f"first waiting status → Failed {end - waited[0]:.1f} s | |")

    # (d) the image removed after admission.
    image = swe_smith_image("bench", "collected", uuid.uuid4().hex)
    stack.node.import_images([image])
    stack.node.wait_in_status(image)
    job = stack.rollout(image)
    job["spec"].update({"completions": 2, "parallelism": 1})
    stack.create(enforced, job)
    name = job["metadata"]["name"]
    wait_for(lambda: any(p.status.phase in ("Running", "Succeeded") for p in stack.pods(enforced, name)),
             "the first Pod started", timeout_s=60)
    start = time.monotonic()
    stack.node.remove_images(image)
    end = _failed_at(stack, enforced, name, GRACE_S + 90, [])
    rows.append(f"| (d) image removed after admission | removal → Failed {end - start:.1f} s | |")

    # The apiserver's own figure and the client's, with and without the webhook called.
    before = _histogram(stack)
    with_webhook, without = [], []
    for index in range(creations):
        for namespace, out in ((enforced, with_webhook), (plain, without)) if index % 2 else (
                (plain, without), (enforced, with_webhook)):
            body = stack.rollout(HELD)
            start = time.monotonic()
            stack.batch.create_namespaced_job(namespace, body, dry_run="All")
            out.append(time.monotonic() - start)
    after = _histogram(stack)
    delta = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
    count = int(delta.get(float("inf"), 0))
    rows.append(f"| {METRIC} over {count} calls | p50 {_quantile(delta, 0.5)}, p99 {_quantile(delta, 0.99)} "
                f"(histogram buckets) | |")
    ratio = statistics.median(with_webhook) / statistics.median(without)
    rows.append(f"| Job create (dry run), {len(with_webhook)} each, alternating | with the webhook p50 "
                f"{percentile(with_webhook, 0.5) * 1000:.1f} ms, p99 {percentile(with_webhook, 0.99) * 1000:.1f} ms; "
                f"without p50 {percentile(without, 0.5) * 1000:.1f} ms, p99 {percentile(without, 0.99) * 1000:.1f} ms "
                f"| median ratio {ratio:.2f} |")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--creations", type=int, default=1000)
    parser.add_argument("--deadline", type=int, default=60)
    args = parser.parse_args()
    if (reason := missing_parts()) is not None:
        parser.error(reason)
    # Kept after the run, as pytest keeps its temporary folders: the processes' logs are there.
    folder = Path(tempfile.mkdtemp(prefix="rollout-failure-"))
    certs = write_webhook_certs(folder / "certs")
    with (running_real_node(folder / "realnode-plane") as node,
          running_stack(node, certs, folder / "real-node-stack") as stack):
        rows = measure(stack, args.creations, args.deadline)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
