"""The registry every image reference resolves to on the real node: 404 for everything.

Run inside the node's network namespace (`nsenter --net=...`), on its loopback, so that the
runtime's pulls of an absent image fail as a registry that lacks it fails them, and never leave
the namespace. Each request is one line in the log, so a test can show what was asked.

    python -m tests.node.stub_registry PORT_FILE LOG_FILE
"""

from __future__ import annotations

import http.server
import os
import sys


def main(port_file: str, log_file: str) -> None:
    log = open(log_file, "a", buffering=1, encoding="utf-8")

    class NotFound(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            log.write(f"{self.command} {self.headers.get('Host', '')} {self.path}\n")
            body = b'{"errors":[{"code":"NAME_UNKNOWN","message":"repository name not known to registry"}]}'
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_HEAD = do_POST = do_PUT = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    with open(port_file + ".tmp", "w", encoding="utf-8") as out:
        out.write(str(server.server_address[1]))
    os.replace(port_file + ".tmp", port_file)
    server.serve_forever()


if __name__ == "__main__":
    main(*sys.argv[1:3])
