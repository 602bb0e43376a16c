"""image_preflight/kube/client.py: the kubeconfig chosen as kubectl chooses it, and what is said
when there is none."""

from __future__ import annotations

import pytest
import yaml

from image_preflight.errors import InputError
from image_preflight.kube.client import ClusterFlags, api_client, default_kubeconfig


def _kubeconfig(path, server: str) -> None:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return tmp_path


def test_the_default_kubeconfig_is_kubeconfigs_files_else_the_one_in_home(home, monkeypatch):
    assert default_kubeconfig() == [home / ".kube" / "config"]
    monkeypatch.setenv("KUBECONFIG", f"{home}/a::{home}/b")  # an empty entry is skipped, as client-go's SplitList
    assert default_kubeconfig() == [home / "a", home / "b"]
    monkeypatch.setenv("KUBECONFIG", "")  # set but empty: as unset
    assert default_kubeconfig() == [home / ".kube" / "config"]


def test_a_kubeconfig_list_is_read_when_set_after_the_client_was_imported(home, monkeypatch):
    """The client reads $KUBECONFIG once, when imported; kubectl, at every run."""
    import kubernetes.config  # noqa: F401 - imported before KUBECONFIG is set

    _kubeconfig(home / "b", "https://127.0.0.1:6443")
    monkeypatch.setenv("KUBECONFIG", f"{home / 'missing'}:{home / 'b'}")  # a missing file is skipped, as kubectl's
    client = api_client(None)
    try:
        assert client.configuration.host == "https://127.0.0.1:6443"
    finally:
        client.close()


def test_no_kubeconfig_names_where_it_was_looked_for_and_what_else_to_give(home):
    class Scan(ClusterFlags):
        instead = ", or --inventory FILE"

    with pytest.raises(InputError, match=rf"^{home}/\.kube/config: no such file \(the default kubeconfig, "
                                         r"\$KUBECONFIG unset\): no configuration has been provided; give "
                                         r"--kubeconfig FILE, or --inventory FILE$"):
        Scan().client()
    with pytest.raises(InputError, match=r"; give --kubeconfig FILE$"):
        ClusterFlags(context="other").client()
