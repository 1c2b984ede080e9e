{{/* Names and labels shared by every template. */}}

{{- define "rollout-fleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart>, or <release> when it already contains the chart name; at most 63 characters. */}}
{{- define "rollout-fleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "rollout-fleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rollout-fleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rollout-fleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "rollout-fleet.labels" -}}
helm.sh/chart: {{ include "rollout-fleet.chart" . }}
{{ include "rollout-fleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: rollout-fleet
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "rollout-fleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "rollout-fleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is given. */}}
{{- define "rollout-fleet.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{- define "rollout-fleet.leaseName" -}}
{{- default (include "rollout-fleet.fullname" .) .Values.operator.leaderElection.leaseName }}
{{- end }}

{{/*
Where every alert's runbook_url points (plus "#<alert in lower case>"): prometheusRule.runbookBaseUrl, or by default
docs/operations.md in the project's repository (Chart.yaml `home`) at the tag of this chart's version, so the runbook
an alert links to is the one for the operator that raised it.
*/}}
{{- define "rollout-fleet.runbookBaseUrl" -}}
{{- .Values.prometheusRule.runbookBaseUrl | default (printf "%s/blob/v%s/docs/operations.md" .Chart.Home .Chart.AppVersion) }}
{{- end }}

{{/* The job label the alerts select the operator's `up` series by (rules/rollout-fleet.rules.yaml). */}}
{{- define "rollout-fleet.metricsJob" -}}
rollout-fleet-operator
{{- end }}

{{/*
The operator's permissions on its own resources: exactly the verbs fleet_operator uses (docs/operations.md, "RBAC",
lists them with the reason; tests/e2e/test_chart_install.py checks `kubectl auth can-i --list` against that list).
*/}}
{{- define "rollout-fleet.operatorRules" -}}
# The engine lists the three kinds once when it starts leading; kopf then watches them and the trainers'
# PolicyVersions (list + watch).
- apiGroups: ["rolloutfleet.dev"]
  resources: ["generationshards", "environmentservers", "rolloutfleets", "policyversions"]
  verbs: ["list", "watch"]
# Observed health is written to the status subresource only (merge patch), never to spec or metadata.
- apiGroups: ["rolloutfleet.dev"]
  resources: ["generationshards/status", "environmentservers/status", "rolloutfleets/status"]
  verbs: ["patch"]
# Health transitions are reported as Events on the shard or fleet.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if .Values.operator.podDiscovery.enabled }}
# Pod members (spec.shardPods, spec.environmentServerPods): pods and a Service's EndpointSlices are read, never written.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list", "watch"]
{{- end }}
{{- end }}

{{/*
The rules values.schema.json cannot express (it compares no two values and its errors carry no hint): each fails
`helm install`/`helm template` with a sentence saying what to change. Included by deployment.yaml, which always
renders. The operator enforces the same rules at start (fleet_operator/settings.py).
*/}}
{{- define "rollout-fleet.validateValues" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.operator.leaderElection.enabled) }}
{{- fail "replicaCount > 1 needs operator.leaderElection.enabled=true: replicas without a leader would all probe and write status" }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled .Values.metrics.podMonitor.enabled }}
{{- fail "enable at most one of metrics.serviceMonitor and metrics.podMonitor: both would scrape the operator twice" }}
{{- end }}
{{- $lease := .Values.operator.leaderElection }}
{{- if ge (float64 $lease.renewSeconds) (float64 $lease.leaseDurationSeconds) }}
{{- fail (printf "operator.leaderElection.renewSeconds (%v) must be less than operator.leaderElection.leaseDurationSeconds (%v): the leader renews the Lease every renewSeconds and a standby takes over after leaseDurationSeconds without one; lower renewSeconds (a third of the lease duration is usual) or raise leaseDurationSeconds" $lease.renewSeconds $lease.leaseDurationSeconds) }}
{{- end }}
{{- $octet := "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])" }}
{{- $ipv4Cidr := printf "^(%s[.]){3}%s/([0-9]|[12][0-9]|3[0-2])$" $octet $octet }}
{{- $ipv6Cidr := "^[0-9a-fA-F:.]*:[0-9a-fA-F:.]*/([0-9]|[1-9][0-9]|1[01][0-9]|12[0-8])$" }}
{{- range .Values.operator.probe.allowedHosts }}
{{- if and (contains "/" .) (not (regexMatch $ipv4Cidr .)) (not (regexMatch $ipv6Cidr .)) }}
{{- fail (printf "operator.probe.allowedHosts: %q is not a CIDR block: write an IPv4 address with a prefix length of 0-32 (10.0.0.0/8) or an IPv6 one with 0-128 (fd00::/8)" .) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The router's labels: the chart's, with component=router (so the operator's selector never matches them). */}}
{{- define "rollout-fleet.routerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "rollout-fleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: router
{{- end }}

{{- define "rollout-fleet.routerLabels" -}}
helm.sh/chart: {{ include "rollout-fleet.chart" . }}
{{ include "rollout-fleet.routerSelectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: rollout-fleet
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "rollout-fleet.routerName" -}}
{{- printf "%s-router" (include "rollout-fleet.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rollout-fleet.routerFleetNamespace" -}}
{{- default .Release.Namespace .Values.router.fleetNamespace }}
{{- end }}
