"""The watchdog's loop: watches feed the core's Stalls; what falls due is acted on, one JSON log
line per action. Watches call the sink methods from their threads; `run` acts from its own."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from image_preflight.core.objects import as_mapping, as_text
from image_preflight.core.watchdog.job_failure import Action, kubelet_reason
from image_preflight.core.watchdog.stalls import JOB, POD, REPORT, Stall, Stalls, event_key, pod_key
from image_preflight.kube.status import describe_error
from image_preflight.watchdog.actions import Actions
from image_preflight.watchdog.metrics import Metrics

log = logging.getLogger("image_preflight.watchdog")
RETRY_S = 5.0  # after an action failed for want of the apiserver
IDLE_WAKE_S = 1.0  # how often an idle loop looks at the stop flag


def _name(obj: Mapping) -> str:
    return as_text(as_mapping(obj.get("metadata")).get("name"))


class Watchdog:
    def __init__(self, stalls: Stalls, actions: Actions, metrics: Metrics, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stalls = stalls
        self._actions = actions
        self._metrics = metrics
        self._clock = clock
        self._changed = threading.Condition()
        self._namespaces: set[str] = set()
        metrics.track_pending(lambda: len(self._stalls))

    # -- namespaces that opted in ----------------------------------------------------------------

    def replace_namespaces(self, namespaces: Iterable[Mapping]) -> None:
        names = {_name(namespace) for namespace in namespaces}
        with self._changed:
            self._namespaces = names
            self._changed.notify()

    def upsert_namespace(self, namespace: Mapping) -> None:
        with self._changed:
            self._namespaces.add(_name(namespace))
            self._changed.notify()

    def delete_namespace(self, namespace: Mapping) -> None:
        with self._changed:
            self._namespaces.discard(_name(namespace))

    # -- Pods that are not yet terminal ----------------------------------------------------------

    def replace_pods(self, pods: Iterable[Mapping]) -> None:
        self._replace(POD, pods, pod_key, self.upsert_pod)

    def upsert_pod(self, pod: Mapping) -> None:
        with self._changed:
            self._stalls.see_pod(pod, self._clock())
            self._changed.notify()

    def delete_pod(self, pod: Mapping) -> None:
        with self._changed:
            self._stalls.forget_pod(pod)

    # -- the Job controller's FailedCreate and the kubelets' FailedCreatePodSandBox Events -------

    def replace_events(self, events: Iterable[Mapping]) -> None:
        """A relist of the FailedCreate watch."""
        self._replace(JOB, events, event_key, self.upsert_event)

    def replace_sandbox_events(self, events: Iterable[Mapping]) -> None:
        """A relist of the FailedCreatePodSandBox watch."""
        self._replace(REPORT, events, event_key, self.upsert_event)

    def upsert_event(self, event: Mapping) -> None:
        with self._changed:
            ignored = self._stalls.see_event(event, self._clock())
            self._changed.notify()
        if ignored is not None:
            self._metrics.acted(Action.IGNORED, as_text(event.get("reason")), 0.0)
            log.warning(json.dumps({"action": Action.IGNORED, "reason": as_text(event.get("reason")),
                                    "detail": f"untrusted: {ignored}"}))

    def delete_event(self, event: Mapping) -> None:
        with self._changed:
            self._stalls.forget_event(event)

    def _replace(self, prefix: str, items: Iterable[Mapping], key_of: Callable[[Mapping], str],
                 see: Callable[[Mapping], None]) -> None:
        """After a relist: see each object, then forget the keys of `prefix` the list no longer has."""
        keys = []
        for item in items:  # page by page, as the watch reads them
            keys.append(key_of(item))
            see(item)
        with self._changed:
            self._stalls.replace(prefix, keys)

    # -- acting ----------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Act on whatever falls due until `stop` is set (then call `wake`)."""
        while not stop.is_set():
            for stall in self.take_due(wait_s=IDLE_WAKE_S):
                if stop.is_set():
                    return
                self.act(stall)

    def wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def take_due(self, wait_s: float = 0.0) -> list[Stall]:
        """What is due now; with `wait_s`, wait up to that long (less when something falls due)."""
        with self._changed:
            now = self._clock()
            due = self._stalls.take_due(now, self._namespaces)
            if due or not wait_s:
                return due
            upcoming = self._stalls.next_due(self._namespaces)
            self._changed.wait(wait_s if upcoming is None else max(0.0, min(wait_s, upcoming - now)))
            return self._stalls.take_due(self._clock(), self._namespaces)

    def act(self, stall: Stall) -> None:
        waited = self._clock() - stall.since
        reason = kubelet_reason(stall)
        try:
            outcome = self._actions.handle(stall, waited)
        except Exception as exc:  # noqa: BLE001 - the apiserver unreachable: try again later
            with self._changed:
                self._stalls.retry(stall, self._clock() + RETRY_S)
            self._metrics.acted(Action.ERROR, reason, waited)
            log.warning(json.dumps({"action": Action.ERROR, "reason": reason, "namespace": stall.namespace,
                                    "job": stall.owner.name if stall.owner and stall.owner.is_job else "",
                                    "subject": stall.name,
                                    "error": describe_error(exc), "retry_in_s": RETRY_S}))
            return
        self._metrics.acted(outcome.action, reason, waited)
        line = {**outcome.record, "action": outcome.action, "mode": self._actions.mode, "namespace": stall.namespace,
                "job": stall.owner.name if stall.owner and stall.owner.is_job else ""}
        if outcome.detail:
            line["detail"] = outcome.detail
        log.info(json.dumps(line, sort_keys=True))
