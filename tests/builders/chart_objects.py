"""The chart's objects, as its tests read them."""

from __future__ import annotations

# API groups whose CRDs cannot be installed on the test control plane (no registry, no network):
# kubernetes-validate has no schema for them either, so tests/deploy/test_chart_render.py checks their
# objects field by field.
CERT_MANAGER = "cert-manager.io"
MONITORING = "monitoring.coreos.com"
UNINSTALLABLE_GROUPS = frozenset({CERT_MANAGER, MONITORING})


def api_group(document: dict) -> str:
    api_version = document["apiVersion"]
    return api_version.split("/")[0] if "/" in api_version else ""
