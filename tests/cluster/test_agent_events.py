"""The agent lists on containerd's image events: a real containerd 1.6, the real control plane.

Every agent here lists only every 600 s, so a change published within seconds was published
because of an event.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest

from image_preflight.agent import cri_pb2, cri_pb2_grpc
from image_preflight.agent.cri import ImageClient
from image_preflight.agent.events import IMAGE_EVENTS_FILTER, ImageEvents
from image_preflight.agent.publisher import Publisher
from image_preflight.agent.runner import Agent
from image_preflight.cli import build_parser
from tests.agent_cluster import ALPHA, SWE, import_images, wait_listed, wait_until
from tests.containerd import build_oci_archive_many, import_image, remove
from tests.controlplane.network import relay

NEVER = 600.0  # --interval: no periodic list happens within a test
# A bound, not a measure: the agent lists 0.2 s after the last event; CI machines may be slow.
EVENT_DEADLINE_S = 3.0


@pytest.fixture
def agents(cluster) -> Iterator[Callable[..., tuple[Agent, threading.Event, threading.Thread]]]:
    """Starts Agents of the cluster's node in threads; stops and closes them at the end."""
    started: list[tuple[Agent, threading.Event, threading.Thread]] = []

    def start(endpoint: str, **options) -> tuple[Agent, threading.Event, threading.Thread]:
        options = {"interval": NEVER, "exit_after_failures": 0, **options}
        agent = Agent(ImageClient(endpoint, timeout=2.0), Publisher(cluster.api, cluster.node, lease_seconds=3600),
                      **options)
        stop = threading.Event()
        thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
        thread.start()
        started.append((agent, stop, thread))
        return agent, stop, thread

    yield start
    for agent, stop, thread in started:
        stop.set()
        agent.wake()
        thread.join(10)
        agent.images.close()


def settled(agent: Agent, quiet: float = 1.5) -> int:
    """The agent's cycle count once it has run none for `quiet` seconds (the start's lists are over)."""
    wait_until(lambda: agent.events is None or agent.events.subscriptions >= 1 or not agent.events.alive,
               "the agent subscribes")
    while True:
        cycles = agent.cycles
        time.sleep(quiet)
        if agent.cycles == cycles:
            return cycles


def within(seconds: float, condition: Callable[[], object], what: str) -> float:
    """How long until `condition` holds; fails after `seconds`."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > seconds:
            raise AssertionError(f"not within {seconds:g} s: {what}")
        time.sleep(0.01)
    return time.monotonic() - start


def test_an_imported_image_and_its_removal_are_published_within_seconds(containerd, tmp_path, cluster, agents):
    agent, _, _ = agents(containerd.endpoint)
    wait_until(cluster.stored, "the object is created")
    settled(agent)
    assert cluster.all_tags() == []

    archive = tmp_path / "alpha.tar"
    build_oci_archive_many(archive, [ALPHA])
    import_image(containerd.socket, archive)
    imported = within(EVENT_DEADLINE_S, lambda: ALPHA in cluster.all_tags(), "the imported image is published")
    remove(containerd.socket, ALPHA)
    removed = within(EVENT_DEADLINE_S, lambda: ALPHA not in cluster.all_tags(), "the removal is published")
    print(f"\nevent to publish: import {imported * 1000:.0f} ms, removal {removed * 1000:.0f} ms")
    assert cluster.writes() == ["create", "update", "update"]
    assert agent.events.received >= 2


def test_an_import_of_many_images_is_listed_a_few_times_not_once_per_event(containerd, tmp_path, cluster, agents):
    agent, _, _ = agents(containerd.endpoint)
    wait_until(cluster.stored, "the object is created")
    cycles = settled(agent)
    names = [f"docker.io/swebench/sweb.eval.x86_64.repo__{n:03d}:openai" for n in range(100)]
    archive = tmp_path / "many.tar"
    build_oci_archive_many(archive, names)
    import_image(containerd.socket, archive, unpack=False)
    within(EVENT_DEADLINE_S, lambda: len(cluster.all_tags()) == len(names), "every image is published")
    settled(agent)
    print(f"\n{len(names)} images imported: {agent.events.received} events, {agent.cycles - cycles} lists,"
          f" {len(cluster.writes()) - 1} writes")
    # Each image gives containerd events of its own, and CRI adds its own id reference.
    assert agent.events.received >= len(names)
    assert agent.cycles - cycles <= 6
    assert len(cluster.writes()) <= 4


def test_image_events_in_other_namespaces_do_not_wake_the_agent(containerd, tmp_path, cluster, agents):
    agent, _, _ = agents(containerd.endpoint)
    wait_until(cluster.stored, "the object is created")
    cycles = settled(agent)
    archive = tmp_path / "alpha.tar"
    build_oci_archive_many(archive, [ALPHA])
    subprocess.run(["ctr", "-a", containerd.socket, "-n", "default", "images", "import", str(archive)],
                   check=True, capture_output=True)
    assert settled(agent) == cycles and agent.events.received == 0

    import_image(containerd.socket, archive)  # namespace k8s.io, the one CRI serves
    within(EVENT_DEADLINE_S, lambda: agent.cycles > cycles, "the agent lists")


def test_without_image_events_only_the_interval_lists(containerd, tmp_path, cluster, agents):
    assert build_parser()[0].parse_args(["agent", "--publish", "--no-image-events"]).image_events is False
    agent, _, _ = agents(containerd.endpoint, image_events=False)
    wait_until(cluster.stored, "the object is created")
    import_images(containerd, tmp_path, [ALPHA])
    wait_listed(containerd, 1)
    time.sleep(EVENT_DEADLINE_S)
    assert agent.events is None and agent.cycles == 1
    assert cluster.all_tags() == []


def test_stop_ends_the_subscription_at_once(containerd, agents):
    agent, stop, thread = agents(containerd.endpoint)
    wait_until(lambda: agent.events is not None and agent.events.subscriptions == 1, "the agent subscribes")
    stop.set()
    agent.wake()  # as Signals.on_stop does on SIGTERM
    assert within(1.0, lambda: not thread.is_alive() and not agent.events.alive, "the agent and its stream end") < 1.0


def test_a_broken_stream_is_resubscribed_and_the_images_listed_once(containerd, tmp_path, cluster, agents, caplog):
    """The agent reaches containerd through a proxy that the test cuts: images imported meanwhile
    send events the agent cannot see; it lists them once subscribed again."""
    caplog.set_level(logging.INFO, logger="image_preflight.agent")
    with SocketProxy(containerd.socket) as proxy:
        agent, _, _ = agents(proxy.endpoint)
        wait_until(cluster.stored, "the object is created")
        cycles = settled(agent)

        proxy.cut()
        import_images(containerd, tmp_path, [ALPHA])
        wait_listed(containerd, 1)
        assert agent.cycles == cycles and ALPHA not in cluster.all_tags()
        proxy.restore()
        wait_until(lambda: ALPHA in cluster.all_tags(), "the images are listed once subscribed again")

        assert agent.events.subscriptions == 2
        import_images(containerd, tmp_path, [SWE])  # and the new stream delivers
        within(EVENT_DEADLINE_S, lambda: SWE in cluster.all_tags(), "an image imported after is published")
        messages = [r.getMessage() for r in caplog.records if r.name == "image_preflight.agent.events"]
    (broken,) = [m for m in messages if "stream broken" in m]  # once, not once per attempt
    assert broken.startswith(f"containerd events at {proxy.endpoint}: stream broken (UNAVAILABLE")
    assert len([m for m in messages if "subscribed again" in m]) == 1, messages


def test_a_runtime_without_the_events_service_is_listed_every_interval_and_says_so_once(tmp_path, cluster, agents,
                                                                                         caplog):
    caplog.set_level(logging.INFO, logger="image_preflight.agent")
    with CRIOnlyRuntime([ALPHA]) as runtime:
        agent, _, _ = agents(runtime.endpoint, interval=0.1)
        wait_until(lambda: agent.cycles >= 10, "ten cycles")
        assert agent.events is not None and not agent.events.alive and agent.events.subscriptions == 0
    assert cluster.all_tags() == [ALPHA]
    assert "sandboxImage" not in cluster.stored()["spec"]  # the runtime names none: unknown, not absent
    unavailable = [r.getMessage() for r in caplog.records if "image events unavailable" in r.getMessage()]
    assert unavailable == [
        f"image events unavailable: containerd events at {runtime.endpoint}:"
        " containerd.services.events.v1.Events/Subscribe not implemented (the runtime is not containerd);"
        " listing every 0.1 s"]


def test_a_runtime_that_names_no_sandbox_image_reports_the_one_given(cluster, agents):
    pause = "registry.k8s.io/pause:3.10"
    assert build_parser()[0].parse_args(["agent", "--publish", "--sandbox-image", pause]).sandbox_image == pause
    with CRIOnlyRuntime([ALPHA, pause]) as runtime:
        agents(runtime.endpoint, sandbox_image=pause)
        wait_until(cluster.stored, "the object is created")
    assert cluster.stored()["spec"]["sandboxImage"] == {"name": pause, "present": True}


def test_the_subscription_asks_containerd_for_image_events_of_the_cri_namespace_only():
    # containerd's filter syntax: selectors joined by a comma must all match.
    assert IMAGE_EVENTS_FILTER == 'topic~="^/images/",namespace=="k8s.io"'


def test_image_events_retry_with_backoff_while_the_socket_is_absent(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="image_preflight.agent.events")
    woken = threading.Event()
    with ImageEvents(str(tmp_path / "absent.sock"), woken.set, retry_initial=0.05, retry_max=0.2) as events:
        wait_until(lambda: sum("cannot subscribe" in r.getMessage() for r in caplog.records) >= 4, "four tries")
    assert not events.alive and not woken.is_set()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"containerd events at {tmp_path / 'absent.sock'}: cannot")


# -- helpers --------------------------------------------------------------------------------


class SocketProxy:
    """Forwards a unix socket of its own to `target`; `cut()` closes every connection and refuses
    new ones until `restore()`."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.dir = tempfile.mkdtemp(prefix="proxy-")  # short: AF_UNIX paths are limited
        self.path = os.path.join(self.dir, "proxy.sock")
        self.endpoint = "unix://" + self.path
        self._connections: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None

    def __enter__(self) -> SocketProxy:
        self.restore()
        return self

    def __exit__(self, *exc: object) -> None:
        self.cut()
        shutil.rmtree(self.dir, ignore_errors=True)

    def restore(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(self.path)
        listener.listen(16)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.shutdown(socket.SHUT_RDWR)
            listener.close()
            os.unlink(self.path)
        with self._lock:
            connections, self._connections = self._connections, []
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            connection.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(self.target)
            with self._lock:
                self._connections += [client, upstream]
            threading.Thread(target=relay, args=(client, upstream), daemon=True).start()


class CRIOnlyRuntime:
    """A CRI runtime that is not containerd, as CRI-O is: ListImages and nothing else, so the
    events service and RuntimeService/Status answer UNIMPLEMENTED."""

    def __init__(self, tags: list[str]) -> None:
        self.dir = tempfile.mkdtemp(prefix="cri-")
        self.endpoint = "unix://" + os.path.join(self.dir, "cri.sock")
        self._images = [cri_pb2.Image(id="sha256:" + f"{n:064x}", repo_tags=[tag], size=1000)
                        for n, tag in enumerate(tags, 1)]
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        images = self._images

        class Images(cri_pb2_grpc.ImageServiceServicer):
            def ListImages(self, request, context):
                return cri_pb2.ListImagesResponse(images=images)

        cri_pb2_grpc.add_ImageServiceServicer_to_server(Images(), self._server)
        self._server.add_insecure_port(self.endpoint)

    def __enter__(self) -> CRIOnlyRuntime:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(None)
        shutil.rmtree(self.dir, ignore_errors=True)
