"""`image-preflight serve` as a process: its log is one shape of JSON line from start to SIGTERM,
the server's own lines and the decisions alike, and SIGTERM ends it with the last lines written."""

from __future__ import annotations

import datetime as dt
import json
import re
import signal
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

from image_preflight.certs.store import CertRequest, ensure_certificates

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "swe-smith"
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def test_every_line_of_serve_has_time_and_level_first_and_sigterm_ends_it_cleanly(tmp_path):
    ensure_certificates(tmp_path, CertRequest("gate", "jobs"), dt.datetime.now(dt.timezone.utc))
    server = subprocess.Popen(
        [sys.executable, "-m", "image_preflight", "serve", "--tls-cert", str(tmp_path / "tls.crt"),
         "--tls-key", str(tmp_path / "tls.key"), "--inventory", str(EXAMPLES / "nodes.json"), "--host", "127.0.0.1",
         "--port", "0", "--metrics-port", "0"],
        stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in server.stderr:  # the server says where it listens once it does
            lines.append(line)
            found = re.search(r"running on https://127\.0\.0\.1:(\d+)", line)
            if found:
                break
        assert found, "".join(lines)
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
        context.check_hostname = False
        request = urllib.request.Request(f"https://127.0.0.1:{found.group(1)}/validate",
                                         data=(EXAMPLES / "admission-review.json").read_bytes(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            assert json.loads(answer.read())["response"]["allowed"] is False
        server.send_signal(signal.SIGTERM)
        _, rest = server.communicate(timeout=60)
    finally:
        server.kill()
    assert server.returncode == 0, rest
    records = [json.loads(line) for line in [*lines, *rest.splitlines()]]
    assert all(list(record)[:2] == ["time", "level"] and TIME.fullmatch(record["time"]) for record in records), records
    (decision,) = [record for record in records if "decision" in record]
    assert (decision["level"], decision["decision"], decision["kind"]) == ("info", "deny", "Job")
    server_lines = [record for record in records if "decision" not in record]
    assert all(set(record) == {"time", "level", "logger", "message"} for record in server_lines), server_lines
    assert server_lines[-1]["message"] == f"Finished server process [{server.pid}]"
