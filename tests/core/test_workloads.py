import pytest

from image_preflight.core.decide.workloads import (
    ALWAYS,
    IF_NOT_PRESENT,
    NEVER,
    WORKLOAD_KINDS,
    ContainerImage,
    WorkloadError,
    container_images,
    default_pull_policy,
    pod_spec_of,
)

DIGEST = "sha256:" + "a" * 64

POD_SPEC = {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox:1.36"}]}


def template(spec):
    return {"metadata": {"labels": {"app": "x"}}, "spec": spec}


# Each workload kind in the shape the apiserver serves it, the pod spec where that kind keeps it.
WORKLOADS = {
    "Pod": lambda spec: {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec},
    "PodTemplate": lambda spec: {"apiVersion": "v1", "kind": "PodTemplate", "template": template(spec)},
    "Job": lambda spec: {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "spec": {"backoffLimit": 0, "template": template(spec)},
    },
    "CronJob": lambda spec: {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": template(spec)}}},
    },
    "Deployment": lambda spec: {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "spec": {"replicas": 2, "template": template(spec)},
    },
    "StatefulSet": lambda spec: {"apiVersion": "apps/v1", "kind": "StatefulSet", "spec": {"template": template(spec)}},
    "DaemonSet": lambda spec: {"apiVersion": "apps/v1", "kind": "DaemonSet", "spec": {"template": template(spec)}},
    "ReplicaSet": lambda spec: {"apiVersion": "apps/v1", "kind": "ReplicaSet", "spec": {"template": template(spec)}},
    "ReplicationController": lambda spec: {
        "apiVersion": "v1",
        "kind": "ReplicationController",
        "spec": {"template": template(spec)},
    },
}


def test_every_workload_kind_is_covered_here():
    assert set(WORKLOADS) == WORKLOAD_KINDS


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_pod_spec_found_in_each_kind(kind):
    spec = {"containers": [{"name": kind.lower(), "image": f"registry.example/{kind.lower()}:v1"}]}
    found = pod_spec_of(WORKLOADS[kind](spec))
    assert found == spec
    assert [c.image for c in container_images(found)] == [f"registry.example/{kind.lower()}:v1"]


@pytest.mark.parametrize(
    ("kind", "cut", "field"),
    [
        ("Pod", lambda o: o.pop("spec"), "spec"),
        ("Job", lambda o: o["spec"].pop("template"), "spec.template"),
        ("Job", lambda o: o["spec"]["template"].update(spec="oops"), "spec.template.spec"),
        ("Deployment", lambda o: o["spec"]["template"].pop("spec"), "spec.template.spec"),
        ("CronJob", lambda o: o["spec"].pop("jobTemplate"), "spec.jobTemplate"),
        ("CronJob", lambda o: o["spec"]["jobTemplate"].update(spec=[]), "spec.jobTemplate.spec"),
        ("PodTemplate", lambda o: o.pop("template"), "template"),
    ],
)
def test_missing_pod_spec_names_the_field(kind, cut, field):
    obj = WORKLOADS[kind](dict(POD_SPEC))
    cut(obj)
    with pytest.raises(WorkloadError) as err:
        pod_spec_of(obj)
    assert str(err.value).startswith(f"{field}: ")
    assert kind in str(err.value)


@pytest.mark.parametrize("kind", ["Service", "ConfigMap", None, "", "job"])
def test_other_kinds_are_rejected(kind):
    with pytest.raises(WorkloadError, match=r"^kind: .* is not a workload kind"):
        pod_spec_of({"kind": kind, "spec": {"template": template(POD_SPEC)}})


@pytest.mark.parametrize("kind", [["Pod"], {"Pod": 1}])
def test_unhashable_kind_is_a_workload_error(kind):
    with pytest.raises(WorkloadError, match=r"^kind: "):
        pod_spec_of({"kind": kind, "spec": POD_SPEC})


@pytest.mark.parametrize("obj", [None, "kind: Pod", ["Pod"]])
def test_non_mapping_object_is_rejected(obj):
    with pytest.raises(WorkloadError, match=r"^object: not a mapping"):
        pod_spec_of(obj)


# --- images -----------------------------------------------------------------------------------


def test_images_of_init_regular_and_ephemeral_containers_init_first():
    spec = {
        "containers": [
            {"name": "main", "image": "app:v2", "imagePullPolicy": "IfNotPresent"},
            {"name": "sidecar", "image": "envoy:v1.29"},
        ],
        "initContainers": [{"name": "setup", "image": "busybox"}],
        "ephemeralContainers": [{"name": "debugger", "image": "debug@" + DIGEST}],
    }
    assert container_images(spec) == [
        ContainerImage("setup", "initContainers", "busybox", ALWAYS),
        ContainerImage("main", "containers", "app:v2", IF_NOT_PRESENT),
        ContainerImage("sidecar", "containers", "envoy:v1.29", IF_NOT_PRESENT),
        ContainerImage("debugger", "ephemeralContainers", "debug@" + DIGEST, IF_NOT_PRESENT),
    ]


def test_unnamed_container_gets_its_index():
    images = container_images({"containers": [{"name": "a", "image": "x:1"}, {"image": "y:1"}]})
    assert [c.container for c in images] == ["a", "#1"]


@pytest.mark.parametrize("spec", [{}, {"containers": None}, {"containers": []}, {"initContainers": None}])
def test_no_containers_means_no_images(spec):
    assert container_images(spec) == []


@pytest.mark.parametrize(
    ("image", "policy"),
    [
        ("img", ALWAYS),
        ("img:latest", ALWAYS),
        ("img:v1", IF_NOT_PRESENT),
        ("img@" + DIGEST, IF_NOT_PRESENT),
        ("img:latest@" + DIGEST, ALWAYS),
        ("img:v1@" + DIGEST, IF_NOT_PRESENT),
        ("docker.io/library/img", ALWAYS),
        ("registry.example:5000/team/img", ALWAYS),
        ("registry.example:5000/team/img:5000", IF_NOT_PRESENT),
        ("localhost/img:latest", ALWAYS),
        ("swebench/sweb.eval.x86_64.astropy__astropy-12907:latest", ALWAYS),
        ("swesmith.x86_64.owner__repo.abcdef12:openai", IF_NOT_PRESENT),
        ("img:Latest", IF_NOT_PRESENT),  # the tag comparison is case-sensitive
        # Unparseable images get tag "" upstream, so IfNotPresent.
        ("Img:latest", IF_NOT_PRESENT),
        (":openai", IF_NOT_PRESENT),
    ],
)
def test_default_pull_policy(image, policy):
    assert default_pull_policy(image) == policy
    [found] = container_images({"containers": [{"name": "c", "image": image}]})
    assert found.pull_policy == policy


@pytest.mark.parametrize("declared", [ALWAYS, IF_NOT_PRESENT, NEVER])
@pytest.mark.parametrize("image", ["img", "img:latest", "img:v1", "img@" + DIGEST])
def test_declared_policy_wins(image, declared):
    [found] = container_images({"containers": [{"name": "c", "image": image, "imagePullPolicy": declared}]})
    assert found.pull_policy == declared


def test_empty_declared_policy_is_defaulted():
    [found] = container_images({"containers": [{"name": "c", "image": "img:v1", "imagePullPolicy": ""}]})
    assert found.pull_policy == IF_NOT_PRESENT


@pytest.mark.parametrize(("policy", "dependent"), [(ALWAYS, False), (IF_NOT_PRESENT, True), (NEVER, True)])
def test_only_always_ignores_the_node(policy, dependent):
    assert ContainerImage("c", "containers", "img:v1", policy).node_dependent is dependent


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"containers": {"name": "c"}}, r"^spec\.containers: not a list$"),
        ({"initContainers": "busybox"}, r"^spec\.initContainers: not a list$"),
        ({"containers": ["busybox"]}, r"^spec\.containers\[0\]: not a mapping$"),
        ({"containers": [{"name": "a", "image": "x:1"}, {"name": "b"}]}, r"^spec\.containers\[1\]\.image: missing"),
        ({"containers": [{"name": "a", "image": ""}]}, r"^spec\.containers\[0\]\.image: missing"),
        ({"containers": [{"name": "a", "image": 7}]}, r"^spec\.containers\[0\]\.image: missing or not a string"),
        ({"ephemeralContainers": [{"name": "d"}]}, r"^spec\.ephemeralContainers\[0\]\.image: "),
        (
            {"containers": [{"name": "a", "image": "x:1", "imagePullPolicy": "Sometimes"}]},
            r"^spec\.containers\[0\]\.imagePullPolicy: 'Sometimes' is not one of Always, IfNotPresent, Never$",
        ),
        (
            {"containers": [{"name": "a", "image": "x:1", "imagePullPolicy": "always"}]},
            r"^spec\.containers\[0\]\.imagePullPolicy: 'always'",
        ),
    ],
)
def test_bad_shapes_name_the_field(spec, message):
    with pytest.raises(WorkloadError, match=message):
        container_images(spec)


def test_image_volumes_are_pulled_like_containers_with_the_same_defaulting():
    """pkg/apis/core/v1/defaults.go, SetDefaults_Volume: an image volume's pullPolicy defaults as a
    container's does; the kubelet pulls `reference` before the containers that mount it start
    (pkg/kubelet/kuberuntime/kuberuntime_manager.go, toKubeContainerImageVolumes): one no container
    mounts holds back nothing."""
    mounts = [{"name": name, "mountPath": f"/{name}"} for name in ("tools", "latest", "never", "scripts")]
    spec = {"initContainers": [{"name": "setup", "image": "swe/task:openai", "volumeMounts": mounts[2:3]}],
            "containers": [{"name": "agent", "image": "swe/task:openai", "volumeMounts": mounts[:2] + mounts[3:]}],
            "volumes": [{"name": "tools", "image": {"reference": "swe/tools:v1"}},
                        {"name": "latest", "image": {"reference": "swe/tools", "pullPolicy": ""}},
                        {"name": "never", "image": {"reference": "swe/tools:v1", "pullPolicy": "Never"}},
                        {"name": "unmounted", "image": {"reference": "swe/unmounted:v1"}},
                        {"name": "scripts", "configMap": {"name": "agent-scripts"}}]}
    found = [(i.field, i.container, i.image, i.pull_policy) for i in container_images(spec)]
    assert found == [("initContainers", "setup", "swe/task:openai", "IfNotPresent"),
                     ("containers", "agent", "swe/task:openai", "IfNotPresent"),
                     ("volumes", "tools", "swe/tools:v1", "IfNotPresent"),
                     ("volumes", "latest", "swe/tools", "Always"),
                     ("volumes", "never", "swe/tools:v1", "Never")]
    assert container_images(spec)[2].label == "volume 'tools'"


@pytest.mark.parametrize(("volume", "field"), [
    ({"name": "v", "image": {}}, "spec.volumes[0].image.reference"),
    ({"name": "v", "image": "swe/tools:v1"}, "spec.volumes[0].image"),
    ({"name": "v", "image": {"reference": "a:1", "pullPolicy": "Sometimes"}}, "spec.volumes[0].image.pullPolicy"),
])
def test_an_unreadable_image_volume_names_its_field(volume, field):
    with pytest.raises(WorkloadError, match=field.replace("[", r"\[").replace("]", r"\]")):
        container_images({"containers": [], "volumes": [volume]})
