{{/*
Names are fixed, not derived from the release: the webhook configurations, the CRD and the
ClusterRoles are cluster-wide, so the chart is installed once per cluster, and image-preflight's
commands (doctor, the agent's needed list) find its objects by these names.
*/}}
{{- define "image-preflight.agentNamespace" -}}image-preflight-agent{{- end }}

{{- define "image-preflight.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
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
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (include "image-preflight.selector" . | fromYaml)) "matchLabelKeys" (list "pod-template-hash") }}
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
  {{- toYaml .values.podSecurityContext | nindent 2 }}
{{- end }}
