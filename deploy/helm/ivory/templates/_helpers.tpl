{{- define "ivory.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "ivory.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ivory.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ivory.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ivory.labels" -}}
{{ include "ivory.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: ivory
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "ivory.serviceAccountName" -}}
{{- default (include "ivory.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "ivory.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- if not (regexMatch "^sha256:[a-f0-9]{64}$" .Values.image.digest) -}}
{{- fail (printf "image.digest must be sha256:<64 lower-case hex digits>, got %q" .Values.image.digest) -}}
{{- end -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "ivory.policiesConfigMap" -}}
{{- if .Values.existingPoliciesConfigMap -}}
{{- .Values.existingPoliciesConfigMap -}}
{{- else if .Values.policies -}}
{{- printf "%s-policies" (include "ivory.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* DNS names the serving certificate must cover. */}}
{{- define "ivory.dnsNames" -}}
{{- $svc := include "ivory.fullname" . -}}
- {{ $svc }}
- {{ $svc }}.{{ .Release.Namespace }}
- {{ $svc }}.{{ .Release.Namespace }}.svc
- {{ $svc }}.{{ .Release.Namespace }}.svc.cluster.local
{{- end -}}

{{- /* The shared cache's URL: sharedCache.url, else the bundled server's Service. */ -}}
{{- define "ivory.sharedCacheURL" -}}
{{- if .Values.sharedCache.url -}}
{{- .Values.sharedCache.url -}}
{{- else if .Values.sharedCache.server.enabled -}}
{{- printf "redis://%s-cache.%s.svc:6379" (include "ivory.fullname" .) .Release.Namespace -}}
{{- else -}}
{{- fail "sharedCache.enabled needs sharedCache.url, sharedCache.urlSecret or sharedCache.server.enabled" -}}
{{- end -}}
{{- end -}}

{{- define "ivory.sharedCacheSelectorLabels" -}}
app.kubernetes.io/name: {{ include "ivory.name" . }}-cache
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- /* The trusted root's source the values choose: "file", "tuf" or "" (the root built into
ivory). `file` replaces the public-good default; with another mirror the two are refused. */ -}}
{{- define "ivory.trustRootSource" -}}
{{- $file := .Values.trustRoot.file -}}
{{- $tuf := .Values.trustRoot.tuf -}}
{{- if and $file.configMap $file.secret -}}
{{- fail "trustRoot.file: set configMap or secret, not both" -}}
{{- end -}}
{{- if or $file.configMap $file.secret -}}
{{- if and $tuf.mirror (ne $tuf.mirror "public-good") -}}
{{- fail (printf "trustRoot.file and trustRoot.tuf.mirror %s: choose one (ivory serve takes --trusted-root or --tuf-mirror)" $tuf.mirror) -}}
{{- end -}}
file
{{- else if $tuf.mirror -}}
{{- if and (ne $tuf.mirror "public-good") (not $tuf.rootConfigMap.name) -}}
{{- fail (printf "trustRoot.tuf.mirror %s needs trustRoot.tuf.rootConfigMap.name: the root.json its chain starts from (--tuf-root)" $tuf.mirror) -}}
{{- end -}}
tuf
{{- end -}}
{{- end -}}
