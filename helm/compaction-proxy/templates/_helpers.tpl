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

{{- define "compaction-proxy.image" -}}
{{- $i := .Values.image }}
{{- $ref := printf "%s:%s" $i.repository ($i.tag | default .Chart.AppVersion) }}
{{- if $i.digest }}{{ printf "%s@%s" $ref $i.digest }}{{ else }}{{ $ref }}{{ end }}
{{- end }}

{{/* Where the store comes from: bundled, external (URL from a Secret: redis.external, or a
Redis URL written in config.store.url, which the chart moves into its Secret), or memory. */}}
{{- define "compaction-proxy.storeSource" -}}
{{- $ext := .Values.redis.external }}
{{- if .Values.redis.bundled.enabled }}bundled
{{- else if or $ext.url $ext.existingSecret }}external
{{- else if not (hasPrefix "memory://" (toString .Values.config.store.url)) }}external
{{- else }}memory
{{- end }}
{{- end }}

{{/* The store URL the chart keeps in its own Secret (key redis-url), if any. */}}
{{- define "compaction-proxy.storeUrlValue" -}}
{{- if .Values.redis.external.url }}{{ .Values.redis.external.url }}
{{- else if and (not .Values.redis.bundled.enabled) (not .Values.redis.external.existingSecret) (not (hasPrefix "memory://" (toString .Values.config.store.url))) }}{{ .Values.config.store.url }}
{{- end }}
{{- end }}

{{/* The TCP ports the proxy's egress must allow to reach an external store, comma-separated:
networkPolicy.storeEgress.ports, then each host:port of the URL the chart holds (6379 when
a host names none; a Sentinel's, 26379). Fails where the chart cannot know a port: a URL in
an existing Secret, hosts written as ${...}, or a Sentinel's data nodes (the
sentinels name the primary at run time). */}}
{{- define "compaction-proxy.storeEgressPorts" -}}
{{- $ports := list }}
{{- range .Values.networkPolicy.storeEgress.ports }}{{ $ports = append $ports (toString (int .)) }}{{ end }}
{{- if eq (include "compaction-proxy.storeSource" .) "external" }}
{{- $url := include "compaction-proxy.storeUrlValue" . }}
{{- if not $url }}
{{- if not $ports }}
{{- fail (printf "networkPolicy.storeEgress.ports: with networkPolicy.enabled the proxy's egress must allow the store's port, and its URL is in Secret %s, which the chart does not read: list the port(s), e.g. [6379] (a Cluster: every node's; Sentinel: the sentinels' and the data nodes')" .Values.redis.external.existingSecret) }}
{{- end }}
{{- else if not (hasPrefix "unix://" $url) }}
{{- $sentinel := regexMatch "^rediss?\\+sentinel://" $url }}
{{- if and $sentinel (not $ports) }}
{{- fail "networkPolicy.storeEgress.ports: with networkPolicy.enabled and a Sentinel store, list the data nodes' port(s), e.g. [6379]: the URL names only the sentinels, which name the primary at run time" }}
{{- end }}
{{- /* The hosts: what follows the scheme up to the path or query, after any userinfo (as the proxy reads them). */}}
{{- $netloc := regexReplaceAll "[/?#].*$" (regexReplaceAll "^[^:]*://" $url "") "" }}
{{- $hosts := regexReplaceAll "^.*@" $netloc "" }}
{{- if and (contains "$" $hosts) (not $ports) }}
{{- fail "networkPolicy.storeEgress.ports: with networkPolicy.enabled the proxy's egress must allow the store's port, and the store URL's hosts hold a ${...} reference the chart cannot read: list the port(s), e.g. [6379]" }}
{{- end }}
{{- if not (contains "$" $hosts) }}
{{- range splitList "," $hosts }}
{{- if and (regexMatch ":[0-9]+$" .) (not (hasSuffix "]" .)) }}
{{- $ports = append $ports (regexFind "[0-9]+$" .) }}
{{- else if . }}
{{- $ports = append $ports (ternary "26379" "6379" $sentinel) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- join "," (uniq $ports) }}
{{- end }}

{{/* Whether every pod has its own sessions: several pods then cannot share them. */}}
{{- define "compaction-proxy.storeIsPerPod" -}}
{{- if eq (include "compaction-proxy.storeSource" .) "memory" }}true{{- end }}
{{- end }}

{{/* The Secret keys the proxy uses, comma-separated: those listed for an existing Secret,
or those set in values. Each is mounted required. */}}
{{- define "compaction-proxy.secretKeys" -}}
{{- $s := .Values.secrets }}
{{- if $s.existingSecret }}{{ join "," $s.existingSecretKeys }}
{{- else }}
{{- $keys := list }}
{{- range $key, $value := dict "upstream-api-key" $s.upstreamApiKey "admin-key" $s.adminKey "encryption-key" $s.encryptionKey "previous-encryption-key" $s.previousEncryptionKey "tenant-id-secret" $s.tenantIdSecret }}
{{- if $value }}{{ $keys = append $keys $key }}{{ end }}
{{- end }}
{{- /* The chart's own Secret always holds one: generated when not given (secret.yaml). */}}
{{- if and $keys (not (has "tenant-id-secret" $keys)) }}{{ $keys = append $keys "tenant-id-secret" }}{{ end }}
{{- join "," $keys }}
{{- end }}
{{- end }}

{{/* server.tenant_id_secret in the chart's Secret: secrets.tenantIdSecret; else the one
the installed Secret holds (an upgrade keeps it: a new one would move every tenant); else
one generated, only where lookup can see the cluster. Without a cluster (helm template, client-side --dry-run, Argo CD
and other GitOps tools) each render would generate another, moving every tenant and
rolling the pods on each sync: the render fails asking for it. Computed once a render
(kept in .Values): the Secret and its checksum/secret see the same value. */}}
{{- define "compaction-proxy.tenantIdSecret" -}}
{{- $s := .Values.secrets }}
{{- if $s.tenantIdSecret }}{{ $s.tenantIdSecret }}
{{- else if hasKey .Values "_tenantIdSecret" }}{{ index .Values "_tenantIdSecret" }}
{{- else }}
{{- $found := "" }}
{{- with lookup "v1" "Secret" .Release.Namespace (include "compaction-proxy.fullname" .) }}
{{- with .data }}{{ with index . "tenant-id-secret" }}{{ $found = b64dec . }}{{ end }}{{ end }}
{{- end }}
{{- if not $found }}
{{- /* A cluster answers a list with a (maybe empty) list, even for a namespace not
created yet (install --create-namespace); with none to ask, lookup gives nothing. */}}
{{- if not (lookup "v1" "ServiceAccount" .Release.Namespace "") }}
{{- fail "secrets.tenantIdSecret is required when the chart cannot read its Secret back from the cluster (helm template, client-side --dry-run, Argo CD or another GitOps tool): each render would generate another and move every tenant. Set it once and keep it (openssl rand -hex 32; --set secrets.tenantIdSecret=..., or a Secret of your own named in secrets.existingSecret with tenant-id-secret in secrets.existingSecretKeys)" }}
{{- end }}
{{- $found = randAlphaNum 48 }}
{{- end }}
{{- $_ := set .Values "_tenantIdSecret" $found }}
{{- $found }}
{{- end }}
{{- end }}

{{/* The Secret holding the proxy's keys, when there is one: the existing one, or the chart's when any key is set. */}}
{{- define "compaction-proxy.keysSecretName" -}}
{{- if .Values.secrets.existingSecret }}{{ .Values.secrets.existingSecret }}
{{- else if include "compaction-proxy.secretKeys" . }}{{ include "compaction-proxy.fullname" . }}
{{- end }}
{{- end }}

{{/* Whether the chart creates its own Secret (keys given in values, or the store URL). */}}
{{- define "compaction-proxy.createsSecret" -}}
{{- if or (include "compaction-proxy.storeUrlValue" .) (and (not .Values.secrets.existingSecret) (include "compaction-proxy.secretKeys" .)) }}true{{- end }}
{{- end }}

{{/* The bundled store's password Secret: the one given, or the chart's generated one. */}}
{{- define "compaction-proxy.redisSecretName" -}}
{{- .Values.redis.bundled.existingSecret | default (include "compaction-proxy.redisName" .) }}
{{- end }}

{{/* Where the Redis CA bundle is mounted, when there is one. */}}
{{- define "compaction-proxy.redisCaFile" -}}
{{- with .Values.redis.tls }}{{ if or .caSecret .caConfigMap }}/etc/compaction-proxy/redis-ca/{{ .caKey }}{{ end }}{{ end }}
{{- end }}

{{/* How many replicas run at least: a PodDisruptionBudget is only worth it above one. */}}
{{- define "compaction-proxy.minReplicas" -}}
{{- if .Values.autoscaling.enabled }}{{ int .Values.autoscaling.minReplicas }}{{ else }}{{ int .Values.replicaCount }}{{ end }}
{{- end }}

{{/* Refuse combinations that would deploy something that cannot work. */}}
{{- define "compaction-proxy.validate" -}}
{{- $ext := .Values.redis.external }}
{{- $s := .Values.secrets }}
{{- if and .Values.redis.bundled.enabled (or $ext.url $ext.existingSecret) }}
{{- fail "redis: set either redis.external or redis.bundled.enabled, not both" }}
{{- end }}
{{- if and $ext.url $ext.existingSecret }}
{{- fail "redis.external: set either url or existingSecret, not both" }}
{{- end }}
{{- if and (or .Values.redis.bundled.enabled $ext.url $ext.existingSecret) (not (hasPrefix "memory://" (toString .Values.config.store.url))) }}
{{- fail "config.store.url: leave it memory:// when redis.external or redis.bundled provides the store" }}
{{- end }}
{{- if and $s.existingSecret (not $s.existingSecretKeys) }}
{{- fail "secrets.existingSecret: list the keys it holds in secrets.existingSecretKeys (each is then required: a missing one keeps the pod from starting)" }}
{{- end }}
{{- if and $s.existingSecretKeys (not $s.existingSecret) }}
{{- fail "secrets.existingSecretKeys: only with secrets.existingSecret" }}
{{- end }}
{{- $keys := splitList "," (include "compaction-proxy.secretKeys" .) }}
{{- if and (has "previous-encryption-key" $keys) (not (has "encryption-key" $keys)) }}
{{- fail "secrets: previous-encryption-key needs encryption-key (the key that encrypts)" }}
{{- end }}
{{- with .Values.redis.tls }}
{{- if and .caSecret .caConfigMap }}
{{- fail "redis.tls: set either caSecret or caConfigMap, not both" }}
{{- end }}
{{- if and (or .caSecret .caConfigMap) (ne (include "compaction-proxy.storeSource" $) "external") }}
{{- fail "redis.tls: a CA bundle is for an external rediss:// store (redis.external)" }}
{{- end }}
{{- end }}
{{- if include "compaction-proxy.storeIsPerPod" . }}
{{- if .Values.autoscaling.enabled }}
{{- fail "autoscaling.enabled needs a shared store: the memory:// store is per pod, so replicas would not share sessions. Set redis.external.url (or existingSecret) or redis.bundled.enabled=true" }}
{{- end }}
{{- if gt (int .Values.replicaCount) 1 }}
{{- fail "replicaCount > 1 needs a shared store: the memory:// store is per pod, so replicas would not share sessions. Set redis.external.url (or existingSecret) or redis.bundled.enabled=true" }}
{{- end }}
{{- end }}
{{- with .Values.metrics }}
{{- if and .prometheusRule.enabled (not .serviceMonitor.enabled) (not .prometheusRule.targetSelector) }}
{{- fail "metrics.prometheusRule: its down alerts watch the chart's ServiceMonitor's targets, and metrics.serviceMonitor is off: enable it, or name the targets that something else scrapes in metrics.prometheusRule.targetSelector (e.g. job=\"kubernetes-pods\",app=\"llm\")" }}
{{- end }}
{{- if and .prometheusRule.enabled (not (regexMatch "^https?://" .prometheusRule.runbookUrl)) }}
{{- fail "metrics.prometheusRule.runbookUrl: set the absolute http(s) URL where your on-call reads docs/runbook.md (e.g. https://git.example.com/platform/compaction-proxy/blob/main/docs/runbook.md): each alert links its section there, and a relative link is dead in Alertmanager and Grafana" }}
{{- end }}
{{- end }}
{{- $pdb := .Values.podDisruptionBudget }}
{{- if and $pdb.enabled (not (kindIs "invalid" $pdb.minAvailable)) }}
{{- $min := toString $pdb.minAvailable }}
{{- if or (eq $min "100%") (and (regexMatch "^[0-9]+$" $min) (ge (atoi $min) (int (include "compaction-proxy.minReplicas" .)))) }}
{{- fail (printf "podDisruptionBudget.minAvailable %s leaves no pod evictable with %s replicas: node drains would block" $min (include "compaction-proxy.minReplicas" .)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The store URL the proxy's config names: the bundled store's with the password from
the environment, or ${COMPACTION_PROXY_STORE_URL} (from a Secret) with the CA file. */}}
{{- define "compaction-proxy.storeUrl" -}}
{{- $source := include "compaction-proxy.storeSource" . }}
{{- if eq $source "bundled" }}
{{- printf "redis://:${COMPACTION_PROXY_STORE_PASSWORD}@%s:%v/0" (include "compaction-proxy.redisName" .) .Values.redis.bundled.port }}
{{- else if eq $source "external" }}
{{- $url := "${COMPACTION_PROXY_STORE_URL}" }}
{{- with include "compaction-proxy.redisCaFile" . }}
{{- $sep := ternary "&" "?" (contains "?" (include "compaction-proxy.storeUrlValue" $)) }}
{{- $url = printf "%s%sssl_ca_certs=%s" $url $sep . }}
{{- end }}
{{- $url }}
{{- else }}
{{- .Values.config.store.url }}
{{- end }}
{{- end }}

{{/* The proxy's config.yaml: values' config, with secrets replaced by references to the pod's environment. */}}
{{- define "compaction-proxy.config" -}}
{{- $cfg := deepCopy .Values.config }}
{{- $store := $cfg.store | default dict }}
{{- $_ := set $store "url" (include "compaction-proxy.storeUrl" .) }}
{{- $keys := splitList "," (include "compaction-proxy.secretKeys" .) }}
{{- if has "upstream-api-key" $keys }}
{{- $_ := set $cfg "upstream" (merge (dict "api_key" "${COMPACTION_PROXY_UPSTREAM_API_KEY}") ($cfg.upstream | default dict)) }}
{{- end }}
{{- if has "admin-key" $keys }}
{{- $_ := set $cfg "server" (merge (dict "admin_key" "${COMPACTION_PROXY_ADMIN_KEY}") ($cfg.server | default dict)) }}
{{- end }}
{{- if has "tenant-id-secret" $keys }}
{{- $_ := set $cfg "server" (merge (dict "tenant_id_secret" "${COMPACTION_PROXY_TENANT_ID_SECRET}") ($cfg.server | default dict)) }}
{{- end }}
{{- if has "encryption-key" $keys }}
{{- $enc := list "${COMPACTION_PROXY_ENCRYPTION_KEY}" }}
{{- if has "previous-encryption-key" $keys }}
{{- $enc = append $enc "${COMPACTION_PROXY_PREVIOUS_ENCRYPTION_KEY}" }}
{{- end }}
{{- $_ := set $store "encryption_keys" $enc }}
{{- end }}
{{- $_ := set $cfg "store" $store }}
{{- toYaml $cfg }}
{{- end }}

{{/* The config but its tenants: what rolls the pods when it changes (checksum/config). */}}
{{- define "compaction-proxy.rolledConfig" -}}
{{- toYaml (omit (fromYaml (include "compaction-proxy.config" .)) "tenants") }}
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

{{/* The container's resources; the memory limit, unless given, from max_sessions (values.yaml, memorySizing). */}}
{{- define "compaction-proxy.resources" -}}
{{- $res := deepCopy .Values.resources }}
{{- $limits := $res.limits | default dict }}
{{- if not $limits.memory }}
{{- $m := .Values.memorySizing }}
{{- $workers := int (.Values.config.server.workers | default 1) }}
{{- $sessions := int (.Values.config.store.max_sessions | default 100000) }}
{{- $thousands := div (add $sessions 999) 1000 }}
{{- $perProcess := add (int $m.baseMiB) (mul $thousands (int $m.perThousandSessionsMiB)) }}
{{- $_ := set $limits "memory" (printf "%dMi" (add (mul $workers $perProcess) (int $m.headroomMiB))) }}
{{- end }}
{{- $_ := set $res "limits" $limits }}
{{- toYaml $res }}
{{- end }}

{{/* The proxy container's environment: the keys and the store's URL or password from Secrets (the config references them), then extraEnv. Every key is required. */}}
{{- define "compaction-proxy.env" -}}
{{- $secret := include "compaction-proxy.keysSecretName" . }}
{{- $vars := dict "upstream-api-key" "COMPACTION_PROXY_UPSTREAM_API_KEY" "admin-key" "COMPACTION_PROXY_ADMIN_KEY" "encryption-key" "COMPACTION_PROXY_ENCRYPTION_KEY" "previous-encryption-key" "COMPACTION_PROXY_PREVIOUS_ENCRYPTION_KEY" "tenant-id-secret" "COMPACTION_PROXY_TENANT_ID_SECRET" }}
{{- range $key := splitList "," (include "compaction-proxy.secretKeys" .) }}
{{- if $key }}
- name: {{ get $vars $key }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ $key }}
{{- end }}
{{- end }}
{{- $source := include "compaction-proxy.storeSource" . }}
{{- if eq $source "external" }}
{{- $ext := .Values.redis.external }}
- name: COMPACTION_PROXY_STORE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $ext.existingSecret | default (include "compaction-proxy.fullname" .) }}
      key: {{ if $ext.existingSecret }}{{ $ext.existingSecretKey }}{{ else }}redis-url{{ end }}
{{- else if eq $source "bundled" }}
- name: COMPACTION_PROXY_STORE_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "compaction-proxy.redisSecretName" . }}
      key: password
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* The default soft spread over nodes and zones (values: topologySpreadConstraints). */}}
{{- define "compaction-proxy.topologySpread" -}}
{{- if .Values.topologySpreadConstraints }}
{{- toYaml .Values.topologySpreadConstraints }}
{{- else if .Values.defaultTopologySpread }}
{{- range $key := list "kubernetes.io/hostname" "topology.kubernetes.io/zone" }}
- maxSkew: 1
  topologyKey: {{ $key }}
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- include "compaction-proxy.selectorLabels" $ | nindent 6 }}
{{- end }}
{{- end }}
{{- end }}
