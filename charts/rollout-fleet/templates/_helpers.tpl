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

{{/* The job label the alerts select the operator's `up` series by (rules/rollout-fleet.rules.yaml). */}}
{{- define "rollout-fleet.metricsJob" -}}
rollout-fleet-operator
{{- end }}

{{/*
The operator's permissions on its own resources: exactly the verbs fleet_operator uses (docs/operations.md, "RBAC",
lists them with the reason; tests/e2e/test_chart_install.py checks `kubectl auth can-i --list` against that list).
*/}}
{{- define "rollout-fleet.operatorRules" -}}
# The engine lists the three kinds once when it starts leading; kopf then watches them (list + watch).
- apiGroups: ["rolloutfleet.dev"]
  resources: ["generationshards", "environmentservers", "rolloutfleets"]
  verbs: ["list", "watch"]
# Observed health is written to the status subresource only (merge patch), never to spec or metadata.
- apiGroups: ["rolloutfleet.dev"]
  resources: ["generationshards/status", "environmentservers/status", "rolloutfleets/status"]
  verbs: ["patch"]
# Health transitions are reported as Events on the shard or fleet.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
