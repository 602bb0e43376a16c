"""What the doctor reads: from the apiserver as the caller, and the webhook's TLS handshake."""

from __future__ import annotations

import socket
import ssl

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from image_preflight.core.doctor.findings import WEBHOOK_NAME, WebhookTarget
from image_preflight.core.image_gc.pinning import NEEDED_CONFIGMAP, NEEDED_NAME, NEEDED_NAMESPACE
from image_preflight.kube import write_policies
from image_preflight.kube.client import json_body
from image_preflight.kube.cluster_inventory import KubeletUnread, Unreadable, kubelet_reads, list_all
from image_preflight.kube.status import describe_error, status_message

_TIMEOUT = (5.0, 30.0)
_SUMMARY_TIMEOUT = (3.0, 15.0)  # the kubelet answers from cached stats; a silent one must not hold the doctor
# An image reference no webhook decision can allow (a repository must be lower case).
PROBE_IMAGE = "image-preflight-doctor/Probe:invalid"


def _list(call, what: str) -> list[dict]:
    return list_all(call, what)  # Unreadable (NotServed among them), naming the cause


def webhook_configurations(api: kubernetes.client.ApiClient) -> list[dict]:
    return _list(kubernetes.client.AdmissionregistrationV1Api(api).list_validating_webhook_configuration,
                 "validatingwebhookconfigurations")


def namespaces(api: kubernetes.client.ApiClient) -> list[dict]:
    return _list(kubernetes.client.CoreV1Api(api).list_namespace, "namespaces")


def ready_endpoints(api: kubernetes.client.ApiClient, target: WebhookTarget) -> int | None:
    """Ready addresses in the Service's EndpointSlices; None when they cannot be read."""
    try:
        slices = _list(
            lambda **q: kubernetes.client.DiscoveryV1Api(api).list_namespaced_endpoint_slice(
                target.namespace, label_selector=f"kubernetes.io/service-name={target.service}", **q),
            "endpointslices")
    except Unreadable:
        return None
    # discovery.k8s.io/v1: a nil `ready` means ready.
    return sum(len(e.get("addresses") or ()) for s in slices for e in s.get("endpoints") or ()
               if (e.get("conditions") or {}).get("ready") is not False)


def replicas(api: kubernetes.client.ApiClient, target: WebhookTarget) -> tuple[int, int] | None:
    """The Deployment named as the Service (the chart names both image-preflight): (ready, desired)."""
    try:
        found = kubernetes.client.AppsV1Api(api).read_namespaced_deployment(
            target.service, target.namespace, _request_timeout=_TIMEOUT)
    except Exception:  # noqa: BLE001 - absent, forbidden or unreachable: the endpoints say enough
        return None
    ready = found.status.ready_replicas if found.status is not None else None
    return (ready or 0, found.spec.replicas if found.spec.replicas is not None else 1)


def replica_pods(api: kubernetes.client.ApiClient, target: WebhookTarget) -> list[dict]:
    """The Pods the chart labels as the webhook's; none when they cannot be read."""
    try:
        return _list(lambda **q: kubernetes.client.CoreV1Api(api).list_namespaced_pod(
            target.namespace, label_selector=f"app.kubernetes.io/name={target.service}", **q), "pods")
    except Unreadable:
        return []


def served_certificate(target: WebhookTarget, address: str | None, timeout: float = 5.0
                       ) -> tuple[tuple[str, str], float | None]:
    """A TLS handshake as the apiserver makes it: the caBundle as the only trust, the Service's
    DNS name as SNI and as the name to verify (a Go client ignores the common name).
    `address` HOST:PORT, default the Service's DNS name, which resolves inside the cluster."""
    where = address or f"{target.server_name}:{target.port}"
    host, _, port = where.rpartition(":")
    try:
        context = ssl.create_default_context(cadata=target.ca_bundle.decode("ascii", "replace"))
    except (ssl.SSLError, ValueError) as exc:
        return ("rejected", f"the caBundle is not a PEM certificate ({exc})"), None
    context.hostname_checks_common_name = False
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as raw:
            with context.wrap_socket(raw, server_hostname=target.server_name) as tls:
                certificate = tls.getpeercert()
    except ssl.SSLCertVerificationError as exc:
        return ("rejected", exc.verify_message or str(exc)), None
    except ssl.SSLError as exc:
        return ("rejected", exc.reason or str(exc)), None
    except (OSError, ValueError) as exc:
        return ("unreachable", f"{where}: {getattr(exc, 'strerror', None) or exc}"), None
    not_after = certificate.get("notAfter") if certificate else None
    return ("verified", where), (ssl.cert_time_to_seconds(not_after) if isinstance(not_after, str) else None)


def probe(api: kubernetes.client.ApiClient, namespace: str) -> tuple[str, str]:
    """Create, as a dry run, a rollout Job shaped as agent-lightning's whose image the webhook
    must deny; what came back."""
    job = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"generateName": "image-preflight-doctor-",
                     "labels": {"app.kubernetes.io/managed-by": "agentlightning"}},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {"app": "agl-rollout"}},
            "spec": {"restartPolicy": "Never",
                     "containers": [{"name": "agent", "image": PROBE_IMAGE, "imagePullPolicy": "IfNotPresent"}]}}},
    }
    try:
        _, _, headers = kubernetes.client.BatchV1Api(api).create_namespaced_job_with_http_info(
            namespace, job, dry_run="All", _request_timeout=_TIMEOUT)  # type: ignore[arg-type]  # a dict body is sent as it is
    except ApiException as exc:
        message = status_message(exc)
        if exc.status == 422 and WEBHOOK_NAME in message:
            return "denied", message
        return "error", f"creating a dry-run Job: {describe_error(exc)}"
    except Exception as exc:  # noqa: BLE001 - connection errors come in many types
        return "error", f"creating a dry-run Job: {describe_error(exc)}"
    warning = (headers or {}).get("Warning", "")
    return ("warned", warning) if "image-preflight" in warning else ("admitted", "")


def needed_list(api: kubernetes.client.ApiClient) -> dict | None:
    """The needed-images ConfigMap's `data`; None when it does not exist."""
    try:
        body = json_body(kubernetes.client.CoreV1Api(api).read_namespaced_config_map(
            NEEDED_NAME, NEEDED_NAMESPACE, _preload_content=False, _request_timeout=_TIMEOUT))
    except ApiException as exc:
        if exc.status == 404:
            return None
        why = (f"HTTP 403; reading it needs get on configmaps in namespace {NEEDED_NAMESPACE}" if exc.status == 403
               else describe_error(exc))
        raise Unreadable(f"configmap {NEEDED_CONFIGMAP}: {why}") from None
    except Exception as exc:  # noqa: BLE001 - connection errors come in many types
        raise Unreadable(f"configmap {NEEDED_CONFIGMAP}: {describe_error(exc)}") from None
    return (body.get("data") or {}) if isinstance(body, dict) else {}


def kubelet_summaries(api: kubernetes.client.ApiClient, names: list[str]) -> dict[str, dict | KubeletUnread]:
    """Each kubelet's stats/summary, cut to node.runtime (imageFs): the rest, per pod, is large."""
    return {name: {"node": {"runtime": (summary.get("node") or {}).get("runtime")}}
            if isinstance(summary, dict) else summary
            for name, summary in kubelet_reads(api, names, "stats/summary", _SUMMARY_TIMEOUT).items()}


def cluster_role_exists(api: kubernetes.client.ApiClient, name: str) -> bool | None:
    """Whether the ClusterRole exists; None when that cannot be read."""
    try:
        kubernetes.client.RbacAuthorizationV1Api(api).read_cluster_role(name, _request_timeout=_TIMEOUT)
    except ApiException as exc:
        return False if exc.status == 404 else None
    except Exception:  # noqa: BLE001 - connection errors come in many types
        return None
    return True


def write_policy(api: kubernetes.client.ApiClient, name: str) -> tuple[dict | None, dict | None] | str:
    """The ValidatingAdmissionPolicy `name` and its binding, each None where absent, as the faces
    read them at start; why not, when they cannot be read."""
    try:
        return write_policies.read(api, name)
    except Unreadable as exc:
        return str(exc)
