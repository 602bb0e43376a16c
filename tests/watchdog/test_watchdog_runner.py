"""The watchdog's loop (watchdog/runner.py) with its writes replaced: what it hands to the actions,
when, what it logs and counts, and that a failed write is tried again. The writes themselves are
proved against the real apiserver in tests/cluster/test_cluster_watchdog.py."""

from __future__ import annotations

import json
import logging
import threading

from image_preflight.core.watchdog.job_failure import FAILED, record
from image_preflight.core.watchdog.stalls import Stalls
from image_preflight.watchdog.actions import Handled
from image_preflight.watchdog.metrics import Metrics
from image_preflight.watchdog.runner import RETRY_S, Watchdog
from tests.builders.stalls import NS, WEBHOOKS, failed_create
from tests.builders.stalls import waiting_pod as pod


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    mode = "enforce"

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.handled: list[tuple[str, float]] = []

    def handle(self, stall, waited_s):
        if self.failures:
            self.failures -= 1
            raise ConnectionError("apiserver unreachable")
        self.handled.append((stall.key, waited_s))
        return Handled(FAILED, "", record(stall, FAILED, at="t", waited_s=waited_s))


def watchdog(actions: Recorder, clock: Clock, metrics: Metrics | None = None) -> Watchdog:
    dog = Watchdog(Stalls(15.0, webhooks=WEBHOOKS), actions, metrics or Metrics(), clock=clock)
    dog.replace_namespaces([{"metadata": {"name": NS}}])
    return dog


def _sample(metrics: Metrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_stuck_pod_is_acted_on_after_the_grace_and_logged_as_one_json_line(caplog):
    clock, actions, metrics = Clock(), Recorder(), Metrics()
    dog = watchdog(actions, clock, metrics)
    dog.replace_pods([pod()])
    assert dog.take_due() == []
    clock.now += 15.0
    with caplog.at_level(logging.INFO, logger="image_preflight.watchdog"):
        for stall in dog.take_due():
            dog.act(stall)
    assert actions.handled == [("pod/pod-uid", 15.0)]
    (line,) = [json.loads(r.getMessage()) for r in caplog.records]
    assert (line["action"], line["reason"], line["job"], line["node"]) == (
        "failed", "ErrImageNeverPull", "agl-rollout-1", "cpu-a")
    assert _sample(metrics, "image_preflight_watchdog_actions_total", action="failed", reason="ErrImageNeverPull") == 1
    assert _sample(metrics, "image_preflight_watchdog_action_delay_seconds_sum") == 15.0


def test_a_failed_write_is_tried_again_and_counted_as_an_error(caplog):
    clock, actions, metrics = Clock(), Recorder(failures=1), Metrics()
    dog = watchdog(actions, clock, metrics)
    dog.upsert_event(failed_create())
    with caplog.at_level(logging.INFO, logger="image_preflight.watchdog"):
        (stall,) = dog.take_due()
        dog.act(stall)
        assert dog.take_due() == []
        clock.now += RETRY_S
        (again,) = dog.take_due()
        dog.act(again)
    assert actions.handled == [("job/job-uid", RETRY_S)]
    error, done = [json.loads(r.getMessage()) for r in caplog.records]
    assert error["action"] == "error" and "apiserver unreachable" in error["error"] and done["action"] == "failed"
    assert _sample(metrics, "image_preflight_watchdog_actions_total", action="error", reason="FailedCreate") == 1


def test_a_pod_deleted_or_relisted_away_before_its_grace_is_never_acted_on():
    clock, actions = Clock(), Recorder()
    dog = watchdog(actions, clock)
    dog.upsert_pod(pod(uid="a"))
    dog.upsert_pod(pod(uid="b"))
    dog.delete_pod(pod(uid="a"))
    dog.replace_pods([])
    clock.now += 100
    assert dog.take_due() == []


def test_the_loop_wakes_when_a_namespace_opts_in_and_stops_when_asked():
    clock, actions = Clock(), Recorder()
    dog = Watchdog(Stalls(0.0, webhooks=WEBHOOKS), actions, Metrics(), clock=clock)
    stop = threading.Event()
    loop = threading.Thread(target=dog.run, args=(stop,))
    loop.start()
    try:
        dog.upsert_pod(pod())
        assert actions.handled == []
        dog.upsert_namespace({"metadata": {"name": NS}})
        for _ in range(100):
            if actions.handled:
                break
            threading.Event().wait(0.02)
        assert [key for key, _ in actions.handled] == ["pod/pod-uid"]
    finally:
        stop.set()
        dog.wake()
        loop.join(timeout=5)
    assert not loop.is_alive()


def test_a_pod_whose_node_lacks_its_sandbox_image_is_acted_on_after_the_grace_and_counted(caplog):
    from tests.builders.stalls import sandbox_event, unstarted

    clock, actions, metrics = Clock(), Recorder(), Metrics()
    dog = watchdog(actions, clock, metrics)
    dog.replace_pods([unstarted()])
    dog.replace_sandbox_events([sandbox_event()])
    dog.replace_events([])  # the FailedCreate watch's relist does not forget the kubelet's report
    clock.now += 14.9
    assert dog.take_due() == []
    clock.now += 0.1
    with caplog.at_level(logging.INFO, logger="image_preflight.watchdog"):
        for stall in dog.take_due():
            dog.act(stall)
    assert actions.handled == [("sandbox/pod-uid", 15.0)]
    (line,) = [json.loads(r.getMessage()) for r in caplog.records]
    assert (line["reason"], line["image"], line["node"], line["job"]) == (
        "FailedCreatePodSandBox", "registry.k8s.io/pause:3.10.1", "cpu-a", "agl-rollout-1")
    assert _sample(metrics, "image_preflight_watchdog_actions_total", action="failed",
                   reason="FailedCreatePodSandBox") == 1


def test_a_relist_of_the_sandbox_watch_without_the_report_forgets_it():
    from tests.builders.stalls import sandbox_event, unstarted

    clock, actions = Clock(), Recorder()
    dog = watchdog(actions, clock)
    dog.upsert_pod(unstarted())
    dog.upsert_event(sandbox_event())
    dog.replace_sandbox_events([])  # expired meanwhile (the Event's TTL)
    clock.now += 100
    assert dog.take_due() == []

