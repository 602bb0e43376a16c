"""The Kubernetes client the agent commands use: a kubeconfig, in-cluster, or the default."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config

from image_preflight.errors import UsageError


def api_client(kubeconfig: Path | None, *, context: str | None = None) -> client.ApiClient:
    """As kubectl chooses: `kubeconfig` if given; else the pod's service account when in a
    cluster; else the default kubeconfig ($KUBECONFIG or ~/.kube/config). `context` picks a
    context of the kubeconfig instead of its current one. Every command that talks to the
    cluster gets its client here."""
    in_cluster = kubeconfig is None and context is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    try:
        if in_cluster:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        return config.new_client_from_config(config_file=str(kubeconfig) if kubeconfig else None, context=context)
    except Exception as exc:  # the client raises several types for a bad or absent config
        where = kubeconfig or ("in-cluster service account" if in_cluster else "default kubeconfig")
        detail = " ".join(str(exc).split())
        raise UsageError(f"{where}: cannot configure the Kubernetes client ({detail})") from None
