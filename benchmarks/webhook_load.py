"""Webhook throughput and latency over TLS with keep-alive, against a bare baseline.

    apt-get install wrk   # the load generator
    python benchmarks/webhook_load.py [--seconds 10] [--connections 16] [--rate 2000] [--slow 200]

Measured in the same run, alternating so that drift on a shared machine hits both alike:
- throughput (wrk, keep-alive, POST of a realistic Job review: 40 env vars, an image the node
  holds) of `image-preflight serve` against a bare endpoint on the same stack (uvicorn with
  httptools and uvloop, the same TLS certificate) answering a canned AdmissionReview
  (benchmarks/canned_webhook.py): target >= 0.5x;
- p50/p99 at a paced `--rate` (wrk's per-request delay over 8 connections): target p99 <= 2 ms;
- the same paced p99 while `--slow` clients trickle request headers a byte a second: target no
  more than 2 ms above the p99 without them.
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
                "name": "agent", "image": "jyangballin/swesmith.x86_64.pandas-dev_1776_pandas.95280573:openai",
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
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    body = review_body()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ensure_certificates(work, CertRequest("image-preflight", "image-preflight"), datetime.now(timezone.utc))
        cert, key = work / "tls.crt", work / "tls.key"
        serve_port, bare_port = free_port(), free_port()
        serve = start([sys.executable, "-m", "image_preflight", "serve", "--tls-cert", str(cert), "--tls-key", str(key),
                       "--inventory", str(EXAMPLE_NODES), "--host", "127.0.0.1", "--port", str(serve_port),
                       "--metrics-port", "0", *EXTRA], serve_port)
        bare = start([sys.executable, str(ROOT / "benchmarks" / "canned_webhook.py"), "--port", str(bare_port),
                      "--tls-cert", str(cert), "--tls-key", str(key)], bare_port)
        try:
            serve_rps, bare_rps, paced, paced_slow, slow_notes = [], [], [], [], []
            for _ in range(2):
                bare_rps.append(wrk_throughput(bare_port, body, args.seconds, args.connections, work))
                serve_rps.append(wrk_throughput(serve_port, body, args.seconds, args.connections, work))
                paced.append(wrk_paced(serve_port, body, args.seconds, args.rate, work))
                slow = SlowClients(serve_port, args.slow)
                try:
                    paced_slow.append(wrk_paced(serve_port, body, args.seconds, args.rate, work))
                finally:
                    slow_notes.append(slow.stop())
        finally:
            for process in (serve, bare):
                process.terminate()
                process.wait(timeout=30)
    s, b = statistics.mean(serve_rps), statistics.mean(bare_rps)
    p99 = max(p[2] for p in paced)
    p99_slow = max(p[2] for p in paced_slow)
    print(f"body: {len(body)} bytes (a Job with 40 env vars; the image held)")
    print(f"bare httptools+uvloop+TLS, canned : {b:8.0f} req/s  (wrk -t1 -c{args.connections}, {args.seconds} s x 2)")
    print(f"image-preflight serve             : {s:8.0f} req/s")
    print(f"ratio                             : {s / b:8.2f}  (target >= 0.5)")
    for label, runs in (("paced", paced), (f"paced, {args.slow} slow clients", paced_slow)):
        for rate, p50, p99_run in runs:
            print(f"{label:32s}: {rate:6.0f} req/s  p50 {p50:.2f} ms  p99 {p99_run:.2f} ms")
    print(f"paced p99, worse of 2             : {p99:.2f} ms  (target <= 2 ms)")
    print(f"slow clients add to the p99       : {p99_slow - p99:+.2f} ms  (target <= 2 ms)  [{'; '.join(slow_notes)}]")


if __name__ == "__main__":
    main()
