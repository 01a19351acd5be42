// Alerts on measured A/B pairs (issue 16): the exporter's sd_measured_speedup compares a
// target running SD with a baseline target at the same arrival rate. Kept apart from
// alerts.libsonnet: its own rule group, its knobs under `alerts.SDMeasuredSlowdown` in
// config.libsonnet.
{
  local c = $._config,
  local cfg = c.alerts.SDMeasuredSlowdown,
  local on = '%s, job, instance, pair, model_name, arrival_rate_bin, acceptance_band' % c.clusterLabel,
  // `bound: 'upper'`: the upper end of the mean ratio's 90% interval must be below the
  // threshold (a noisy bin cannot page anyone); `'point'`: the ratio itself.
  local series = if cfg.bound == 'upper' then 'sd_measured_speedup_upper' else 'sd_measured_speedup',
  assert std.member(['upper', 'point'], cfg.bound) : "alerts.SDMeasuredSlowdown.bound: 'upper' or 'point'",
  assert cfg.bound == 'point' || cfg.statistic == 'mean' : 'alerts.SDMeasuredSlowdown: the interval (bound: upper) is of the mean only',

  prometheusAlerts+:: {
    groups+: if !cfg.enabled then [] else [
      {
        name: 'specwatch-measured',
        rules: [
          {
            alert: 'SDMeasuredSlowdown',
            expr: |||
              %(series)s{%(sel)s, statistic="%(stat)s"} < %(threshold)g
              and on (%(on)s)
              sd_pair_current_arrival_rate_bin{%(sel)s} == 1
            ||| % {
              series: series,
              sel: c.exporterSelector,
              stat: cfg.statistic,
              threshold: cfg.threshold,
              on: on,
            },
            'for': cfg['for'],
            labels: c.alertLabels { severity: cfg.severity },
            annotations: {
              summary: 'Speculative decoding is measured slower than its baseline.',
              description: 'Pair {{ $labels.pair }} measures a %(stat)s speedup %(what)s {{ printf "%%.2f" $value }}x for {{ $labels.model_name }} at the current load and acceptance (arrival-rate bin {{ $labels.arrival_rate_bin }} req/s, acceptance band {{ $labels.acceptance_band }}; threshold %(t)gx): the target running SD answers slower than the baseline without it.' % {
                stat: cfg.statistic,
                what: if cfg.bound == 'upper' then 'whose 90% interval ends at' else 'of',
                t: cfg.threshold,
              },
              runbook_url: c.runbookURLPattern % std.asciiLower('SDMeasuredSlowdown'),
            } + $.sdDashboardURL,
          },
        ],
      },
    ],
  },
}
