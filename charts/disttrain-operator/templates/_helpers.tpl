{{- define "disttrain.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "disttrain.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "disttrain.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "disttrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "disttrain.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The rules the operator needs on job namespaces: what it reads, creates and deletes. */}}
{{- define "disttrain.jobRules" -}}
# The jobs are watched (never read one by one), their status patched, and a job past its
# ttlSecondsAfterFinished deleted. Every verb here was used in `make test`
# (tests/integration/test_rbac_audit.py fails on one that isn't).
- apiGroups: [disttrain.dev]
  resources: [disttrainjobs]
  verbs: [list, watch, delete]
- apiGroups: [disttrain.dev]
  resources: [disttrainjobs/status]
  verbs: [patch]
# patch: an elastic MPI job's launcher gets an annotation when discover_hosts.sh changes, so the
# kubelet refreshes its ConfigMap volume at once rather than at its next periodic sync.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, create, delete, patch]
# get: only when a create finds the name taken, to see whose object is there (an earlier job's
# is waited out; anything else's fails the job). Secrets are never read: an MPI job's is named for
# its uid, so one found there is its own.
- apiGroups: [""]
  resources: [services]
  verbs: [create, get]
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [create, get, patch]
# A gang's group (runPolicy.scheduling.gang): made before the pods, deleted when the job
# finishes; get: whose group holds the name, and a Volcano group's phase.
- apiGroups: [scheduling.k8s.io]
  resources: [workloads, podgroups]
  verbs: [create, get, delete]
- apiGroups: [scheduling.x-k8s.io, scheduling.volcano.sh]
  resources: [podgroups]
  verbs: [create, get, delete]
# Kueue (a job labelled kueue.x-k8s.io/queue-name): its Workload, watched, and its status kept.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [list, watch, create, delete, patch]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [patch]
# The opt-in NetworkPolicy (runPolicy.networkPolicy); get: whose policy holds the name.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create, get]
# DRA: an MPI worker's ResourceClaimTemplates and ResourceClaims, each read once per job, give it
# its slots (operator/disttrain/control/claims.py).
- apiGroups: [resource.k8s.io]
  resources: [resourceclaimtemplates, resourceclaims]
  verbs: [get]
# kopf and the operator post core/v1 events, each a create (no aggregation patches).
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}

{{/* The operator's image: [<registry>/]<repository>[:<tag>][@<digest>]. */}}
{{- define "disttrain.image" -}}
{{- $image := .Values.image -}}
{{- $name := $image.repository -}}
{{- with $image.registry }}{{ $name = printf "%s/%s" (trimSuffix "/" .) $name }}{{ end -}}
{{- $name = printf "%s:%s" $name ($image.tag | default .Chart.AppVersion) -}}
{{- with $image.digest }}{{ $name = printf "%s@%s" $name . }}{{ end -}}
{{- $name -}}
{{- end -}}
