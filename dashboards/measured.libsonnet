// Measured speedup (issue 16), kept apart from sd-overview.libsonnet: the points an A/B
// pair (`pairs:` in the exporter config) and the controller's before/after switch records
// measure, overlaid on the predicted speedup-vs-arrival-rate panel, and the panels of
// their own (measured speedup per arrival-rate bin, switch history).
local g = import 'lib/g.libsonnet';

local ts = g.panel.timeSeries;
local xy = g.panel.xyChart;

{
  new(c, m)::
    local f = m.filters;
    local t = m.target;
    // Pair series carry `target` (the pair's SD side): the points land in the frame of
    // that target's predicted curve.
    local pairFilter = f.sd;
    local switchE2E(action) =
      'sd_switch_latency_ratio{%s, action="%s", latency="e2e", percentile="50"}' % [f.sd, action];
    {
      // Mixed into the predicted xychart after its six queries (A-F): refIds G-J. Like
      // the chart's own series, fields keep their query names (Value #G ...) and get display
      // names from their labels; the series match either form.
      local field(refId, suffix) = { id: 'byRegexp', options: '^(Value #%s( .*)?|.* \\(%s\\))$' % [refId, suffix] },
      local named(refId, suffix) =
        xy.standardOptions.override.byRegexp.new('^Value #%s( .*)?$' % refId)
        + xy.standardOptions.override.byRegexp.withProperty('displayName', '${__field.labels.target} · ${__field.labels.model_name} (%s)' % suffix),
      local point(refId, suffix, color) =
        named(refId, suffix)
        + xy.standardOptions.override.byRegexp.withProperty('custom.pointSize', { fixed: 9 })
        + xy.standardOptions.override.byRegexp.withProperty('color', { mode: 'fixed', fixedColor: color }),
      local instantTable(expr) = t(expr) + g.query.prometheus.withFormat('table') + g.query.prometheus.withInstant(),
      overlay:: {
                  targets+: [
                    // Only the bins of the acceptance regime each pair is in now: a point
                    // measured in a regime that has ended is not drawn beside the curve.
                    instantTable('max by (target, model_name, arrival_rate_bin) (sd_measured_arrival_rate{%(f)s} and on (job, instance, pair, target, model_name, acceptance_band) sd_pair_current_arrival_rate_bin{%(f)s})' % { f: pairFilter }),
                    instantTable('max by (target, model_name, arrival_rate_bin) (sd_measured_speedup{%(f)s, statistic="mean"} and on (job, instance, pair, target, model_name, acceptance_band) sd_pair_current_arrival_rate_bin{%(f)s})' % { f: pairFilter }),
                    // A switch record: the arrival rate at the switch, and no-SD / SD latency (P50):
                    // after/before for a switch off, before/after for a switch on.
                    // x: the arrival rate over the model's window, like the chart's own points.
                    instantTable('max by (target, model_name) (sd_arrival_rate{%(f)s} and on (job, instance, target, model_name, window) sd_model_valid{%(f)s}) and on (target, model_name) group by (target, model_name) (sd_switch_latency_ratio{%(f)s})'
                                 % { f: f.sd }),
                    instantTable('max by (target, model_name) (%s) or max by (target, model_name) (1 / %s)'
                                 % [switchE2E('disable'), switchE2E('enable')]),
                  ],
                  options+: {
                    series+: [
                      { x: { matcher: field('G', 'pair arrival rate') }, y: { matcher: field('H', 'pair measured speedup') } },
                      { x: { matcher: field('I', 'switch arrival rate') }, y: { matcher: field('J', 'switch measured speedup') } },
                    ],
                  },
                }
                + xy.standardOptions.withOverridesMixin([
                  named('G', 'pair arrival rate'),
                  point('H', 'pair measured speedup', 'green'),
                  named('I', 'switch arrival rate'),
                  point('J', 'switch measured speedup', 'purple'),
                ]),

      // Which statistics of the measured speedup the panel shows: the mean by default
      // (one line per pair and bin), P50 / P99 on demand.
      statistic::
        g.dashboard.variable.custom.new('statistic', ['mean', 'p50', 'p99'])
        + g.dashboard.variable.custom.generalOptions.withLabel('Measured statistic')
        + g.dashboard.variable.custom.generalOptions.withDescription(
          'Statistic of the measured speedup (A/B pairs) shown: the mean end-to-end latency ratio, or its P50 / P99.'
        )
        + { multi: true },

      // The pair's current bin and band (1 there), and the bins it was in within
      // measuredBinMaxAge: the others are left off, their values describe a past load.
      local binOn = 'job, instance, pair, target, model_name, arrival_rate_bin, acceptance_band',
      local current = '(sd_pair_current_arrival_rate_bin{%s} == 1)' % pairFilter,
      local recent = '(max_over_time(sd_pair_current_arrival_rate_bin{%s}[%s]) == 1)' % [pairFilter, c.grafana.measuredBinMaxAge],
      // One continuous line per pair: the value of whichever bin is current.
      local atCurrentBin(metric, statistic) =
        'max by (pair, target, model_name) (\n  %s{%s, statistic="%s"}\n  and on (%s)\n  %s\n)' % [metric, pairFilter, statistic, binOn, current],
      measuredSpeedup::
        m.timeSeries(
          'Measured speedup (A/B pairs)',
          'Baseline latency / SD latency measured by each A/B pair (`pairs:` in the exporter config) over the finished requests of both sides. The thick line ("current bin") is the mean ratio of the arrival-rate bin and acceptance band the pair is in now, whichever it is, with the dashed 90%% interval of that mean: SDMeasuredSlowdown fires when the upper end stays below %g (dashed line) for %s. The thin lines are the bins the pair was in during the last %s (grafana.measuredBinMaxAge), one per bin and band, the mean by default; the "Measured statistic" variable adds P50 or P99, shown only where the histogram buckets resolve them. Bins not visited for longer are left off: they describe a load that has passed. A bin without enough requests on both sides has no line.' % [c.alerts.SDMeasuredSlowdown.threshold, c.alerts.SDMeasuredSlowdown['for'], c.grafana.measuredBinMaxAge],
          'none',
          [
            t('sd_measured_speedup{%s, statistic=~"$statistic"}\nand on (%s)\n%s' % [pairFilter, binOn, recent], '{{pair}} · {{model_name}} · {{arrival_rate_bin}} req/s · acceptance {{acceptance_band}} ({{statistic}})'),
            t(atCurrentBin('sd_measured_speedup', 'mean'), '{{pair}} · {{model_name}} · current bin (mean)'),
            t(atCurrentBin('sd_measured_speedup_lower', 'mean'), '{{pair}} · {{model_name}} · current bin (90% lower)'),
            t(atCurrentBin('sd_measured_speedup_upper', 'mean'), '{{pair}} · {{model_name}} · current bin (90% upper)'),
          ],
        )
        + ts.standardOptions.withOverrides([
          ts.standardOptions.override.byRegexp.new('.* current bin \\(mean\\)$')
          + ts.standardOptions.override.byRegexp.withProperty('custom.lineWidth', 3)
          + ts.standardOptions.override.byRegexp.withProperty('custom.fillOpacity', 0),
          ts.standardOptions.override.byRegexp.new('.* current bin \\(90% (lower|upper)\\)$')
          + ts.standardOptions.override.byRegexp.withProperty('custom.lineStyle', { fill: 'dash', dash: [4, 4] })
          + ts.standardOptions.override.byRegexp.withProperty('custom.fillOpacity', 0),
          ts.standardOptions.override.byRegexp.new('.* req/s · acceptance .*')
          + ts.standardOptions.override.byRegexp.withProperty('custom.fillOpacity', 0)
          + ts.standardOptions.override.byRegexp.withProperty('custom.lineStyle', { fill: 'dot', dash: [1, 4] }),
        ])
        + m.thresholdLines([['red', null], ['green', c.alerts.SDMeasuredSlowdown.threshold]]),

      switchHistory::
        m.timeSeries(
          'Switch history: latency after / before',
          'Each controller switch (enable/disable SD) and the latency ratio it measured: the P50 and P99 of end-to-end latency and TTFT over the decision window after the switch divided by the window before it (below 1: the switch helped). The switches line counts them per interval (sd_controller_transitions_total).',
          'none',
          [
            t('sd_switch_latency_ratio{%s}' % f.sd, '{{target}} · {{model_name}} · {{action}} · {{latency}} P{{percentile}}'),
            t('sum by (target, model_name, action) (increase(sd_controller_transitions_total{%s}[$__rate_interval]))' % f.sd, '{{target}} · {{model_name}} · switches ({{action}})'),
          ],
        )
        + m.thresholdLines([['green', null], ['red', 1]]),
    },
}
