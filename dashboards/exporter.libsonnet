// "specwatch exporter": is specwatch itself healthy, and can it poll its targets?
local common = import 'common.libsonnet';
local g = import 'lib/g.libsonnet';

local ts = g.panel.timeSeries;
local stat = g.panel.stat;
local st = g.panel.stateTimeline;

{
  new(c)::
    local m = common.new(c);
    local f = m.filters;
    local v = m.variables;
    local t = m.target;

    // Stats say "now": instant queries, which return only the series that exist at the
    // current time (a range query's last value outlives a series that has ended).
    local statPanel(title, description, unit, targets, w=6, h=4) =
      stat.new(title)
      + stat.panelOptions.withDescription(description)
      + stat.panelOptions.withGridPos(h, w)
      + stat.queryOptions.withTargets([x + g.query.prometheus.withInstant() for x in targets])
      + stat.standardOptions.withUnit(unit)
      + stat.options.reduceOptions.withCalcs(['lastNotNull'])
      + stat.options.withColorMode('value')
      + stat.options.withGraphMode('none');

    local upDown(title, description, expr, legend, upText, downText) =
      st.new(title)
      + st.panelOptions.withDescription(description)
      + st.panelOptions.withGridPos(8, 12)
      + st.queryOptions.withTargets([t(expr, legend)])
      + st.standardOptions.withUnit('none')
      + st.standardOptions.withMappings([
        {
          type: 'value',
          options: {
            '0': { index: 0, text: downText, color: 'red' },
            '1': { index: 1, text: upText, color: 'green' },
          },
        },
      ])
      + st.options.withShowValue('never')
      + st.options.withMergeValues()
      + st.options.legend.withShowLegend(false);

    local targetsUp =
      statPanel(
        'Targets up',
        'Targets (vLLM or SGLang servers) whose last poll succeeded.',
        'short',
        [t('sum(specwatch_target_up{%s})' % f.exporter, 'up')],
      )
      + stat.standardOptions.color.withMode('fixed')
      + stat.standardOptions.color.withFixedColor('green');

    local targetsDown =
      statPanel(
        'Targets down',
        'Targets whose last poll failed (their SD series are absent until a poll succeeds; SpecwatchTargetDown fires after %s).' % c.alerts.SpecwatchTargetDown['for'],
        'short',
        [t('count(specwatch_target_up{%s} == 0) or vector(0)' % f.exporter, 'down')],
      )
      + stat.standardOptions.thresholds.withMode('absolute')
      + stat.standardOptions.thresholds.withSteps([
        { color: 'green', value: null },
        { color: 'red', value: 1 },
      ]);

    local exportersUp =
      statPanel(
        'Exporter instances up',
        'specwatch instances Prometheus scraped successfully (the `up` series of the specwatch job).',
        'short',
        [t('sum(up{%s})' % f.job, 'up')],
      );

    local version =
      statPanel(
        'Version',
        'specwatch version per exporter instance (specwatch_build_info).',
        'none',
        [t('specwatch_build_info{%s}' % f.job, '{{instance}}: {{version}}')],
      )
      + stat.options.withTextMode('name');

    local pollDuration =
      m.timeSeries(
        'Poll duration',
        'Time the last poll of each target took (fetch and parse of its /metrics page). Close to the poll deadline means the target or the network is slow and polls will start to time out.',
        's',
        [t('specwatch_target_poll_duration_seconds{%s}' % f.exporter, '{{target}}')],
      );

    local pollErrors =
      m.timeSeries(
        'Poll errors by reason',
        'Failed polls per second by target and reason: timeout, connection, http_status, parse, too_large.',
        'cps',
        [t('sum by (target, reason) (rate(specwatch_target_poll_errors_total{%s}[$__rate_interval]))' % f.exporter, '{{target}} {{reason}}')],
      );

    local counterResets =
      m.timeSeries(
        'Counter resets',
        'Counter resets specwatch detected and corrected per rate interval (a restarted server, an engine or adapter whose series came back). Each one is handled without a negative delta; many of them mean a crash-looping server.',
        'short',
        [t('sum by (target) (increase(specwatch_target_resets_total{%s}[$__rate_interval]))' % f.exporter, '{{target}}')],
      )
      + ts.standardOptions.withDecimals(0);

    local lastSuccess =
      m.timeSeries(
        'Time since last successful poll',
        'Age of the last successful poll of each target. It grows while a target is down; derived series are absent meanwhile rather than stale.',
        's',
        [t('time() - specwatch_target_last_success_timestamp_seconds{%s}' % f.exporter, '{{target}}')],
      );

    local scrapeDuration =
      m.timeSeries(
        'Exporter scrape duration',
        'How long Prometheus takes to scrape each specwatch instance. specwatch serves a snapshot built by its poller, so this should stay small and flat however many targets it polls.',
        's',
        [t('scrape_duration_seconds{%s}' % f.job, '{{instance}}')],
      );

    g.dashboard.new(c.dashboardTitles['specwatch-exporter.json'])
    + g.dashboard.withDescription('Health of the specwatch exporter: targets up, poll durations, poll errors by reason, counter resets.')
    + g.dashboard.withVariables([v.datasource] + m.clusterVariables + [v.job, v.target])
    + g.dashboard.withPanels(
      g.util.grid.wrapPanels([
        g.panel.row.new('Targets'),
        targetsUp,
        targetsDown,
        exportersUp,
        version,
        upDown(
          'Target up',
          'Whether the last poll of each target succeeded (specwatch_target_up).',
          'specwatch_target_up{%s}' % f.exporter,
          '{{target}}',
          'up',
          'down',
        ),
        upDown(
          'Latency model configured',
          'Whether a model parameters file is configured for the target (specwatch_model_configured); without one the prediction series are absent.',
          'specwatch_model_configured{%s}' % f.exporter,
          '{{target}}',
          'configured',
          'not configured',
        ),
        g.panel.row.new('Polling'),
        pollDuration,
        pollErrors,
        counterResets,
        lastSuccess,
        g.panel.row.new('Exporter'),
        scrapeDuration,
      ])
    ),
}
