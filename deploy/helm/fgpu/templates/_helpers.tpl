{{- define "fgpu.name" -}}fgpu{{- end -}}
{{- define "fgpu.labels" -}}
app.kubernetes.io/name: fgpu
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "fgpu.selector" -}}
app.kubernetes.io/name: fgpu
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
{{- define "fgpu.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag }}{{- end -}}
