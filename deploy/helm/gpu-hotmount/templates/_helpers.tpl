{{- define "gpu-hotmount.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpu-hotmount.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "gpu-hotmount.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "gpu-hotmount.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The agents' pod labels; agents find their peers with exactly these (--agent-selector). */}}
{{- define "gpu-hotmount.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-hotmount.name" . }}
{{- end -}}

{{- define "gpu-hotmount.labels" -}}
{{ include "gpu-hotmount.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpu-hotmount.tlsSecret" -}}
{{- default (printf "%s-tls" (include "gpu-hotmount.fullname" .)) .Values.tls.secretName -}}
{{- end -}}
