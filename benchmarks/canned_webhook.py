"""The baseline for benchmarks/webhook_load.py: bare uvicorn (httptools, uvloop) + TLS answering a
canned review: the stack `serve` runs on, doing nothing else.

    python benchmarks/canned_webhook.py --port P --tls-cert F --tls-key F
"""

from __future__ import annotations

import argparse
import json

import uvicorn

CANNED = json.dumps(
    {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
     "response": {"uid": "0b2c1e5e-0000-4000-8000-000000000001", "allowed": True}}
).encode()


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:  # read the whole body, as any webhook must
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(CANNED)).encode())]})
    await send({"type": "http.response.body", "body": CANNED})


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tls-cert", required=True)
    parser.add_argument("--tls-key", required=True)
    args = parser.parse_args()
    uvicorn.run(app, host="127.0.0.1", port=args.port, http="httptools", loop="uvloop", log_level="warning",
                access_log=False, lifespan="off", ssl_certfile=args.tls_cert, ssl_keyfile=args.tls_key)
