// "SD overview": where speculative decoding stops paying, and whether acceptance is healthy.
local common = import 'common.libsonnet';
local g = import 'lib/g.libsonnet';

local ts = g.panel.timeSeries;
local row = g.panel.row;

{
  new(c)::
    local m = common.new(c);
    local f = m.filters;
    local v = m.variables;
    local t = m.target;
    local a = c.alerts;
    local who = '{{target}} · {{model_name}}';

    // Ratio of two summed vLLM counters over $__rate_interval, absent (not 0) when the
    // denominator did not move.
    local vllmRatio(num, den) =
      |||
        sum by (model_name) (rate(%(num)s{%(f)s}[$__rate_interval]))
        /
        (sum by (model_name) (rate(%(den)s{%(f)s}[$__rate_interval])) > 0)
      ||| % { num: num, den: den, f: f.vllm };
    local quantile(q, histogram) =
      'histogram_quantile(%g, sum by (le, model_name) (rate(%s_bucket{%s}[$__rate_interval])))'
      % [q, histogram, f.vllm];

    local acceptanceRate =
      m.timeSeries(
        'Acceptance rate',
        'Accepted / proposed draft tokens (vLLM\'s definition, 0-1) over the exporter window selected above, per target and model. The dashed line is the SDAcceptanceRateLow threshold (%g; the alert fires after %s below it). Lines marked "vLLM counters" are the same ratio computed by Prometheus from vLLM\'s counters over $__rate_interval, a cross-check that needs no exporter. A gap means no drafts were verified in the window (an idle server), not an acceptance of 0.' % [a.SDAcceptanceRateLow.threshold, a.SDAcceptanceRateLow['for']],
        'percentunit',
        [
          t('sd_acceptance_rate{%s}' % f.sdWindow, who),
          t(vllmRatio('vllm:spec_decode_num_accepted_tokens_total', 'vllm:spec_decode_num_draft_tokens_total'), '{{model_name}} (vLLM counters)'),
        ],
      )
      + ts.standardOptions.withMin(0)
      + ts.standardOptions.withMax(1)
      + m.thresholdLines([['red', null], ['green', a.SDAcceptanceRateLow.threshold]]);

    local acceptanceLength =
      m.timeSeries(
        'Acceptance length',
        'Tokens committed per verification step, bonus token included: 1 + accepted / drafts, between 1 and k+1. It is what one verifier pass of the target model buys; SD pays only when it outweighs the cost of drafting and of the longer verification.',
        'short',
        [
          t('sd_acceptance_length{%s}' % f.sdWindow, who),
          t('1 + ' + vllmRatio('vllm:spec_decode_num_accepted_tokens_total', 'vllm:spec_decode_num_drafts_total'), '{{model_name}} (vLLM counters)'),
        ],
      )
      + ts.fieldConfig.defaults.custom.withAxisLabel('tokens / step')
      + ts.fieldConfig.defaults.custom.withAxisSoftMin(1);

    local draftLength =
      m.timeSeries(
        'Draft length: configured vs effective',
        "Configured k (num_speculative_tokens, counted from vLLM's per-position series) against the effective draft length actually proposed per verification step (draft tokens / drafts). Effective below configured means drafts are cut short: n-gram misses, suffix decoding, dynamic SD by batch size, or structured output invalidating drafts.",
        'short',
        [
          t('sd_draft_length_configured{%s}' % f.sd, who + ' configured'),
          t('sd_draft_length{%s}' % f.sdWindow, who + ' effective'),
        ],
      )
      + ts.fieldConfig.defaults.custom.withAxisLabel('tokens')
      + ts.fieldConfig.defaults.custom.withAxisSoftMin(0);

    local positionAcceptance =
      m.timeSeries(
        'Acceptance by draft position',
        'Share of verification steps whose draft token at each position was accepted (acceptance is a prefix, so it falls with position). A steep fall after position 0 says the later draft positions are mostly wasted: a shorter k costs less verification. Conditional acceptance that rises with position hints at a mix of easy and hard traffic.',
        'percentunit',
        [t('sd_position_acceptance_rate{%s}' % f.sdWindow, who + ' position {{position}}')],
      )
      + ts.standardOptions.withMin(0)
      + ts.standardOptions.withMax(1);

    local conditional =
      m.timeSeries(
        'Conditional acceptance and heterogeneity',
        'Conditional acceptance: the share of drafts whose token at a position was accepted given the previous one was (p_i / p_(i-1)). For one homogeneous population it stays flat or falls with position; rising with position points at a mix of easy and hard traffic. Heterogeneity (0-1, from positions 0 and 1): 0 for homogeneous traffic, 1 for an all-or-nothing mixture; a lower bound when acceptance decays with position.',
        'percentunit',
        [
          t('sd_position_conditional_acceptance_rate{%s}' % f.sdWindow, who + ' position {{position}}'),
          t('sd_acceptance_heterogeneity{%s}' % f.sdWindow, who + ' heterogeneity'),
        ],
      )
      + ts.standardOptions.withMin(0)
      + ts.standardOptions.withMax(1);

    local hm = g.panel.heatmap;
    local samplesHeatmap =
      hm.new('Acceptance-rate distribution')
      + hm.panelOptions.withDescription('Distribution of per-poll acceptance rates (the sd_acceptance_rate_samples histogram, buckets 0.05 wide; only polls with enough drafts count), summed over the selected targets and models. One band is one population; two bands (easy and hard traffic) mean the mean acceptance rate describes neither. Cells are samples per second.')
      + hm.panelOptions.withGridPos(8, 12)
      + hm.queryOptions.withTargets([
        t('sum by (le) (rate(sd_acceptance_rate_samples_bucket{%s}[$__rate_interval]))' % f.sd, '{{le}}')
        + g.query.prometheus.withFormat('heatmap'),
      ])
      + hm.standardOptions.withUnit('percentunit')
      + hm.options.withCalculate(false)
      + hm.options.withCellGap(1)
      + hm.options.rowsFrame.withLayout('le')
      + hm.options.yAxis.withUnit('percentunit')
      + hm.options.cellValues.withUnit('cps')
      + hm.options.color.withMode('scheme')
      + hm.options.color.withScheme('Oranges')
      + hm.options.color.withScale('exponential')
      + hm.options.color.withExponent(0.5)
      + hm.options.color.withFill('dark-orange')
      + hm.options.color.withSteps(64)
      + hm.options.filterValues.withLe(1e-9)
      + hm.options.tooltip.withMode('single');

    local bimodality =
      m.timeSeries(
        'Bimodality coefficient',
        "Sarle's bimodality coefficient of the recent per-poll acceptance samples. Above 5/9 (dashed line, SDAcceptanceBimodal at %g) suggests two modes: part of the traffic drafts well and part badly. Read it with the distribution panel; it is noisy with few samples." % a.SDAcceptanceBimodal.threshold,
        'none',
        [t('sd_acceptance_bimodality_coefficient{%s}' % f.sdWindow, who)],
      )
      + ts.standardOptions.withMin(0)
      + ts.standardOptions.withMax(1)
      + m.thresholdLines([['green', null], ['orange', a.SDAcceptanceBimodal.threshold]]);

    // Speedup against arrival rate: every scrape gives one (arrival rate, predicted
    // speedup) point per target and model, so over the time range the points trace the
    // model's curve at the loads actually seen. The break-even arrival rate is drawn as a
    // larger point at speedup 1. Table queries are merged on time and labels, then
    // partitioned into one frame per target and model, each a series of the xychart.
    local xy = g.panel.xyChart;
    local by = 'max by (target, model_name)';
    local speedupVsLoad =
      xy.new('Predicted speedup against arrival rate')
      + xy.withPluginVersion(c.grafana.pluginVersion)
      + xy.panelOptions.withDescription('Each point is one scrape: the measured arrival rate (x) and the speedup the latency model predicts for SD at that load (y), per target and model. Above 1 SD makes requests faster; the large points mark the break-even arrival rate, where the predicted speedup is 1 and above which SD costs latency. Points come only from targets with a model parameters file (specwatch_model_configured 1).')
      + xy.panelOptions.withGridPos(10, 12)
      + xy.queryOptions.withTargets([
        t('%s (sd_arrival_rate{%s})' % [by, f.sdWindow]) + g.query.prometheus.withFormat('table'),
        t('%s (sd_predicted_speedup{%s})' % [by, f.sd]) + g.query.prometheus.withFormat('table'),
        t('%s (sd_breakeven_arrival_rate{%s})' % [by, f.sd]) + g.query.prometheus.withFormat('table'),
        // y of the break-even point: the predicted speedup there is 1 by definition.
        t('%s (sd_breakeven_arrival_rate{%s}) * 0 + 1' % [by, f.sd]) + g.query.prometheus.withFormat('table'),
      ])
      + xy.queryOptions.withTransformations([
        { id: 'merge', options: {} },
        {
          id: 'organize',
          options: {
            excludeByName: {},
            indexByName: {},
            renameByName: {
              'Value #A': 'arrival rate',
              'Value #B': 'predicted speedup',
              'Value #C': 'break-even arrival rate',
              'Value #D': 'speedup at break-even',
            },
          },
        },
        {
          id: 'partitionByValues',
          options: { fields: ['target', 'model_name'], keepFields: false, naming: { asLabels: true } },
        },
      ])
      + xy.options.withMapping('auto')
      + xy.options.withSeries([
        xy.options.series.new('arrival rate', 'predicted speedup'),
        xy.options.series.new('break-even arrival rate', 'speedup at break-even'),
      ])
      + xy.options.legend.withDisplayMode('list')
      + xy.options.legend.withPlacement('bottom')
      + xy.options.legend.withShowLegend()
      + xy.options.tooltip.withMode('single')
      + xy.standardOptions.withUnit('none')
      + xy.fieldConfig.defaults.custom.withShow('points')
      + xy.fieldConfig.defaults.custom.withPointSize(4)
      + xy.fieldConfig.defaults.custom.withAxisLabel('predicted speedup (x)')
      + xy.standardOptions.withOverrides([
        xy.standardOptions.override.byName.new('arrival rate')
        + xy.standardOptions.override.byName.withProperty('unit', 'reqps')
        + xy.standardOptions.override.byName.withProperty('custom.axisLabel', 'arrival rate'),
        xy.standardOptions.override.byName.new('break-even arrival rate')
        + xy.standardOptions.override.byName.withProperty('unit', 'reqps'),
        xy.standardOptions.override.byName.new('speedup at break-even')
        + xy.standardOptions.override.byName.withProperty('custom.pointSize', { fixed: 12 })
        + xy.standardOptions.override.byName.withProperty('color', { mode: 'fixed', fixedColor: 'red' }),
      ]);

    local predictedSpeedup =
      m.timeSeries(
        'Predicted speedup',
        'Latency without SD / latency with SD, predicted by the latency model at the current load, acceptance and lengths. Dashed lines: 1 (below it SD makes requests slower) and the SDPredictedSpeedupLow threshold (%g). Only targets with a valid model show a line.' % a.SDPredictedSpeedupLow.threshold,
        'none',
        [t('sd_predicted_speedup{%s}' % f.sd, who)],
      )
      + ts.fieldConfig.defaults.custom.withAxisLabel('x vs no SD')
      + ts.fieldConfig.defaults.custom.withAxisSoftMin(0.8)
      + m.thresholdLines([['red', null], ['orange', 1], ['green', a.SDPredictedSpeedupLow.threshold]]);

    local breakeven =
      m.timeSeries(
        'Break-even vs current arrival rate',
        "The arrival rate above which the model predicts SD costs latency (break-even), against the measured arrival rate (finished requests per second over the exporter window) and vLLM's completion rate over $__rate_interval. A break-even of +Inf (SD pays at every load below saturation) is off the chart; 0 means SD never pays. Arrival above break-even fires SDArrivalRateAboveBreakeven.",
        'reqps',
        [
          t('sd_breakeven_arrival_rate{%s}' % f.sd, who + ' break-even'),
          t('sd_arrival_rate{%s}' % f.sdWindow, who + ' arrival'),
          t('sum by (model_name) (rate(vllm:request_success_total{%s}[$__rate_interval]))' % f.vllm, '{{model_name}} completions (vLLM counters)'),
        ],
      );

    local optimalK =
      m.timeSeries(
        'Optimal draft length',
        'The draft length k the latency model finds best at the current load (0 means SD off), against the configured k. A lower optimum than configured says shorter drafts would be faster at this load; vLLM needs a restart (or a num_speculative_tokens_per_batch_size schedule) to change it.',
        'short',
        [
          t('sd_optimal_draft_length{%s}' % f.sd, who + ' optimal'),
          t('sd_draft_length_configured{%s}' % f.sd, who + ' configured'),
        ],
      )
      + ts.standardOptions.withDecimals(0)
      + ts.fieldConfig.defaults.custom.withAxisSoftMin(0);

    local utilisation =
      m.timeSeries(
        'Model utilisation',
        'Utilisation of the server in the latency model (arrival rate x service time per request). Near 100%% latency grows without bound with or without SD; the dashed line is the SDModelSaturated threshold (%g).' % a.SDModelSaturated.threshold,
        'percentunit',
        [t('sd_model_utilization{%s}' % f.sd, who)],
      )
      + ts.standardOptions.withMin(0)
      + m.thresholdLines([['green', null], ['red', a.SDModelSaturated.threshold]]);

    local predictedLatency =
      m.timeSeries(
        'Predicted mean latency with and without SD',
        'Mean end-to-end request latency the model predicts at the current load with SD (mode="sd") and without it (mode="nosd"). Their ratio is the predicted speedup.',
        's',
        [t('sd_predicted_latency_seconds{%s}' % f.sd, who + ' {{mode}}')],
      );

    local modelError =
      m.timeSeries(
        'Model error: predicted / measured mean latency - 1',
        'Signed relative error of the latency model at the observed load: the predicted mean latency of the running configuration over the measured mean latency of the model window, minus 1. Beyond the dashed line (+/-%g) for %s fires SDModelDrift: re-calibrate. Periods when the prediction is not valid are marked by the "model invalid" annotation with its reason (saturated, beyond_calibrated_load, queueing, ...).' % [a.SDModelDrift.threshold, a.SDModelDrift['for']],
        'percentunit',
        [t('sd_model_latency_error_ratio{%s}' % f.sd, who)],
      )
      + m.thresholdLines([['green', null], ['red', a.SDModelDrift.threshold]]);

    local e2e =
      m.timeSeries(
        'End-to-end latency P50 / P99',
        "Request latency from arrival to the last token, from vLLM's vllm:e2e_request_latency_seconds histogram (finished requests), per model.",
        's',
        [
          t(quantile(0.5, 'vllm:e2e_request_latency_seconds'), '{{model_name}} p50'),
          t(quantile(0.99, 'vllm:e2e_request_latency_seconds'), '{{model_name}} p99'),
        ],
      );

    local ttft =
      m.timeSeries(
        'Time to first token P50 / P99',
        'Time from arrival to the first token (queueing plus prefill), from vllm:time_to_first_token_seconds, per model. SD does not speed up prefill; a longer queue under SD shows here.',
        's',
        [
          t(quantile(0.5, 'vllm:time_to_first_token_seconds'), '{{model_name}} p50'),
          t(quantile(0.99, 'vllm:time_to_first_token_seconds'), '{{model_name}} p99'),
        ],
      );

    local itl =
      m.timeSeries(
        'Inter-token latency P50 / P99',
        'Gap between successive outputs of a decoding request, from vllm:inter_token_latency_seconds. With SD one output carries 1 to k+1 tokens, so this is the time per verification step, not per token; the mean time per output token (per token, from vllm:request_time_per_output_token_seconds) is shown alongside.',
        's',
        [
          t(quantile(0.5, 'vllm:inter_token_latency_seconds'), '{{model_name}} p50 (per step)'),
          t(quantile(0.99, 'vllm:inter_token_latency_seconds'), '{{model_name}} p99 (per step)'),
          t(vllmRatio('vllm:request_time_per_output_token_seconds_sum', 'vllm:request_time_per_output_token_seconds_count'), '{{model_name}} mean per token'),
        ],
      );

    local load =
      m.timeSeries(
        'Requests running and waiting',
        "Requests in the running batch and in the queue, from vLLM's scheduler gauges, per model. SD pays best at small batches; a growing queue means the server is past the load it can serve.",
        'short',
        [
          t('sum by (model_name) (vllm:num_requests_running{%s})' % f.vllm, '{{model_name}} running'),
          t('sum by (model_name) (vllm:num_requests_waiting{%s})' % f.vllm, '{{model_name}} waiting'),
        ],
      );

    local st = g.panel.stateTimeline;
    local controllerState =
      st.new('Controller state')
      + st.panelOptions.withDescription('State of the specwatch controller per target and model: enabled (SD on), disabled (SD switched off), pending (a switch was requested and the server has not come back with the new configuration). Empty when the controller is not enabled for a target.')
      + st.panelOptions.withGridPos(8, 12)
      + st.queryOptions.withTargets([
        t(|||
          max by (target, model_name) (
            sd_controller_state{%(f)s, state="enabled"}
            or sd_controller_state{%(f)s, state="disabled"} * 2
            or sd_controller_state{%(f)s, state="pending"} * 3
          )
        ||| % { f: f.sd }, who),
      ])
      + st.standardOptions.withUnit('none')
      + st.standardOptions.withMappings([
        {
          type: 'value',
          options: {
            '1': { index: 0, text: 'enabled', color: 'green' },
            '2': { index: 1, text: 'disabled', color: 'red' },
            '3': { index: 2, text: 'pending', color: 'yellow' },
          },
        },
      ])
      + st.options.withShowValue('auto')
      + st.options.withMergeValues()
      + st.options.legend.withShowLegend(false);

    local controllerK =
      m.timeSeries(
        'Controller: recommended draft length and actions',
        'The draft length the controller recommends, and the actions it took (transitions per rate interval, by action) and actuation errors. Actions are rare; every one is also logged with before/after latency.',
        'short',
        [
          t('sd_controller_recommended_draft_length{%s}' % f.sd, who + ' recommended k'),
          t('sum by (target, model_name, action) (increase(sd_controller_transitions_total{%s}[$__rate_interval]))' % f.sd, who + ' {{action}}'),
          t('sum by (target, model_name) (increase(sd_controller_actuation_errors_total{%s}[$__rate_interval]))' % f.sd, who + ' actuation errors'),
        ],
      )
      + ts.standardOptions.withDecimals(0);

    g.dashboard.new(c.dashboardTitles['specwatch-sd-overview.json'])
    + g.dashboard.withDescription("Speculative decoding at a glance: acceptance, draft length, the latency model's predicted speedup and break-even load, vLLM latency, and the controller.")
    + g.dashboard.withVariables(
      [v.datasource] + m.clusterVariables + [v.job, v.vllmJob, v.target, v.modelName, v.window]
    )
    + g.dashboard.withAnnotationsMixin([
      g.dashboard.annotation.withName('specwatch alerts')
      + g.dashboard.annotation.withDatasource({ type: 'prometheus', uid: '${datasource}' })
      + g.dashboard.annotation.withEnable()
      + g.dashboard.annotation.withHide(false)
      + g.dashboard.annotation.withIconColor('red')
      + g.dashboard.annotation.withExpr('ALERTS{alertname=~"SD.+|Specwatch.+", alertstate="firing"}')
      + g.dashboard.annotation.withStep('60s')
      + g.dashboard.annotation.withTitleFormat('{{alertname}}')
      + g.dashboard.annotation.withTextFormat('{{target}} {{model_name}} ({{severity}})')
      + g.dashboard.annotation.withTagKeys('severity'),
      // Predictions the model does not vouch for (sd_model_valid 0) are marked, with why.
      g.dashboard.annotation.withName('model invalid')
      + g.dashboard.annotation.withDatasource({ type: 'prometheus', uid: '${datasource}' })
      + g.dashboard.annotation.withEnable()
      + g.dashboard.annotation.withHide(false)
      + g.dashboard.annotation.withIconColor('gray')
      + g.dashboard.annotation.withExpr('sd_model_valid{%s} == 0' % f.sd)
      + g.dashboard.annotation.withStep('60s')
      + g.dashboard.annotation.withTitleFormat('model invalid: {{reason}}')
      + g.dashboard.annotation.withTextFormat('{{target}} {{model_name}}')
      + g.dashboard.annotation.withTagKeys('reason'),
    ])
    + g.dashboard.withPanels(
      g.util.grid.wrapPanels([
        row.new('Acceptance'),
        acceptanceRate,
        acceptanceLength,
        draftLength,
        positionAcceptance,
        samplesHeatmap,
        bimodality,
        conditional,
        row.new('Latency model: does SD pay at this load?'),
        speedupVsLoad,
        predictedSpeedup + ts.panelOptions.withGridPos(10, 12),
        breakeven,
        optimalK,
        utilisation,
        predictedLatency,
        modelError,
        row.new('vLLM latency'),
        e2e,
        ttft,
        itl,
        load,
        row.new('Controller'),
        controllerState,
        controllerK,
      ])
    ),
}
