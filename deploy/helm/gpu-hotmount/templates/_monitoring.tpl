{{/* The agents' scrape job, as the alerts select it (monitoring.jobSelector). */}}
{{- define "gpu-hotmount.jobSelector" -}}
{{- .Values.monitoring.jobSelector | default (printf "job=%q" (include "gpu-hotmount.fullname" .)) -}}
{{- end -}}

{{/* One alert's labels and annotations: severity, alertLabels, summary, runbook_url. */}}
{{- define "gpu-hotmount.alertMeta" -}}
labels:
  severity: {{ .severity }}
  {{- with .root.Values.monitoring.rules.alertLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
annotations:
  summary: {{ .summary | quote }}
  description: {{ .description | quote }}
  runbook_url: {{ printf "%s#%s" .root.Values.monitoring.runbookBaseUrl (lower .alert) | quote }}
{{- end -}}

{{/*
The alert groups: the PrometheusRule's spec, and deploy/monitoring/gpu-hotmount.rules.yaml
(scripts/render-monitoring.py) for Prometheus without the operator. Runbooks:
docs/runbooks.md, a section per alert. Summaries name the node (the scrape's `node`
label, from the pod's node: the ServiceMonitor's relabeling) and the pod.
*/}}
{{- define "gpu-hotmount.alertGroups" -}}
{{- $job := include "gpu-hotmount.jobSelector" . -}}
{{- $rules := .Values.monitoring.rules -}}
groups:
  - name: gpu-hotmount
    rules:
      - alert: HotmountGPUDoubleBooked
        expr: hotmount_gpu_double_booked{ {{- $job -}} } > 0
        for: 1m
        {{- include "gpu-hotmount.alertMeta" (dict "root" . "alert" "HotmountGPUDoubleBooked" "severity" "critical"
            "summary" `GPU {{ $labels.gpu }} on node {{ $labels.node }} is hot-mounted in pod {{ $labels.namespace }}/{{ $labels.pod }} and the kubelet gave it to pod {{ $labels.other_namespace }}/{{ $labels.other_pod }}`
            "description" "Two pods share one GPU: the kubelet's books count a hot-mounted GPU as free. With --on-double-booking=take-back the agent unmounts it at its next pass; this alert means it stays.") | nindent 8 }}
      - alert: HotmountReconcileStalled
        expr: timestamp(hotmount_reconcile_last_success_timestamp_seconds{ {{- $job -}} }) - hotmount_reconcile_last_success_timestamp_seconds{ {{- $job -}} } > {{ mulf $rules.reconcileStalledIntervals .Values.reconcileInterval }}
        for: 2m
        {{- include "gpu-hotmount.alertMeta" (dict "root" . "alert" "HotmountReconcileStalled" "severity" "critical"
            "summary" `Agent {{ $labels.pod }} on node {{ $labels.node }} has finished no reconcile pass for {{ $value | humanizeDuration }}`
            "description" (printf "No pass finished in %v reconcile intervals: idle reclaim, take-backs, remounts and orphan cleanup have stopped on this node." $rules.reconcileStalledIntervals)) | nindent 8 }}
      - alert: HotmountAgentDown
        expr: up{ {{- $job -}} } == 0
        for: 5m
        {{- include "gpu-hotmount.alertMeta" (dict "root" . "alert" "HotmountAgentDown" "severity" "critical"
            "summary" `Agent {{ $labels.pod }} on GPU node {{ $labels.node }} cannot be scraped`
            "description" "Prometheus cannot read the agent's /metrics: the agent is down, not ready, or refuses the scrape's token. Mounts, unmounts and reclaims on this node fail or wait.") | nindent 8 }}
      - alert: HotmountDriftRepairsRepeated
        expr: increase(hotmount_drift_repairs_total{ {{- $job -}} }[{{ $rules.driftRepairs.window }}]) >= {{ $rules.driftRepairs.threshold }}
        {{- include "gpu-hotmount.alertMeta" (dict "root" . "alert" "HotmountDriftRepairsRepeated" "severity" "warning"
            "summary" (printf "Agent {{ $labels.pod }} on node {{ $labels.node }} repaired {{ $value | humanize }} drifts of kind {{ $labels.kind }} in %s" $rules.driftRepairs.window)
            "description" "Something on the node keeps taking hot-mounted GPUs away (a runtime update, a device-plugin restart, another controller rewriting the cgroup) and the agent keeps putting them back.") | nindent 8 }}
      - alert: HotmountIdleReclaimFailing
        expr: increase(hotmount_gpu_reclaim_failures_total{ {{- $job -}} ,reason="error"}[{{ $rules.reclaimFailures.window }}]) >= {{ $rules.reclaimFailures.threshold }}
        {{- include "gpu-hotmount.alertMeta" (dict "root" . "alert" "HotmountIdleReclaimFailing" "severity" "warning"
            "summary" (printf "Agent {{ $labels.pod }} on node {{ $labels.node }} failed {{ $value | humanize }} idle reclaims in %s" $rules.reclaimFailures.window)
            "description" "Idle GPUs the agent should take back stay mounted: the unmount fails. They stay unavailable to other pods.") | nindent 8 }}
      - alert: HotmountMountsRefusedForQuota
        expr: rate(hotmount_operations_refused_total{ {{- $job -}} ,reason="QuotaExceeded"}[{{ $rules.quotaRefusals.window }}]) * 60 >= {{ $rules.quotaRefusals.perMinute }}
        {{- include "gpu-hotmount.alertMeta" (dict "root" . "alert" "HotmountMountsRefusedForQuota" "severity" "warning"
            "summary" `Agent {{ $labels.pod }} on node {{ $labels.node }} refuses {{ $value | humanize }} {{ $labels.operation }} calls a minute for ResourceQuota`
            "description" "A namespace's ResourceQuota has no room for the pin or holder pod a mount needs; its users keep asking.") | nindent 8 }}
      - alert: HotmountTokenReviewsAtBound
        expr: hotmount_token_reviews{ {{- $job -}} ,state="reviewing"} >= ignoring(state) hotmount_token_reviews_limit{ {{- $job -}} }
        for: {{ $rules.tokenReviewsAtBound.for }}
        {{- include "gpu-hotmount.alertMeta" (dict "root" . "alert" "HotmountTokenReviewsAtBound" "severity" "warning"
            "summary" `Agent {{ $labels.pod }} on node {{ $labels.node }} runs {{ $value }} TokenReviews at once, its bound (--max-token-reviews)`
            "description" "Calls with tokens the agent does not know yet get 429 while the bound is reached: many new tokens (a flood, or a client minting one per call) or a slow API server.") | nindent 8 }}
      - alert: HotmountOnDemandQueueNotDraining
        expr: min_over_time(hotmount_ondemand_queue_length{ {{- $job -}} }[{{ $rules.onDemandQueue.for }}]) > 0 unless on (job, instance) sum by (job, instance) (increase(hotmount_ondemand_attaches_total{ {{- $job -}} }[{{ $rules.onDemandQueue.for }}])) > 0
        {{- include "gpu-hotmount.alertMeta" (dict "root" . "alert" "HotmountOnDemandQueueNotDraining" "severity" "warning"
            "summary" (printf "Agent {{ $labels.pod }} on node {{ $labels.node }} has had at least {{ $value }} on-demand notebooks waiting for a GPU for %s, and attached none" $rules.onDemandQueue.for)
            "description" "Notebooks wait in the node's on-demand queue and no GPU goes to any of them: every on-demand GPU is busy (cells running), the GPUs are held by ordinary pods or hot-mounts, or resumes fail.") | nindent 8 }}
{{- end -}}
