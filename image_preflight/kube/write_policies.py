"""A ValidatingAdmissionPolicy and the ValidatingAdmissionPolicyBinding of the same name, read by
name: what the watchdog and the node agent check before they start (`require`), and what doctor
reports. The judgement is image_preflight/core/write_policies.py's.

Both are read through the custom-objects path (/apis/GROUP/VERSION/PLURAL/NAME), which any client
version can build: the typed admissionregistration.k8s.io/v1 calls exist only in clients for
Kubernetes 1.30 and later, where these kinds became v1.
"""

from __future__ import annotations

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from image_preflight.core.write_policies import problem
from image_preflight.errors import UnavailableError
from image_preflight.kube.cluster_inventory import Unreadable
from image_preflight.kube.status import describe_error

GROUP, VERSION = "admissionregistration.k8s.io", "v1"
POLICIES = "validatingadmissionpolicies"
BINDINGS = "validatingadmissionpolicybindings"
_TIMEOUT = (5.0, 30.0)


class UnguardedError(UnavailableError):
    """A face's write policy is absent, unbound or does not deny: the face does not start."""


def read(api: kubernetes.client.ApiClient, name: str) -> tuple[dict | None, dict | None]:
    """(the policy, its binding) named `name`, each None where absent (404, which is also what an
    apiserver before 1.30, serving no v1 policies, answers). Unreadable otherwise, naming the
    grant a 403 lacks."""
    return _get(api, POLICIES, name), _get(api, BINDINGS, name)


def _get(api: kubernetes.client.ApiClient, plural: str, name: str) -> dict | None:
    try:
        found = kubernetes.client.CustomObjectsApi(api).get_cluster_custom_object(
            GROUP, VERSION, plural, name, _request_timeout=_TIMEOUT)
    except ApiException as exc:
        if exc.status == 404:
            return None
        why = (f"HTTP 403; reading it needs get on {plural}.{GROUP}" if exc.status == 403
               else describe_error(exc))
        raise Unreadable(f"{plural}.{GROUP} {name}: {why}") from None
    except Exception as exc:  # noqa: BLE001 - connection errors come in many types
        raise Unreadable(f"{plural}.{GROUP} {name}: {describe_error(exc)}") from None
    return found if isinstance(found, dict) else None


def require(api: kubernetes.client.ApiClient, name: str, risk: str) -> None:
    """Return when the policy `name` denies what it should; UnguardedError saying what is missing
    otherwise, Unreadable when it cannot be told. `risk`: what a stolen token could do without it."""
    policy, binding = read(api, name)
    missing = problem(name, policy, binding)
    if missing is not None:
        raise UnguardedError(f"{missing}, so {risk}; install or upgrade the chart, which creates both")
