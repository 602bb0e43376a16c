"""The Kubernetes client every command gets, and the flags that choose it (--kubeconfig, --context),
with where the node agents keep their Leases (--agent-namespace).

The flags cost no import of the client: a command's parser is built before anything heavy loads.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, cast

from image_preflight.core.sources.runtime_lists import AGENT_NAMESPACE
from image_preflight.errors import InputError
from image_preflight.flags import FILE, NAME, Flags, flag

if TYPE_CHECKING:
    import urllib3
    from kubernetes.client import ApiClient


@dataclass(frozen=True)
class ClusterFlags(Flags):
    """--kubeconfig and --context, worded alike for every command that talks to the cluster (a
    command's config holds them with flags_of, which may prefix a condition to their help)."""

    kubeconfig: Path | None = flag(None, kind=FILE, help="as kubectl's",
                                   unset="in a pod its service account, else $KUBECONFIG or ~/.kube/config")
    context: str | None = flag(None, kind=NAME, help="a context of the kubeconfig", unset="its current one")
    agent_namespace: str = flag(AGENT_NAMESPACE, kind=NAME,
                                help="the node agents' namespace (their Leases)")
    # What else the command could be given when there is no kubeconfig (", or --inventory FILE").
    instead: ClassVar[str] = ""

    @property
    def given(self) -> bool:
        return self.kubeconfig is not None or self.context is not None

    def client(self) -> ApiClient:
        return api_client(self.kubeconfig, context=self.context, instead=self.instead)


def default_kubeconfig() -> list[Path]:
    """The files kubectl reads without --kubeconfig, as client-go's
    NewDefaultClientConfigLoadingRules (tools/clientcmd/loader.go) lists them: those $KUBECONFIG
    names (a path list), else ~/.kube/config. Of them, Load merges the ones that exist."""
    listed = [Path(part) for part in os.environ.get("KUBECONFIG", "").split(os.pathsep) if part]
    return listed or [Path.home() / ".kube" / "config"]


def api_client(kubeconfig: Path | None, *, context: str | None = None, instead: str = "") -> ApiClient:
    """As kubectl chooses: `kubeconfig` if given; else the pod's service account when in a
    cluster; else the default kubeconfig ($KUBECONFIG or ~/.kube/config). `context` picks a
    context of the kubeconfig instead of its current one. InputError, naming the kubeconfig,
    when it cannot be used; where none exists, `instead` ends the message (what else to give)."""
    in_cluster = kubeconfig is None and context is None and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if kubeconfig is not None:
        # As kubectl (client-go's ClientConfigLoadingRules.Load): an explicit file must exist.
        try:
            kubeconfig.stat()
        except OSError as exc:
            raise InputError(f"{kubeconfig}: cannot read the kubeconfig ({exc.strerror or exc})") from None
        where = config_file = str(kubeconfig)
    elif not in_cluster:
        files = default_kubeconfig()
        # The list as read now: the client's own default was read from $KUBECONFIG when imported.
        where = config_file = os.pathsep.join(map(str, files))
        if not any(path.is_file() for path in files):
            # kubectl, finding none, says "no configuration has been provided" (clientcmd's
            # ErrEmptyConfig); this names where it looked.
            source = "$KUBECONFIG" if os.environ.get("KUBECONFIG") else "the default kubeconfig, $KUBECONFIG unset"
            raise InputError(f"{', '.join(map(str, files))}: no such file ({source}): no configuration has been "
                             f"provided; give --kubeconfig FILE{instead}")
    else:
        where = "in-cluster service account"
    from kubernetes import client, config

    try:
        if in_cluster:
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        return config.new_client_from_config(config_file=config_file, context=context)
    except Exception as exc:  # the client raises several types for a bad or absent config
        detail = " ".join(str(exc).split())
        raise InputError(f"{where}: cannot configure the Kubernetes client ({detail})") from None


def json_body(response: object) -> Any:
    """The JSON body of what a generated client's method returns with _preload_content=False: the
    urllib3 response, not the model its signature names. Its connection is released."""
    raw = cast("urllib3.HTTPResponse", response)
    try:
        return json.loads(raw.data)
    finally:
        raw.release_conn()


def custom_object(value: object) -> dict[str, Any]:
    """A custom object as CustomObjectsApi's methods return it, typed `object`: its decoded JSON."""
    return cast("dict[str, Any]", value)
