"""Webhook throughput and latency over TLS with keep-alive, against a bare baseline.

    apt-get install wrk   # the load generator
    python benchmarks/webhook_load.py [--seconds 10] [--connections 16] [--rate 2000] [--slow 200] [--fastapi]

Measured in the same run, alternating so that drift on a shared machine hits both alike:
- throughput (wrk, keep-alive, POST of a realistic Job review: 40 env vars, an image the node
  holds) of `image-preflight serve` against a bare endpoint on the same stack (uvicorn with
  httptools and uvloop, the same TLS certificate) answering a canned AdmissionReview
  (benchmarks/canned_webhook.py): target >= 0.5x. Twice: on the example's one-node inventory,
  and on five nodes holding 1,253 images (three CPU nodes, two tainted GPU nodes; every list
  complete, `--max-images -1`) with the review carrying a nodeSelector and a toleration;
- p50/p99 at a paced `--rate` (wrk's per-request delay over 8 connections): target p99 <= 2 ms;
- the same paced p99 while `--slow` clients trickle request headers a byte a second: target no
  more than 2 ms above the p99 without them;
- with `--fastapi`, the example's throughput again with the admission paths routed through
  FastAPI (benchmarks/serve_through_fastapi.py), as webhook/app.py would without its dispatch.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from image_preflight.certs.store import CertRequest, ensure_certificates

ROOT = Path(__file__).resolve().parents[1]

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


HELD = "jyangballin/swesmith.x86_64.pandas-dev_1776_pandas.95280573:openai"


def multi_node_inventory(path: Path) -> int:
    """Five nodes, 250 other images each; the three CPU nodes hold HELD too, the two GPU nodes are
    tainted. Returns the number of images listed."""
    items = []
    for n in range(5):
        gpu = n >= 3
        images = [{"names": [f"docker.io/jyangballin/swesmith.x86_64.repo{n}_{i}.{i:08x}:openai"],
                   "sizeBytes": 1_000_000_000} for i in range(250)]
        if not gpu:
            images.append({"names": [f"docker.io/{HELD}"], "sizeBytes": 1_000_000_000})
        items.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": f"node-{n}", "labels": {"pool": "gpu" if gpu else "cpu",
                                                        "kubernetes.io/hostname": f"node-{n}"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}] if gpu else []},
            "status": {"images": images, "conditions": [{"type": "Ready", "status": "True"}]},
        })
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return sum(len(item["status"]["images"]) for item in items)


def scheduled_review_body() -> bytes:
    """review_body() with the rollout pinned to the CPU pool, tolerating the GPU taint."""
    review = json.loads(review_body())
    spec = review["request"]["object"]["spec"]["template"]["spec"]
    spec["nodeSelector"] = {"pool": "cpu"}
    spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return json.dumps(review).encode()


def yaml_free_job() -> dict:
    """A rollout Job as the apiserver sends it: agent-lightning's template with 40 env vars, its
    image held by the example's CPU node."""
    env = [{"name": f"SMITH_SETTING_{i}", "value": f"value-{i}-" + "x" * 40} for i in range(40)]
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "agl-rollout-1", "namespace": "rl", "labels": {
            "app.kubernetes.io/managed-by": "agentlightning", "agentlightning/rollout-id": "1"}},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {"app": "agl-rollout"}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "agent", "image": HELD,
                "imagePullPolicy": "IfNotPresent", "command": ["bash", "-lc", "python /agl/agents/smith_agent.py"],
                "env": env, "resources": {"requests": {"cpu": "50m", "memory": "1Gi"}},
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


def _wrk(port: int, body: bytes, seconds: int, connections: int, work: Path, delay_ms: float | None = None) -> str:
    script = work / "post.lua"
    text = ('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
            f"wrk.body = {json.dumps(body.decode())}\n")
    if delay_ms is not None:  # paced: each connection waits this long before its next request
        text += f"function delay() return {delay_ms} end\n"
    script.write_text(text)
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s", str(script),
         f"https://127.0.0.1:{port}/validate?timeout=10s"],
        check=True, capture_output=True, text=True,
    ).stdout
    if re.search(r"Non-2xx|Socket errors", out):
        raise RuntimeError(f"errors under load:\n{out}")
    return out


def wrk_throughput(port: int, body: bytes, seconds: int, connections: int, work: Path) -> float:
    return float(re.search(r"Requests/sec:\s+([\d.]+)", _wrk(port, body, seconds, connections, work)).group(1))


def _ms(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", text).groups()
    return float(number) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]


def wrk_paced(port: int, body: bytes, seconds: int, rate: int, work: Path, connections: int = 8
              ) -> tuple[float, float, float]:
    """(requests/s achieved, p50 ms, p99 ms) at `rate` spread over `connections`. wrk waits its
    delay after each answer, so a short run first measures the time an answer adds."""
    delay = 1000 * connections / rate
    calibration = _wrk(port, body, 2, connections, work, delay_ms=delay)
    achieved = float(re.search(r"Requests/sec:\s+([\d.]+)", calibration).group(1))
    delay = max(0.0, 2 * delay - 1000 * connections / achieved)
    out = _wrk(port, body, seconds, connections, work, delay_ms=delay)
    p50 = _ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))
    p99 = _ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)), p50, p99


class SlowClients:
    """`count` TLS connections that send a request's headers a byte a second, in a process of
    their own (benchmarks/slow_clients.py), as an attacker holding connections open would."""

    def __init__(self, port: int, count: int) -> None:
        self.process = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "slow_clients.py"),
                                         "--port", str(port), "--count", str(count)],
                                        stdout=subprocess.PIPE, text=True)
        self.process.stdout.readline()  # "connected": all of them are open

    def stop(self) -> str:
        self.process.terminate()
        out, _ = self.process.communicate(timeout=30)
        return out.strip()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--slow", type=int, default=200)
    parser.add_argument("--fastapi", action="store_true", help="also serve /validate through FastAPI's router")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    body, scheduled = review_body(), scheduled_review_body()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ensure_certificates(work, CertRequest("image-preflight", "image-preflight"), datetime.now(timezone.utc))
        cert, key = work / "tls.crt", work / "tls.key"
        images = multi_node_inventory(work / "nodes.json")
        serve_port, multi_port, bare_port, fastapi_port = free_port(), free_port(), free_port(), free_port()
        serve_command = [sys.executable, "-m", "image_preflight", "serve", "--tls-cert", str(cert),
                         "--tls-key", str(key), "--host", "127.0.0.1", "--metrics-port", "0", *EXTRA]
        serve = start([*serve_command, "--inventory", str(EXAMPLE_NODES), "--port", str(serve_port)], serve_port)
        multi = start([*serve_command, "--inventory", str(work / "nodes.json"), "--max-images", "-1",
                       "--port", str(multi_port)], multi_port)
        bare = start([sys.executable, str(ROOT / "benchmarks" / "canned_webhook.py"), "--port", str(bare_port),
                      "--tls-cert", str(cert), "--tls-key", str(key)], bare_port)
        through = [start([sys.executable, str(ROOT / "benchmarks" / "serve_through_fastapi.py"), *serve_command[3:],
                          "--inventory", str(EXAMPLE_NODES), "--port", str(fastapi_port)], fastapi_port)
                   ] if args.fastapi else []
        try:
            serve_rps, multi_rps, bare_rps, fastapi_rps, paced, paced_slow, slow_notes = [], [], [], [], [], [], []
            for _ in range(2):
                bare_rps.append(wrk_throughput(bare_port, body, args.seconds, args.connections, work))
                serve_rps.append(wrk_throughput(serve_port, body, args.seconds, args.connections, work))
                multi_rps.append(wrk_throughput(multi_port, scheduled, args.seconds, args.connections, work))
                if through:
                    fastapi_rps.append(wrk_throughput(fastapi_port, body, args.seconds, args.connections, work))
                paced.append(wrk_paced(serve_port, body, args.seconds, args.rate, work))
                slow = SlowClients(serve_port, args.slow)
                try:
                    paced_slow.append(wrk_paced(serve_port, body, args.seconds, args.rate, work))
                finally:
                    slow_notes.append(slow.stop())
        finally:
            for process in (serve, multi, bare, *through):
                process.terminate()
                process.wait(timeout=30)
    s, m, b = statistics.mean(serve_rps), statistics.mean(multi_rps), statistics.mean(bare_rps)
    p99 = max(p[2] for p in paced)
    p99_slow = max(p[2] for p in paced_slow)
    print(f"body: {len(body)} bytes (a Job with 40 env vars; the image held)")
    print(f"bare httptools+uvloop+TLS, canned : {b:8.0f} req/s  (wrk -t1 -c{args.connections}, {args.seconds} s x 2)")
    print(f"image-preflight serve, example    : {s:8.0f} req/s  ratio {s / b:.2f}  (target >= 0.5)")
    print(f"{f'serve, 5 nodes, {images:,} images':34s}: {m:8.0f} req/s  ratio {m / b:.2f}  (target >= 0.5; "
          "nodeSelector and toleration in the review)")
    if fastapi_rps:
        f = statistics.mean(fastapi_rps)
        print(f"{'serve, example, through FastAPI':34s}: {f:8.0f} req/s  ratio {f / b:.2f}")
    for label, runs in (("paced", paced), (f"paced, {args.slow} slow clients", paced_slow)):
        for rate, p50, p99_run in runs:
            print(f"{label:32s}: {rate:6.0f} req/s  p50 {p50:.2f} ms  p99 {p99_run:.2f} ms")
    print(f"paced p99, worse of 2             : {p99:.2f} ms  (target <= 2 ms)")
    print(f"slow clients add to the p99       : {p99_slow - p99:+.2f} ms  (target <= 2 ms)  [{'; '.join(slow_notes)}]")

if __name__ == "__main__":
    main()
