import pytest

from image_preflight.core.decide.scheduling import (
    REASON_AFFINITY,
    REASON_NODE_NAME,
    REASON_UNSCHEDULABLE,
    NodeTraits,
    PodPlacement,
    SchedulingSpecError,
    Taint,
    Toleration,
    as_admitted,
    as_daemon,
    unschedulable_reason,
)
from tests.builders.nodes import kube_node, status_image

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
TERMS_PATH = f"spec.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms"


def expr(key, operator, *values):
    return {"key": key, "operator": operator, "values": list(values)}


def affinity(*terms):
    return {"affinity": {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": list(terms)}}}}


def placement(**spec):
    return PodPlacement.from_pod_spec(spec)


def fits(spec, node):
    return unschedulable_reason(PodPlacement.from_pod_spec(spec), node) is None


def traits(name="n1", taints=(), unschedulable=False, **labels):
    return NodeTraits(name, labels, tuple(taints), unschedulable)


# --- NodeAffinity: operators ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "labels", "expected"),
    [
        (expr("zone", "In", "a", "b"), {"zone": "b"}, True),
        (expr("zone", "In", "a", "b"), {"zone": "c"}, False),
        (expr("zone", "In", "a"), {}, False),
        (expr("zone", "In", ""), {"zone": ""}, True),
        (expr("zone", "NotIn", "a"), {"zone": "b"}, True),
        (expr("zone", "NotIn", "a"), {"zone": "a"}, False),
        (expr("zone", "NotIn", "a"), {}, True),
        (expr("gpu", "Exists"), {"gpu": ""}, True),
        (expr("gpu", "Exists"), {"cpu": "x"}, False),
        (expr("gpu", "DoesNotExist"), {"cpu": "x"}, True),
        (expr("gpu", "DoesNotExist"), {"gpu": "x"}, False),
        (expr("cores", "Gt", "8"), {"cores": "16"}, True),
        (expr("cores", "Gt", "8"), {"cores": "8"}, False),
        (expr("cores", "Gt", "8"), {"cores": "4"}, False),
        (expr("cores", "Gt", "8"), {"cores": "010"}, True),
        (expr("cores", "Gt", "8"), {"cores": "16x"}, False),
        (expr("cores", "Gt", "8"), {"cores": "1_6"}, False),
        (expr("cores", "Gt", "8"), {"cores": "99999999999999999999"}, False),
        (expr("cores", "Gt", "8"), {}, False),
        (expr("cores", "Lt", "8"), {"cores": "4"}, True),
        (expr("cores", "Lt", "8"), {"cores": "-4"}, True),
        (expr("cores", "Lt", "8"), {"cores": "8"}, False),
        (expr("cores", "Lt", "8"), {"cores": "four"}, False),
        (expr("cores", "Lt", "8"), {}, False),
    ],
)
def test_operator(expression, labels, expected):
    assert fits(affinity({"matchExpressions": [expression]}), NodeTraits("n1", labels)) is expected


def test_terms_are_ored():
    spec = affinity(
        {"matchExpressions": [expr("zone", "In", "a")]},
        {"matchExpressions": [expr("zone", "In", "b")]},
    )
    assert fits(spec, traits(zone="a"))
    assert fits(spec, traits(zone="b"))
    assert not fits(spec, traits(zone="c"))


def test_expressions_in_a_term_are_anded():
    spec = affinity({"matchExpressions": [expr("zone", "In", "a"), expr("gpu", "Exists")]})
    assert fits(spec, traits(zone="a", gpu="t4"))
    assert not fits(spec, traits(zone="a"))
    assert not fits(spec, traits(gpu="t4"))


def test_node_selector_matches_exactly():
    spec = {"nodeSelector": {"disk": "ssd", "arch": ""}}
    assert fits(spec, traits(disk="ssd", arch="", extra="x"))
    assert not fits(spec, traits(disk="ssd"))
    assert not fits(spec, traits(disk="hdd", arch=""))


def test_node_selector_and_affinity_must_both_hold():
    spec = {"nodeSelector": {"disk": "ssd"}, **affinity({"matchExpressions": [expr("zone", "In", "a")]})}
    assert fits(spec, traits(disk="ssd", zone="a"))
    assert unschedulable_reason(placement(**spec), traits(disk="ssd", zone="b")) == REASON_AFFINITY
    assert unschedulable_reason(placement(**spec), traits(disk="hdd", zone="a")) == REASON_AFFINITY


def test_match_fields_metadata_name():
    spec_in = affinity({"matchFields": [expr("metadata.name", "In", "n2")]})
    spec_not_in = affinity({"matchFields": [expr("metadata.name", "NotIn", "n2")]})
    assert [n.name for n in [traits("n1"), traits("n2")]
            if unschedulable_reason(placement(**spec_in), n) is None] == ["n2"]
    assert [n.name for n in [traits("n1"), traits("n2")]
            if unschedulable_reason(placement(**spec_not_in), n) is None] == ["n1"]


def test_match_fields_and_expressions_in_one_term_are_anded():
    spec = affinity({"matchExpressions": [expr("zone", "In", "a")], "matchFields": [expr("metadata.name", "In", "n1")]})
    assert fits(spec, traits("n1", zone="a"))
    assert not fits(spec, traits("n1", zone="b"))
    assert not fits(spec, traits("n2", zone="a"))


def test_match_fields_are_skipped_for_a_node_without_a_name():
    # Upstream only checks matchFields when the node exposes metadata.name.
    assert fits(affinity({"matchFields": [expr("metadata.name", "In", "n1")]}), traits(""))


def test_match_fields_other_key_reads_as_empty_like_the_scheduler():
    assert not fits(affinity({"matchFields": [expr("metadata.uid", "In", "n1")]}), traits("n1"))
    assert fits(affinity({"matchFields": [expr("metadata.uid", "NotIn", "n1")]}), traits("n1"))


@pytest.mark.parametrize(
    "terms",
    [
        [{}],
        [None],
        [{"matchExpressions": [], "matchFields": []}],
        [{"matchExpressions": None}],
        [],
    ],
)
def test_empty_terms_match_no_node(terms):
    p = placement(**affinity(*terms))
    assert p.required_terms == ()
    assert unschedulable_reason(p, traits(zone="a")) == REASON_AFFINITY


def test_empty_term_does_not_block_a_matching_sibling():
    spec = affinity({}, {"matchExpressions": [expr("zone", "In", "a")]})
    assert fits(spec, traits(zone="a"))


def test_required_without_terms_matches_no_node():
    assert not fits({"affinity": {"nodeAffinity": {REQUIRED: {}}}}, traits())


def test_no_required_affinity_matches_every_node():
    spec = {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}}
    p = placement(**spec)
    assert p.required_terms is None
    assert fits(spec, traits())


@pytest.mark.parametrize(
    ("expression", "error"),
    [
        (expr("zone", "In"), "values: must not be empty for 'In'"),
        (expr("zone", "NotIn"), "values: must not be empty for 'NotIn'"),
        (expr("zone", "Exists", "a"), "values: must be empty for 'Exists'"),
        (expr("zone", "DoesNotExist", "a"), "values: must be empty for 'DoesNotExist'"),
        (expr("cores", "Gt", "1", "2"), "values: 'Gt' takes exactly one value, got 2"),
        (expr("cores", "Lt"), "values: 'Lt' takes exactly one value, got 0"),
        (expr("cores", "Gt", "eight"), "values[0]: 'eight' is not an integer"),
        # Gt/Lt values are label values too, so a negative bound is invalid upstream.
        (expr("cores", "Gt", "-1"), "values[0]: '-1' is not a valid label value"),
        (expr("zone", "Foo", "a"), "operator: 'Foo' is not supported"),
        ({"key": "zone", "values": ["a"]}, "operator: '' is not supported"),
        (expr("bad key", "Exists"), "key: 'bad key' is not a valid label key"),
        (expr("", "DoesNotExist"), "key: '' is not a valid label key"),
        (expr("Example.com/zone", "Exists"), "key: 'Example.com/zone' is not a valid label key"),
        (expr("a/b/c", "Exists"), "key: 'a/b/c' is not a valid label key"),
        (expr("zone", "In", "a b"), "values[0]: 'a b' is not a valid label value"),
        (expr("zone", "In", "a", "x" * 64), f"values[1]: '{'x' * 64}' is not a valid label value"),
        (expr("x" * 64, "Exists"), f"key: '{'x' * 64}' is not a valid label key"),
    ],
)
def test_invalid_expression_makes_its_term_match_nothing(expression, error):
    # Such labels would satisfy the requirement if it were read leniently.
    n = traits(zone="a", cores="5", gpu="x")
    spec = affinity({"matchExpressions": [expr("gpu", "Exists"), expression]})
    p = placement(**spec)
    assert p.term_errors == (f"{TERMS_PATH}[0].matchExpressions[1].{error}",)
    assert p.required_terms == ()
    assert unschedulable_reason(p, n) == REASON_AFFINITY
    # The scheduler ignores the bad term but still honours the others.
    p = placement(**affinity({"matchExpressions": [expression]}, {"matchExpressions": [expr("gpu", "Exists")]}))
    assert unschedulable_reason(p, n) is None


@pytest.mark.parametrize(
    ("requirement", "error"),
    [
        (expr("metadata.name", "Exists"), "matchFields[0].operator: 'Exists' is not supported for matchFields"),
        (expr("metadata.name", "In", "n1", "n2"), "matchFields[0].values: must have one element, got 2"),
        (expr("metadata.name", "NotIn"), "matchFields[0].values: must have one element, got 0"),
    ],
)
def test_invalid_match_fields_make_the_term_match_nothing(requirement, error):
    p = placement(**affinity({"matchFields": [requirement]}))
    assert p.term_errors == (f"{TERMS_PATH}[0].{error}",)
    assert unschedulable_reason(p, traits("n1")) == REASON_AFFINITY


def test_valid_labels_with_prefix_are_accepted():
    spec = affinity({"matchExpressions": [expr("topology.kubernetes.io/zone", "In", "eu-west-1a")]})
    assert fits(spec, traits(**{"topology.kubernetes.io/zone": "eu-west-1a"}))
    assert placement(**spec).term_errors == ()


# --- NodeName -------------------------------------------------------------------------------------


def test_node_name():
    p = placement(nodeName="n2")
    assert unschedulable_reason(p, traits("n2")) is None
    assert unschedulable_reason(p, traits("n1")) == REASON_NODE_NAME


def test_empty_node_name_means_any_node():
    assert placement(nodeName="").node_name is None
    assert fits({"nodeName": ""}, traits("n1"))


# --- NodeUnschedulable ----------------------------------------------------------------------------


def test_unschedulable_node_rejects_pod():
    assert unschedulable_reason(placement(), traits(unschedulable=True)) == REASON_UNSCHEDULABLE


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},  # Equal to the empty value
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"},
        {"operator": "Exists"},
    ],
)
def test_unschedulable_node_accepts_pod_tolerating_the_taint(toleration):
    assert fits({"tolerations": [toleration]}, traits(unschedulable=True))


@pytest.mark.parametrize(
    "toleration",
    [
        {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoExecute"},
        {"key": "node.kubernetes.io/unschedulable", "value": "true", "effect": "NoSchedule"},
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists"},
    ],
)
def test_unschedulable_node_rejects_other_tolerations(toleration):
    assert not fits({"tolerations": [toleration]}, traits(unschedulable=True))


# --- TaintToleration ------------------------------------------------------------------------------

DEDICATED = Taint("dedicated", "gpu", "NoSchedule")


@pytest.mark.parametrize(("effect", "blocks"), [("NoSchedule", True), ("NoExecute", True), ("PreferNoSchedule", False)])
def test_taint_effects(effect, blocks):
    reason = unschedulable_reason(placement(), traits(taints=[Taint("dedicated", "gpu", effect)]))
    assert reason == ("node(s) had untolerated taint {dedicated: gpu}" if blocks else None)


def test_first_untolerated_taint_is_reported():
    taints = [Taint("a", "1", "PreferNoSchedule"), Taint("b", "", "NoExecute"), Taint("c", "3", "NoSchedule")]
    assert unschedulable_reason(placement(), traits(taints=taints)) == "node(s) had untolerated taint {b: }"
    p = placement(tolerations=[{"key": "b", "operator": "Exists"}])
    assert unschedulable_reason(p, traits(taints=taints)) == "node(s) had untolerated taint {c: 3}"


@pytest.mark.parametrize(
    ("toleration", "tolerates"),
    [
        ({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}, True),
        ({"key": "dedicated", "value": "gpu"}, True),  # operator defaults to Equal, empty effect = all
        ({"key": "dedicated", "operator": "Equal", "value": "cpu"}, False),
        ({"key": "dedicated", "operator": "Equal"}, False),
        ({"key": "dedicated", "operator": "Exists"}, True),
        ({"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
        ({"operator": "Exists"}, True),  # empty key with Exists tolerates every taint
        ({"operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "dedicated", "operator": "Gt", "value": "1"}, False),  # alpha, gated off by default
        ({"key": "dedicated", "operator": "Foo", "value": "gpu"}, False),
    ],
)
def test_toleration_matching(toleration, tolerates):
    assert fits({"tolerations": [toleration]}, traits(taints=[DEDICATED])) is tolerates


def test_every_blocking_taint_needs_a_toleration():
    taints = [DEDICATED, Taint("spot", "", "NoExecute")]
    one = [{"key": "dedicated", "operator": "Exists"}]
    both = one + [{"key": "spot", "operator": "Exists", "effect": "NoExecute"}]
    assert not fits({"tolerations": one}, traits(taints=taints))
    assert fits({"tolerations": both}, traits(taints=taints))


NOT_READY = [Taint("node.kubernetes.io/not-ready", "", "NoSchedule"),
             Taint("node.kubernetes.io/not-ready", "", "NoExecute")]


def test_not_ready_node_rejects_pod():
    reason = unschedulable_reason(placement(), traits(taints=NOT_READY))
    assert reason == "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"


def test_not_ready_node_rejects_pod_with_default_noexecute_tolerations():
    # What the DefaultTolerationSeconds admission plugin adds to every pod: not enough for NoSchedule.
    default = [
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 300},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 300},
    ]
    assert not fits({"tolerations": default}, traits(taints=NOT_READY))


def test_not_ready_node_accepts_pod_tolerating_every_effect():
    assert fits({"tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}]},
                traits(taints=NOT_READY))


def test_toleration_object_directly():
    assert Toleration(operator="Exists").tolerates(Taint("anything", "v", "NoExecute"))
    assert not Toleration(key="k", value="v", effect="NoSchedule").tolerates(Taint("k", "v", "NoExecute"))


# --- plugin order and eligible_nodes --------------------------------------------------------------


def test_reasons_follow_the_scheduler_plugin_order():
    p = placement(nodeSelector={"zone": "a"})
    assert unschedulable_reason(p, traits("n1", taints=[DEDICATED], unschedulable=True)) == REASON_UNSCHEDULABLE
    assert unschedulable_reason(p, traits("n1", taints=[DEDICATED])).startswith("node(s) had untolerated taint")
    assert unschedulable_reason(p, traits("n1")) == REASON_AFFINITY


def test_a_pod_naming_its_node_is_admitted_by_the_kubelet_not_the_scheduler():
    """pkg/kubelet/lifecycle/predicate.go, generalFilter: scheduler.AdmissionCheck (node affinity
    and selector, node name) and NoExecute taints only. A cordon or a NoSchedule taint does not
    keep the pod off, so it pulls there (and waits there for a missing image)."""
    named = placement(nodeName="n1", nodeSelector={"zone": "a"})
    assert unschedulable_reason(named, traits("n1", taints=[DEDICATED], unschedulable=True, zone="a")) is None
    evicting = traits("n1", taints=[Taint("spot", "", "NoExecute")], zone="a")
    assert unschedulable_reason(named, evicting).startswith("node(s) had untolerated taint")
    assert unschedulable_reason(named, traits("n1", zone="b")) == REASON_AFFINITY
    assert unschedulable_reason(named, traits("n2", zone="a")) == REASON_NODE_NAME


def test_filters_keep_the_nodes_every_filter_passes():
    nodes = [
        traits("a", zone="x"),
        traits("b", zone="y"),
        traits("c", zone="x", taints=[DEDICATED]),
        traits("d", zone="x", unschedulable=True),
        traits("e", zone="x"),
    ]
    assert eligible({"nodeSelector": {"zone": "x"}}, nodes) == ["a", "e"]


# --- NodeTraits -----------------------------------------------------------------------------------

KUBECTL_NODE = kube_node(
    "gpu-worker-3",
    [status_image("docker.io/library/busybox", "1.36", digest="sha256:abc")],
    labels={"nvidia.com/gpu.count": "8", "topology.kubernetes.io/zone": "us-east-1b"},
    taints=[
        {"effect": "NoSchedule", "key": "nvidia.com/gpu", "value": "present"},
        {"effect": "NoSchedule", "key": "node.kubernetes.io/unschedulable", "timeAdded": "2024-05-03T10:00:00Z"},
    ],
    unschedulable=True,
)


def test_from_node_reads_a_kubectl_node():
    traits = NodeTraits.from_node(KUBECTL_NODE)
    assert traits.name == "gpu-worker-3"
    assert traits.labels["nvidia.com/gpu.count"] == "8"
    assert len(traits.labels) == 7
    assert traits.taints == (
        Taint("nvidia.com/gpu", "present", "NoSchedule"),
        Taint("node.kubernetes.io/unschedulable", "", "NoSchedule"),
    )
    assert traits.unschedulable is True
    gpu_pod = placement(
        tolerations=[
            {"key": "nvidia.com/gpu", "operator": "Exists"},
            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
        ],
        **affinity({"matchExpressions": [expr("nvidia.com/gpu.count", "Gt", "4")]}),
    )
    assert unschedulable_reason(gpu_pod, traits) is None
    assert unschedulable_reason(placement(), traits) == REASON_UNSCHEDULABLE


@pytest.mark.parametrize(
    "obj",
    [
        {},
        {"metadata": None, "spec": None},
        {"metadata": {"name": "n1", "labels": None}, "spec": {"taints": None, "unschedulable": None}},
    ],
)
def test_from_node_tolerates_missing_fields(obj):
    traits = NodeTraits.from_node(obj)
    assert dict(traits.labels) == {}
    assert traits.taints == ()
    assert traits.unschedulable is False


def test_from_node_taint_without_value():
    traits = NodeTraits.from_node({"metadata": {"name": "n1"},
                                   "spec": {"taints": [{"key": "k", "effect": "NoExecute"}]}})
    assert traits.taints == (Taint("k", "", "NoExecute"),)


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        ([], "node: expected a mapping, got list"),
        ({"metadata": {"name": 7}}, "node: metadata.name: expected a string, got int"),
        ({"metadata": {"name": "n1", "labels": ["a"]}}, "node n1: metadata.labels: expected a mapping, got list"),
        ({"metadata": {"name": "n1", "labels": {"a": 1}}}, "node n1: metadata.labels.a: expected a string, got int"),
        (
            {"metadata": {"name": "n1"}, "spec": {"taints": {"key": "k"}}},
            "node n1: spec.taints: expected a list, got dict",
        ),
        (
            {"metadata": {"name": "n1"}, "spec": {"taints": [{"key": "k", "effect": 1}]}},
            "node n1: spec.taints[0].effect: expected a string, got int",
        ),
        (
            {"metadata": {"name": "n1"}, "spec": {"unschedulable": "yes"}},
            "node n1: spec.unschedulable: expected true or false, got str",
        ),
    ],
)
def test_from_node_rejects_wrong_types(obj, message):
    with pytest.raises(SchedulingSpecError) as err:
        NodeTraits.from_node(obj)
    assert str(err.value) == message


def test_node_traits_are_read_only_and_hashable():
    labels = {"zone": "a"}
    traits = NodeTraits("n1", labels, [DEDICATED])
    labels["zone"] = "b"
    assert traits.labels["zone"] == "a"
    assert traits.taints == (DEDICATED,)
    with pytest.raises(TypeError):
        traits.labels["zone"] = "c"
    assert traits == NodeTraits("n1", {"zone": "a"}, (DEDICATED,))
    assert hash(traits) == hash(NodeTraits("n1", {"zone": "a"}, (DEDICATED,)))
    assert traits != NodeTraits("n1", {"zone": "b"}, (DEDICATED,))


# --- PodPlacement parsing -------------------------------------------------------------------------


def test_from_pod_spec_of_a_plain_pod():
    p = PodPlacement.from_pod_spec({"containers": [{"name": "c", "image": "busybox"}]})
    assert p == PodPlacement()
    assert hash(p) == hash(PodPlacement())
    assert p.node_name is None and dict(p.node_selector) == {} and p.required_terms is None and p.tolerations == ()


def test_from_pod_spec_reads_tolerations():
    p = placement(tolerations=[{"key": "k", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 5},
                               None])
    # A null entry decodes to the zero toleration, as in the apiserver.
    assert p.tolerations == (Toleration("k", "Exists", "", "NoSchedule"), Toleration())


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (None, "spec: expected a mapping, got NoneType"),
        ({"nodeName": 3}, "spec.nodeName: expected a string, got int"),
        ({"nodeSelector": ["gpu"]}, "spec.nodeSelector: expected a mapping, got list"),
        ({"nodeSelector": {"gpu": 1}}, "spec.nodeSelector.gpu: expected a string, got int"),
        ({"nodeSelector": {"gpu": True}}, "spec.nodeSelector.gpu: expected a string, got bool"),
        ({"tolerations": {"key": "k"}}, "spec.tolerations: expected a list, got dict"),
        ({"tolerations": ["k"]}, "spec.tolerations[0]: expected a mapping, got str"),
        ({"tolerations": [{"key": "k", "value": 1}]}, "spec.tolerations[0].value: expected a string, got int"),
        ({"affinity": []}, "spec.affinity: expected a mapping, got list"),
        (
            {"affinity": {"nodeAffinity": {REQUIRED: []}}},
            f"spec.affinity.nodeAffinity.{REQUIRED}: expected a mapping, got list",
        ),
        (affinity({"matchExpressions": {"key": "k"}}), f"{TERMS_PATH}[0].matchExpressions: expected a list, got dict"),
        (
            affinity({"matchExpressions": ["zone In a"]}),
            f"{TERMS_PATH}[0].matchExpressions[0]: expected a mapping, got str",
        ),
        (
            affinity({}, {"matchExpressions": [expr("cores", "Gt", 4)]}),
            f"{TERMS_PATH}[1].matchExpressions[0].values[0]: expected a string, got int",
        ),
        (
            affinity({"matchExpressions": [{"key": "zone", "operator": "In", "values": "a"}]}),
            f"{TERMS_PATH}[0].matchExpressions[0].values: expected a list, got str",
        ),
        (
            affinity({"matchFields": [{"key": "metadata.name", "operator": 1, "values": ["n1"]}]}),
            f"{TERMS_PATH}[0].matchFields[0].operator: expected a string, got int",
        ),
    ],
)
def test_from_pod_spec_rejects_wrong_types(spec, message):
    with pytest.raises(SchedulingSpecError) as err:
        PodPlacement.from_pod_spec(spec)
    assert str(err.value) == message
    assert "\n" not in message


def test_from_pod_spec_error_uses_the_given_path():
    with pytest.raises(SchedulingSpecError, match=r"^spec\.template\.spec\.nodeSelector\.gpu: "):
        PodPlacement.from_pod_spec({"nodeSelector": {"gpu": 1}}, path="spec.template.spec")
    p = PodPlacement.from_pod_spec(affinity({"matchExpressions": [expr("zone", "Foo")]}), path="spec.template.spec")
    assert p.term_errors == (
        f"spec.template.spec.affinity.nodeAffinity.{REQUIRED}.nodeSelectorTerms[0].matchExpressions[0].operator: "
        "'Foo' is not supported",
    )


def test_scheduling_spec_error_is_a_value_error():
    assert issubclass(SchedulingSpecError, ValueError)


def eligible(spec: dict, nodes: list[NodeTraits]) -> list[str]:
    return [n.name for n in nodes if unschedulable_reason(placement(**spec), n) is None]


def test_admission_adds_the_default_not_ready_and_unreachable_tolerations():
    """plugin/pkg/admission/defaulttolerationseconds/admission.go: a node tainted only
    not-ready/unreachable NoExecute still takes new pods (the scheduler tolerates them for 300 s)."""
    unreachable = traits("n1", taints=[Taint("node.kubernetes.io/unreachable", "", "NoExecute")])
    assert unschedulable_reason(placement(), unreachable) is not None
    assert unschedulable_reason(as_admitted(placement()), unreachable) is None
    not_ready = traits("n1", taints=[Taint("node.kubernetes.io/not-ready", "", "NoExecute"),
                                   Taint("node.kubernetes.io/not-ready", "", "NoSchedule")])
    assert unschedulable_reason(as_admitted(placement()), not_ready).startswith("node(s) had untolerated taint")


def test_a_daemonset_runs_where_its_controller_puts_it_not_where_the_scheduler_would():
    """pkg/controller/daemon/daemon_controller.go, NodeShouldRunDaemonPod, with the tolerations of
    pkg/controller/daemon/util/daemonset_util.go AddOrUpdateDaemonPodTolerations."""
    daemon = as_daemon(placement())
    cordoned = traits("n1", taints=[Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")], unschedulable=True)
    assert unschedulable_reason(placement(), cordoned) == REASON_UNSCHEDULABLE
    assert unschedulable_reason(daemon, cordoned) is None
    pressure = traits("n1", taints=[Taint("node.kubernetes.io/disk-pressure", "", "NoSchedule")])
    assert unschedulable_reason(daemon, pressure) is None
    no_network = traits("n1", taints=[Taint("node.kubernetes.io/network-unavailable", "", "NoSchedule")])
    assert unschedulable_reason(daemon, no_network) is not None
    assert unschedulable_reason(as_daemon(placement(hostNetwork=True)), no_network) is None
    assert unschedulable_reason(daemon, traits("n1", taints=[DEDICATED])) is not None
