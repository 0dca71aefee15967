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

{{- define "stream-export.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "stream-export.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: worker
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
