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

{{/* One word for sh -c, quoted as Python's shlex.quote does; $(NODE_NAME) and $(POD_IP) are left to the
kubelet's expansion. */}}
{{- define "forensics.sh" -}}
{{- if or (eq . "$(NODE_NAME)") (eq . "$(POD_IP)") (regexMatch "^[A-Za-z0-9@%+=:,./_-]+$" .) -}}
{{ . }}
{{- else -}}
'{{ replace "'" "'\"'\"'" . }}'
{{- end -}}
{{- end }}

{{- define "forensics.words" -}}
{{- $out := list -}}
{{- range . -}}{{- $out = append $out (include "forensics.sh" (toString .)) -}}{{- end -}}
{{ join " " $out }}
{{- end }}

{{/* The agent container's shell line: install the handler with its bounds, then exec `agent serve`. */}}
{{- define "forensics.shell" -}}
{{- $v := .Values -}}
{{- $handler := printf "%s/bin/forensics" $v.hostPrefix -}}
{{- $install := list $handler "capture" "--install-handler" "--core-dir" $v.coreDir -}}
{{- range $name := list "budget" "loopLimit" "maxCoreSize" "minFree" -}}
{{- $value := index $v.handler $name -}}
{{- if not (kindIs "invalid" $value) -}}
{{- $install = append $install (printf "--%s" (kebabcase $name)) -}}
{{- $install = append $install (toString (int64 $value)) -}}
{{- end -}}
{{- end -}}
{{- $serve := list $handler "agent" "serve" "--core-dir" $v.coreDir "--metrics-port" (toString (int64 $v.metrics.port))
      "--metrics-address" "$(POD_IP)" "--node-name" "$(NODE_NAME)"
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
{{ include "forensics.words" $install }} && exec {{ include "forensics.words" $serve }}
{{- end }}

{{- define "forensics.image" -}}
{{ printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
