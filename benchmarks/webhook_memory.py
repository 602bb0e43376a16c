"""Memory under reviews that each name a distinct huge image, and the cost of a huge denial.

    python benchmarks/webhook_memory.py [--reviews 10000] [--image-mib 1] [--images 16000]

- `image-preflight serve` answers `--reviews` Pod reviews over one keep-alive TLS connection, each
  naming a distinct image of `--image-mib` MiB; its resident memory is read from /proc before and
  after: target growth <= 64 MiB (the caches are bounded by bytes, not only by entries).
- the denial text for a Pod with `--images` missing images, built by
  image_preflight.core.admission.messages.denial_message: target <= 50 ms, against json.dumps of the same
  verdicts' images in the same run as a yardstick of linear work.
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.figures import rss_mib
from benchmarks.webhook_load import EXAMPLE_NODES, SERVER_NAME, free_port, wait_for_port
from image_preflight.certs.store import CertRequest, ensure_certificates
from image_preflight.core.admission.messages import denial_message
from image_preflight.core.decide.decision import MISSING, Decision, ImageVerdict
from image_preflight.core.decide.workloads import ContainerImage


def pod_review(uid: int, image: str) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": f"uid-{uid}", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
        "namespace": "rl", "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{uid}"},
                                      "spec": {"containers": [{"name": "a", "image": image,
                                                               "imagePullPolicy": "IfNotPresent"}]}}}}).encode()


def post_all(port: int, ca: Path, count: int, image_bytes: int) -> None:
    context = ssl.create_default_context(cafile=str(ca))
    with context.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname=SERVER_NAME) as sock:
        reader = sock.makefile("rb")
        for n in range(count):
            prefix = f"reg.example/{n:08d}/"
            body = pod_review(n, prefix + "a" * (image_bytes - len(prefix) - 4) + ":v1")
            sock.sendall(b"POST /validate?timeout=10s HTTP/1.1\r\nHost: " + SERVER_NAME.encode() +
                         b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() +
                         b"\r\n\r\n" + body)
            length = 0
            while (line := reader.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
                status = line if line.startswith(b"HTTP/") else None
                if status and b" 200 " not in status:
                    raise RuntimeError(status.decode())
            reader.read(length)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reviews", type=int, default=10_000)
    parser.add_argument("--image-mib", type=float, default=1.0)
    parser.add_argument("--images", type=int, default=16_000)
    args = parser.parse_args()

    verdicts = tuple(ImageVerdict(ContainerImage(f"c{i}", "containers", f"reg.example/swe/img-{i}:openai",
                                                 "IfNotPresent"), MISSING, missing_on=("cpu-1", "cpu-2"))
                     for i in range(args.images))
    decision = Decision("deny", verdicts, ("cpu-1", "cpu-2"))
    started = time.perf_counter()
    message = denial_message(decision)
    denial_ms = (time.perf_counter() - started) * 1000
    started = time.perf_counter()
    json.dumps([v.image.image for v in verdicts])
    yardstick_ms = (time.perf_counter() - started) * 1000

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ensure_certificates(work, CertRequest("image-preflight", "image-preflight"), datetime.now(timezone.utc))
        port = free_port()
        serve = subprocess.Popen([sys.executable, "-m", "image_preflight", "serve", "--tls-cert", str(work / "tls.crt"),
                                  "--tls-key", str(work / "tls.key"), "--inventory", str(EXAMPLE_NODES),
                                  "--host", "127.0.0.1", "--port", str(port), "--metrics-port", "0"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for_port(port)
            post_all(port, work / "ca.crt", 100, int(args.image_mib * 1024 * 1024))  # warm up the allocator
            before = rss_mib(serve.pid)
            started = time.perf_counter()
            post_all(port, work / "ca.crt", args.reviews, int(args.image_mib * 1024 * 1024))
            seconds = time.perf_counter() - started
            after = rss_mib(serve.pid)
        finally:
            serve.terminate()
            serve.wait(timeout=30)
    print(f"denial text for {args.images} missing images: {denial_ms:.1f} ms ({len(message.encode())} bytes; "
          f"json.dumps of their names {yardstick_ms:.1f} ms)  (target <= 50 ms)")
    print(f"{args.reviews} reviews, each a distinct {args.image_mib:g} MiB image, in {seconds:.0f} s: "
          f"RSS {before:.0f} -> {after:.0f} MiB, growth {after - before:+.1f} MiB  (target <= 64 MiB)")


if __name__ == "__main__":
    main()
