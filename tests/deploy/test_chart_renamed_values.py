"""The chart's values that changed shape in 0.2: those renamed to carry their unit, still read by
their old names for this release with a note in NOTES.txt; the security contexts, set once for
every Pod and container with each component's own merged over them; and the PodDisruptionBudgets
the webhook and the watchdog share one template for."""

from __future__ import annotations

import pytest

from image_preflight.cli import parse_config
from image_preflight.core.doctor.findings import selects as selector_matches  # metav1.LabelSelector
from tests.chart import NAMESPACE, notes, render, template

# (component, old name, new name, a value other than the default, the flag it becomes)
RENAMED = [
    ("agent", "interval", "intervalSeconds", 20, "interval"),
    ("agent", "lease", "leaseSeconds", 120, "lease"),
    ("watchdog", "grace", "graceSeconds", 30, "grace"),
]
OLD = {"agent": {"interval": 20, "lease": 120}, "watchdog": {"grace": 30}}
NEW = {"agent": {"intervalSeconds": 20, "leaseSeconds": 120}, "watchdog": {"graceSeconds": 30}}
WORKLOADS = {"agent": ("DaemonSet", "image-preflight-agent"), "watchdog": ("Deployment", "image-preflight-watchdog")}
# Every Pod the chart runs, by its owner, and the component whose security contexts it takes.
PODS = {
    ("Deployment", "image-preflight"): "webhook",
    ("DaemonSet", "image-preflight-agent"): "agent",
    ("Deployment", "image-preflight-watchdog"): "watchdog",
    ("Pod", "image-preflight-test"): "webhook",
    ("Job", "image-preflight-uninstall"): "webhook",
}
CONTAINER = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "readOnlyRootFilesystem": True,
             "allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]},
             "seccompProfile": {"type": "RuntimeDefault"}}
POD = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}}


def _flags(documents: list[dict], component: str):
    kind, name = WORKLOADS[component]
    (workload,) = [d for d in documents if d["kind"] == kind and d["metadata"]["name"] == name]
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return parse_config([*container["command"][1:], *container["args"]])


# --- renamed values ---------------------------------------------------------------------------


@pytest.mark.parametrize("helm", ["helm", "helm4"])
def test_the_old_names_render_exactly_what_the_new_names_do(helm):
    # With an existing Secret nothing is generated, so the same values render the same text.
    old = template(OLD, case="secret", helm=helm).stdout
    assert old == template(NEW, case="secret", helm=helm).stdout
    assert old != template(case="secret", helm=helm).stdout


@pytest.mark.parametrize(("component", "old", "new", "value", "flag"), RENAMED)
def test_each_old_name_alone_wins_over_the_new_names_default(monkeypatch, component, old, new, value, flag):
    monkeypatch.setenv("NODE_NAME", "cpu-1")  # the agent's, from spec.nodeName
    by_old = render({component: {old: value}}, case="secret")
    assert by_old == render({component: {new: value}}, case="secret")
    assert getattr(_flags(by_old, component), flag) == value
    assert getattr(_flags(render(case="secret"), component), flag) != value


@pytest.mark.parametrize(("component", "old", "new", "value", "flag"), RENAMED)
def test_the_schema_still_checks_an_old_name(component, old, new, value, flag):
    done = template({component: {old: -1}}, check=False)
    assert done.returncode != 0 and not done.stdout
    assert f"/{component}/{old}" in done.stderr or f"{component}.{old}" in done.stderr, done.stderr


def test_the_notes_name_each_old_name_set_and_the_setting_that_replaces_it():
    text = notes(OLD)
    (heading,) = [line for line in text.splitlines() if line.startswith("Deprecated values")]
    assert "0.3.0" in heading
    listed = text.split(heading, 1)[1].strip("\n").splitlines()
    assert listed == [f"  {c}.{old}: set {c}.{new}={value} instead." for c, old, new, value, _ in RENAMED]
    # What the notes say of the watchdog is what the old name set.
    assert "watchdog: enforce, 30 s grace" in text


def test_the_notes_name_only_the_old_names_set():
    text = notes({"watchdog": {"grace": 45}})
    assert "  watchdog.grace: set watchdog.graceSeconds=45 instead." in text
    assert "agent.interval" not in text and "agent.lease" not in text


@pytest.mark.parametrize("values", [None, NEW], ids=["defaults", "new names"])
def test_the_notes_say_nothing_of_old_names_none_of_which_is_set(values):
    text = notes(values)
    assert "Deprecated" not in text
    assert f"helm test image-preflight -n {NAMESPACE}" in text


# --- security contexts ------------------------------------------------------------------------


def _contexts(documents: list[dict]) -> dict[tuple[str, str], tuple[dict, list[dict]]]:
    """Each Pod's securityContext and its containers', by the Pod's owner."""
    found = {}
    for document in documents:
        key = (document["kind"], document["metadata"]["name"])
        if key in PODS:
            spec = document["spec"] if document["kind"] == "Pod" else document["spec"]["template"]["spec"]
            found[key] = (spec.get("securityContext"), [c.get("securityContext") for c in spec["containers"]])
    assert set(found) == set(PODS)
    return found


def test_by_default_every_pod_runs_as_before_the_contexts_were_shared():
    own = {"webhook": {"fsGroup": 10001}, "watchdog": {"fsGroup": 10001}, "agent": {"supplementalGroups": [0]}}
    for owner, (pod, containers) in _contexts(render()).items():
        assert pod == {**POD, **own[PODS[owner]]}, owner
        assert containers == [CONTAINER], owner


def test_a_chart_wide_context_reaches_every_pod_and_container():
    values = {"podSecurityContext": {"runAsUser": 2000}, "securityContext": {"runAsUser": 2000}}
    for owner, (pod, containers) in _contexts(render(values)).items():
        assert pod["runAsUser"] == 2000 and [c["runAsUser"] for c in containers] == [2000], owner


def test_a_components_own_keys_are_merged_over_the_chart_wide_ones():
    values = {"webhook": {"securityContext": {"readOnlyRootFilesystem": False,
                                              "capabilities": {"add": ["NET_BIND_SERVICE"]}}},
              # A null drops the chart-wide key for that component alone.
              "agent": {"podSecurityContext": {"runAsUser": None}, "securityContext": {"seccompProfile": None}}}
    contexts = _contexts(render(values))
    for owner, component in PODS.items():
        pod, (container,) = contexts[owner]
        if component == "webhook":
            assert container == {**CONTAINER, "readOnlyRootFilesystem": False,
                                 "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}, owner
        elif component == "agent":
            assert "runAsUser" not in pod and pod["runAsGroup"] == 10001
            assert "seccompProfile" not in container and container["runAsUser"] == 10001
        else:
            assert container == CONTAINER, owner


# --- PodDisruptionBudgets ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["image-preflight", "image-preflight-watchdog"])
def test_each_replicated_component_has_a_budget_over_its_own_pods(name):
    component = "webhook" if name == "image-preflight" else "watchdog"
    documents = render({component: {"podDisruptionBudget": {"minAvailable": "50%"}}})
    (budget,) = [d for d in documents if d["kind"] == "PodDisruptionBudget" and d["metadata"]["name"] == name]
    assert budget["metadata"]["namespace"] == NAMESPACE
    assert budget["spec"]["minAvailable"] == "50%"
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    for deployment in (d for d in documents if d["kind"] == "Deployment"):
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector_matches(budget["spec"]["selector"], labels) is (deployment["metadata"]["name"] == name)
    off = render({component: {"podDisruptionBudget": {"enabled": False}}})
    assert [d["metadata"]["name"] for d in off if d["kind"] == "PodDisruptionBudget"] == [
        n for n in ("image-preflight", "image-preflight-watchdog") if n != name]
