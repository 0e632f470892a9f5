{{/* The chart's name: nameOverride, else the chart's. */}}
{{- define "forensics.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end }}

{{/* The objects' name: fullnameOverride, else the release's name when it holds the chart's name, else
RELEASE-NAME. `helm install forensics-agent` names them as `forensics agent manifest` does. */}}
{{- define "forensics.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "forensics.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* A cluster-scoped object's name (ClusterRole, ClusterRoleBinding): NAMESPACE:FULLNAME, so that releases in two
namespaces never share one. */}}
{{- define "forensics.clusterName" -}}
{{- printf "%s:%s" .Release.Namespace (include "forensics.fullname" .) -}}
{{- end }}

{{/* The pods' service account: the chart's (serviceAccount.create), else one of yours (`default` unless named). */}}
{{- define "forensics.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "forensics.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end }}

{{/* The labels the agent's pods are selected by (the same as `forensics agent manifest`'s). */}}
{{- define "forensics.selectorLabels" -}}
app.kubernetes.io/name: {{ include "forensics.name" . | toJson }}
app.kubernetes.io/part-of: forensics
{{- end }}

{{/* Object labels: the selector labels and Helm's own. */}}
{{- define "forensics.labels" -}}
{{ include "forensics.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name | toJson }}
app.kubernetes.io/managed-by: {{ .Release.Service | toJson }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | toJson }}
{{- end }}

{{/* The bytes of a size value (values.schema.json's: a count of bytes, or N with K, M, G, T, Ki ... TiB, either
case, all binary, a decimal fraction allowed; under 8 PiB): what forensics.argspec.parse_size reads the same text to.
A form the schema refuses (a render with --skip-schema-validation) fails the render: never a silent 0. */}}
{{- define "forensics.bytes" -}}
{{- if not (kindIs "string" .) -}}
{{- int64 . -}}
{{- else -}}
{{- $text := . -}}
{{- if not (regexMatch "^[0-9]+([.][0-9]+)?([KkMmGgTt][Ii]?)?[Bb]?$" $text) -}}
{{- fail (printf "%q is not a size (a count of bytes, or with K, M, G, T, Ki, Mi, Gi, Ti: all binary, e.g. 4096, 512M, 20Gi)" $text) -}}
{{- end -}}
{{- $number := regexFind "^[0-9]+([.][0-9]+)?" $text -}}
{{- $unit := trimPrefix $number $text | upper | trimSuffix "B" | trimSuffix "I" -}}
{{- $bytes := mulf (float64 $number) (float64 (get (dict "" "1" "K" "1024" "M" "1048576" "G" "1073741824" "T" "1099511627776") $unit)) -}}
{{- if ge $bytes 9007199254740992.0 -}}
{{- fail (printf "%q is not a size: larger than 8 PiB" $text) -}}
{{- end -}}
{{- int64 $bytes -}}
{{- end -}}
{{- end }}

{{/* The keeper container's command (JSON): `agent keep` installs the handler with its bounds and restores the
previous core_pattern when the pod stops. */}}
{{- define "forensics.keepCommand" -}}
{{- $v := .Values -}}
{{- $keep := list (printf "%s/bin/forensics" $v.hostPrefix) "agent" "keep" "--core-dir" $v.coreDir -}}
{{- range $name := list "budget" "loopLimit" "maxCoreSize" "minFree" -}}{{/* (a loop limit is a count: bytes of it, itself) */}}
{{- $value := index $v.handler $name -}}
{{- if not (kindIs "invalid" $value) -}}
{{- $keep = append $keep (printf "--%s" (kebabcase $name)) -}}
{{- $keep = append $keep (include "forensics.bytes" $value) -}}
{{- end -}}
{{- end -}}
{{ toJson $keep }}
{{- end }}

{{/* The agent container's command (JSON): `agent serve`; $(NODE_NAME) and $(POD_IP) are the kubelet's expansions. */}}
{{- define "forensics.serveCommand" -}}
{{- $v := .Values -}}
{{- $serve := list (printf "%s/bin/forensics" $v.hostPrefix) "agent" "serve" "--core-dir" $v.coreDir
      "--metrics-port" (toString (int64 $v.metrics.port)) "--metrics-address" "$(POD_IP)" "--node-name" "$(NODE_NAME)"
      "--analysis-timeout" (toString (int64 $v.analysis.timeout)) "--analysis-memory" (include "forensics.bytes" $v.analysis.memory)
      "--analysis-output-max" (include "forensics.bytes" $v.analysis.outputMax) -}}
{{- with $v.upload -}}
{{- if .url -}}
{{- $serve = concat $serve (list "--upload" .url "--cluster" .cluster "--upload-max-bandwidth" (include "forensics.bytes" .maxBandwidth)
      "--upload-concurrency" (toString (int64 .concurrency)) "--upload-max-pending" (toString (int64 .maxPending))
      "--upload-max-pending-bytes" (include "forensics.bytes" .maxPendingBytes)
      "--upload-max-attempts" (toString (int64 .maxAttempts))) -}}
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
