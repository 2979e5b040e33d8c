{{- define "tailguard.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tailguard.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tailguard.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tailguard.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "tailguard.syncNamespace" -}}
{{ .Values.k8sSync.namespace | default .Release.Namespace }}
{{- end -}}

{{/* The settings every component reads: Kafka, Redis, secrets from the existing Secret. */}}
{{- define "tailguard.env" -}}
- name: TAILGUARD_KAFKA_BOOTSTRAP
  value: {{ .Values.kafka.bootstrap | quote }}
- name: TAILGUARD_KAFKA_SECURITY_PROTOCOL
  value: {{ .Values.kafka.securityProtocol | quote }}
- name: TAILGUARD_KAFKA_SASL_MECHANISM
  value: {{ .Values.kafka.saslMechanism | quote }}
{{- with .Values.kafka.saslUsername }}
- name: TAILGUARD_KAFKA_SASL_USERNAME
  value: {{ . | quote }}
{{- end }}
- name: TAILGUARD_REDIS_URL
  value: {{ .Values.redis.url | quote }}
{{- with .Values.redis.username }}
- name: TAILGUARD_REDIS_USERNAME
  value: {{ . | quote }}
{{- end }}
- name: TAILGUARD_KEY_PREFIX
  value: {{ .Values.keyPrefix | quote }}
- name: TAILGUARD_METRICS_HOST
  value: "0.0.0.0"
- name: TAILGUARD_METRICS_PORT
  value: {{ .Values.metrics.port | quote }}
{{- if .Values.existingSecret }}
- name: TAILGUARD_REDIS_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ .Values.existingSecret | quote }}, key: {{ .Values.secretKeys.redisPassword | quote }}, optional: true}
- name: TAILGUARD_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef: {name: {{ .Values.existingSecret | quote }}, key: {{ .Values.secretKeys.kafkaSaslPassword | quote }}, optional: true}
{{- end }}
{{- range $k, $v := .Values.env }}
- name: {{ $k }}
  value: {{ $v | quote }}
{{- end }}
{{- end -}}

{{- define "tailguard.securityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: false
  capabilities: {drop: ["ALL"]}
{{- end -}}
