"""Every sink a ResourceWatcher feeds takes its relist as an iterable read once: the watcher hands
over a generator that pages through the list as it is consumed (image_preflight.kube.watch)."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable

import kubernetes.client

from image_preflight.core.watchdog.stalls import Stalls
from image_preflight.kube.needed_images import needed_images_watcher
from image_preflight.kube.node_images import RenewalSink, RuntimeSink
from image_preflight.kube.nodes import NodeSink
from image_preflight.kube.runtime_classes import RuntimeClassSink
from image_preflight.kube.watch import ResourceWatcher
from image_preflight.watchdog.metrics import Metrics
from image_preflight.watchdog.runner import Watchdog
from image_preflight.webhook.live_inventory import LiveInventory
from tests.builders.nodes import OBSERVED, PYTHON, kube_node, runtime
from tests.builders.stalls import NS, WEBHOOKS, failed_create, waiting_pod


def once(*items: dict):
    """A generator, as the watcher passes: it can be read only once and has no len()."""
    yield from items


def test_the_watcher_and_the_sink_protocols_say_an_iterable():
    replace = typing.get_type_hints(ResourceWatcher.__init__)["replace"]
    assert typing.get_origin(replace) is Callable and typing.get_args(replace)[0] == [Iterable[dict]]
    for protocol, method, parameter in ((NodeSink, "replace_nodes", "nodes"),
                                        (RuntimeSink, "replace_runtime_objects", "objects"),
                                        (RenewalSink, "replace_renewals", "leases"),
                                        (RuntimeClassSink, "replace_runtime_classes", "objects")):
        assert typing.get_type_hints(getattr(protocol, method))[parameter] == Iterable[dict], protocol


def test_the_live_inventory_reads_each_relist_from_a_generator():
    live = LiveInventory(max_images=-1)
    live.replace_nodes(once(kube_node("worker-1", [PYTHON]), kube_node("worker-2", [PYTHON])))
    assert sorted(n.node for n in live.current.nodes) == ["worker-1", "worker-2"]
    live.replace_runtime_objects(once(runtime("worker-1", observed_at=OBSERVED)))
    assert live.current.get("worker-1").source != live.current.get("worker-2").source
    live.replace_runtime_classes(once({"metadata": {"name": "gvisor"}, "handler": "runsc"}))
    assert set(live.current.runtime_classes) == {"gvisor"}


class _Actions:
    mode = "enforce"

    def handle(self, stall, waited_s):  # pragma: no cover - nothing falls due here
        raise AssertionError(stall)


def test_the_watchdog_reads_each_relist_from_a_generator():
    clock = [1000.0]
    dog = Watchdog(Stalls(15.0, webhooks=WEBHOOKS), _Actions(), Metrics(), clock=lambda: clock[0])
    dog.replace_namespaces(once({"metadata": {"name": NS}}))
    dog.replace_pods(once(waiting_pod()))
    dog.replace_events(once(failed_create()))
    dog.replace_sandbox_events(once())
    clock[0] += 15.0
    # The pod and the denied Job were both seen.
    assert sorted(stall.key for stall in dog.take_due()) == ["job/job-uid", "pod/pod-uid"]


def test_the_needed_images_watch_reads_its_relist_from_a_generator():
    seen = []
    watcher = needed_images_watcher(kubernetes.client.ApiClient(), "image-preflight/needed", seen.append)
    configmap = {"metadata": {"name": "needed", "namespace": "image-preflight"}, "data": {"images": "a:1\n"}}
    watcher._replace(once(configmap))
    watcher._replace(once())
    assert seen == [configmap, None]


def test_every_watch_is_made_one_way_named_and_not_started():
    """Each function that makes a watch returns ResourceWatchers with a name of their own, not started
    (whoever owns their lifetime starts them); the lists of large objects page by NODE_PAGE."""
    from image_preflight.kube.node_images import node_images_watcher
    from image_preflight.kube.nodes import node_watcher
    from image_preflight.kube.runtime_classes import runtime_class_watcher
    from image_preflight.kube.watch import NODE_PAGE, PAGE
    from image_preflight.watchdog.watches import watchers

    api = kubernetes.client.ApiClient()
    live = LiveInventory()
    dog = Watchdog(Stalls(15.0, webhooks=WEBHOOKS), _Actions(), Metrics())
    made = [node_watcher(api, live), node_images_watcher(api, live), runtime_class_watcher(api, live),
            needed_images_watcher(api, "image-preflight/needed", lambda _: None),
            *watchers(api, dog, namespace_selector="a=b", pods="status.phase=Pending", events="reason=x",
                      sandbox_events="reason=y")]
    assert all(isinstance(w, ResourceWatcher) and w._thread is None for w in made)
    names = [w._what for w in made]
    assert names == ["node", "nodeimages", "runtimeclass", "configmap", "namespace", "pod", "event", "sandbox-event"]
    assert [w._page_size for w in made] == [NODE_PAGE, NODE_PAGE] + [PAGE] * 6
    assert inspect.signature(ResourceWatcher).parameters["what"].default is inspect.Parameter.empty
