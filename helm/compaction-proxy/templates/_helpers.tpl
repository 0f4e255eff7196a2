{{/* Names, labels, and the values every template derives from the same way. */}}

{{- define "compaction-proxy.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "compaction-proxy.fullname" -}}
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

{{- define "compaction-proxy.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "compaction-proxy.commonLabels" -}}
helm.sh/chart: {{ include "compaction-proxy.chart" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "compaction-proxy.labels" -}}
{{ include "compaction-proxy.commonLabels" . }}
{{ include "compaction-proxy.selectorLabels" . }}
{{- end }}

{{- define "compaction-proxy.redisLabels" -}}
{{ include "compaction-proxy.commonLabels" . }}
{{ include "compaction-proxy.redisSelectorLabels" . }}
{{- end }}

{{- define "compaction-proxy.selectorLabels" -}}
app.kubernetes.io/name: {{ include "compaction-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: proxy
{{- end }}

{{- define "compaction-proxy.redisName" -}}
{{- printf "%s-redis" (include "compaction-proxy.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{- define "compaction-proxy.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "compaction-proxy.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: redis
{{- end }}

{{- define "compaction-proxy.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "compaction-proxy.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Where the store comes from: bundled, external (URL from a Secret), or config (memory:// or a URL in config.store.url). */}}
{{- define "compaction-proxy.storeSource" -}}
{{- $ext := .Values.redis.external }}
{{- if .Values.redis.bundled.enabled }}bundled
{{- else if or $ext.url $ext.existingSecret }}external
{{- else }}config
{{- end }}
{{- end }}

{{/* Whether every pod has its own sessions: several pods then cannot share them. */}}
{{- define "compaction-proxy.storeIsPerPod" -}}
{{- if and (eq (include "compaction-proxy.storeSource" .) "config") (hasPrefix "memory://" (toString .Values.config.store.url)) }}true{{- end }}
{{- end }}

{{/* The Secret holding the proxy's keys, when there is one: the existing one, or the chart's when any key is set. */}}
{{- define "compaction-proxy.keysSecretName" -}}
{{- $s := .Values.secrets }}
{{- if $s.existingSecret }}{{ $s.existingSecret }}
{{- else if or $s.upstreamApiKey $s.adminKey $s.encryptionKey $s.previousEncryptionKey }}{{ include "compaction-proxy.fullname" . }}
{{- end }}
{{- end }}

{{/* Whether the chart creates its own Secret (keys given in values, or the Redis URL). */}}
{{- define "compaction-proxy.createsSecret" -}}
{{- $s := .Values.secrets }}
{{- if or .Values.redis.external.url (and (not $s.existingSecret) (or $s.upstreamApiKey $s.adminKey $s.encryptionKey $s.previousEncryptionKey)) }}true{{- end }}
{{- end }}

{{/* Refuse combinations that would deploy something that cannot work. */}}
{{- define "compaction-proxy.validate" -}}
{{- $ext := .Values.redis.external }}
{{- if and .Values.redis.bundled.enabled (or $ext.url $ext.existingSecret) }}
{{- fail "redis: set either redis.external or redis.bundled.enabled, not both" }}
{{- end }}
{{- if and $ext.url $ext.existingSecret }}
{{- fail "redis.external: set either url or existingSecret, not both" }}
{{- end }}
{{- if and (ne (include "compaction-proxy.storeSource" .) "config") (not (hasPrefix "memory://" (toString .Values.config.store.url))) }}
{{- fail "config.store.url: leave it memory:// when redis.external or redis.bundled provides the store" }}
{{- end }}
{{- if include "compaction-proxy.storeIsPerPod" . }}
{{- if .Values.autoscaling.enabled }}
{{- fail "autoscaling.enabled needs a shared store: the memory:// store is per pod, so replicas would not share sessions. Set redis.external.url (or existingSecret) or redis.bundled.enabled=true" }}
{{- end }}
{{- if gt (int .Values.replicaCount) 1 }}
{{- fail "replicaCount > 1 needs a shared store: the memory:// store is per pod, so replicas would not share sessions. Set redis.external.url (or existingSecret) or redis.bundled.enabled=true" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The proxy's config.yaml: values' config, with secrets replaced by references to the pod's environment. */}}
{{- define "compaction-proxy.config" -}}
{{- $cfg := deepCopy .Values.config }}
{{- $store := $cfg.store | default dict }}
{{- $source := include "compaction-proxy.storeSource" . }}
{{- if eq $source "bundled" }}
{{- $_ := set $store "url" (printf "redis://%s:%v/0" (include "compaction-proxy.redisName" .) .Values.redis.bundled.port) }}
{{- else if eq $source "external" }}
{{- $_ := set $store "url" "${COMPACTION_PROXY_STORE_URL}" }}
{{- end }}
{{- if include "compaction-proxy.keysSecretName" . }}
{{- $server := $cfg.server | default dict }}
{{- $upstream := $cfg.upstream | default dict }}
{{- $_ := set $upstream "api_key" "${COMPACTION_PROXY_UPSTREAM_API_KEY:-}" }}
{{- $_ := set $server "admin_key" "${COMPACTION_PROXY_ADMIN_KEY:-}" }}
{{- /* An unset rotation key interpolates to "", which the proxy drops. */}}
{{- $_ := set $store "encryption_keys" (list "${COMPACTION_PROXY_ENCRYPTION_KEY:-}" "${COMPACTION_PROXY_PREVIOUS_ENCRYPTION_KEY:-}") }}
{{- $_ := set $cfg "server" $server }}
{{- $_ := set $cfg "upstream" $upstream }}
{{- end }}
{{- $_ := set $cfg "store" $store }}
{{- toYaml $cfg }}
{{- end }}

{{/* terminationGracePeriodSeconds: preStop sleep + the proxy's drain delay and drain time (rounded up) + a margin. */}}
{{- define "compaction-proxy.terminationGracePeriodSeconds" -}}
{{- $drain := 30 }}{{/* the proxy's default when the key is left out */}}
{{- if hasKey .Values.config.server "shutdown_timeout_s" }}
{{- $drain = .Values.config.server.shutdown_timeout_s | ceil | int }}
{{- end }}
{{- $delay := 0 }}
{{- if hasKey .Values.config.server "drain_delay_s" }}
{{- $delay = .Values.config.server.drain_delay_s | ceil | int }}
{{- end }}
{{- add (int .Values.preStopSleepSeconds) $delay $drain (int .Values.terminationGraceMarginSeconds) }}
{{- end }}

{{/* The proxy container's environment: the keys and the Redis URL from Secrets (the config references them), then extraEnv. */}}
{{- define "compaction-proxy.env" -}}
{{- $keys := include "compaction-proxy.keysSecretName" . }}
{{- if $keys }}
{{- range $var, $key := dict "COMPACTION_PROXY_UPSTREAM_API_KEY" "upstream-api-key" "COMPACTION_PROXY_ADMIN_KEY" "admin-key" "COMPACTION_PROXY_ENCRYPTION_KEY" "encryption-key" "COMPACTION_PROXY_PREVIOUS_ENCRYPTION_KEY" "previous-encryption-key" }}
- name: {{ $var }}
  valueFrom:
    secretKeyRef:
      name: {{ $keys }}
      key: {{ $key }}
      optional: true
{{- end }}
{{- end }}
{{- with .Values.redis.external }}
{{- if or .url .existingSecret }}
- name: COMPACTION_PROXY_STORE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret | default (include "compaction-proxy.fullname" $) }}
      key: {{ if .existingSecret }}{{ .existingSecretKey }}{{ else }}redis-url{{ end }}
{{- end }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}
