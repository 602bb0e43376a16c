"""What the node watch's tests share, on the real control plane and on the in-process double: a
sink that records every call, and node watchers started in threads and stopped after the test."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

from kubernetes import client as k8s

from image_preflight.kube.nodes import node_watcher
from image_preflight.kube.watch import ResourceWatcher

DEADLINE = 10.0


def wait_until(condition: Callable[[], bool], what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.01)


class RecordingSink:
    """A dict view of the nodes plus a log of every call, for duplicate checks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.nodes: dict[str, dict] = {}
        self.calls: list[tuple[str, str, str | None]] = []  # (call, name, resourceVersion)
        self.fail_upserts = 0

    def replace_nodes(self, nodes: list[dict]) -> None:
        with self._lock:
            self.nodes = {n["metadata"]["name"]: n for n in nodes}
            self.calls.append(("replace", ",".join(sorted(self.nodes)), None))

    def upsert_node(self, node: dict) -> None:
        with self._lock:
            if self.fail_upserts:
                self.fail_upserts -= 1
                raise RuntimeError("sink refused the node")
            self.nodes[node["metadata"]["name"]] = node
            self.calls.append(("upsert", node["metadata"]["name"], node["metadata"]["resourceVersion"]))

    def delete_node(self, name: str) -> None:
        with self._lock:
            self.nodes.pop(name, None)
            self.calls.append(("delete", name, None))

    def versions(self) -> dict[str, str]:
        with self._lock:
            return {name: n["metadata"]["resourceVersion"] for name, n in self.nodes.items()}


@dataclass
class Running:
    watcher: ResourceWatcher
    sink: RecordingSink
    thread: threading.Thread
    restarts: list[str]


class Watchers:
    def __init__(self) -> None:
        self.started: list[ResourceWatcher] = []

    def start(self, api_client: k8s.ApiClient, **options) -> Running:
        restarts: list[str] = []
        sink = RecordingSink()
        options = {"backoff_initial": 0.01, "backoff_max": 0.1, "watch_timeout_seconds": 60, **options}
        watcher = node_watcher(api_client, sink, on_restart=restarts.append, **options)
        thread = watcher.start()
        self.started.append(watcher)
        return Running(watcher, sink, thread, restarts)

    def stop(self) -> None:
        for watcher in self.started:
            watcher.stop()
