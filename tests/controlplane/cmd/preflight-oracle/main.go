// Command preflight-oracle answers questions about Kubernetes semantics with Kubernetes' own
// code, so that tests can compare the Python core with it on generated cases.
//
// It reads one JSON object per line on stdin and writes one JSON object per line on stdout:
//
//	{"kind":"reference","ref":"..."}          distribution/reference, as the kubelet links it
//	{"kind":"eligible","pod":{...},"node":{...}}  where the pod may run: kube-scheduler's filter
//	    plugins in the default order, or for a pod with spec.nodeName (no scheduler) the kubelet's
//	    admission, pkg/kubelet/lifecycle/predicate.go generalFilter
//	{"kind":"daemonset","pod":{...},"node":{...}}  whether a DaemonSet with that pod template
//	    runs a pod on the node: pkg/controller/daemon, NodeShouldRunDaemonPod
package main

import (
	"bufio"
	"context"
	_ "crypto/sha512" // the kubelet and containerd link sha384/sha512, so their digests validate
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/distribution/reference"
	"github.com/opencontainers/go-digest"
	apps "k8s.io/api/apps/v1"
	v1 "k8s.io/api/core/v1"
	v1helper "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/controller/daemon"
	"k8s.io/kubernetes/pkg/scheduler"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodeaffinity"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodename"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/nodeunschedulable"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/tainttoleration"
	k8sjson "sigs.k8s.io/json"
)

type request struct {
	Kind string          `json:"kind"`
	Ref  *string         `json:"ref,omitempty"`
	Pod  json.RawMessage `json:"pod,omitempty"`
	Node json.RawMessage `json:"node,omitempty"`
}

// result is one outcome of a reference function: the string it gives, or the name of its error.
type result struct {
	Value *string `json:"value,omitempty"`
	Error string  `json:"error,omitempty"`
}

var referenceErrors = []struct {
	name string
	err  error
}{
	{"ErrReferenceInvalidFormat", reference.ErrReferenceInvalidFormat},
	{"ErrTagInvalidFormat", reference.ErrTagInvalidFormat},
	{"ErrDigestInvalidFormat", reference.ErrDigestInvalidFormat},
	{"ErrNameContainsUppercase", reference.ErrNameContainsUppercase},
	{"ErrNameEmpty", reference.ErrNameEmpty},
	{"ErrNameTooLong", reference.ErrNameTooLong},
	{"ErrNameNotCanonical", reference.ErrNameNotCanonical},
	{"digest.ErrDigestInvalidFormat", digest.ErrDigestInvalidFormat},
	{"digest.ErrDigestInvalidLength", digest.ErrDigestInvalidLength},
	{"digest.ErrDigestUnsupported", digest.ErrDigestUnsupported},
}

// Errors reference.ParseNormalizedNamed makes with fmt.Errorf, named as the conformance data names them.
var unnamedErrors = []struct{ name, text string }{
	{"ErrRepoNameIsHexIdentifier", "cannot specify 64-byte hexadecimal strings"},
	{"ErrRemoteNameNotLowercase", "must be lowercase"},
}

func outcome(value string, err error) result {
	if err == nil {
		return result{Value: &value}
	}
	for _, known := range referenceErrors {
		if errors.Is(err, known.err) {
			return result{Error: known.name}
		}
	}
	for _, known := range unnamedErrors {
		if strings.Contains(err.Error(), known.text) {
			return result{Error: known.name}
		}
	}
	return result{Error: "other: " + err.Error()}
}

func named(ref string, f func(reference.Named) string) result {
	n, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return outcome("", err)
	}
	return outcome(f(n), nil)
}

func references(ref string) map[string]result {
	parsed, err := reference.Parse(ref)
	parse := outcome("", err)
	if err == nil {
		parse = outcome(parsed.String(), nil)
	}
	dockerRef, err := reference.ParseDockerRef(ref)
	docker := outcome("", err)
	if err == nil {
		docker = outcome(dockerRef.String(), nil)
	}
	anyRef, err := reference.ParseAnyReference(ref)
	parseAny := outcome("", err)
	if err == nil {
		parseAny = outcome(anyRef.String(), nil)
	}
	return map[string]result{
		"parse":            parse,
		"normalized":       named(ref, func(n reference.Named) string { return n.String() }),
		"familiar":         named(ref, func(n reference.Named) string { return reference.FamiliarString(n) }),
		"familiar_name":    named(ref, reference.FamiliarName),
		"with_default_tag": named(ref, func(n reference.Named) string { return reference.TagNameOnly(n).String() }),
		"docker_ref":       docker,
		"parse_any":        parseAny,
	}
}

// filters are kube-scheduler's node filters that read only the pod and the node, in the order
// of the default profile (pkg/scheduler/apis/config/v1/default_plugins.go).
var filters []fwk.FilterPlugin

func init() {
	ctx := context.Background()
	features := feature.Features{} // the 1.37 defaults: taint comparison operators are alpha, off
	for _, build := range []func() (fwk.Plugin, error){
		func() (fwk.Plugin, error) { return nodeunschedulable.New(ctx, nil, nil, features) },
		func() (fwk.Plugin, error) { return nodename.New(ctx, nil, nil, features) },
		func() (fwk.Plugin, error) { return tainttoleration.New(ctx, nil, nil, features) },
		func() (fwk.Plugin, error) {
			return nodeaffinity.New(ctx, &config.NodeAffinityArgs{}, nil, features)
		},
	} {
		p, err := build()
		if err != nil {
			panic(err)
		}
		filters = append(filters, p.(fwk.FilterPlugin))
	}
}

func eligible(podSpec, nodeJSON json.RawMessage) (map[string]any, error) {
	pod := &v1.Pod{}
	if err := k8sjson.UnmarshalCaseSensitivePreserveInts(podSpec, &pod.Spec); err != nil {
		return nil, fmt.Errorf("pod: %w", err)
	}
	node := &v1.Node{}
	if err := k8sjson.UnmarshalCaseSensitivePreserveInts(nodeJSON, node); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	info := framework.NewNodeInfo()
	info.SetNode(node)
	if pod.Spec.NodeName != "" {
		return kubeletAdmission(pod, info), nil
	}
	for _, f := range filters {
		status := f.Filter(context.Background(), framework.NewCycleState(), pod, info)
		if !status.IsSuccess() {
			return map[string]any{"eligible": false, "plugin": f.Name(), "reasons": status.Reasons()}, nil
		}
	}
	return map[string]any{"eligible": true}, nil
}

func daemonSet(podSpec, nodeJSON json.RawMessage) (map[string]any, error) {
	ds := &apps.DaemonSet{}
	if err := k8sjson.UnmarshalCaseSensitivePreserveInts(podSpec, &ds.Spec.Template.Spec); err != nil {
		return nil, fmt.Errorf("pod: %w", err)
	}
	node := &v1.Node{}
	if err := k8sjson.UnmarshalCaseSensitivePreserveInts(nodeJSON, node); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	shouldRun, _ := daemon.NodeShouldRunDaemonPod(klog.Background(), node, ds)
	return map[string]any{"eligible": shouldRun}, nil
}

// kubeletAdmission is generalFilter of pkg/kubelet/lifecycle/predicate.go, which is unexported:
// the same calls in the same order. Resource fit is left out (the cases carry no requests, and
// the decision does not model node resources).
func kubeletAdmission(pod *v1.Pod, info *framework.NodeInfo) map[string]any {
	for _, r := range scheduler.AdmissionCheck(pod, info, true) {
		if r.InsufficientResource == nil {
			return map[string]any{"eligible": false, "plugin": r.Name, "reasons": []string{r.Reason}}
		}
	}
	_, untolerated := v1helper.FindMatchingUntoleratedTaint(klog.Background(), info.Node().Spec.Taints,
		pod.Spec.Tolerations, func(t *v1.Taint) bool { return t.Effect == v1.TaintEffectNoExecute }, false)
	if untolerated {
		return map[string]any{"eligible": false, "plugin": tainttoleration.Name}
	}
	return map[string]any{"eligible": true}
}

// placements answer {"kind": ..., "pod": ..., "node": ...}.
var placements = map[string]func(pod, node json.RawMessage) (map[string]any, error){
	"eligible":  eligible,
	"daemonset": daemonSet,
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	enc.SetEscapeHTML(false)
	for in.Scan() {
		var req request
		var answer any
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			answer = map[string]string{"fault": err.Error()}
		} else {
			placement := placements[req.Kind]
			switch {
			case req.Kind == "reference" && req.Ref != nil:
				answer = references(*req.Ref)
			case placement != nil:
				if a, err := placement(req.Pod, req.Node); err != nil {
					answer = map[string]string{"fault": err.Error()}
				} else {
					answer = a
				}
			default:
				answer = map[string]string{"fault": "unknown kind " + req.Kind}
			}
		}
		if err := enc.Encode(answer); err != nil {
			panic(err)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
