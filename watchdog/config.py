"""`image-preflight watchdog`'s flags and the frozen config they map onto; the runner is command.run."""

from __future__ import annotations

from dataclasses import dataclass

from image_preflight.commands import add_command, log_level_flag, metrics_port_flag
from image_preflight.core.watchdog.job_failure import MODES, Mode
from image_preflight.flags import ADDRESS, NAME, SECONDS, SELECTOR, Flags, flag, flags_of
from image_preflight.kube.client import ClusterFlags

# The kubelet retries a failed container start 10-15 s later (pkg/kubelet/kubelet.go backOffPeriod
# 10 s, pod_workers.go workerBackOffPeriodJitterFactor 0.5): 15 s lets that one retry show an image
# that arrived meanwhile. Any longer only lengthens every real failure (docs/deploy.md).
DEFAULT_GRACE_S = 15.0
ENFORCE_LABEL = "image-preflight.io/enforce=true"  # the webhook's namespaceSelector
WEBHOOK = "validate.image-preflight.io"  # the chart's ValidatingWebhookConfiguration


def register(subparsers, epilog: str | None = None) -> None:
    add_command(
        subparsers, "watchdog", WatchdogConfig, "image_preflight.watchdog.command",
        epilog=epilog,
        help="fail a Job whose Pod cannot get its node-local image",
        description="Watch Pods in the opted-in namespaces; when a Job's Pod waits for an image its node "
        "will not get (ErrImageNeverPull, InvalidImageName, or a failed pull of an IfNotPresent image), or "
        "cannot start because its node's runtime lacks its sandbox image (FailedCreatePodSandBox), for longer "
        "than the grace, or the webhook denied its Pod, fail the Job at once.",
    )


@dataclass(frozen=True)
class WatchdogConfig(Flags):
    cluster: ClusterFlags = flags_of(ClusterFlags)
    grace: float = flag(DEFAULT_GRACE_S, kind=SECONDS,
                        help="how long a container must wait before its Job is failed; the default lets the "
                        "kubelet retry once")
    mode: Mode = flag(Mode.ENFORCE, choices=MODES, help="enforce fails the Job; audit only records (annotation, "
                      "Event, log)")
    include_always: bool = flag(False, help="also act on failed pulls of imagePullPolicy Always images")
    namespace_selector: str = flag(ENFORCE_LABEL, kind=SELECTOR,
                                   help="the namespaces watched (the webhook's opt-in label)")
    webhook_names: frozenset[str] = flag(frozenset((WEBHOOK,)), kind=NAME, name="--webhook-name", repeat=True,
                                         collect=frozenset,
                                         help="whose denials in FailedCreate events fail the Job (repeatable)")
    write_policy: str | None = flag(None, kind=NAME, unset="not checked",
                                    help="start only while the ValidatingAdmissionPolicy of this name and the "
                                    "binding of the same name (validationActions Deny) exist: the chart's keeps the "
                                    "watchdog's cluster-wide Job patch and Pod create to the checked namespaces and "
                                    "to what it changes")
    metrics_port: int = metrics_port_flag()
    host: str = flag("0.0.0.0", kind=ADDRESS, help="where /metrics listens")
    log_level: str = log_level_flag()
