"""Webhook throughput and latency over TLS with keep-alive, against a bare baseline.

    apt-get install wrk   # the load generator
    python benchmarks/webhook_load.py [--seconds 10] [--connections 16] [--rate 200]

Measured in the same run:
- throughput (wrk, keep-alive, POST of a Job review) of `image-preflight serve` against bare
  uvicorn + TLS returning a canned AdmissionReview (benchmarks/canned_webhook.py): target >= 0.8x;
- p50/p99 latency at a fixed 200 requests/s over 4 keep-alive TLS connections verified with SNI
  as the apiserver connects: target p99 <= 10 ms.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import shutil
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from image_preflight.certs.store import CertRequest, ensure_certificates  # noqa: E402

SERVER_NAME = "image-preflight.image-preflight.svc"
EXTRA: list[str] = []
EXAMPLE_NODES = ROOT / "examples" / "swe-smith" / "nodes.json"


def review_body() -> bytes:
    job = json.loads(json.dumps(yaml_free_job()))
    return json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "0b2c1e5e-0000-4000-8000-000000000001",
            "kind": {"group": "batch", "version": "v1", "kind": "Job"},
            "resource": {"group": "batch", "version": "v1", "resource": "jobs"},
            "requestKind": {"group": "batch", "version": "v1", "kind": "Job"},
            "requestResource": {"group": "batch", "version": "v1", "resource": "jobs"},
            "name": "rollout-1", "namespace": "rl", "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:rl:agentlightning", "groups": ["system:serviceaccounts"]},
            "object": job, "oldObject": None, "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }).encode()


def yaml_free_job() -> dict:
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "rollout-1", "namespace": "rl", "labels": {"app.kubernetes.io/managed-by": "agentlightning"}},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {"app.kubernetes.io/managed-by": "agentlightning"}},
            "spec": {"restartPolicy": "Never", "nodeSelector": {"pool": "cpu"}, "containers": [{
                "name": "rollout", "image": "jyangballin/swesmith.x86_64.pandas-dev_1776_pandas.95280573:openai",
                "imagePullPolicy": "IfNotPresent", "command": ["python", "-m", "agentlightning.runner"],
                "resources": {"requests": {"cpu": "2", "memory": "4Gi"}},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}],
                "dnsPolicy": "ClusterFirst", "schedulerName": "default-scheduler", "securityContext": {},
                "terminationGracePeriodSeconds": 30}}},
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"nothing listens on {port}")


def start(command: list[str], port: int) -> subprocess.Popen:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port)
    return process


def wrk_throughput(port: int, body: bytes, seconds: int, connections: int, work: Path) -> float:
    script = work / "post.lua"
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = {json.dumps(body.decode())}\n"
    )
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", str(script),
         f"https://127.0.0.1:{port}/validate?timeout=10s"],
        check=True, capture_output=True, text=True,
    ).stdout
    if re.search(r"Non-2xx", out):
        raise RuntimeError(f"errors under load:\n{out}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))


class _ApiserverLikeConnection(http.client.HTTPSConnection):
    """Dials 127.0.0.1 but sends SNI and verifies the service name, as the apiserver does."""

    def __init__(self, port: int, context: ssl.SSLContext) -> None:
        super().__init__(SERVER_NAME, port, context=context, timeout=10)
        self._context = context

    def connect(self) -> None:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self._context.wrap_socket(raw, server_hostname=SERVER_NAME)


def fixed_rate_latencies(port: int, body: bytes, ca: Path, rate: int, seconds: int, connections: int = 4) -> list[float]:
    context = ssl.create_default_context(cafile=str(ca))
    latencies: list[float] = []
    lock = threading.Lock()
    interval = connections / rate
    start_at = time.perf_counter() + 0.5

    def client(offset: float) -> None:
        conn = _ApiserverLikeConnection(port, context)
        mine = []
        n = 0
        while True:
            due = start_at + offset + n * interval
            if due > start_at + seconds:
                break
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            sent = time.perf_counter()
            conn.request("POST", "/validate?timeout=10s", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}")
            mine.append(time.perf_counter() - sent)
            n += 1
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=client, args=(i * interval / connections,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rate", type=int, default=200)
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    body = review_body()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ensure_certificates(work, CertRequest("image-preflight", "image-preflight"), datetime.now(timezone.utc))
        cert, key, ca = work / "tls.crt", work / "tls.key", work / "ca.crt"
        serve_port, bare_port = free_port(), free_port()
        serve = start([sys.executable, "-m", "image_preflight", "serve", "--tls-cert", str(cert), "--tls-key", str(key),
                       "--inventory", str(EXAMPLE_NODES), "--host", "127.0.0.1", "--port", str(serve_port),
                       "--metrics-port", "0", *EXTRA], serve_port)
        bare = start([sys.executable, str(ROOT / "benchmarks" / "canned_webhook.py"), "--port", str(bare_port),
                      "--tls-cert", str(cert), "--tls-key", str(key)], bare_port)
        try:
            # Alternate, so drift on a shared machine hits both alike.
            serve_rps, bare_rps = [], []
            for _ in range(2):
                bare_rps.append(wrk_throughput(bare_port, body, args.seconds, args.connections, work))
                serve_rps.append(wrk_throughput(serve_port, body, args.seconds, args.connections, work))
            latencies = sorted(fixed_rate_latencies(serve_port, body, ca, args.rate, args.seconds))
        finally:
            for process in (serve, bare):
                process.terminate()
                process.wait(timeout=30)
    s, b = statistics.mean(serve_rps), statistics.mean(bare_rps)
    p50 = latencies[len(latencies) // 2] * 1000
    p99 = latencies[int(len(latencies) * 0.99) - 1] * 1000
    print(f"bare uvicorn+TLS, canned review : {b:8.0f} req/s  (wrk -t1 -c{args.connections}, {args.seconds} s x 2)")
    print(f"image-preflight serve           : {s:8.0f} req/s")
    print(f"ratio                           : {s / b:8.2f}  (target >= 0.8)")
    print(f"at {args.rate} req/s for {args.seconds} s ({len(latencies)} requests, 4 keep-alive TLS connections):")
    print(f"  p50 {p50:.2f} ms   p99 {p99:.2f} ms  (target p99 <= 10 ms)")


if __name__ == "__main__":
    main()
