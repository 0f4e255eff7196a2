{{/* What helm prints after install/upgrade (NOTES.txt); a named template so tests can render it. */}}
{{- define "compaction-proxy.notes" -}}
{{- $fullname := include "compaction-proxy.fullname" . -}}
{{- $source := include "compaction-proxy.storeSource" . -}}
compaction-proxy {{ .Chart.AppVersion }} is deployed as {{ $fullname }} in namespace {{ .Release.Namespace }}.

Point an OpenAI SDK's base_url at it:
  inside the cluster:  http://{{ $fullname }}.{{ .Release.Namespace }}.svc:{{ .Values.service.port }}/v1
  from here:           kubectl -n {{ .Release.Namespace }} port-forward svc/{{ $fullname }} 8080:{{ .Values.service.port }}
                       then http://127.0.0.1:8080/v1

Store: {{ if eq $source "bundled" }}the bundled Valkey ({{ include "compaction-proxy.redisName" . }}, password in Secret {{ include "compaction-proxy.redisSecretName" . }}){{ else if eq $source "external" }}external Redis (URL from Secret {{ .Values.redis.external.existingSecret | default $fullname }}){{ else }}{{ .Values.config.store.url }}{{ end }}
{{- if include "compaction-proxy.storeIsPerPod" . }}
  The memory:// store is per pod (and per worker process): sessions do not survive
  a restart and are not shared. Use Redis (redis.external or redis.bundled) before
  scaling out.
{{- with .Values.config.server.workers }}
{{- if gt (int .) 1 }}
  WARNING: server.workers={{ . }} with the memory:// store: each worker process has
  its own sessions, so a conversation's turns may land on workers that do not share
  its summary. Use Redis.
{{- end }}
{{- end }}
{{- end }}

Health:  /healthz (liveness), /readyz (readiness)   Metrics: /metrics on port {{ .Values.service.port }}
{{- if .Values.metrics.serviceMonitor.enabled }} (ServiceMonitor {{ $fullname }}){{ end }}
{{- if and .Values.dashboards.enabled (.Files.Glob "dashboards/*.json") }}
Grafana: ConfigMap {{ $fullname }}-dashboards
  (labels {{ range $k, $v := .Values.dashboards.labels }}{{ $k }}={{ $v | quote }} {{ end }}) for the Grafana sidecar.
{{- end }}
{{- if not (include "compaction-proxy.keysSecretName" .) }}
No upstream key is configured: each caller's own Authorization header is forwarded.
{{- end }}
Check the rendered config: kubectl -n {{ .Release.Namespace }} exec deploy/{{ $fullname }} -- compaction-proxy check-config /etc/compaction-proxy/config.yaml
{{- end }}
