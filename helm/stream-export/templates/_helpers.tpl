{{/* Chart name, truncated to the 63 characters Kubernetes allows in names. */}}
{{- define "stream-export.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name, unless the release name already contains the chart name. */}}
{{- define "stream-export.fullname" -}}
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

{{- define "stream-export.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stream-export.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The recommended labels (app.kubernetes.io/*), on every object and pod. */}}
{{- define "stream-export.labels" -}}
{{ include "stream-export.selectorLabels" . }}
app.kubernetes.io/component: worker
{{ include "stream-export.commonLabels" . }}
{{- end }}

{{/* The labels that do not select the worker pods (the test pod has only these). */}}
{{- define "stream-export.commonLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: stream-export
{{- end }}

{{/* The image reference, also used by the helm test pod. */}}
{{- define "stream-export.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* Values the schema cannot relate to each other: fail the render with the fix. */}}
{{- define "stream-export.validate" -}}
{{- $partitions := int .Values.topics.partitions }}
{{- if gt (int .Values.replicaCount) $partitions }}
{{- fail (printf "replicaCount %d is above topics.partitions %d: each pod needs a partition of its own, so the extra pods would never become ready; lower replicaCount or raise topics.partitions" (int .Values.replicaCount) $partitions) }}
{{- end }}
{{- if and .Values.http.probePort (eq (int .Values.http.probePort) (int .Values.http.port)) }}
{{- fail (printf "http.probePort %d is http.port: give the probes a port of their own, or leave http.probePort empty to probe http.port" (int .Values.http.port)) }}
{{- end }}
{{- if and (hasPrefix "SASL_" .Values.kafka.securityProtocol) (not .Values.kafka.sasl.mechanism) }}
{{- fail (printf "kafka.securityProtocol %s needs kafka.sasl.mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512" .Values.kafka.securityProtocol) }}
{{- end }}
{{- end }}

{{- define "stream-export.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "stream-export.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* STREAM_EXPORT_<SECTION>_<FIELD> for a section and a field name. */}}
{{- define "stream-export.envName" -}}
{{- printf "STREAM_EXPORT_%s_%s" .section .field | upper }}
{{- end }}

{{/* Where the Kafka secrets are mounted (read-only files, never env values). */}}
{{- define "stream-export.saslDir" -}}/var/run/secrets/stream-export/sasl{{- end }}
{{- define "stream-export.tlsDir" -}}/var/run/secrets/stream-export/tls{{- end }}
