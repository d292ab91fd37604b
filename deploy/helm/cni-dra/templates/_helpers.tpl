{{/* The name of every object: "cni-dra" for a release named after the chart. */}}
{{- define "cni-dra.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "cni-dra.serviceAccountName" -}}
{{- default (include "cni-dra.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* Labels of every object; the selector uses the first two only. */}}
{{- define "cni-dra.selectorLabels" -}}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cni-dra.labels" -}}
{{ include "cni-dra.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{- define "cni-dra.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The plugin's entry of the conflist, keys in the order README "Config reference" lists them.
The context: the root, or a dict {Values, ipam} for a node of network.ipamByNode. */}}
{{- define "cni-dra.conflist" -}}
{{- $n := .Values.network -}}
{{- $ipam := (hasKey . "ipam") | ternary (get . "ipam") $n.ipam -}}
{
  "cniVersion": {{ $n.cniVersion | toString | toJson }},
  "name": {{ $n.name | toJson }},
  "plugins": [
    {
      "type": "cni-dra",
      "driver": {{ .Values.driver | toJson }},
      "stateDir": {{ .Values.stateDir | toJson }},
      "inventory": {{ .Values.inventory.path | toJson }},
      "linkType": {{ $n.linkType | toJson }},
      "mode": {{ $n.mode | toJson }},
      {{- if not (kindIs "invalid" $n.shaping) }}
      "shaping": {{ $n.shaping | toJson }},
      {{- end }}
      {{- with $n.profiles }}
      "profiles": {{ toJson . }},
      {{- end }}
      {{- range $key, $value := $n.extraConfig }}
      {{ $key | toJson }}: {{ $value | toJson }},
      {{- end }}
      "capabilities": {{ $n.capabilities | toJson }},
      "ipam": {{ $ipam | toJson }}
    }
  ]
}
{{- end -}}
