"""Whether a ValidatingAdmissionPolicy keeps a face's writes in bounds: the policy exists, and the
ValidatingAdmissionPolicyBinding of the same name binds it with the Deny action. Pure: the kube
shell (image_preflight/kube/write_policies.py) reads both objects; the watchdog and the node agent
refuse to start on a problem, and doctor reports it.

RBAC grants the watchdog its Job patch and its Pod create cluster-wide, and the node agents their
NodeImages writes for every node: the policies are what narrows them. A policy does nothing until
a binding names it (k8s.io/apiserver pkg/admission/plugin/policy/validating, the dispatcher
evaluates policies through their bindings only), and a binding without Deny only warns or audits
(admissionregistration/v1 ValidationAction).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from image_preflight.core.objects import as_mapping

DENY = "Deny"


def problem(name: str, policy: Mapping[str, Any] | None, binding: Mapping[str, Any] | None) -> str | None:
    """What keeps the policy `name` from denying, in words naming the object; None when it denies.
    `policy` and `binding`: the objects of that name, None where absent."""
    if policy is None:
        return f"ValidatingAdmissionPolicy {name} does not exist"
    if binding is None:
        return f"ValidatingAdmissionPolicyBinding {name} does not exist"
    spec = as_mapping(binding.get("spec"))
    bound = spec.get("policyName")
    if bound != name:
        return f"ValidatingAdmissionPolicyBinding {name} binds policy {bound or '(none)'}, not {name}"
    actions = spec.get("validationActions")
    actions = [a for a in actions if isinstance(a, str)] if isinstance(actions, list) else []
    if DENY not in actions:
        return f"ValidatingAdmissionPolicyBinding {name} has validationActions [{', '.join(actions)}], without {DENY}"
    return None
