// The one configuration of the specwatch mixin. Every selector, threshold, alert switch,
// duration and dashboard setting lives here, so that a team adapts the bundle by merging
// an object into `_config` (see README, "Dashboards, rules and alerts") and never forks
// the rule or dashboard sources.
//
//   local specwatch = (import 'mixin.libsonnet') + {
//     _config+:: {
//       vllmSelector: 'job="inference", namespace="llm"',
//       alerts+: { SDAcceptanceRateLow+: { threshold: 0.35, 'for': '15m' } },
//     },
//   };
{
  _config+:: {
    // Selectors: label matchers inserted between `{}` in every query. vLLM series are
    // scraped from the inference servers; exporter series from specwatch itself.
    // Prometheus adds `job` and `instance` when scraping; match whatever your scrape
    // configuration sets.
    vllmSelector: 'job="vllm"',
    exporterSelector: 'job="specwatch"',
    // The other serving engines of a mixed fleet. Their recording rules
    // (alerts/rules.libsonnet) record into the same names as vLLM's, so the dashboards' and
    // the alerts' recorded series cover every engine. An engine you do not run costs
    // nothing: its rules match no series.
    sglangSelector: 'job="sglang"',
    trtllmSelector: 'job="trtllm"',
    llamacppSelector: 'job="llamacpp"',
    // llama-server labels no series with a model (one model per server): its recorded series
    // get this model_name, the one specwatch's exporter gives them too.
    llamacppModelName: 'default',

    // The label that tells clusters apart when one Prometheus (or Thanos/Mimir) holds
    // several. Rules always keep it in their aggregations (a missing label costs nothing);
    // dashboards show a `cluster` variable only when showMultiCluster is true.
    clusterLabel: 'cluster',
    showMultiCluster: false,

    // Window of the recording rules computed from vLLM's counters. It is part of the
    // recorded names (`..._rate5m`), so changing it renames the series. Keep it at least
    // 4x the scrape interval of vLLM.
    rateWindow: '5m',

    // The exporter computes its windows from its own poll history (label `window`:
    // 1m, 5m, 15m, 1000req). Alerts and the default dashboard view read this one.
    exporterWindow: '5m',

    // Where `runbook_url` points. `%s` is replaced by the lower-cased alert name, which is
    // the anchor GitHub generates for that alert's heading in runbook.md.
    runbookURLPattern: 'https://github.com/specwatch/specwatch/blob/main/runbook.md#%s',

    // Grafana's address: alerts carry a `dashboard_url` annotation linking to the SD
    // overview (the exporter dashboard for exporter alerts) filtered to the alert's target
    // and model. The default is where deploy/compose serves Grafana; set your Grafana's
    // external URL (e.g. 'https://grafana.example.com'), or '' for no link.
    grafanaURL: 'http://127.0.0.1:3000',

    // Labels every specwatch alert carries. Alertmanager routes the bundle's alerts on
    // them, so that merged under another root route they take no other team's alerts: the
    // shipped routes (deploy/alertmanager/alertmanager.yml) match component="specwatch".
    // Change the route's matcher with the value.
    alertLabels: { component: 'specwatch' },

    // Alerts. Each one can be switched off (`enabled: false`), and its threshold,
    // pending duration (`for`) and severity changed. Severities follow the
    // monitoring-mixins convention: critical pages a human now, warning goes to a
    // ticket/chat during working hours, info is context that is not routed on its own.
    //
    // Severity policy: a page (critical) is reserved for speculative decoding that makes
    // requests slower, held for the alert's `for`:
    //   - SDMeasuredSlowdown: the measured A/B speedup's 90% interval ends below 1
    //     (bound 'upper', threshold 1);
    //   - SDPredictedSlowdown: a valid prediction whose whole 90% interval is below 1
    //     (sd_predicted_speedup_upper < 1 while sd_model_valid is 1).
    // Everything else is a warning or info: low acceptance, a small predicted speedup,
    // drift, saturation. Low acceptance that does slow requests down pages through one of
    // the two slowdown alerts. Keep the policy when you change a `bound`, a `threshold`
    // or a severity: a page that SD is merely less useful than it could be wakes people
    // for something that can wait until morning.
    alerts: {
      // Rolling draft acceptance below the threshold: most drafts are rejected and their
      // verification is wasted verifier work. A ticket (warning), not a page: it says SD
      // pays less, not that it slows requests down (the slowdown alerts page for that).
      // Absent, and therefore silent, when no drafts were verified in the window (an idle
      // server never alerts); also silent below minArrivalRate, where a handful of prompts
      // decides the ratio and nobody waits on the latency.
      SDAcceptanceRateLow: {
        enabled: true,
        severity: 'warning',
        // What is compared with the threshold:
        // 'alpha': the draft-length-independent acceptance α, the same at every k: the
        //   share of drafts whose first token was accepted (label method="first_position",
        //   from vLLM's per-position counters), else the per-token α solved from the
        //   acceptance length and k (method="per_token"; exporter source only). At k = 1 it
        //   equals vLLM's acceptance rate, so 0.4 keeps its meaning.
        // 'rate': vLLM's acceptance rate, accepted / proposed draft tokens. It falls with k
        //   by construction (later positions are accepted less often): on the public
        //   Qwen3-32B sweep EAGLE-3 reads 0.22-0.25 at k = 6 where it is 1.7-2.1x faster (its
        //   first-position acceptance: 0.62-0.66), so a fixed threshold fires on healthy SD.
        //   Only for a threshold chosen for one k.
        measure: 'alpha',
        threshold: 0.4,
        'for': '10m',
        // Rides over a single failed poll or scrape instead of resolving and re-firing
        // (Prometheus >= 2.42). Set to '' to omit the field for older Prometheus.
        keepFiringFor: '2m',
        minArrivalRate: 0.05,  // finished requests per second
        // The guard where an engine counts no finished requests (the llama.cpp server), with
        // source 'vllm': its verification steps (drafts) per second must reach this instead,
        // so that the alert can fire for it. 1/s is minArrivalRate at the 21 drafts per
        // finished request of the recorded vLLM 0.32 pair (tests/fixtures/
        // vllm-0.32-cpu-pair-k2: 74250 drafts, 3550 requests); where an engine records an
        // arrival rate, that decides alone.
        minDraftRate: 1,  // verification steps per second
        // The same guard with source 'exporter', which derives no arrival rate for such an
        // engine: at least minDraftedPolls poll intervals with enough drafts for an
        // acceptance sample (global.min_drafts_per_sample) within draftedPollsWindow, so a
        // lone burst does not decide; where the exporter derives an arrival rate, that
        // decides alone. 3 in 5m holds for poll intervals up to 100 s.
        minDraftedPolls: 3,
        draftedPollsWindow: '5m',
        // Exporter window the alert reads (source 'exporter'). 1m, not the 5m of the
        // dashboards: the `for` clock starts when the window crosses the threshold, and a
        // 5m window of a drop that follows heavy traffic crosses it up to 5 minutes late
        // (4.8 min in the demo), so the alert would come 14-15 minutes after the drop.
        // With 1m it comes 10-12 minutes after (tests/mixin/test_mixin_alert_timing.py).
        window: '1m',
        // An isolated missing sample (a failed poll drops the target's series for one
        // scrape, a missed scrape) must not reset the `for` clock: the rule reads the last
        // sample within this grace (last_over_time) instead of the instant value. Keep it
        // at least 2x the scrape interval of specwatch. '' reads instant values.
        missingSampleGrace: '2m',
        // 'exporter': specwatch's windowed sd_acceptance_alpha (or sd_acceptance_rate with
        // measure 'rate'; labels target, model_name); 'vllm': the recording rules computed
        // from the engines' counters, for Prometheus setups without the exporter (labels job,
        // model_name; measure 'alpha' needs per-position counters: vLLM v1, TensorRT-LLM,
        // llama.cpp; with minArrivalRate above 0, an engine that counts no finished requests,
        // llama.cpp, is guarded by minDraftRate instead).
        source: 'exporter',
      },
      // The latency model predicts that SD buys less than `threshold` x speedup at the
      // current load (below 1, SD makes requests slower). A warning: the point prediction
      // alone does not prove a slowdown (SDPredictedSlowdown pages when its interval does).
      SDPredictedSpeedupLow: {
        enabled: true,
        severity: 'warning',
        threshold: 1.05,
        'for': '15m',
      },
      // A valid prediction (sd_model_valid 1) whose whole 90% interval is below 1: the
      // model is confident that SD makes requests slower at the current load. Pages.
      SDPredictedSlowdown: {
        enabled: true,
        severity: 'critical',
        'for': '15m',
      },
      // The measured arrival rate is above the model's break-even arrival rate: at this
      // load SD costs latency.
      SDArrivalRateAboveBreakeven: {
        enabled: true,
        severity: 'warning',
        'for': '15m',
      },
      // Sarle's bimodality coefficient of the per-poll acceptance samples is above 5/9:
      // acceptance has split into two populations (easy and hard traffic), so one mean
      // acceptance rate describes neither.
      SDAcceptanceBimodal: {
        enabled: true,
        severity: 'info',
        threshold: 0.555,
        'for': '30m',
        window: '15m',
        // At least this many acceptance samples in the last 30 minutes, so that the
        // coefficient is not computed from a handful of polls.
        minSamples: 30,
      },
      // The model's utilisation (lambda x per-request service time) is close to 1: the
      // server is near saturation and predicted latency grows without bound.
      SDModelSaturated: {
        enabled: true,
        severity: 'warning',
        threshold: 0.9,
        'for': '10m',
      },
      // The latency model cannot produce a prediction (inputs missing or out of range,
      // or saturated): speedup, break-even and optimal draft length are not trustworthy.
      SDModelInvalid: {
        enabled: true,
        severity: 'warning',
        'for': '15m',
        // Only with traffic: an idle server (sd_arrival_rate 0) has no request lengths to
        // feed the model, so it is invalid by construction and nobody waits on it.
        minArrivalRate: 0.05,  // finished requests per second, over the model's window
      },
      // Measured A/B pair (issue 16, `pairs:` in the serve config): the baseline's
      // latency / the SD side's latency is below `threshold` in the arrival-rate bin and
      // acceptance band the pair is at now. `bound: 'upper'`: the upper end of the mean
      // ratio's 90% interval (sd_measured_speedup_upper) is below it, so a bin too noisy to
      // tell stays silent; `'point'`: the ratio itself (sd_measured_speedup, statistic
      // `statistic`). Unlike SDPredictedSpeedupLow this is a measurement, not a model's
      // prediction. Pages (the severity policy above) with bound 'upper' and threshold 1:
      // set severity 'warning' if you change either.
      SDMeasuredSlowdown: {
        enabled: true,
        severity: 'critical',
        threshold: 1,
        bound: 'upper',
        statistic: 'mean',
        'for': '30m',
      },
      // The model's predicted mean latency at the observed load differs from the measured
      // mean latency by more than `threshold` (relative, either sign) for `for`: the
      // calibration no longer describes the server (new vLLM, hardware, traffic mix).
      // Re-calibrate (runbook). Silent while the model has no prediction (no error series).
      SDModelDrift: {
        enabled: true,
        severity: 'warning',
        threshold: 0.2,
        'for': '30m',
      },
      // specwatch cannot poll one of its targets (vLLM or SGLang server): its SD series
      // are absent, so SD alerts for it cannot fire.
      SpecwatchTargetDown: {
        enabled: true,
        severity: 'warning',
        'for': '5m',
      },
      // Prometheus cannot scrape one specwatch instance.
      SpecwatchExporterDown: {
        enabled: true,
        severity: 'warning',
        'for': '5m',
      },
      // No specwatch instance is scraped successfully at all (none discovered, or all
      // down): every SD alert is blind. Raise to critical if you rely on the page.
      SpecwatchAbsent: {
        enabled: true,
        severity: 'warning',
        'for': '10m',
      },
    },

    // Grafana.
    grafana: {
      dashboardNamePrefix: 'specwatch / ',
      dashboardTags: ['specwatch', 'speculative-decoding', 'vllm'],
      refresh: '30s',
      timezone: 'utc',
      timeFrom: 'now-3h',
      // The data source the `datasource` variable starts on. 'default' is Grafana's
      // default Prometheus data source, so an import needs no edit.
      datasourceName: 'default',
      // Regex limiting which Prometheus data sources the variable offers ('' = all).
      datasourceRegex: '',
      // The oldest Grafana the dashboards are written and type-checked for (dashboard
      // `__requires`, docs/dashboards-alerts.md; tests/mixin/test_grafana_schema.py types every
      // dashboard against @grafana/schema of this version and of the newest). The XY
      // chart needs 11.2 at least (earlier versions hide it behind a feature toggle).
      minVersion: '11.4.0',
      // Panel plugin version the JSON is written for. Set on every panel so that Grafana
      // does not run a pre-GA migration over the xychart options (it does when empty).
      pluginVersion: self.minVersion,
      // Target/model pairs the speedup XY chart draws at once: Grafana's xychart needs one
      // series config per frame (byIndex), and the chart has one frame per pair.
      xyChartMaxFrames: 8,
      // Latency quantiles from vLLM's histograms: a quantile whose bucket is wider than
      // this fraction of its interpolated value (the first bucket always is) is shown as
      // the bucket's upper bound ("≤"), not as the interpolated value.
      quantileResolution: 0.5,
      // Measured A/B speedup: an arrival-rate bin and acceptance band the pair has not
      // been in for this long is left off the measured-speedup panel (its value describes
      // a load and acceptance that have passed). The current bin is always drawn.
      measuredBinMaxAge: '15m',
    },

    // Dashboard file name -> uid (stable across releases so links and bookmarks keep
    // working; at most 40 characters).
    dashboardUIDs: {
      'specwatch-sd-overview.json': 'specwatch-sd-overview',
      'specwatch-exporter.json': 'specwatch-exporter',
    },
    dashboardTitles: {
      'specwatch-sd-overview.json': 'SD overview',
      'specwatch-exporter.json': 'specwatch exporter',
    },
  },
}
