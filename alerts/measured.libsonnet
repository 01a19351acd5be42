// Alerts on measured A/B pairs (issue 16): the exporter's sd_measured_speedup compares a
// target running SD with a baseline target at the same arrival rate. Kept apart from
// alerts.libsonnet: its own rule group, its knobs under `alerts.SDMeasuredSlowdown` in
// config.libsonnet.
{
  local c = $._config,
  local cfg = c.alerts.SDMeasuredSlowdown,
  local on = '%s, job, instance, pair, model_name, arrival_rate_bin' % c.clusterLabel,

  prometheusAlerts+:: {
    groups+: if !cfg.enabled then [] else [
      {
        name: 'specwatch-measured',
        rules: [
          {
            alert: 'SDMeasuredSlowdown',
            expr: |||
              sd_measured_speedup{%(sel)s, statistic="%(stat)s"} < %(threshold)g
              and on (%(on)s)
              sd_pair_current_arrival_rate_bin{%(sel)s} == 1
            ||| % {
              sel: c.exporterSelector,
              stat: cfg.statistic,
              threshold: cfg.threshold,
              on: on,
            },
            'for': cfg['for'],
            labels: { severity: cfg.severity },
            annotations: {
              summary: 'Speculative decoding is measured slower than its baseline.',
              description: 'Pair {{ $labels.pair }} measures a %(stat)s speedup of {{ printf "%%.2f" $value }}x for {{ $labels.model_name }} at the current load (arrival-rate bin {{ $labels.arrival_rate_bin }} req/s; threshold %(t)gx): the target running SD answers slower than the baseline without it.' % {
                stat: cfg.statistic,
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
