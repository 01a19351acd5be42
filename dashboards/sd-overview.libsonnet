// "SD overview": where speculative decoding stops paying, and whether acceptance is healthy.
local common = import 'common.libsonnet';
local g = import 'lib/g.libsonnet';
local measured = import 'measured.libsonnet';

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
    local ms = measured.new(c, m);
    // The recording rules on the engines' counters (alerts/rules.libsonnet): every engine of
    // the fleet records into the same names, so their lines are fleet-wide, one per job
    // and model (the legend names the job).
    local n = c.recordedNames;
    // One window per decision: a panel that shows the signal an alert acts on reads it over
    // the rule's window, whatever $window says, so it crosses the threshold when the alert
    // goes pending. `low` is the acceptance alert; with source 'vllm' it reads the recording
    // rules, and the exporter's lines follow $window.
    local low = a.SDAcceptanceRateLow;
    local lowFilter = if low.source == 'exporter' then '%s, window="%s"' % [f.sd, low.window] else f.sdWindow;
    local lowWindowWords = if low.source == 'exporter' then 'the %s window SDAcceptanceRateLow reads' % low.window else 'the exporter window selected above';
    local rec(name) = '%s{%s}' % [name, f.recorded];
    local counters = '{{job}} counters, %s' % c.rateWindow;
    // Names that changed between vLLM versions: the current one (0.11+, as in the 0.32 and
    // 0.33 pages of tests/fixtures) or the one before.
    local vllmNames = {
      kvCacheUsage: ['vllm:kv_cache_usage_perc', 'vllm:gpu_cache_usage_perc'],
      timePerOutputToken: ['vllm:request_time_per_output_token_seconds', 'vllm:time_per_output_token_seconds'],
    };
    // Latency quantiles from vLLM histograms that claim no more resolution than the
    // buckets have. histogram_quantile interpolates linearly inside the bucket the quantile
    // falls in: inside vLLM's first queue-time bucket (0-0.3 s) it draws 150 ms for
    // requests that never wait, and when every request lands in one bucket P50 and P99
    // are its middle and its top whatever the real values. So where the bucket holding a
    // quantile is wider than `resolution` x the interpolated value (the first bucket, from
    // 0, always is), the panel shows that bucket's upper bound instead, as "≤" (dashed),
    // and always the exact mean (sum / count) beside it.
    //
    // The bucket is found in PromQL: `step` is 1 for every cumulative bucket holding at
    // least the quantile's share of the requests, 0 below; histogram_quantile(1, step) is
    // the upper bound U of the first such bucket and histogram_quantile(0.5, step) the
    // middle of that bucket, so its width is 2 (U - middle).
    local resolution = c.grafana.quantileResolution;
    local buckets(names) =
      'sum by (le, model_name) (%s)' % std.join(' or ', ['rate(%s_bucket{%s}[$__rate_interval])' % [h, f.vllm] for h in names]);
    local requests(names) =
      'sum by (model_name) (%s)' % std.join(' or ', ['rate(%s_count{%s}[$__rate_interval])' % [h, f.vllm] for h in names]);
    local quantileParts(q, names) = {
      local step = '(%s >= bool on (model_name) group_left () (%g * %s))' % [buckets(names), q, requests(names)],
      value: 'histogram_quantile(%g, %s)' % [q, buckets(names)],
      upper: 'histogram_quantile(1, %s)' % step,
      width: '2 * (histogram_quantile(1, %(s)s) - histogram_quantile(0.5, %(s)s))' % { s: step },
    };
    // The interpolated quantile where its bucket resolves it, else its bucket's upper bound
    // with the label bound=" ≤ bucket bound" (a series of its own, named by the legend).
    local honestQuantile(q, names) =
      local p = quantileParts(q, names) { r: resolution };
      |||
        %(value)s
        and on (model_name)
        (%(width)s <= %(r)g * %(value)s)
        or
        label_replace(
          %(upper)s
          and on (model_name)
          (%(width)s > %(r)g * %(value)s),
          "bound", " ≤ bucket bound", "", ""
        )
        and on () (vector($quantile_bounds) == 1)
      ||| % p;
    local meanOf(names) =
      |||
        sum by (model_name) (%(sum)s)
        /
        (sum by (model_name) (%(count)s) > 0)
      ||| % {
        sum: std.join(' or ', ['rate(%s_sum{%s}[$__rate_interval])' % [h, f.vllm] for h in names]),
        count: std.join(' or ', ['rate(%s_count{%s}[$__rate_interval])' % [h, f.vllm] for h in names]),
      };
    // The targets of a latency panel: the mean first (exact, and the line to read where
    // the buckets are too coarse), then P50 and P99 (each as a value, or as its bucket's
    // bound when the quantile_bounds variable asks for it). `what` qualifies the legend
    // (e.g. per step).
    local latencyTargets(names, what='') =
      local sfx = if what == '' then '' else ' (%s)' % what;
      [t(meanOf(names), '{{model_name}} mean%s' % sfx)] + [
        t(honestQuantile(q[1], names), '{{model_name}} %s{{bound}}%s' % [q[0], sfx])
        for q in [['p50', 0.5], ['p99', 0.99]]
      ];
    // Buckets that resolve a quantile to `resolution`: a bucket (b / ratio, b] is at most
    // resolution x a value inside it wide when ratio <= 1 + resolution.
    local bucketRatio = 1 + resolution;
    local resolutionNote = ' The thick line is the mean (sum / count), always exact. P50 and P99 are interpolated inside histogram buckets and drawn only where the bucket holding them is at most %(r)g x their value wide; where vLLM\'s buckets are coarser (the first bucket always is) the quantile is unresolved and has no line, unless "Unresolved quantiles" is set to show, which draws the bucket\'s upper bound, dashed and marked "≤" (an upper bound, not a measurement). To resolve these quantiles the server would need bucket bounds in a geometric series with each bound at most %(q)g x the one before (for example 1, %(q)g, %(q2).3g, %(q3).3g ... x the smallest latency it serves), from below the lowest latency to above the highest.' % { r: resolution, q: bucketRatio, q2: bucketRatio * bucketRatio, q3: bucketRatio * bucketRatio * bucketRatio };
    // Dashed lines for the bucket bounds.
    local boundsDashed =
      ts.standardOptions.withOverridesMixin([
        ts.standardOptions.override.byRegexp.new('.* mean( .*)?$')
        + ts.standardOptions.override.byRegexp.withProperty('custom.lineWidth', 3),
        ts.standardOptions.override.byRegexp.new('.*≤ bucket bound.*')
        + ts.standardOptions.override.byRegexp.withProperty('custom.lineStyle', { fill: 'dash', dash: [6, 4] }),
      ]);
    // One SD signal per target and model, now: a stat panel of instant queries. A range
    // query reduced to its last non-null value would keep showing a series that has
    // ended (a resolved alert, a target that stopped drafting) until it left the time
    // range; an instant query returns only what exists at the current time.
    local stat = g.panel.stat;
    local nowStat(title, description, unit, targets) =
      stat.new(title)
      + stat.panelOptions.withDescription(description)
      + stat.panelOptions.withGridPos(5, 6)
      + stat.queryOptions.withTargets([x + g.query.prometheus.withInstant() for x in targets])
      + stat.standardOptions.withUnit(unit)
      + stat.options.reduceOptions.withCalcs(['lastNotNull'])
      + stat.options.withColorMode('background')
      + stat.options.withGraphMode('none')
      + stat.options.withTextMode('value_and_name');

    // Ratio of two summed vLLM counters over $__rate_interval, absent (not 0) when the
    // denominator did not move.
    local vllmRatio(num, den) =
      |||
        sum by (model_name) (rate(%(num)s{%(f)s}[$__rate_interval]))
        /
        (sum by (model_name) (rate(%(den)s{%(f)s}[$__rate_interval])) > 0)
      ||| % { num: num, den: den, f: f.vllm };
    local acceptanceRate =
      m.timeSeries(
        'Acceptance α and rate',
        "The acceptance α (share of drafts whose first token was accepted, or the per-token α where the engine has no per-position counters: label method) beside vLLM's acceptance rate (accepted / proposed draft tokens), over %s. The rate falls with the draft length k by construction, because later positions are accepted less often; the α does not, and equals the rate at k = 1. The dashed line is the SDAcceptanceRateLow threshold on the %s (%g; the alert fires after %s below it). Lines marked \"engine counters\" are the same from the recording rules on the serving engines' counters (%s window), one per job and model: every engine of the fleet (vLLM, SGLang, TensorRT-LLM, llama.cpp) records into them. A gap means no drafts were verified in the window (an idle server), not an acceptance of 0." % [lowWindowWords, if low.measure == 'alpha' then 'α' else 'rate', low.threshold, low['for'], c.rateWindow],
        'percentunit',
        [
          t('sd_acceptance_alpha{%s}' % lowFilter, who + ' α ({{method}})'),
          t(rec(n.acceptanceAlpha), '{{model_name}} α (engine counters, %s)' % counters),
          t('sd_acceptance_rate{%s}' % lowFilter, who + ' rate'),
          t(rec(n.acceptanceRate), '{{model_name}} rate (engine counters, %s)' % counters),
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
          t(rec(n.acceptanceLength), '{{model_name}} (engine counters, %s)' % counters),
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
          t(rec(n.draftLengthConfigured), '{{model_name}} configured (engine counters, {{job}})'),
          t(rec(n.draftLength), '{{model_name}} effective (engine counters, %s)' % counters),
        ],
      )
      + ts.fieldConfig.defaults.custom.withAxisLabel('tokens')
      + ts.fieldConfig.defaults.custom.withAxisSoftMin(0);

    local positionAcceptance =
      m.timeSeries(
        'Acceptance by draft position',
        "Share of verification steps whose draft token at each position was accepted (acceptance is a prefix, so it falls with position; position 0 is the α). A steep fall after position 0 says the later draft positions are mostly wasted: a shorter k costs less verification. One line per target, model and position, from the exporter over the window selected above; a model no exporter polls is drawn from the recording rule on its engine's counters instead (%s window, target \"<job> counters\"; every engine with per-position counters), never both." % c.rateWindow,
        'percentunit',
        [
          t(|||
            sd_position_acceptance_rate{%(f)s}
            or on (model_name, position)
            label_replace(%(rec)s, "target", "$1 counters", "job", "(.*)")
          ||| % { f: f.sdWindow, rec: rec(n.positionAcceptanceRate) }, who + ' · position {{position}}'),
        ],
      )
      + ts.standardOptions.withMin(0)
      + ts.standardOptions.withMax(1);

    local conditional =
      m.timeSeries(
        'Conditional acceptance and heterogeneity',
        'Conditional acceptance: the share of drafts whose token at a position was accepted given the previous one was (p_i / p_(i-1)). For one homogeneous population it stays flat or falls with position; rising with position points at a mix of easy and hard traffic. Heterogeneity (0-1, from positions 0 and 1): 0 for homogeneous traffic, 1 for an all-or-nothing mixture; a lower bound when acceptance decays with position.',
        'percentunit',
        [
          t('sd_position_conditional_acceptance_rate{%s}' % f.sdWindow, who + ' · conditional at position {{position}}'),
          t('sd_acceptance_heterogeneity{%s}' % f.sdWindow, who + ' heterogeneity'),
        ],
      )
      + ts.standardOptions.withMin(0)
      + ts.standardOptions.withMax(1);

    local hm = g.panel.heatmap;
    local samplesHeatmap =
      hm.new('Acceptance-rate distribution · $model_name')
      + hm.panelOptions.withDescription("Distribution of per-poll acceptance rates (the sd_acceptance_rate_samples histogram, buckets 0.05 wide; only polls with enough drafts count) of one target (this row) and one model (this panel): the panel repeats per model, the row per target, because summed over several targets each one's band would draw a multi-band picture of unimodal traffic. One band is one population; two bands that alternate in time are two kinds of traffic taking turns, while one band that moves is a change. Cells are samples per second.")
      + hm.panelOptions.withGridPos(8, 12)
      + hm.panelOptions.withRepeat('model_name')
      + hm.panelOptions.withRepeatDirection('h')
      + hm.panelOptions.withMaxPerRow(2)
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
        "Sarle's bimodality coefficient of the per-poll acceptance samples of the last %s (the window SDAcceptanceBimodal reads). Above 5/9 (dashed line, SDAcceptanceBimodal at %g, which fires after %s above it) suggests two modes: part of the traffic drafts well and part badly. Read it with the distribution panel; it is noisy with few samples." % [a.SDAcceptanceBimodal.window, a.SDAcceptanceBimodal.threshold, a.SDAcceptanceBimodal['for']],
        'none',
        [t('sd_acceptance_bimodality_coefficient{%s, window="%s"}' % [f.sd, a.SDAcceptanceBimodal.window], who)],
      )
      + ts.standardOptions.withMin(0)
      + ts.standardOptions.withMax(1)
      + m.thresholdLines([['green', null], ['orange', a.SDAcceptanceBimodal.threshold]]);

    // Speedup against arrival rate, now: per target and model, the current operating
    // point (the measured arrival rate and the predicted speedup, both over the model's
    // window), the break-even point (lambda*, 1) and the break-even line (speedup 1, from
    // 0 to past both points). Instant queries: the chart shows the present, not a cloud
    // of past values. Table queries are merged on their labels and partitioned into one
    // frame per target and model; the partition values become field labels, from which
    // the display names are built, so every target's points carry its own name.
    //
    // The model's curve (modelCurve below) is mixed in after the measured overlay.
    local xy = g.panel.xyChart;
    local by = 'max by (target, model_name)';
    local modelKey = 'job, instance, target, model_name, window';
    // The arrival rate of the window the model's series were computed over.
    local arrivalOfModelWindow =
      'sd_arrival_rate{%(f)s} and on (%(on)s) sd_model_valid{%(f)s}' % { f: f.sd, on: modelKey };
    local finiteBreakeven = 'sd_breakeven_arrival_rate{%s} < +Inf' % f.sd;
    local lineEnd = |||
      1.5 * %(by)s (
        label_replace(%(arrival)s, "point", "now", "", "")
        or label_replace(%(be)s, "point", "break-even", "", "")
      )
    ||| % { by: by, arrival: arrivalOfModelWindow, be: finiteBreakeven };
    local lineStart = '0 * %s (sd_model_valid{%s})' % [by, f.sd];
    local atEnds(start, end_) =
      'label_replace(%s, "end", "start", "", "")\nor\nlabel_replace(%s, "end", "end", "", "")' % [start, end_];
    local instantTable(expr) = t(expr) + g.query.prometheus.withFormat('table') + g.query.prometheus.withInstant();
    // Fields keep their query names (Value #A ...) and get display names from the
    // target and model labels; the series match either form, so they hold whether
    // Grafana matches before or after the display names are applied.
    local named(refId, suffix) =
      xy.standardOptions.override.byRegexp.new('^Value #%s( .*)?$' % refId)
      + xy.standardOptions.override.byRegexp.withProperty('displayName', '${__field.labels.target} · ${__field.labels.model_name} (%s)' % suffix);
    local field(refId, suffix) = { id: 'byRegexp', options: '^(Value #%s( .*)?|.* \\(%s\\))$' % [refId, suffix] };
    // Grafana's xychart (11.x onwards) draws a manual-mode series only when it names its
    // frame, and a frame matcher is byIndex: one series config matches one frame. The
    // partition makes one frame per target and model, so every series (operating point,
    // break-even, line, measured overlay, curve) is repeated for frames 0 to
    // xyChartMaxFrames - 1; target/model pairs beyond them are not drawn (narrow $target
    // or $model_name).
    local perFrame(panel) = panel {
      options+: {
        series: [
          s { frame: { matcher: { id: 'byIndex', options: i } } }
          for i in std.range(0, c.grafana.xyChartMaxFrames - 1)
          for s in super.series
        ],
      },
    };
    local speedupVsLoad =
      xy.new('Predicted speedup against arrival rate, now')
      + xy.withPluginVersion(c.grafana.pluginVersion)
      + xy.panelOptions.withDescription("Per target and model, now: the current operating point (measured arrival rate, x, against the speedup the latency model predicts there, y; both over the model's window), the break-even point (the arrival rate where the predicted speedup is 1) and the break-even line (speedup 1: below it SD makes requests slower). The line through them is the model's curve: the speedup it predicts along arrival rates from 0 to the validity ceiling (max_utilization of the lower throughput ceiling) for the acceptance, draft length and request lengths measured now; it crosses the break-even line at the break-even point. The curve leaves out the rates where the prediction is not valid (beyond the calibrated load, above the utilisation ceiling) and is absent when the model has no inputs. An operating point left of the break-even point is a load where SD pays. A break-even of +Inf (SD pays at every load below saturation) has no point. Only targets with a model parameters file appear.")
      + xy.panelOptions.withGridPos(10, 12)
      + xy.queryOptions.withTargets([
        instantTable('%s (%s)' % [by, arrivalOfModelWindow]),
        instantTable('%s (sd_predicted_speedup{%s})' % [by, f.sd]),
        instantTable('%s (%s)' % [by, finiteBreakeven]),
        // y of the break-even point: the predicted speedup there is 1 by definition.
        instantTable('%s (%s) * 0 + 1' % [by, finiteBreakeven]),
        // The break-even line: x from 0 to 1.5 x the larger of the two points, y = 1.
        instantTable(atEnds(lineStart, lineEnd)),
        instantTable(atEnds(lineStart + ' + 1', '0 * ' + lineEnd + ' + 1')),
      ])
      + xy.queryOptions.withTransformations([
        { id: 'merge', options: {} },
        {
          id: 'partitionByValues',
          options: { fields: ['target', 'model_name'], keepFields: false, naming: { asLabels: true } },
        },
      ])
      + xy.options.withMapping('manual')
      + xy.options.withSeries([
        { x: { matcher: field('A', 'arrival rate') }, y: { matcher: field('B', 'now') } },
        { x: { matcher: field('C', 'break-even arrival rate') }, y: { matcher: field('D', 'break-even') } },
        { x: { matcher: field('E', 'line x') }, y: { matcher: field('F', 'speedup 1') } },
      ])
      + xy.options.legend.withDisplayMode('list')
      + xy.options.legend.withPlacement('bottom')
      + xy.options.legend.withShowLegend()
      + xy.options.tooltip.withMode('single')
      + xy.standardOptions.withUnit('none')
      + xy.fieldConfig.defaults.custom.withShow('points')
      + xy.fieldConfig.defaults.custom.withPointSize(10)
      + xy.fieldConfig.defaults.custom.withAxisLabel('predicted speedup (x)')
      + xy.standardOptions.withOverrides([
        named('A', 'arrival rate')
        + xy.standardOptions.override.byRegexp.withProperty('unit', 'reqps')
        + xy.standardOptions.override.byRegexp.withProperty('custom.axisLabel', 'arrival rate'),
        named('B', 'now'),
        named('C', 'break-even arrival rate')
        + xy.standardOptions.override.byRegexp.withProperty('unit', 'reqps'),
        named('D', 'break-even')
        + xy.standardOptions.override.byRegexp.withProperty('custom.pointShape', 'square')
        + xy.standardOptions.override.byRegexp.withProperty('color', { mode: 'fixed', fixedColor: 'red' }),
        named('E', 'line x')
        + xy.standardOptions.override.byRegexp.withProperty('unit', 'reqps'),
        named('F', 'speedup 1')
        + xy.standardOptions.override.byRegexp.withProperty('custom.show', 'lines')
        + xy.standardOptions.override.byRegexp.withProperty('custom.lineStyle', { fill: 'dash', dash: [10, 10] })
        + xy.standardOptions.override.byRegexp.withProperty('color', { mode: 'fixed', fixedColor: 'red' }),
      ]);

    // The model's curve: the predicted speedup at the exporter's grid of arrival rates
    // for the current acceptance (sd_model_curve_arrival_rate, x, and
    // sd_model_speedup_curve, y, joined by the merge on their `point` label), one line per
    // target and model. Mixed in after the measured overlay (refIds G-J): K and L. The
    // xychart draws a line through the rows in their order: K comes first and is sorted
    // by rate, and the merge keeps the order in which rows first appear, so the line runs
    // left to right.
    local curveBy = 'max by (target, model_name, point)';
    local modelCurve =
      {
        targets+: [
          instantTable('sort(%s (sd_model_curve_arrival_rate{%s}))' % [curveBy, f.sd]),
          instantTable('%s (sd_model_speedup_curve{%s})' % [curveBy, f.sd]),
          // The 90% band around the curve (the fit's residual spread through the fixed
          // point): M lower, N upper, same points, drawn as two thin dashed lines.
          instantTable('%s (sd_model_speedup_curve_lower{%s})' % [curveBy, f.sd]),
          instantTable('%s (sd_model_speedup_curve_upper{%s})' % [curveBy, f.sd]),
        ],
        options+: {
          series+: [
            { x: { matcher: field('K', 'model curve arrival rate') }, y: { matcher: field('L', 'model curve') } },
            { x: { matcher: field('K', 'model curve arrival rate') }, y: { matcher: field('M', 'model 90% lower') } },
            { x: { matcher: field('K', 'model curve arrival rate') }, y: { matcher: field('N', 'model 90% upper') } },
          ],
        },
      }
      + xy.standardOptions.withOverridesMixin([
        named('K', 'model curve arrival rate')
        + xy.standardOptions.override.byRegexp.withProperty('unit', 'reqps'),
        named('L', 'model curve')
        + xy.standardOptions.override.byRegexp.withProperty('custom.show', 'lines')
        + xy.standardOptions.override.byRegexp.withProperty('custom.lineWidth', 2),
      ] + [
        named(ref, 'model 90%% %s' % bound)
        + xy.standardOptions.override.byRegexp.withProperty('custom.show', 'lines')
        + xy.standardOptions.override.byRegexp.withProperty('custom.lineWidth', 1)
        + xy.standardOptions.override.byRegexp.withProperty('custom.lineStyle', { fill: 'dash', dash: [4, 4] })
        for ref_bound in [['M', 'lower'], ['N', 'upper']]
        for ref in [ref_bound[0]]
        for bound in [ref_bound[1]]
      ]);

    // The 90% interval of a prediction: thin dashed lines named "(90% lower)" and
    // "(90% upper)" beside the value.
    local bandDashed =
      ts.standardOptions.withOverrides([
        ts.standardOptions.override.byRegexp.new('.* \\(90% (lower|upper)\\)$')
        + ts.standardOptions.override.byRegexp.withProperty('custom.lineStyle', { fill: 'dash', dash: [4, 4] })
        + ts.standardOptions.override.byRegexp.withProperty('custom.lineWidth', 1)
        + ts.standardOptions.override.byRegexp.withProperty('custom.fillOpacity', 0),
      ]);
    local predictedSpeedup =
      m.timeSeries(
        'Predicted speedup',
        "Latency without SD / latency with SD, predicted by the latency model at the current load, acceptance and lengths; the thin dashed lines around each are its 90%% interval (the calibration's residual spread carried through the fixed point: a band that straddles 1 means the data cannot tell whether SD helps). Dashed lines: 1 (below it SD makes requests slower; SDPredictedSlowdown pages when the upper end of the interval stays below it) and the SDPredictedSpeedupLow threshold (%g). Only targets with a valid model show a line." % a.SDPredictedSpeedupLow.threshold,
        'none',
        [
          t('sd_predicted_speedup{%s}' % f.sd, who),
          t('sd_predicted_speedup_lower{%s}' % f.sd, who + ' (90% lower)'),
          t('sd_predicted_speedup_upper{%s}' % f.sd, who + ' (90% upper)'),
        ],
      )
      + bandDashed
      + ts.fieldConfig.defaults.custom.withAxisLabel('x vs no SD')
      + ts.fieldConfig.defaults.custom.withAxisSoftMin(0.8)
      + m.thresholdLines([['red', null], ['orange', 1], ['green', a.SDPredictedSpeedupLow.threshold]]);

    local breakeven =
      m.timeSeries(
        'Break-even and SD throughput ceiling vs current arrival rate',
        "Two model figures against the measured arrival rate (finished requests per second over the exporter window) and the engines' completion rate (recording rule, per job and model; llama.cpp counts no finished requests). Break-even (red, solid): the arrival rate where the predicted speedup crosses 1; +Inf (no crossing: SD pays up to its ceiling) is off the chart, 0 means SD never pays; arrival above it fires SDArrivalRateAboveBreakeven. SD throughput ceiling (purple, dashed): the arrival rate past which SD no longer keeps up, measured or modelled; the speedup may still be well above 1 just below it, so it is not a break-even.",
        'reqps',
        [
          t('sd_breakeven_arrival_rate{%s}' % f.sd, who + ' break-even'),
          t('sd_throughput_ceiling_arrival_rate{%s}' % f.sd, who + ' SD throughput ceiling'),
          t('sd_arrival_rate{%s}' % f.sdWindow, who + ' arrival'),
          t(rec(n.arrivalRate), '{{model_name}} completions (engine counters, %s)' % counters),
        ],
      )
      // Break-even red and solid, the ceiling purple and dashed: two figures, two lines.
      + ts.standardOptions.withOverrides([
        ts.standardOptions.override.byRegexp.new('.* break-even$')
        + ts.standardOptions.override.byRegexp.withProperty('color', { mode: 'fixed', fixedColor: 'red' })
        + ts.standardOptions.override.byRegexp.withProperty('custom.lineWidth', 2)
        + ts.standardOptions.override.byRegexp.withProperty('custom.fillOpacity', 0),
        ts.standardOptions.override.byRegexp.new('.* SD throughput ceiling$')
        + ts.standardOptions.override.byRegexp.withProperty('color', { mode: 'fixed', fixedColor: 'purple' })
        + ts.standardOptions.override.byRegexp.withProperty('custom.lineStyle', { fill: 'dash', dash: [10, 6] })
        + ts.standardOptions.override.byRegexp.withProperty('custom.lineWidth', 2)
        + ts.standardOptions.override.byRegexp.withProperty('custom.fillOpacity', 0),
      ]);

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
        'Mean end-to-end request latency the model predicts at the current load with SD (mode="sd") and without it (mode="nosd"); the thin dashed lines around each are its 90% interval (the calibration\'s residual spread carried through the fixed point). Their ratio is the predicted speedup. Only while the model is valid.',
        's',
        [
          t('sd_predicted_latency_seconds{%s}' % f.sd, who + ' {{mode}}'),
          t('sd_predicted_latency_lower_seconds{%s}' % f.sd, who + ' {{mode}} (90% lower)'),
          t('sd_predicted_latency_upper_seconds{%s}' % f.sd, who + ' {{mode}} (90% upper)'),
        ],
      )
      + bandDashed;

    local modelError =
      m.timeSeries(
        'Model error: predicted / measured mean latency - 1',
        'Signed relative error of the latency model at the observed load: the predicted mean latency of the running configuration over the measured mean latency of the model window, minus 1. Beyond either dashed line (+%g or -%g; the %s window the rule reads) for %s fires SDModelDrift: re-calibrate. Periods when the prediction is not valid are marked by the "model invalid" annotation with its reason (saturated, beyond_calibrated_load, queueing, ...).' % [a.SDModelDrift.threshold, a.SDModelDrift.threshold, c.exporterWindow, a.SDModelDrift['for']],
        'percentunit',
        [t('sd_model_latency_error_ratio{%s, window="%s"}' % [f.sd, c.exporterWindow], who)],
      )
      + m.thresholdLines([['red', null], ['green', -a.SDModelDrift.threshold], ['red', a.SDModelDrift.threshold]]);

    local e2e =
      m.timeSeries(
        'End-to-end latency P50 / P99',
        "Request latency from arrival to the last token, from vLLM's vllm:e2e_request_latency_seconds histogram (finished requests), per model." + resolutionNote,
        's',
        latencyTargets(['vllm:e2e_request_latency_seconds']),
      ) + boundsDashed;

    local ttft =
      m.timeSeries(
        'Time to first token P50 / P99',
        'Time from arrival to the first token (queueing plus prefill), from vllm:time_to_first_token_seconds, per model. SD does not speed up prefill; a longer queue under SD shows here.' + resolutionNote,
        's',
        latencyTargets(['vllm:time_to_first_token_seconds']),
      ) + boundsDashed;

    local itl =
      m.timeSeries(
        'Inter-token latency P50 / P99',
        'Gap between successive outputs of a decoding request, from vllm:inter_token_latency_seconds. With SD one output carries 1 to k+1 tokens, so this is the time per verification step, not per token; the mean time per output token (per token, from vllm:request_time_per_output_token_seconds) is shown alongside.' + resolutionNote,
        's',
        latencyTargets(['vllm:inter_token_latency_seconds'], 'per step')
        + [t(vllmRatio('vllm:request_time_per_output_token_seconds_sum', 'vllm:request_time_per_output_token_seconds_count'), '{{model_name}} mean per token')],
      ) + boundsDashed;

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
      st.new('Controller state and why')
      + st.panelOptions.withDescription('State of the specwatch controller per target and model: enabled (SD on), disabled (SD switched off), pending (a switch was requested and the server has not come back with the new configuration), one row per reason it gives for that state next to the latency model (in brackets): agrees (state and recommended k follow the model), acceptance_guard (the first-position acceptance, which unlike the vLLM acceptance rate does not fall with k, is below min_acceptance_alpha and SD does not pay: SD off, recommended k 0, although the model predicts some speedup), sd_pays (a switch-off condition holds, such as low acceptance or an alert, but the predicted or measured A/B speedup shows SD paying above enable_above_speedup: SD stays on; GET /controller names the signals that disagree), alert (an Alertmanager alert holds SD off), hysteresis (SD off, predicted speedup between the switch-off and switch-on thresholds), stabilization (a switch condition has not held long enough yet), min_interval (the last switch is too recent), no_prediction, no_data (the poll cannot be used), pending. Empty when the controller is not enabled for a target.')
      + st.panelOptions.withGridPos(8, 12)
      + st.queryOptions.withTargets([
        t(|||
          max by (target, model_name, reason) (
            sd_controller_state{%(f)s, state="enabled"}
            or sd_controller_state{%(f)s, state="disabled"} * 2
            or sd_controller_state{%(f)s, state="pending"} * 3
          )
        ||| % { f: f.sd }, who + ' ({{reason}})'),
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
        "The draft length the controller recommends beside the model's optimal k (sd_optimal_draft_length; they differ when the controller's acceptance guard limits k: see the reason on the state panel), and the actions it took (transitions per rate interval, by action) and actuation errors. Actions are rare; every one is also logged with before/after latency.",
        'short',
        [
          t('sd_controller_recommended_draft_length{%s}' % f.sd, who + ' recommended k'),
          t('sd_optimal_draft_length{%s}' % f.sd, who + ' model optimal k'),
          t('sum by (target, model_name, action) (increase(sd_controller_transitions_total{%s}[$__rate_interval]))' % f.sd, who + ' {{action}}'),
          t('sum by (target, model_name) (increase(sd_controller_actuation_errors_total{%s}[$__rate_interval]))' % f.sd, who + ' actuation errors'),
        ],
      )
      + ts.standardOptions.withDecimals(0);

    // ---- Top row: is SD paying off right now, how far from break-even, what fires.
    local acceptanceNow =
      nowStat(
        'Acceptance now',
        "Acceptance α (share of drafts whose first token was accepted; the per-token α where positions are not counted) and vLLM's acceptance rate (accepted / proposed draft tokens) per target and model, now, over %s. The rate falls with the draft length k by construction, the α does not (they are equal at k = 1); the %s is red below the SDAcceptanceRateLow threshold (%g), which the alert needs for %s. No value: no drafts verified in the window." % [lowWindowWords, if low.measure == 'alpha' then 'α' else 'rate', low.threshold, low['for']],
        'percentunit',
        [
          t('sd_acceptance_alpha{%s}' % lowFilter, who + ' α'),
          t('sd_acceptance_rate{%s}' % lowFilter, who + ' rate'),
        ],
      )
      + stat.standardOptions.thresholds.withMode('absolute')
      + stat.standardOptions.thresholds.withSteps([
        { color: 'red', value: null },
        { color: 'green', value: a.SDAcceptanceRateLow.threshold },
      ])
      // Only the measure the alert compares is coloured by its threshold.
      + stat.standardOptions.withOverrides([
        stat.standardOptions.override.byRegexp.new(if a.SDAcceptanceRateLow.measure == 'alpha' then '.* rate$' else '.* α$')
        + stat.standardOptions.override.byRegexp.withProperty('color', { mode: 'fixed', fixedColor: 'blue' }),
      ]);

    local speedupNow =
      nowStat(
        'Predicted speedup and validity',
        'Speedup the latency model predicts for SD at the live load (latency without SD / with SD; below 1 SD makes requests slower), and whether the model is valid for each target and model. Red below 1 (SD makes requests slower), orange below the SDPredictedSpeedupLow threshold (%g). An invalid model has no speedup: "invalid" says so instead of a number (SDModelInvalid explains why; saturation is SDModelSaturated).' % a.SDPredictedSpeedupLow.threshold,
        'none',
        [
          t('sd_predicted_speedup{%s}' % f.sd, who),
          t('sd_model_valid{%s}' % f.sd, who + ' model'),
        ],
      )
      + stat.standardOptions.withDecimals(2)
      + stat.standardOptions.thresholds.withMode('absolute')
      + stat.standardOptions.thresholds.withSteps([
        { color: 'red', value: null },
        { color: 'orange', value: 1 },
        { color: 'green', value: a.SDPredictedSpeedupLow.threshold },
      ])
      + stat.standardOptions.withOverrides([
        // Match the raw field and its display name (the legend of query B).
        stat.standardOptions.override.byRegexp.new('.* model$')
        + stat.standardOptions.override.byRegexp.withProperty('mappings', [{
          type: 'value',
          options: {
            '0': { index: 0, text: 'invalid', color: 'red' },
            '1': { index: 1, text: 'valid', color: 'green' },
          },
        }]),
      ]);

    local headroom =
      nowStat(
        'Headroom to break-even and to SD ceiling (×λ)',
        "Break-even arrival rate (where the predicted speedup crosses 1), and SD's throughput ceiling (past which SD no longer keeps up), each over the measured arrival rate, all over the model window: how many times today's load the server can take before SD stops paying, or stops keeping up. Break-even below 1: SD already costs latency (SDArrivalRateAboveBreakeven); +Inf: no crossing below SD's ceiling. No value with no traffic.",
        'none',
        [t(|||
          sd_breakeven_arrival_rate{%(f)s}
          / on (job, instance, target, model_name, window)
          (sd_arrival_rate{%(f)s} > 0)
        ||| % { f: f.sd }, who + ' to break-even'), t(|||
          sd_throughput_ceiling_arrival_rate{%(f)s}
          / on (job, instance, target, model_name, window)
          (sd_arrival_rate{%(f)s} > 0)
        ||| % { f: f.sd }, who + ' to SD ceiling')],
      )
      + stat.standardOptions.withDecimals(2)
      + stat.standardOptions.thresholds.withMode('absolute')
      + stat.standardOptions.thresholds.withSteps([
        { color: 'red', value: null },
        { color: 'orange', value: 1 },
        { color: 'green', value: 1.5 },
      ]);

    local firing =
      nowStat(
        'Firing specwatch alerts',
        'specwatch alerts firing now for the selected targets and models, by alert name (alerts without a target, such as SpecwatchAbsent, always count): ALERTS{alertstate="firing"} at the current time, so an alert that has resolved is gone at once. The alert annotations on the time series mark when they fired.',
        'short',
        [t('count by (alertname) (%s)' % m.alertsSelector, '{{alertname}}')],
      )
      + stat.standardOptions.withNoValue('none firing')
      + stat.standardOptions.thresholds.withMode('absolute')
      + stat.standardOptions.thresholds.withSteps([{ color: 'red', value: null }]);

    // ---- Serving context: what vLLM's own dashboard shows beside SD.
    local tokens =
      m.timeSeries(
        'Tokens per second',
        "Prompt (prefill) and generated tokens per second from vLLM's counters, per model: the work the server does, against which SD's gains and waste are measured.",
        'short',
        [
          t('sum by (model_name) (rate(vllm:generation_tokens_total{%s}[$__rate_interval]))' % f.vllm, '{{model_name}} generated'),
          t('sum by (model_name) (rate(vllm:prompt_tokens_total{%s}[$__rate_interval]))' % f.vllm, '{{model_name}} prompt'),
        ],
      )
      + ts.fieldConfig.defaults.custom.withAxisLabel('tokens / s');

    local draftTokens =
      m.timeSeries(
        'Draft tokens accepted and wasted per second',
        "Draft tokens the verifier accepted per second, and those it rejected (proposed - accepted): the wasted verification work, per job and model, from the recording rules on the serving engines' counters (%s window)." % c.rateWindow,
        'short',
        [
          t(rec(n.acceptedTokens), '{{model_name}} accepted ({{job}})'),
          t('%s\n- on (%s, job, model_name)\n%s' % [rec(n.draftTokens), c.clusterLabel, rec(n.acceptedTokens)], '{{model_name}} wasted ({{job}})'),
        ],
      )
      + ts.fieldConfig.defaults.custom.withAxisLabel('tokens / s');

    // ---- Speculative decoding per engine: what vLLM's own speculative-decoding dashboard
    // shows (examples/observability/dashboards/grafana/vllm_speculative_decoding.json),
    // with α beside vLLM's rate.
    local fe = f.vllmEngine;
    local perEngine(metric, by) = 'sum by (%s) (rate(%s{%s}[$__rate_interval]))' % [by, metric, fe];
    local engineBy = 'model_name, instance, engine';
    local acceptancePerEngine =
      m.timeSeries(
        'Acceptance per engine',
        "Per vLLM instance and engine (the vLLM instance and Engine variables filter them): the acceptance α, the share of drafts whose first token was accepted (vllm:spec_decode_num_accepted_tokens_per_pos_total at position 0 over vllm:spec_decode_num_drafts_total; absent where the engine has no per-position counters), and vLLM's acceptance rate (accepted / proposed draft tokens, as vLLM's own dashboard draws it). The rate falls with the draft length k by construction, the α does not. One engine far below the others points at that engine's traffic or configuration. Over $__rate_interval.",
        'percentunit',
        [
          t('%s\n/\n(%s > 0)' % [
            'sum by (%s) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total{%s, position="0"}[$__rate_interval]))' % [engineBy, fe],
            perEngine('vllm:spec_decode_num_drafts_total', engineBy),
          ], '{{model_name}} · {{instance}} · engine {{engine}} α'),
          t('%s\n/\n(%s > 0)' % [
            perEngine('vllm:spec_decode_num_accepted_tokens_total', engineBy),
            perEngine('vllm:spec_decode_num_draft_tokens_total', engineBy),
          ], '{{model_name}} · {{instance}} · engine {{engine}} rate'),
        ],
      )
      + ts.standardOptions.withMin(0)
      + ts.standardOptions.withMax(1);

    local draftShare =
      m.timeSeries(
        'Output tokens from drafts',
        'Share of the generated tokens that were accepted draft tokens (vllm:spec_decode_num_accepted_tokens_total over vllm:generation_tokens_total), per model, for the selected instances and engines: the part of the output the drafter wrote. 0 means SD adds nothing but its cost; with k draft tokens it can approach k / (k + 1).',
        'percentunit',
        [t('%s\n/\n(%s > 0)' % [
          perEngine('vllm:spec_decode_num_accepted_tokens_total', 'model_name'),
          perEngine('vllm:generation_tokens_total', 'model_name'),
        ], '{{model_name}}')],
      )
      + ts.standardOptions.withMin(0)
      + ts.standardOptions.withMax(1);

    local draftRates =
      m.timeSeries(
        'Drafts and proposed draft tokens per second',
        'Drafts (verification steps that carried a draft) and draft tokens proposed per second, per model, for the selected instances and engines (vllm:spec_decode_num_drafts_total, vllm:spec_decode_num_draft_tokens_total). Proposed tokens / drafts is the effective draft length.',
        'short',
        [
          t(perEngine('vllm:spec_decode_num_draft_tokens_total', 'model_name'), '{{model_name}} proposed draft tokens'),
          t(perEngine('vllm:spec_decode_num_drafts_total', 'model_name'), '{{model_name}} drafts'),
        ],
      )
      + ts.fieldConfig.defaults.custom.withAxisLabel('per second');

    local tpot =
      m.timeSeries(
        'Time per output token P50 / P99',
        "Time per generated token of each request (TPOT: decode time / tokens), from vLLM's vllm:request_time_per_output_token_seconds (vllm:time_per_output_token_seconds before vLLM 0.11), per model. With SD a step yields several tokens, so TPOT falls while the inter-token latency per step (vLLM latency row) may rise." + resolutionNote,
        's',
        latencyTargets(vllmNames.timePerOutputToken),
      ) + boundsDashed;

    local queueTime =
      m.timeSeries(
        'Queue time P50 / P99',
        "Time requests wait in vLLM's queue before they are scheduled (vllm:request_queue_time_seconds), per model. Rising queue time means the server is past the load it serves; SD's extra verification work brings that point closer." + resolutionNote,
        's',
        latencyTargets(['vllm:request_queue_time_seconds']),
      ) + boundsDashed;

    local kvCache =
      m.timeSeries(
        'KV-cache usage',
        'Share of the KV cache in use (vllm:kv_cache_usage_perc; vllm:gpu_cache_usage_perc before vLLM 0.11), the highest engine per model. Close to 100% vLLM preempts requests; draft tokens take KV-cache space too.',
        'percentunit',
        [t('max by (model_name) (%s)' % std.join(' or ', ['%s{%s}' % [x, f.vllm] for x in vllmNames.kvCacheUsage]), '{{model_name}}')],
      )
      + ts.standardOptions.withMin(0)
      + ts.standardOptions.withMax(1);

    local preemptions =
      m.timeSeries(
        'Preemptions per second',
        'Requests vLLM preempted (evicted from the KV cache, to be recomputed) per second, per model (vllm:num_preemptions_total). Any sustained rate means the KV cache is too small for the load; each preemption throws work away.',
        'short',
        [t('sum by (model_name) (rate(vllm:num_preemptions_total{%s}[$__rate_interval]))' % f.vllm, '{{model_name}}')],
      );

    g.dashboard.new(c.dashboardTitles['specwatch-sd-overview.json'])
    + g.dashboard.withDescription("Speculative decoding at a glance: acceptance, draft length, the latency model's predicted speedup and break-even load, vLLM latency, and the controller.")
    + g.dashboard.withVariables(
      [v.datasource] + m.clusterVariables + [v.job, v.vllmJob, v.sdTarget, v.modelName, v.vllmInstance, v.engine, v.window, ms.statistic, v.quantileBounds]
    )
    + g.dashboard.withAnnotationsMixin([
      g.dashboard.annotation.withName('specwatch alerts')
      + g.dashboard.annotation.withDatasource({ type: 'prometheus', uid: '${datasource}' })
      + g.dashboard.annotation.withEnable()
      + g.dashboard.annotation.withHide(false)
      + g.dashboard.annotation.withIconColor('red')
      + g.dashboard.annotation.withExpr(m.alertsSelector)
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
        row.new('Now: is SD paying off?'),
        acceptanceNow,
        speedupNow,
        headroom,
        firing,
        row.new('Acceptance'),
        acceptanceRate,
        acceptanceLength,
        draftLength,
        positionAcceptance,
        bimodality,
        conditional,
        // One row per target, one heatmap per model in it: a heatmap must never sum the
        // distributions of two targets or models.
        row.new('Acceptance distribution · $target') + row.withRepeat('target'),
        samplesHeatmap,
        row.new('Latency model: does SD pay at this load?'),
        perFrame(speedupVsLoad + ms.overlay + modelCurve),
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
        row.new('Speculative decoding per engine'),
        acceptancePerEngine,
        draftShare,
        draftRates,
        row.new('Serving context'),
        tokens,
        draftTokens,
        tpot,
        queueTime,
        kvCache,
        preemptions,
        row.new('Controller'),
        controllerState,
        controllerK,
        row.new('Measured speedup'),
        ms.measuredSpeedup,
        ms.switchHistory,
      ])
    ),
}
