{{/*
Names. Every object name comes from the truncated full name, so it fits Kubernetes' 63-character
limit; a StatefulSet's name also leaves room for its pods' revision-hash label (52).
*/}}
{{- define "tokenrelay.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tokenrelay.fullname" -}}
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

{{/* "<fullname>-<component>", the full name cut so the whole fits in `max` characters. */}}
{{- define "tokenrelay.componentName" -}}
{{- $max := .max | default 63 }}
{{- $prefix := include "tokenrelay.fullname" .ctx | trunc (int (sub $max (add1 (len .component)))) | trimSuffix "-" }}
{{- printf "%s-%s" $prefix .component }}
{{- end }}

{{- define "tokenrelay.api.fullname" -}}
{{- include "tokenrelay.componentName" (dict "ctx" . "component" "api") }}
{{- end }}

{{- define "tokenrelay.worker.fullname" -}}
{{- include "tokenrelay.componentName" (dict "ctx" . "component" "worker") }}
{{- end }}

{{- define "tokenrelay.redis.fullname" -}}
{{- include "tokenrelay.componentName" (dict "ctx" . "component" "redis" "max" 52) }}
{{- end }}

{{- define "tokenrelay.ownerIdSecretName" -}}
{{- include "tokenrelay.componentName" (dict "ctx" . "component" "owner-id" "max" 63) }}
{{- end }}

{{- define "tokenrelay.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: name + instance only, never anything that changes between releases. The name
carries the component ("tokenrelay-api", "tokenrelay-worker", "tokenrelay-redis"), so the
Deployments' selectors never overlap. Call with (dict "ctx" $ "component" "api").
*/}}
{{- define "tokenrelay.selectorLabels" -}}
app.kubernetes.io/name: {{ printf "%s-%s" (include "tokenrelay.name" .ctx | trunc 50 | trimSuffix "-") .component }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
{{- end }}

{{/* Full labels of an object; same arguments as tokenrelay.selectorLabels. */}}
{{- define "tokenrelay.labels" -}}
helm.sh/chart: {{ include "tokenrelay.chart" .ctx }}
{{ include "tokenrelay.selectorLabels" . }}
app.kubernetes.io/component: {{ .component }}
app.kubernetes.io/part-of: {{ include "tokenrelay.name" .ctx }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* An image reference: repository@digest when a digest is set, else repository:tag. */}}
{{- define "tokenrelay.image" -}}
{{- if .digest }}
{{- printf "%s@%s" .repository .digest }}
{{- else }}
{{- printf "%s:%s" .repository .tag }}
{{- end }}
{{- end }}

{{- define "tokenrelay.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "tokenrelay.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "tokenrelay.configMapName" -}}
{{- include "tokenrelay.fullname" . }}
{{- end }}

{{/* The model name clients send: the demo model has a fixed one. */}}
{{- define "tokenrelay.servedModelName" -}}
{{- if .Values.worker.demo }}tokenrelay-demo{{ else }}{{ default .Values.config.model .Values.config.servedModelName }}{{ end }}
{{- end }}

{{/* The Secret holding the API keys, or nothing when authentication is off. */}}
{{- define "tokenrelay.apiKeysSecretName" -}}
{{- if .Values.auth.existingSecret }}
{{- .Values.auth.existingSecret }}
{{- else if .Values.auth.apiKeys }}
{{- include "tokenrelay.fullname" . }}
{{- end }}
{{- end }}

{{- define "tokenrelay.apiKeysSecretKey" -}}
{{- if .Values.auth.existingSecret }}{{ .Values.auth.existingSecretKey }}{{ else }}api-keys{{ end }}
{{- end }}

{{- define "tokenrelay.webhookSecretName" -}}
{{- if .Values.webhooks.existingSecret }}
{{- .Values.webhooks.existingSecret }}
{{- else if .Values.webhooks.secret }}
{{- include "tokenrelay.fullname" . }}
{{- end }}
{{- end }}

{{- define "tokenrelay.webhookSecretKey" -}}
{{- if .Values.webhooks.existingSecret }}{{ .Values.webhooks.existingSecretKey }}{{ else }}webhook-secret{{ end }}
{{- end }}

{{/* The Secret holding the Redis credentials (bundled: the password; external: the URL). */}}
{{- define "tokenrelay.redis.secretName" -}}
{{- if .Values.redis.bundled.enabled }}
{{- default (include "tokenrelay.redis.fullname" .) .Values.redis.bundled.existingSecret }}
{{- else }}
{{- required "redis.external.existingSecret is required when redis.bundled.enabled is false: a Secret holding the Redis URL" .Values.redis.external.existingSecret }}
{{- end }}
{{- end }}

{{/* Key of the Redis password inside tokenrelay.redis.secretName; empty when there is none. */}}
{{- define "tokenrelay.redis.passwordKey" -}}
{{- if .Values.redis.bundled.enabled }}
{{- if .Values.redis.bundled.existingSecret }}{{ .Values.redis.bundled.existingSecretPasswordKey }}{{ else }}redis-password{{ end }}
{{- else }}
{{- .Values.redis.external.existingSecretPasswordKey }}
{{- end }}
{{- end }}

{{/* host:port of Redis as the KEDA operator, in its own namespace, must dial it. */}}
{{- define "tokenrelay.redis.address" -}}
{{- if .Values.redis.bundled.enabled }}
{{- printf "%s.%s.svc:6379" (include "tokenrelay.redis.fullname" .) .Release.Namespace }}
{{- else }}
{{- required "redis.external.address (host:port) is required for worker.keda with an external Redis" .Values.redis.external.address }}
{{- end }}
{{- end }}

{{/*
TOKENRELAY_REDIS_URL for the API and worker containers. Bundled Redis: built from the password
Secret with Kubernetes' $(VAR) expansion; external Redis: the URL straight from its Secret.
*/}}
{{- define "tokenrelay.redisEnv" -}}
{{- if .Values.redis.bundled.enabled }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "tokenrelay.redis.secretName" . }}
      key: {{ include "tokenrelay.redis.passwordKey" . }}
- name: TOKENRELAY_REDIS_URL
  value: {{ printf "redis://:$(REDIS_PASSWORD)@%s:6379/0" (include "tokenrelay.redis.fullname" .) | quote }}
{{- else }}
- name: TOKENRELAY_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "tokenrelay.redis.secretName" . }}
      key: {{ .Values.redis.external.existingSecretUrlKey }}
{{- with .Values.redis.external.sentinel.existingSecretPasswordKey }}
- name: TOKENRELAY_REDIS_SENTINEL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "tokenrelay.redis.secretName" $ }}
      key: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/*
One HTTP probe from its values: `enabled` switches it, every other key is passed through.
Call with (dict "probe" .Values.api.livenessProbe "path" "/healthz").
*/}}
{{- define "tokenrelay.httpProbe" -}}
httpGet:
  path: {{ .path }}
  port: http
{{- with omit .probe "enabled" }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Checksums that roll the pods when their configuration changes. */}}
{{- define "tokenrelay.configChecksums" -}}
checksum/config: {{ include (print .Template.BasePath "/configmap.yaml") . | sha256sum }}
checksum/secret: {{ include (print .Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}

{{/* Cross-value rules the schema cannot express; renders nothing when they hold. */}}
{{- define "tokenrelay.validate" -}}
{{- if gt (int .Values.config.defaultMaxTokens) (int .Values.config.maxTokensLimit) }}
{{- fail (printf "config.defaultMaxTokens (%v) must be <= config.maxTokensLimit (%v)" .Values.config.defaultMaxTokens .Values.config.maxTokensLimit) }}
{{- end }}
{{- if and .Values.api.autoscaling.enabled (gt (int .Values.api.autoscaling.minReplicas) (int .Values.api.autoscaling.maxReplicas)) }}
{{- fail (printf "api.autoscaling.minReplicas (%v) must be <= api.autoscaling.maxReplicas (%v)" .Values.api.autoscaling.minReplicas .Values.api.autoscaling.maxReplicas) }}
{{- end }}
{{- if and .Values.worker.keda.enabled (gt (int .Values.worker.keda.minReplicas) (int .Values.worker.keda.maxReplicas)) }}
{{- fail (printf "worker.keda.minReplicas (%v) must be <= worker.keda.maxReplicas (%v)" .Values.worker.keda.minReplicas .Values.worker.keda.maxReplicas) }}
{{- end }}
{{- if and .Values.worker.demo (ne .Values.config.servedModelName "") (ne .Values.config.servedModelName "tokenrelay-demo") }}
{{- fail "config.servedModelName must be empty or tokenrelay-demo with worker.demo: the demo model has a fixed name" }}
{{- end }}
{{- end }}
