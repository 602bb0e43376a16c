{{/*
Names are fixed, not derived from the release: the webhook configurations, the CRD and the
ClusterRoles are cluster-wide, so the chart is installed once per cluster, and image-preflight's
commands (doctor, the agent's needed list) find its objects by these names.
*/}}
{{- define "image-preflight.agentNamespace" -}}image-preflight-agent{{- end }}

{{- define "image-preflight.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
Each component: its fixed name (app.kubernetes.io/name, and the name of its own objects), its
app.kubernetes.io/component label, and the values its Pods take. The helm test Pod and the
uninstall hook are placed and secured as the webhook is, so they take the webhook's values.
*/}}
{{- define "image-preflight.components" -}}
webhook: {name: image-preflight, component: webhook, values: webhook}
metrics: {name: image-preflight, component: metrics, values: webhook}
crds: {name: image-preflight, component: crds, values: crds}
agent: {name: image-preflight-agent, component: node-agent, values: agent}
watchdog: {name: image-preflight-watchdog, component: watchdog, values: watchdog}
test: {name: image-preflight-test, component: test, values: webhook}
uninstall: {name: image-preflight-uninstall, component: uninstall, values: webhook}
{{- end }}

{{/*
A component's context, which every template starts from and every helper below takes:
  {{- $c := dict -}}{{- include "image-preflight.component" (list $c . "watchdog") -}}
fills $c with root, key, name, component, values (the component's own, as given), labels and
selector (rendered text, so that their order is the one written below) and the component's
podSecurityContext and securityContext (the chart-wide ones with the component's merged over
them). It fills a dict rather than returning one because include returns text only, and a YAML
round trip would turn the values' integers into floats.
*/}}
{{- define "image-preflight.component" -}}
{{- $c := index . 0 -}}
{{- $root := index . 1 -}}
{{- $key := index . 2 -}}
{{- $facts := index (include "image-preflight.components" $root | fromYaml) $key -}}
{{- if not $facts -}}
{{- fail (printf "image-preflight.component: no component %q" $key) -}}
{{- end -}}
{{- $values := index $root.Values $facts.values -}}
{{- $_ := set $c "root" $root -}}
{{- $_ = set $c "key" $key -}}
{{- $_ = set $c "name" $facts.name -}}
{{- $_ = set $c "component" $facts.component -}}
{{- $_ = set $c "values" $values -}}
{{- $_ = set $c "labels" (include "image-preflight.labels" $c) -}}
{{- $_ = set $c "selector" (include "image-preflight.selector" $c) -}}
{{- range list "podSecurityContext" "securityContext" -}}
{{- /*
The component's keys over the chart-wide ones, two levels deep as Helm merges a user's values
over the defaults (a security context nests no deeper: capabilities.drop, seccompProfile.type);
a key set to null drops the chart-wide one, as a null drops a default, and the whole block set
to null drops the context, as it did before the chart-wide default. Not sprig's merge functions:
they keep some nulls and not others.
*/ -}}
{{- if hasKey $values . -}}
{{- $merged := deepCopy (index $root.Values . | default dict) -}}
{{- range $field, $value := deepCopy (index $values . | default dict) -}}
{{- $under := index $merged $field -}}
{{- if and (kindIs "map" $value) (kindIs "map" $under) -}}
{{- range $inner, $innerValue := $value -}}
{{- if kindIs "invalid" $innerValue }}{{ $_ = unset $under $inner }}{{ else }}{{ $_ = set $under $inner $innerValue }}{{ end -}}
{{- end -}}
{{- else if kindIs "invalid" $value -}}
{{- $_ = unset $merged $field -}}
{{- else -}}
{{- $_ = set $merged $field $value -}}
{{- end -}}
{{- end -}}
{{- $_ = set $c . $merged -}}
{{- else -}}
{{- $_ = set $c . nil -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The labels every object carries; `component` names the face. */}}
{{- define "image-preflight.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: image-preflight
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* A Pod template's selector labels: stable across upgrades. */}}
{{- define "image-preflight.selector" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end }}

{{/*
Values renamed to carry their unit, by component: new name: old name. values.yaml holds the new
names only, so an old one is present only where a user set it (or --reuse-values kept it), and it
then wins over the new name's default. This release still reads the old names; NOTES.txt asks for
the new ones.
*/}}
{{- define "image-preflight.renamedValues" -}}
agent: {intervalSeconds: interval, leaseSeconds: lease}
watchdog: {graceSeconds: grace}
{{- end }}

{{/*
A component's value by its new name, or by its old one while a user sets that:
(list $c "graceSeconds").
*/}}
{{- define "image-preflight.value" -}}
{{- $c := index . 0 -}}
{{- $new := index . 1 -}}
{{- $old := dig $c.key $new "" (include "image-preflight.renamedValues" . | fromYaml) -}}
{{- if and $old (hasKey $c.values $old) -}}
{{- index $c.values $old -}}
{{- else -}}
{{- index $c.values $new -}}
{{- end -}}
{{- end }}

{{/*
The renamed values a user still sets by their old names, as a YAML list of {old, new, value}, in
the order of their paths.
*/}}
{{- define "image-preflight.deprecatedValues" -}}
{{- $found := list -}}
{{- range $key, $renamed := include "image-preflight.renamedValues" . | fromYaml -}}
{{- $values := index $.Values $key -}}
{{- range $new, $old := $renamed -}}
{{- if hasKey $values $old -}}
{{- $found = append $found (dict "old" (printf "%s.%s" $key $old) "new" (printf "%s.%s" $key $new) "value" (index $values $old)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml $found -}}
{{- end }}

{{/*
Checkov reads skips from annotations on the rendered output, where YAML comments are gone; a
reason may not hold '='. The same for every Pod of the chart's image:
(list why-the-Pod-uses-its-token), or for a Pod that runs once and exits,
(list why-the-Pod-uses-its-token what-runs-once).
*/}}
{{- define "image-preflight.checkovSkips" -}}
checkov.io/skip1: CKV_K8S_15=the image is loaded onto each node without a registry so it cannot be pulled
checkov.io/skip2: CKV_K8S_43=a locally built and loaded image has no registry digest to pin
checkov.io/skip3: CKV_K8S_38={{ index . 0 }}
{{- if gt (len .) 1 }}
checkov.io/skip4: CKV_K8S_8={{ index . 1 }} runs once and exits; nothing to probe
checkov.io/skip5: CKV_K8S_9={{ index . 1 }} runs once and exits; nothing to probe
{{- end }}
{{- end }}

{{/*
The webhook's namespaceSelector: the chosen namespaces, less the excluded ones and the release's
own (by the name label the apiserver sets on every namespace).
*/}}
{{- define "image-preflight.namespaceSelector" -}}
{{- $excluded := concat .Values.excludedNamespaces (list .Release.Namespace) | uniq -}}
{{- $expressions := concat (.Values.namespaceSelector.matchExpressions | default list) (list (dict "key" "kubernetes.io/metadata.name" "operator" "NotIn" "values" $excluded)) -}}
{{- $selector := dict "matchExpressions" $expressions -}}
{{- with .Values.namespaceSelector.matchLabels }}{{ $_ := set $selector "matchLabels" . }}{{ end -}}
{{- toYaml $selector }}
{{- end }}

{{/*
The same selector as a label-selector string, for the watchdog's --namespace-selector
(k8s.io/apimachinery/pkg/labels: `k=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`).
*/}}
{{- define "image-preflight.namespaceSelectorString" -}}
{{- $selector := include "image-preflight.namespaceSelector" . | fromYaml -}}
{{- $terms := list -}}
{{- range $key, $value := $selector.matchLabels | default dict -}}
{{- $terms = append $terms (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- range $selector.matchExpressions -}}
{{- if eq .operator "In" -}}{{ $terms = append $terms (printf "%s in (%s)" .key (join "," .values)) }}
{{- else if eq .operator "NotIn" -}}{{ $terms = append $terms (printf "%s notin (%s)" .key (join "," .values)) }}
{{- else if eq .operator "Exists" -}}{{ $terms = append $terms .key }}
{{- else -}}{{ $terms = append $terms (printf "!%s" .key) }}
{{- end -}}
{{- end -}}
{{- join "," $terms -}}
{{- end }}

{{/*
The same selector as CEL over `variables.labels` (a namespace's labels, the name label among them
as the apiserver sets it): true for the namespaces the webhook checks.
*/}}
{{- define "image-preflight.namespaceSelectorCEL" -}}
{{- $selector := include "image-preflight.namespaceSelector" . | fromYaml -}}
{{- $terms := list -}}
{{- range $key, $value := $selector.matchLabels | default dict -}}
{{- $terms = append $terms (printf "(%q in variables.labels && variables.labels[%q] == %q)" $key $key $value) -}}
{{- end -}}
{{- range $selector.matchExpressions -}}
{{- $in := printf "variables.labels[%q] in [%s]" .key (include "image-preflight.celStrings" .values) -}}
{{- if eq .operator "In" -}}{{ $terms = append $terms (printf "(%q in variables.labels && %s)" .key $in) }}
{{- else if eq .operator "NotIn" -}}{{ $terms = append $terms (printf "(!(%q in variables.labels) || !(%s))" .key $in) }}
{{- else if eq .operator "Exists" -}}{{ $terms = append $terms (printf "(%q in variables.labels)" .key) }}
{{- else -}}{{ $terms = append $terms (printf "!(%q in variables.labels)" .key) }}
{{- end -}}
{{- end -}}
{{- join " && " $terms -}}
{{- end }}

{{- define "image-preflight.celStrings" -}}
{{- $quoted := list -}}
{{- range . }}{{ $quoted = append $quoted (printf "%q" .) }}{{ end -}}
{{- join ", " $quoted -}}
{{- end }}

{{/*
agent-lightning's rollout Jobs and their Pods, on either side of an UPDATE (as objectSelector
does), every label lookup guarded: an evaluation error would fall to failurePolicy.
*/}}
{{- define "image-preflight.matchConditions" -}}
{{- if .Values.agentlightningOnly -}}
matchConditions:
- name: agentlightning-rollout
  expression: >-
    [object, oldObject].exists(o, o != null && has(o.metadata.labels) && (
    ('app.kubernetes.io/managed-by' in o.metadata.labels &&
    o.metadata.labels['app.kubernetes.io/managed-by'] == 'agentlightning') ||
    ('batch.kubernetes.io/job-name' in o.metadata.labels &&
    o.metadata.labels['batch.kubernetes.io/job-name'].startsWith('agl-rollout-'))))
{{- end }}
{{- end }}

{{/* Spread replicas over nodes: preferred (soft), required (hard) or not at all (none). */}}
{{- define "image-preflight.affinity" -}}
{{- if .values.affinity }}
affinity:
  {{- toYaml .values.affinity | nindent 2 }}
{{- else if ne .values.antiAffinity "none" }}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (.selector | fromYaml)) "matchLabelKeys" (list "pod-template-hash") }}
affinity:
  podAntiAffinity:
    {{- if eq .values.antiAffinity "hard" }}
    requiredDuringSchedulingIgnoredDuringExecution:
    {{- list $term | toYaml | nindent 4 }}
    {{- else }}
    preferredDuringSchedulingIgnoredDuringExecution:
    {{- list (dict "weight" 100 "podAffinityTerm" $term) | toYaml | nindent 4 }}
    {{- end }}
{{- end }}
{{- end }}

{{/* What every Pod template shares: scheduling, priority, pull secrets, security context. */}}
{{- define "image-preflight.podCommon" -}}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .root.Values.image.pullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .podSecurityContext | nindent 2 }}
{{- end }}

{{/*
A component's PodDisruptionBudget (its podDisruptionBudget values), for those that run replicas:
the webhook and the watchdog.
*/}}
{{- define "image-preflight.podDisruptionBudget" -}}
{{- with .values.podDisruptionBudget }}
{{- if .enabled }}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $.name }}
  namespace: {{ $.root.Release.Namespace }}
  labels:
    {{- $.labels | nindent 4 }}
spec:
  minAvailable: {{ .minAvailable }}
  # A replica that is not ready serves nobody; let drains evict it.
  unhealthyPodEvictionPolicy: AlwaysAllow
  selector:
    matchLabels:
      {{- $.selector | nindent 6 }}
{{- end }}
{{- end }}
{{- end }}
