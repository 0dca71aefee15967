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

{{/* The environment the worker and the gateway share: the broker, the topics, logging
and every value of `settings` (the gateway reads assemble.max_event_bytes too). */}}
{{- define "stream-export.commonEnv" -}}
{{- $k := .Values.kafka -}}
- name: STREAM_EXPORT_KAFKA_BOOTSTRAP_SERVERS
  value: {{ $k.bootstrapServers | quote }}
- name: STREAM_EXPORT_KAFKA_SECURITY_PROTOCOL
  value: {{ $k.securityProtocol | quote }}
{{- if $k.sasl.mechanism }}
- name: STREAM_EXPORT_KAFKA_SASL_MECHANISM
  value: {{ $k.sasl.mechanism | quote }}
- name: STREAM_EXPORT_KAFKA_SASL_USERNAME
  value: {{ $k.sasl.username | quote }}
{{- end }}
{{- if $k.sasl.existingSecret }}
- name: STREAM_EXPORT_KAFKA_SASL_PASSWORD_FILE
  value: {{ include "stream-export.saslDir" . }}/{{ $k.sasl.passwordKey }}
{{- end }}
{{- if $k.tls.existingSecret }}
- name: STREAM_EXPORT_KAFKA_SSL_CAFILE
  value: {{ include "stream-export.tlsDir" . }}/{{ $k.tls.caKey }}
{{- if $k.tls.certKey }}
- name: STREAM_EXPORT_KAFKA_SSL_CERTFILE
  value: {{ include "stream-export.tlsDir" . }}/{{ $k.tls.certKey }}
- name: STREAM_EXPORT_KAFKA_SSL_KEYFILE
  value: {{ include "stream-export.tlsDir" . }}/{{ $k.tls.keyKey }}
{{- end }}
{{- end }}
- name: STREAM_EXPORT_TOPICS_STEPS
  value: {{ .Values.topics.steps | quote }}
- name: STREAM_EXPORT_TOPICS_EPISODES
  value: {{ .Values.topics.episodes | quote }}
- name: STREAM_EXPORT_TOPICS_DEAD_LETTERS
  value: {{ .Values.topics.deadLetters | quote }}
- name: STREAM_EXPORT_TOPICS_PARTITIONS
  value: {{ .Values.topics.partitions | quote }}
- name: STREAM_EXPORT_TOPICS_REPLICATION_FACTOR
  value: {{ .Values.topics.replicationFactor | quote }}
- name: STREAM_EXPORT_WORKER_APP_ID
  value: {{ .Values.worker.appId | quote }}
- name: STREAM_EXPORT_WORKER_LOG_LEVEL
  value: {{ .Values.worker.logLevel | quote }}
- name: STREAM_EXPORT_WORKER_LOG_JSON
  value: {{ .Values.worker.logJson | quote }}
{{- range $section, $fields := .Values.settings }}
{{- range $field, $value := $fields }}
- name: {{ include "stream-export.envName" (dict "section" $section "field" $field) }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Kafka secrets' mounts and volumes (read-only files). */}}
{{- define "stream-export.kafkaMounts" -}}
{{- $k := .Values.kafka -}}
{{- if $k.sasl.existingSecret }}
- name: kafka-sasl
  mountPath: {{ include "stream-export.saslDir" . }}
  readOnly: true
{{- end }}
{{- if $k.tls.existingSecret }}
- name: kafka-tls
  mountPath: {{ include "stream-export.tlsDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "stream-export.kafkaVolumes" -}}
{{- $k := .Values.kafka -}}
{{- if $k.sasl.existingSecret }}
- name: kafka-sasl
  secret:
    secretName: {{ $k.sasl.existingSecret }}
    defaultMode: 0440
    items:
      - key: {{ $k.sasl.passwordKey }}
        path: {{ $k.sasl.passwordKey }}
{{- end }}
{{- if $k.tls.existingSecret }}
- name: kafka-tls
  secret:
    secretName: {{ $k.tls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/* The gateway's pods: a name of their own, so no worker selector matches them. */}}
{{- define "stream-export.gatewaySelectorLabels" -}}
app.kubernetes.io/name: {{ include "stream-export.name" . }}-gateway
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "stream-export.gatewayLabels" -}}
{{ include "stream-export.gatewaySelectorLabels" . }}
app.kubernetes.io/component: gateway
{{ include "stream-export.commonLabels" . }}
{{- end }}

{{- define "stream-export.gatewayKeysDir" -}}/var/run/secrets/stream-export/gateway{{- end }}
