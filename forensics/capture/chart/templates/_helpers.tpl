{{/* The labels the agent's pods are selected by (the same as `forensics agent manifest`'s). */}}
{{- define "forensics.selectorLabels" -}}
app.kubernetes.io/name: forensics-agent
app.kubernetes.io/part-of: forensics
{{- end }}

{{/* Object labels: the selector labels and Helm's own. */}}
{{- define "forensics.labels" -}}
{{ include "forensics.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name | toJson }}
app.kubernetes.io/managed-by: {{ .Release.Service | toJson }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | toJson }}
{{- end }}

{{/* The keeper container's command (JSON): `agent keep` installs the handler with its bounds and restores the
previous core_pattern when the pod stops. */}}
{{- define "forensics.keepCommand" -}}
{{- $v := .Values -}}
{{- $keep := list (printf "%s/bin/forensics" $v.hostPrefix) "agent" "keep" "--core-dir" $v.coreDir -}}
{{- range $name := list "budget" "loopLimit" "maxCoreSize" "minFree" -}}
{{- $value := index $v.handler $name -}}
{{- if not (kindIs "invalid" $value) -}}
{{- $keep = append $keep (printf "--%s" (kebabcase $name)) -}}
{{- $keep = append $keep (toString (int64 $value)) -}}
{{- end -}}
{{- end -}}
{{ toJson $keep }}
{{- end }}

{{/* The agent container's command (JSON): `agent serve`; $(NODE_NAME) and $(POD_IP) are the kubelet's expansions. */}}
{{- define "forensics.serveCommand" -}}
{{- $v := .Values -}}
{{- $serve := list (printf "%s/bin/forensics" $v.hostPrefix) "agent" "serve" "--core-dir" $v.coreDir
      "--metrics-port" (toString (int64 $v.metrics.port)) "--metrics-address" "$(POD_IP)" "--node-name" "$(NODE_NAME)"
      "--analysis-timeout" (toString (int64 $v.analysis.timeout)) "--analysis-memory" (toString (int64 $v.analysis.memory))
      "--analysis-output-max" (toString (int64 $v.analysis.outputMax)) -}}
{{- with $v.upload -}}
{{- if .url -}}
{{- $serve = concat $serve (list "--upload" .url "--cluster" .cluster "--upload-max-bandwidth" (toString (int64 .maxBandwidth))
      "--upload-concurrency" (toString (int64 .concurrency)) "--upload-max-pending" (toString (int64 .maxPending))
      "--upload-max-pending-bytes" (toString (int64 .maxPendingBytes))) -}}
{{- if .keep -}}{{- $serve = append $serve "--upload-keep" -}}{{- end -}}
{{- if .endpointUrl -}}{{- $serve = concat $serve (list "--endpoint-url" .endpointUrl) -}}{{- end -}}
{{- if .region -}}{{- $serve = concat $serve (list "--region" .region) -}}{{- end -}}
{{- end -}}
{{- end -}}
{{ toJson $serve }}
{{- end }}

{{- define "forensics.image" -}}
{{ printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
