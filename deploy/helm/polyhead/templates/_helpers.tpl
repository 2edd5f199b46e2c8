{{- define "polyhead.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "polyhead.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "polyhead.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "polyhead.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "polyhead.selector" -}}
app.kubernetes.io/name: {{ include "polyhead.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "polyhead.adminSecretName" -}}
{{- default (printf "%s-admin" (include "polyhead.fullname" .)) .Values.adminToken.existingSecret -}}
{{- end -}}

{{- define "polyhead.terminationGrace" -}}
{{- add .Values.gateway.shutdownDelaySeconds .Values.gateway.shutdownGraceSeconds .Values.gateway.terminationMarginSeconds -}}
{{- end -}}

{{/* The engine pool the gateway routes to: engine.discoveryPool, or the first pool. */}}
{{- define "polyhead.discoveryPool" -}}
{{- $pool := .Values.engine.discoveryPool | default (index .Values.engine.pools 0).name -}}
{{- printf "%s-engine-%s" (include "polyhead.fullname" .) $pool | trunc 63 | trimSuffix "-" -}}
{{- end -}}
