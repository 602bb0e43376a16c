"""`image-preflight serve` with /validate and /mutate routed through FastAPI's middleware and
router instead of straight to their endpoint, for benchmarks/webhook_load.py --fastapi: the
figure behind webhook/app.py's admission-first dispatch.

    python benchmarks/serve_through_fastapi.py serve --tls-cert ... (serve's own arguments)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import image_preflight.webhook.command as command
from image_preflight.cli import main
from image_preflight.webhook.app import create_app

# The FastAPI app create_app builds holds every route, the admission paths among them.
command.create_app = lambda state: create_app(state).fastapi

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
