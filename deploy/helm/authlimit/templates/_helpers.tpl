{{/* The chart's name, or nameOverride. */}}
{{- define "authlimit.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' name: fullnameOverride, or the release's name with the
chart's unless it already holds it. At most 57 characters, so that the
"-rules" and "-env" ConfigMaps stay within 63. */}}
{{- define "authlimit.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 57 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 57 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 57 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "authlimit.selectorLabels" -}}
app.kubernetes.io/name: {{ include "authlimit.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "authlimit.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "authlimit.selectorLabels" . }}
app.kubernetes.io/version: {{ (default .Chart.AppVersion .Values.image.tag) | trunc 63 | quote }}
app.kubernetes.io/component: ratelimiter
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* How many replicas run at most: what the local fail mode divides by. */}}
{{- define "authlimit.maxReplicas" -}}
{{- if .Values.autoscaling.enabled -}}
{{- .Values.autoscaling.maxReplicas -}}
{{- else -}}
{{- .Values.replicaCount -}}
{{- end -}}
{{- end -}}

{{/* How many replicas run at least: a PodDisruptionBudget needs two. */}}
{{- define "authlimit.minReplicas" -}}
{{- if .Values.autoscaling.enabled -}}
{{- .Values.autoscaling.minReplicas -}}
{{- else -}}
{{- .Values.replicaCount -}}
{{- end -}}
{{- end -}}

{{- define "authlimit.localDivisor" -}}
{{- if kindIs "invalid" .Values.localDivisor -}}
{{- include "authlimit.maxReplicas" . -}}
{{- else -}}
{{- .Values.localDivisor -}}
{{- end -}}
{{- end -}}

{{- define "authlimit.rulesConfigMap" -}}
{{- default (printf "%s-rules" (include "authlimit.fullname" .)) .Values.existingRulesConfigMap -}}
{{- end -}}

{{/* Where the rules ConfigMap is mounted: a directory, never a subPath, so
that the kubelet's updates (a swap of its ..data symlink) reach the pod. */}}
{{- define "authlimit.rulesDir" -}}/etc/authlimit/rules{{- end -}}

{{/* Where envoyproxy/ratelimit's ConfigMap is mounted: a directory too. */}}
{{- define "authlimit.rlsDir" -}}/etc/authlimit/rls{{- end -}}

{{/* Where the gRPC port's TLS Secret is mounted. */}}
{{- define "authlimit.grpcTLSDir" -}}/etc/authlimit/grpc-tls{{- end -}}
