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

{{/*
Where the serving certificate comes from: "cert-manager", "given" (the user's Secret and
caBundle) or "generated" (the chart's own CA, in the Secret it makes).
*/}}
{{- define "gpu-hotmount.tlsSource" -}}
{{- if .Values.tls.certManager.enabled -}}
cert-manager
{{- else if .Values.tls.caBundle -}}
given
{{- else if .Values.tls.secretName -}}
{{- fail "tls.secretName names your own Secret: set tls.caBundle to the base64 PEM of the CA that signed it (or leave both empty and the chart makes a CA and certificate); see deploy/README.md" -}}
{{- else -}}
generated
{{- end -}}
{{- end -}}

{{/*
The chart's own CA and serving certificate as JSON: the Secret's data (base64 PEM).
An installed release's Secret is read back (lookup), so `helm upgrade` keeps them;
otherwise they are made here, once per render (cached in .Values.tls), so the Secret
and the APIService's caBundle agree.
*/}}
{{- define "gpu-hotmount.generatedTLS" -}}
{{- if not (hasKey .Values.tls "_generated") -}}
{{- $fullname := include "gpu-hotmount.fullname" . -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "gpu-hotmount.tlsSecret" .) -}}
{{- $data := dict -}}
{{- if $existing -}}
{{- $data = pick ($existing.data | default dict) "ca.crt" "tls.crt" "tls.key" -}}
{{- end -}}
{{- if ne (len $data) 3 -}}
{{- $days := int .Values.tls.generatedDays -}}
{{- $service := printf "%s.%s.svc" $fullname .Release.Namespace -}}
{{- $ca := genCA (printf "%s-ca" $fullname) $days -}}
{{- $local := printf "%s-local.%s.svc" $fullname .Release.Namespace -}}
{{- $cert := genSignedCert $service nil (list $service (printf "%s.cluster.local" $service) $local) $days $ca -}}
{{- $data = dict "ca.crt" ($ca.Cert | b64enc) "tls.crt" ($cert.Cert | b64enc) "tls.key" ($cert.Key | b64enc) -}}
{{- end -}}
{{- $_ := set .Values.tls "_generated" $data -}}
{{- end -}}
{{- index .Values.tls "_generated" | toJson -}}
{{- end -}}

{{/*
The priority classes holder and pin pods may carry, as a JSON array: holder.priorityClasses
plus the fallback holder.priorityClassName. The admission policy's list and the agent's
--holder-priority-classes both come from here, so they cannot disagree.
*/}}
{{- define "gpu-hotmount.holderPriorityClasses" -}}
{{- $classes := list -}}
{{- range (.Values.holder.priorityClasses | default list) -}}
{{- $classes = append $classes (toString .) -}}
{{- end -}}
{{- with .Values.holder.priorityClassName -}}
{{- $classes = append $classes (toString .) -}}
{{- end -}}
{{- range $classes -}}
{{- include "gpu-hotmount.celSafe" (list "holder.priorityClasses" .) -}}
{{- end -}}
{{- $classes | uniq | toJson -}}
{{- end -}}

{{/*
The blockers' PriorityClass (priorityclass.yaml, preemptionPolicy Never): the agent's
--blocker-priority-class and the admission policy's blockerPriorityClass both come from here.
*/}}
{{- define "gpu-hotmount.blockerPriorityClass" -}}
{{- printf "%s-blocker" (include "gpu-hotmount.fullname" .) -}}
{{- end -}}

{{/* A value pasted into a CEL string literal: names and image references only, no quotes. */}}
{{- define "gpu-hotmount.celSafe" -}}
{{- $name := index . 0 -}}
{{- $value := toString (index . 1) -}}
{{- if not (regexMatch "^[A-Za-z0-9._:/@-]*$" $value) -}}
{{- fail (printf "%s: %q is not a name or image reference (letters, digits and ._:/@- only)" $name $value) -}}
{{- end -}}
{{- end -}}

{{/* A list of strings as a CEL list literal: ['a', 'b'], or [] */}}
{{- define "gpu-hotmount.celStrings" -}}
{{- $quoted := list -}}
{{- range . -}}
{{- $quoted = append $quoted (printf "'%s'" .) -}}
{{- end -}}
[{{ join ", " $quoted }}]
{{- end -}}

{{/*
The NetworkPolicy's API-server peers as a JSON array: networkPolicy.apiServer, else the
`kubernetes` Service's endpoints read at install (lookup), else none. An offline render
(helm template, Argo CD, Flux) cannot read them and admits no API-server peer: never
0.0.0.0/0, which would keep no pod off the port on networks that match pod traffic by
address. The policy and NOTES.txt say so (deploy/README.md, "Network policy").
*/}}
{{- define "gpu-hotmount.apiServerPeers" -}}
{{- $peers := .Values.networkPolicy.apiServer | default list -}}
{{- if not $peers -}}
{{- $endpoints := lookup "v1" "Endpoints" "default" "kubernetes" -}}
{{- range ($endpoints.subsets | default list) -}}
{{- range (.addresses | default list) -}}
{{- $peers = append $peers (dict "ipBlock" (dict "cidr" (printf "%s/%s" .ip (ternary "128" "32" (contains ":" .ip))))) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $peers | toJson -}}
{{- end -}}
