"""Webhook decision time against inventory size, and the server's resident memory.

    python benchmarks/webhook_inventory.py [--nodes 200] [--images 5000]

1. Decision time (admit() on a Job review, in process, nothing remembered) with NODES x IMAGES (node, image) pairs
   against NODES x 5 pairs (1,000 with the defaults): target ratio <= 1.5.
2. Resident memory of `image-preflight serve --inventory` holding NODES x IMAGES: target <= 150 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.figures import rss_mib
from image_preflight.certs.store import CertRequest, ensure_certificates
from image_preflight.core.admission.review import admit
from image_preflight.core.admission.settings import Settings
from image_preflight.files.inventory import load_inventory_file


def node_list(nodes: int, images: int) -> dict:
    """Nodes shaped like kubelet status: each image with a tag and a repo digest (the same image,
    so the same digest, on every node)."""
    items = []
    for n in range(nodes):
        status_images = [
            {
                "names": [
                    f"docker.io/library/swesmith.x86_64.owner{i % 97}__repo{i}.{i:08x}@sha256:{i * 7919:064x}",
                    f"docker.io/library/swesmith.x86_64.owner{i % 97}__repo{i}.{i:08x}:openai",
                ],
                "sizeBytes": 2_000_000_000,
            }
            for i in range(images)
        ]
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": f"cpu-{n:03d}",
                             "labels": {"pool": "cpu", "kubernetes.io/hostname": f"cpu-{n:03d}"}},
                "spec": {},
                "status": {"images": status_images},
            }
        )
    return {"apiVersion": "v1", "kind": "List", "items": items}


def job_review(image: str) -> dict:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0b2c1e5e-0000-4000-8000-000000000001",
            "kind": {"group": "batch", "version": "v1", "kind": "Job"},
            "resource": {"group": "batch", "version": "v1", "resource": "jobs"},
            "namespace": "rl",
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:rl:agentlightning"},
            "object": {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "rollout-1", "namespace": "rl"},
                "spec": {"template": {"spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"pool": "cpu"},
                    "containers": [{"name": "rollout", "image": image, "imagePullPolicy": "IfNotPresent"}],
                }}},
            },
            "dryRun": False,
        },
    }


def decision_seconds(snapshot: Path, iterations: int) -> float:
    inventory = load_inventory_file(snapshot, max_images=-1)
    review = job_review("swesmith.x86_64.owner3__repo3.00000003:openai")
    settings = Settings()
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(iterations):
            inventory.decisions.clear()  # the first review of its kind: nothing remembered
            admit(review, inventory, settings, now=time.time())
        samples.append((time.perf_counter() - start) / iterations)
    return statistics.median(samples)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_rss_mb(source: list[str], certs: Path) -> float:
    """VmRSS of `serve` once it answers, its inventory from `source` (--inventory or --kubeconfig)."""
    port = free_port()
    command = [
        sys.executable, "-m", "image_preflight", "serve", "--tls-cert", str(certs / "tls.crt"),
        "--tls-key", str(certs / "tls.key"), *source, "--max-images", "-1",
        "--host", "127.0.0.1", "--port", str(port), "--metrics-port", "0", "--log-level", "warning",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, certs / "ca.crt")
        return rss_mib(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=30)


def wait_ready(port: int, ca: Path) -> None:
    context = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as raw:
                with context.wrap_socket(raw, server_hostname="image-preflight.image-preflight.svc") as tls:
                    tls.sendall(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    if b" 200 " in tls.recv(64):
                        time.sleep(2.0)  # let the watch settle
                        return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("serve did not become ready")


def watch_rss_mb(nodes: dict, certs: Path, work: Path) -> float:
    from tests.fake_apiserver import FakeApiServer, write_kubeconfig

    with FakeApiServer() as server:
        server.register(resource="nodes", kind="Node")
        for item in nodes["items"]:
            server.put_object("nodes", item)
        kubeconfig = write_kubeconfig(server, work / "kubeconfig")
        return serve_rss_mb(["--kubeconfig", str(kubeconfig)], certs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--iterations", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        large, small = work / "large.json", work / "small.json"
        nodes = node_list(args.nodes, args.images)
        large.write_text(json.dumps(nodes))
        small.write_text(json.dumps(node_list(args.nodes, 5)))
        t_small = decision_seconds(small, args.iterations)
        t_large = decision_seconds(large, args.iterations)
        ensure_certificates(work / "certs", CertRequest("image-preflight", "image-preflight"),
                            datetime.now(timezone.utc))
        rss_file = serve_rss_mb(["--inventory", str(large)], work / "certs")
        rss_watch = watch_rss_mb(nodes, work / "certs", work)
        size_mb = os.path.getsize(large) / 1e6
    pairs_large, pairs_small = args.nodes * args.images, args.nodes * 5
    print(f"decision, {pairs_small:,} (node, image) pairs : {t_small * 1e6:8.1f} us")
    print(f"decision, {pairs_large:,} (node, image) pairs : {t_large * 1e6:8.1f} us")
    print(f"ratio                                  : {t_large / t_small:8.2f}  (target <= 1.5)")
    print(f"serve RSS, {pairs_large:,} pairs, node watch (paged list) : {rss_watch:.0f} MB  (target <= 150)")
    print(f"serve RSS, {pairs_large:,} pairs, --inventory ({size_mb:.0f} MB file) : {rss_file:.0f} MB")


if __name__ == "__main__":
    main()
