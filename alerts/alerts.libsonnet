// Alerts. Every alert carries `summary` (a static sentence), `description` (with the value
// and the labels that locate the problem), `runbook_url` (its section of runbook.md),
// a `severity` label and a `for` duration; all knobs are in config.libsonnet under
// `alerts.<AlertName>`.
{
  local c = $._config,
  local a = c.alerts,
  local rec = $._recordedNames,

  // Labels that identify one exporter series of one model on one target. The cluster
  // label is always listed: joining on a label that no series has costs nothing.
  local exporterOn = '%s, job, instance, target, model_name' % c.clusterLabel,
  local vllmOn = '%s, job, model_name' % c.clusterLabel,
  local windowMatcher(window) = if window == '' then '' else ', window="%s"' % window,
  local exp(metric, window='') = '%s{%s%s}' % [metric, c.exporterSelector, windowMatcher(window)],

  // Where a target's SD problem is, in words, for descriptions: exporter series carry
  // `target`; the vLLM recording rules carry `job` only.
  local where = '{{ $labels.model_name }} on {{ with $labels.target }}target {{ . }}{{ else }}job {{ $labels.job }}{{ end }}',

  // Link to the dashboard filtered to the alert's target and model (the variables of
  // dashboards/common.libsonnet); vLLM-source alerts have no target and select the vLLM job.
  local link(file, query) =
    if c.grafanaURL == '' then {}
    else { dashboard_url: '%s/d/%s/?%s' % [c.grafanaURL, c.dashboardUIDs[file], query] },
  local dashboardURL = link(
    'specwatch-sd-overview.json',
    '{{ with $labels.target }}var-target={{ . | urlquery }}{{ else }}var-vllm_job={{ $labels.job | urlquery }}{{ end }}&var-model_name={{ $labels.model_name | urlquery }}',
  ),
  local exporterURL(byTarget) = link(
    'specwatch-exporter.json',
    'var-job={{ $labels.job | urlquery }}' + (if byTarget then '&var-target={{ $labels.target | urlquery }}' else ''),
  ),

  // One alert rule from its config block; [] when switched off.
  local alert(name, expr, summary, description, extraAnnotations={}) =
    local cfg = a[name];
    if !cfg.enabled then [] else [
      {
        alert: name,
        expr: expr,
        'for': cfg['for'],
        labels: c.alertLabels { severity: cfg.severity },
        annotations: {
          summary: summary,
          description: description,
          runbook_url: c.runbookURLPattern % std.asciiLower(name),
        } + extraAnnotations,
      } + (
        if std.objectHas(cfg, 'keepFiringFor') && cfg.keepFiringFor != ''
        then { keep_firing_for: cfg.keepFiringFor }
        else {}
      ),
    ],

  local low = a.SDAcceptanceRateLow,
  // An isolated missing sample (one failed poll removes the target's series from one
  // scrape; a missed scrape) makes an instant selector return nothing, which resets the
  // `for` clock: pending -> inactive -> pending. last_over_time() reads the latest sample
  // within the grace instead (range selectors skip staleness markers), so the clock keeps
  // running through a gap; a series that has really gone (idle server) is still absent
  // after the grace.
  local graced(sel) =
    if low.missingSampleGrace == '' then sel
    else 'last_over_time(%s[%s])' % [sel, low.missingSampleGrace],
  assert std.member(['alpha', 'rate'], low.measure) : "alerts.SDAcceptanceRateLow.measure must be 'alpha' or 'rate', got %s" % low.measure,
  local alpha = low.measure == 'alpha',
  local lowExpr =
    if low.source == 'exporter' then
      |||
        %(rate)s < %(threshold)g
      ||| % {
        rate: graced(exp(if alpha then 'sd_acceptance_alpha' else 'sd_acceptance_rate', low.window)),
        threshold: low.threshold,
      }
      + (
        // The arrival rate where the exporter derives one; where it cannot (an engine that
        // counts no finished requests: llama.cpp), the poll intervals with enough drafts
        // for an acceptance sample, or the alert could never fire for that engine.
        if low.minArrivalRate > 0 then |||
          and on (%(on)s)
          (
            %(arrival)s >= %(min)g
            or on (%(on)s)
            (
              increase(%(samples)s[%(pw)s]) >= %(minPolls)g
              unless on (%(on)s) %(arrival)s
            )
          )
        ||| % {
          on: exporterOn,
          arrival: graced(exp('sd_arrival_rate', low.window)),
          min: low.minArrivalRate,
          samples: exp('sd_acceptance_rate_samples_count'),
          pw: low.draftedPollsWindow,
          minPolls: low.minDraftedPolls,
        }
        else ''
      )
    else if low.source == 'vllm' then
      |||
        %(rate)s < %(threshold)g
      ||| % {
        rate: graced(if alpha then rec.acceptanceAlpha else rec.acceptanceRate),
        threshold: low.threshold,
      }
      + (
        // The arrival rate where the engine records one; the drafts rate where it does not
        // (llama.cpp counts no finished requests), or the alert could never fire for it.
        if low.minArrivalRate > 0 then |||
          and on (%(on)s)
          (
            %(arrival)s >= %(min)g
            or on (%(on)s)
            (%(drafts)s >= %(minDrafts)g unless on (%(on)s) %(arrival)s)
          )
        ||| % {
          on: vllmOn,
          arrival: graced(rec.arrivalRate),
          min: low.minArrivalRate,
          drafts: graced(rec.drafts),
          minDrafts: low.minDraftRate,
        }
        else ''
      )
    else error "alerts.SDAcceptanceRateLow.source must be 'exporter' or 'vllm', got %s" % low.source,
  local lowWindow = if low.source == 'exporter' then low.window else c.rateWindow,
  // What the low-acceptance alert compared, in words (the α's `method` label decides).
  local lowMeasure =
    // One template part: each costs a label value's worth of the controller's webhook body.
    if alpha then 'acceptance α (method {{ $labels.method }}: first_position is the share of drafts whose first token was accepted, per_token the per-token α solved from the acceptance length and k; unlike the acceptance rate it does not fall with k)'
    else "acceptance rate (vLLM's accepted / proposed draft tokens)",

  // The SD dashboard link, for alert groups kept in other files (alerts/measured.libsonnet).
  sdDashboardURL:: dashboardURL,

  prometheusAlerts+:: {
    groups+: [
      {
        name: 'specwatch-speculative-decoding',
        rules: std.flattenArrays([
          alert(
            'SDAcceptanceRateLow',
            lowExpr,
            if alpha then 'Speculative decoding acceptance is low.'
            else 'Speculative decoding acceptance rate is low.',
            'The %(w)s %(measure)s of %(where)s has been {{ $value | humanizePercentage }} for %(for)s (threshold %(t)g): %(what)s, and their verification is wasted work.' % {
              w: lowWindow,
              measure: lowMeasure,
              where: where,
              'for': low['for'],
              t: low.threshold,
              what: if alpha then 'most drafts are rejected early' else 'most draft tokens are rejected',
            },
            dashboardURL,
          ),
          alert(
            'SDPredictedSpeedupLow',
            |||
              %(speedup)s < %(threshold)g
              and on (%(on)s)
              %(valid)s == 1
            ||| % {
              speedup: exp('sd_predicted_speedup'),
              valid: exp('sd_model_valid'),
              threshold: a.SDPredictedSpeedupLow.threshold,
              on: exporterOn,
            },
            'Speculative decoding is predicted to bring little or no speedup.',
            'The latency model predicts a speedup of {{ printf "%%.2f" $value }}x for %(where)s at the current load (threshold %(t)gx; below 1 speculative decoding makes requests slower).' % {
              where: where,
              t: a.SDPredictedSpeedupLow.threshold,
            },
            dashboardURL,
          ),
          alert(
            'SDPredictedSlowdown',
            // The upper end of the 90% interval below 1: the whole interval is.
            |||
              %(upper)s < 1
              and on (%(on)s)
              %(valid)s == 1
            ||| % {
              upper: exp('sd_predicted_speedup_upper'),
              valid: exp('sd_model_valid'),
              on: exporterOn,
            },
            'Speculative decoding is predicted to make requests slower.',
            'The latency model predicts that speculative decoding makes requests of %(where)s slower at the current load: the whole 90%% interval of the predicted speedup is below 1 (upper end {{ printf "%%.2f" $value }}x) and the prediction is valid. Turn SD off or lower k for this load.' % {
              where: where,
            },
            dashboardURL,
          ),
          alert(
            'SDArrivalRateAboveBreakeven',
            // The model's series carry the window they were computed over (the exporter's
            // model window); the arrival rate of that same window is compared with them.
            |||
              %(arrival)s
              > on (%(on)s, window)
              %(breakeven)s
            ||| % {
              arrival: exp('sd_arrival_rate'),
              breakeven: exp('sd_breakeven_arrival_rate'),
              on: exporterOn,
            },
            'Arrival rate is above the break-even point of speculative decoding.',
            'The %(w)s arrival rate of %(where)s is {{ printf "%%.3g" $value }} req/s, above the break-even arrival rate{{ with printf "sd_breakeven_arrival_rate{job=%%q,instance=%%q,target=%%q,model_name=%%q,window=%%q}" $labels.job $labels.instance $labels.target $labels.model_name $labels.window | query }}{{ with . | first }} of {{ .Value | printf "%%.3g" }} req/s{{ end }}{{ end }}: at this load speculative decoding makes requests slower.' % {
              where: where,
              w: '{{ $labels.window }}',
            },
            dashboardURL,
          ),
          alert(
            'SDAcceptanceBimodal',
            |||
              %(bc)s > %(threshold)g
              and on (%(on)s)
              increase(%(samples)s[30m]) >= %(min)g
            ||| % {
              bc: exp('sd_acceptance_bimodality_coefficient', a.SDAcceptanceBimodal.window),
              samples: exp('sd_acceptance_rate_samples_count'),
              threshold: a.SDAcceptanceBimodal.threshold,
              min: a.SDAcceptanceBimodal.minSamples,
              on: exporterOn,
            },
            'Speculative decoding acceptance has split into two populations.',
            'The bimodality coefficient of the acceptance samples of %(where)s is {{ printf "%%.2f" $value }} (above %(t)g suggests two modes): some traffic drafts well and some badly, so the mean acceptance rate describes neither. Consider routing or a drafter per traffic class.' % {
              where: where,
              t: a.SDAcceptanceBimodal.threshold,
            },
            dashboardURL,
          ),
          alert(
            'SDModelSaturated',
            '%s > %g\n' % [exp('sd_model_utilization'), a.SDModelSaturated.threshold],
            'The latency model predicts the server is close to saturation.',
            'The latency model puts the utilisation of %(where)s at {{ $value | humanizePercentage }} (threshold %(t)g): latency grows without bound as it approaches 100%%, with or without speculative decoding.' % {
              where: where,
              t: a.SDModelSaturated.threshold,
            },
            dashboardURL,
          ),
          alert(
            'SDModelInvalid',
            // Saturation also makes the model invalid; SDModelSaturated reports that case.
            // An idle server is invalid by construction (no finished requests, no lengths):
            // the alert needs traffic in the model's window.
            |||
              %(valid)s == 0
              unless on (%(on)s, window)
              %(utilization)s > %(saturated)g
              and on (%(on)s, window)
              %(arrival)s >= %(min)g
            ||| % {
              valid: exp('sd_model_valid'),
              utilization: exp('sd_model_utilization'),
              saturated: a.SDModelSaturated.threshold,
              arrival: exp('sd_arrival_rate'),
              min: a.SDModelInvalid.minArrivalRate,
              on: exporterOn,
            },
            'The latency model cannot make a valid prediction.',
            'The latency model of %(where)s has been invalid for %(for)s (inputs missing or out of range): predicted speedup, break-even arrival rate and optimal draft length are not available or not trustworthy.{{ with printf "sd_model_utilization{job=%%q,instance=%%q,target=%%q,model_name=%%q,window=%%q}" $labels.job $labels.instance $labels.target $labels.model_name $labels.window | query }}{{ with . | first }} Model utilisation: {{ .Value | humanizePercentage }}.{{ end }}{{ end }}' % {
              where: where,
              'for': a.SDModelInvalid['for'],
            },
            dashboardURL,
          ),
          alert(
            'SDModelDrift',
            |||
              %(err)s > %(threshold)g or %(err)s < -%(threshold)g
            ||| % {
              err: exp('sd_model_latency_error_ratio', c.exporterWindow),
              threshold: a.SDModelDrift.threshold,
            },
            'The latency model no longer matches the measured latency.',
            'The latency model of %(where)s predicts a mean latency {{ $value | humanizePercentage }} away from the measured one (predicted/measured - 1, threshold %(threshold)g) for %(for)s: its speedup, break-even and best k describe another system. Re-calibrate the parameters file.' % {
              where: where,
              threshold: a.SDModelDrift.threshold,
              'for': a.SDModelDrift['for'],
            },
            dashboardURL,
          ),
        ]),
      },
      {
        name: 'specwatch-exporter',
        rules: std.flattenArrays([
          alert(
            'SpecwatchTargetDown',
            '%s == 0\n' % exp('specwatch_target_up'),
            'An inference server cannot be polled by specwatch.',
            'specwatch {{ $labels.instance }} has failed to poll target {{ $labels.target }} for %(for)s; its SD series are absent and its SD alerts cannot fire.{{ with printf "topk(1, increase(specwatch_target_poll_errors_total{job=%%q,instance=%%q,target=%%q}[10m]))" $labels.job $labels.instance $labels.target | query }}{{ with . | first }} Most frequent poll error in the last 10 minutes: {{ .Labels.reason }}.{{ end }}{{ end }}' % {
              'for': a.SpecwatchTargetDown['for'],
            },
            exporterURL(true),
          ),
          alert(
            'SpecwatchExporterDown',
            'up{%s} == 0\n' % c.exporterSelector,
            'Prometheus cannot scrape a specwatch exporter.',
            'Prometheus has failed to scrape specwatch at {{ $labels.instance }} (job {{ $labels.job }}) for %(for)s; the SD series of its targets are missing.' % {
              'for': a.SpecwatchExporterDown['for'],
            },
            exporterURL(false),
          ),
          alert(
            'SpecwatchAbsent',
            'absent(up{%s} == 1)\n' % c.exporterSelector,
            'No specwatch exporter is being scraped.',
            'No specwatch exporter matching {%s} has been scraped successfully for %s: no speculative-decoding alert can fire.' % [
              c.exporterSelector,
              a.SpecwatchAbsent['for'],
            ],
          ),
        ]),
      },
    ],
  },
}
