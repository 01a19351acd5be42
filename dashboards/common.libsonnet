// What both dashboards share: template variables, the label filters every query uses, and
// small panel shortcuts. Nothing here knows about a particular panel.
local g = import 'lib/g.libsonnet';

local ds = '${datasource}';

{
  new(c):: {
    local root = self,
    local multi = c.showMultiCluster,
    local clusterFilter = if multi then '%s=~"$cluster", ' % c.clusterLabel else '',
    local clusterSelector = if multi then ', %s=~"$cluster"' % c.clusterLabel else '',

    // Label filters (without braces). `exporter` matches one exporter job and target;
    // `sd` adds the model; `sdWindow` adds the exporter window chosen on the dashboard;
    // `vllm` matches the vLLM job and model; `recorded` the recording rules' series of every
    // engine of the fleet (their names are specwatch's own, so no job needs scoping them).
    //
    // Every filter starts with the configured selector (exporterSelector, vllmSelector)
    // and only then narrows it with the variable: whatever "All" expands to, a panel
    // never counts another job's series (`up` and `scrape_duration_seconds` exist for
    // every job Prometheus scrapes, vLLM's included).
    filters:: {
      job: '%s%s, job=~"$job"' % [clusterFilter, c.exporterSelector],
      exporter: self.job + ', target=~"$target"',
      sd: self.exporter + ', model_name=~"$model_name"',
      sdWindow: self.sd + ', window="$window"',
      vllm: '%s%s, job=~"$vllm_job", model_name=~"$model_name"' % [clusterFilter, c.vllmSelector],
      // vLLM series narrowed to the chosen server instances and engines (the per-engine
      // panels, as vLLM's own speculative-decoding dashboard filters them).
      vllmEngine: self.vllm + ', instance=~"$vllm_instance", engine=~"$engine"',
      recorded: '%smodel_name=~"$model_name"' % clusterFilter,
    },

    local datasourceVar =
      g.dashboard.variable.datasource.new('datasource', 'prometheus')
      + g.dashboard.variable.datasource.generalOptions.withLabel('Data source')
      + g.dashboard.variable.datasource.generalOptions.withDescription('Prometheus data source holding the vLLM and specwatch series.')
      + g.dashboard.variable.datasource.withRegex(c.grafana.datasourceRegex)
      + g.dashboard.variable.datasource.generalOptions.withCurrent(c.grafana.datasourceName),

    // includeAll: 'values' makes All the regex of the listed values (Grafana's default),
    // 'any' makes it '.+'. '.+' is only safe where the query's own selector already
    // scopes the label (target and model_name under the exporter's job); for `job` it
    // would match every job in Prometheus.
    // A job variable whose configured selector already names one job (job="...") could
    // only ever list that job: it is kept for the queries but not shown.
    local pinsJob(selector) = std.length(std.findSubstr('job="', selector)) > 0,
    local queryVar(name, label, description, query, includeAll='values', hidden=false) =
      local v = g.dashboard.variable.query;
      v.new(name)
      + (if hidden then v.generalOptions.showOnDashboard.withNothing() else {})
      + v.withDatasourceFromVariable(datasourceVar)
      + v.queryTypes.withLabelValues(query[1], query[0])
      + v.refresh.onTime()
      + v.generalOptions.withLabel(label)
      + v.generalOptions.withDescription(description)
      + (
        if includeAll == 'values' then
          v.selectionOptions.withIncludeAll(true) + v.selectionOptions.withMulti()
        else if includeAll == 'any' then
          v.selectionOptions.withIncludeAll(true, '.+') + v.selectionOptions.withMulti()
        else {}
      ),

    local clusterVar =
      queryVar(
        'cluster',
        'Cluster',
        'Cluster label (%s) of the specwatch exporters.' % c.clusterLabel,
        ['specwatch_build_info{%s}' % c.exporterSelector, c.clusterLabel],
        includeAll='none',
      ),

    variables:: {
      datasource: datasourceVar,
      cluster: clusterVar,
      job: queryVar(
        'job',
        'specwatch job',
        'Prometheus job of the specwatch exporters.',
        ['specwatch_build_info{%s%s}' % [c.exporterSelector, clusterSelector], 'job'],
        hidden=pinsJob(c.exporterSelector),
      ),
      vllmJob: queryVar(
        'vllm_job',
        'vLLM job',
        'Prometheus job of the vLLM servers (for the panels computed from vLLM series).',
        ['vllm:num_requests_running{%s%s}' % [c.vllmSelector, clusterSelector], 'job'],
        hidden=pinsJob(c.vllmSelector),
      ),
      vllmInstance: queryVar(
        'vllm_instance',
        'vLLM instance',
        'vLLM server instances (the per-engine speculative-decoding panels).',
        ['vllm:num_requests_running{%s}' % root.filters.vllm, 'instance'],
        includeAll='any',
      ),
      engine: queryVar(
        'engine',
        'Engine',
        'vLLM engine cores (label engine; the per-engine speculative-decoding panels).',
        ['vllm:num_requests_running{%s, instance=~"$vllm_instance"}' % root.filters.vllm, 'engine'],
        includeAll='any',
      ),
      target: queryVar(
        'target',
        'Target',
        'Inference server polled by specwatch (the `target` name in its configuration).',
        ['specwatch_target_up{%s}' % root.filters.job, 'target'],
        includeAll='any',
      ),
      // The SD dashboards' targets: those running SD (a draft length configured), so that
      // a baseline without SD (an A/B pair's other side) adds no empty row or stray line.
      // All is the list of their names, not '.+', which would match the others too.
      sdTarget: queryVar(
        'target',
        'Target',
        'Inference server polled by specwatch that runs speculative decoding (the `target` name in its configuration).',
        ['sd_draft_length_configured{%s}' % root.filters.job, 'target'],
      ),
      modelName: queryVar(
        'model_name',
        'Model',
        'Served model name.',
        ['sd_draft_length_configured{%s}' % root.filters.exporter, 'model_name'],
        includeAll='any',
      ),
      window:
        local others = [w for w in ['1m', '5m', '15m', '1000req'] if w != c.exporterWindow];
        g.dashboard.variable.custom.new('window', [c.exporterWindow] + others)
        + g.dashboard.variable.custom.generalOptions.withLabel('Window')
        + g.dashboard.variable.custom.generalOptions.withDescription(
          'Window of the exporter-derived series: a time window, or the most recent N finished requests.'
        ),
      // Whether the latency panels draw a quantile whose bucket does not resolve it, as
      // the bucket's upper bound ("≤ bucket bound"): off by default, one choice away. The
      // queries read the value (0 or 1) through vector($quantile_bounds).
      quantileBounds:
        g.dashboard.variable.custom.new('quantile_bounds', ['hide : 0', 'show : 1'])
        + g.dashboard.variable.custom.generalOptions.withLabel('Unresolved quantiles')
        + g.dashboard.variable.custom.generalOptions.withDescription(
          "Latency panels: draw a P50/P99 that vLLM's buckets do not resolve as its bucket's upper bound (dashed, marked ≤), or leave it out (the mean is always drawn)."
        )
        + {
          current: { selected: true, text: 'hide', value: '0' },
          options: [
            { selected: true, text: 'hide', value: '0' },
            { selected: false, text: 'show', value: '1' },
          ],
        },
    },

    // The specwatch alerts firing for the selected targets and models; alerts without a
    // target or model label (SpecwatchAbsent, SpecwatchExporterDown, the vLLM-source
    // variant) match the empty alternative.
    alertsSelector:: 'ALERTS{%salertname=~"SD.+|Specwatch.+", alertstate="firing", target=~"${target:regex}|", model_name=~"${model_name:regex}|"}' % clusterFilter,

    // The cluster variable, only for multi-cluster setups (goes right after datasource).
    clusterVariables:: if multi then [clusterVar] else [],

    // A Prometheus target on the dashboard's data source variable.
    target(expr, legend=''):: g.query.prometheus.new(ds, expr)
                              + (if legend == '' then {} else g.query.prometheus.withLegendFormat(legend)),

    // A time series panel with the defaults every specwatch time series uses.
    timeSeries(title, description, unit, targets, w=12, h=8)::
      local ts = g.panel.timeSeries;
      ts.new(title)
      + ts.panelOptions.withDescription(description)
      + ts.panelOptions.withGridPos(h, w)
      + ts.queryOptions.withTargets(targets)
      + ts.standardOptions.withUnit(unit)
      + ts.fieldConfig.defaults.custom.withLineWidth(1)
      + ts.fieldConfig.defaults.custom.withFillOpacity(10)
      + ts.fieldConfig.defaults.custom.withShowPoints('never')
      + ts.options.legend.withDisplayMode('table')
      + ts.options.legend.withPlacement('bottom')
      + ts.options.legend.withCalcs(['lastNotNull', 'max'])
      + ts.options.tooltip.withMode('multi')
      + ts.options.tooltip.withSort('desc'),

    // Dashed threshold lines on a time series: steps is [[color, value], ...] ascending,
    // the first step's value is the base (null).
    thresholdLines(steps)::
      local ts = g.panel.timeSeries;
      ts.standardOptions.thresholds.withMode('absolute')
      + ts.standardOptions.thresholds.withSteps([{ color: s[0], value: s[1] } for s in steps])
      + ts.fieldConfig.defaults.custom.thresholdsStyle.withMode('dashed'),
  },
}
