"""The agent's loop: list the runtime's images every interval, and soon after each image event or
change of the needed list; pin what is due, and publish the list (agent/publisher.py)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from image_preflight.agent.cri import CRIError, ImageClient
from image_preflight.agent.events import ImageEvents
from image_preflight.agent.inventory import fingerprint, image_dicts, sandbox_image_report
from image_preflight.agent.metrics import Metrics
from image_preflight.agent.pinner import Pinner
from image_preflight.agent.publisher import Publisher, PublishError
from image_preflight.kube.status import describe_error

log = logging.getLogger(__name__)

# After an image event, list once no further event has come for QUIET_S (an import of many
# images sends many), but no later than COALESCE_MAX_S after the first.
QUIET_S = 0.2
COALESCE_MAX_S = 1.0
# containerd's CRI plugin learns of an image change from the same event, so one more list this
# long after an event-driven one catches what it had not taken in yet.
CONFIRM_AFTER_S = 1.0


class Agent:
    """List the runtime's images every `interval` seconds, and soon after each image event when
    `image_events` (containerd's events service on the same socket), and publish them."""

    def __init__(
        self,
        images: ImageClient,
        publisher: Publisher,
        *,
        interval: float,
        exit_after_failures: int = 3,
        image_events: bool = True,
        sandbox_image: str | None = None,
        pinner: Pinner | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.images = images
        self.publisher = publisher
        self.interval = interval
        self.exit_after_failures = exit_after_failures
        self.image_events = image_events
        self.clock = clock
        self.cri_failures = 0  # consecutive
        self.cycles = 0
        self.sandbox_image_fallback = sandbox_image  # for runtimes that do not name theirs (containerd 2.x)
        self.sandbox_image: str | None = None  # as the runtime last named it
        self._sandbox_present: bool | None = None  # None: not known yet
        self.pinner = pinner  # None: pinning is not enabled
        self.metrics = metrics or Metrics()
        self._wake = threading.Event()  # set by image events, the needed list and a stop signal
        self.events: ImageEvents | None = None

    def wake(self) -> None:
        """Run a cycle soon (after QUIET_S without another wake), not at the next interval."""
        self._wake.set()

    def cycle(self) -> bool:
        """One list and (if due) publish; False when the runtime could not be asked."""
        self.cycles += 1
        try:
            images = image_dicts(self.images.list_images())
        except CRIError as exc:
            # The object is left alone: it goes stale, which readers take as "unknown".
            self.cri_failures += 1
            self.metrics.cycles.labels("runtime_unavailable").inc()
            log.warning("%s (failure %d in a row; %s left as it is)", exc, self.cri_failures,
                        self.publisher.where)
            return False
        self.metrics.images.set(len(images))
        self.metrics.listed_at.set(self.clock())
        if self.cri_failures:
            log.info("CRI endpoint %s answers again", self.images.endpoint)
            self.cri_failures = 0
        digest = fingerprint(images)  # once a cycle, for the pinner and the publisher
        spec = {"sandboxImage": self._sandbox_report(images), "pinning": self._pin(images, digest)}
        try:
            reason = self.publisher.publish(images, now=self.clock(), digest=digest, spec=spec)
        except Exception as exc:  # noqa: BLE001 - refused (PublishError), or any connection error: retry next cycle
            self.metrics.cycles.labels("publish_failed").inc()
            said = str(exc) if isinstance(exc, PublishError) else f"{self.publisher.where}: {describe_error(exc)}"
            log.warning("%s; retrying in %g s", said, self.interval)
            return True
        self.metrics.cycles.labels("listed").inc()
        self.metrics.published_at.set(self.clock())
        if reason is not None:
            log.info("%s: written (%s, %d images)", self.publisher.where, reason, len(images))
        return True

    def _pin(self, images: list[dict], digest: str) -> dict | None:
        """spec.pinning after pinning what is due; the pins show in the next list, which the
        runtime's image events bring within about a second."""
        if self.pinner is None:
            return None
        if not self.pinner.runtime_known:
            try:
                self.pinner.runtime(self.images.version())
            except CRIError as exc:  # ListImages answered a moment ago: try again next cycle
                log.debug("%s; the runtime's version next cycle", exc)
        return self.pinner.apply(images, digest)

    def _sandbox_report(self, images: list[dict]) -> dict | None:
        """spec.sandboxImage for this list; a Status call costs well under a millisecond."""
        try:
            self.sandbox_image = self.images.sandbox_image()
        except CRIError as exc:  # ListImages answered a moment ago: keep the name last named
            log.debug("%s; keeping the sandbox image last named", exc)
        name = self.sandbox_image or self.sandbox_image_fallback
        if name is None:
            return None
        report = sandbox_image_report(name, images)
        if report["present"] != self._sandbox_present:
            if not report["present"]:
                log.warning("sandbox image %s is not on the runtime at %s: every pod sandbox needs it, so unless"
                            " the runtime can pull it, pods here wait in ContainerCreating (FailedCreatePodSandBox)",
                            name, self.images.endpoint)
            elif self._sandbox_present is not None:
                log.info("sandbox image %s is on the runtime again", name)
            self._sandbox_present = report["present"]
        return report

    def run(self, stop: threading.Event) -> bool:
        """Cycle until `stop` is set (then call `wake`: Signals.on_stop does), True; or until the
        runtime has failed `exit_after_failures` cycles in a row, False (0 never gives up)."""
        if self.image_events:
            self.events = ImageEvents(self.images.endpoint, self.wake, on_unavailable=self._events_unavailable)
            self.events.start()
        try:
            confirm = False
            while not stop.is_set():
                self.cycle()
                if self.exit_after_failures and self.cri_failures >= self.exit_after_failures:
                    return False
                # After an event-driven cycle, one more after CONFIRM_AFTER_S unless woken again.
                confirm = self._sleep(stop, CONFIRM_AFTER_S if confirm else self.interval)
        finally:
            if self.events is not None:
                self.events.close()
        return True

    def _sleep(self, stop: threading.Event, timeout: float) -> bool:
        """Until `timeout` passes (False) or a burst of wakes is over (True)."""
        if not self._wake.wait(timeout) or stop.is_set():
            return False
        deadline = time.monotonic() + COALESCE_MAX_S
        while True:
            self._wake.clear()  # cleared before the list: a wake during it runs another cycle
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._wake.wait(min(QUIET_S, remaining)):
                return True
            if stop.is_set():
                return False

    def _events_unavailable(self, reason: str) -> None:
        log.warning("image events unavailable: %s; listing every %g s", reason, self.interval)
