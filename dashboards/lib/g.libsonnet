// The single import point for building dashboards, with the names and call shapes of
// grafonnet (github.com/grafana/grafonnet, gen/grafonnet-v11.4.0): `g.dashboard.new`,
// `g.panel.timeSeries.new`, `...standardOptions.withUnit`, `g.query.prometheus.new`,
// `g.dashboard.variable.query.new`, `g.util.grid.wrapPanels`, ...
//
// grafonnet cannot be installed from the package registries this project builds with, so
// this file implements the small subset the specwatch dashboards use. Replacing it with
// grafonnet (jsonnetfile.json declares v11.4.0) is the import
// `github.com/grafana/grafonnet/gen/grafonnet-v11.4.0/main.libsonnet` here plus the few
// extensions docs/dashboards-alerts.md lists (tests/mixin/test_mixin_grafonnet.py keeps that list
// exact). Only builders live here; no specwatch query or layout does.
local fieldConfigDefaults(o) = { fieldConfig+: { defaults+: o } };
local custom(o) = fieldConfigDefaults({ custom+: o });
local options(o) = { options+: o };
local asArray(v) = if std.isArray(v) then v else [v];

// Options every panel type shares.
local panel(type) = {
  new(title): {
    type: type,
    title: title,
    // grafonnet sets the plugin version it was generated for; we set the one from
    // config through withPluginVersion, and default to no migration-triggering blank.
    fieldConfig: { defaults: {}, overrides: [] },
    options: {},
  },
  withPluginVersion(value): { pluginVersion: value },
  panelOptions: {
    withDescription(value): { description: value },
    withGridPos(h=8, w=12, x=0, y=0): { gridPos: { h: h, w: w, x: x, y: y } },
    withRepeat(value): { repeat: value },
    withRepeatDirection(value='h'): { repeatDirection: value },
    withMaxPerRow(value): { maxPerRow: value },
    withLinks(value): { links: asArray(value) },
  },
  queryOptions: {
    withDatasource(type, uid): { datasource: { type: type, uid: uid } },
    withTargets(value): { targets: asArray(value) },
    withTargetsMixin(value): { targets+: asArray(value) },
    withTransformations(value): { transformations: asArray(value) },
    withInterval(value): { interval: value },
    withMaxDataPoints(value): { maxDataPoints: value },
  },
  standardOptions: {
    withUnit(value): fieldConfigDefaults({ unit: value }),
    withMin(value): fieldConfigDefaults({ min: value }),
    withMax(value): fieldConfigDefaults({ max: value }),
    withDecimals(value): fieldConfigDefaults({ decimals: value }),
    withNoValue(value): fieldConfigDefaults({ noValue: value }),
    withMappings(value): fieldConfigDefaults({ mappings: asArray(value) }),
    withOverrides(value): { fieldConfig+: { overrides: asArray(value) } },
    withOverridesMixin(value): { fieldConfig+: { overrides+: asArray(value) } },
    color: {
      withMode(value): fieldConfigDefaults({ color+: { mode: value } }),
      withFixedColor(value): fieldConfigDefaults({ color+: { fixedColor: value } }),
    },
    thresholds: {
      withMode(value): fieldConfigDefaults({ thresholds+: { mode: value } }),
      withSteps(value): fieldConfigDefaults({ thresholds+: { steps: asArray(value) } }),
    },
    override: {
      byName: {
        new(value): { matcher: { id: 'byName', options: value }, properties: [] },
        withProperty(id, value): { properties+: [{ id: id, value: value }] },
      },
      byRegexp: {
        new(value): { matcher: { id: 'byRegexp', options: value }, properties: [] },
        withProperty(id, value): { properties+: [{ id: id, value: value }] },
      },
    },
  },
};

// Grafana's defaults of the legend and tooltip, written out: its published schema
// (@grafana/schema) declares them required, and a saved dashboard always has them.
local vizDefaults = {
  legend: { showLegend: true, displayMode: 'list', placement: 'bottom', calcs: [] },
  tooltip: { mode: 'single', sort: 'none' },
};
local withVizDefaults(type) = panel(type) + {
  new(title): super.new(title) + { options+: vizDefaults },
};

// The legend/tooltip options of the uPlot-based panels.
local vizOptions = {
  legend: {
    withDisplayMode(value): options({ legend+: { displayMode: value } }),
    withPlacement(value): options({ legend+: { placement: value } }),
    withShowLegend(value=true): options({ legend+: { showLegend: value } }),
    withCalcs(value): options({ legend+: { calcs: asArray(value) } }),
  },
  tooltip: {
    withMode(value): options({ tooltip+: { mode: value } }),
    withSort(value): options({ tooltip+: { sort: value } }),
  },
};

local variableCommon = {
  generalOptions: {
    withLabel(value): { label: value },
    withDescription(value): { description: value },
    withCurrent(key, value=key): { current: { selected: false, text: key, value: value } },
    showOnDashboard: {
      withLabelAndValue(): { hide: 0 },
      withValueOnly(): { hide: 1 },
      withNothing(): { hide: 2 },
    },
  },
};

{
  dashboard: {
    new(title): {
      id: null,
      title: title,
      schemaVersion: 39,
      version: 1,
      editable: false,
      graphTooltip: 0,
      fiscalYearStartMonth: 0,
      liveNow: false,
      timezone: 'browser',
      time: { from: 'now-6h', to: 'now' },
      timepicker: {},
      refresh: '',
      tags: [],
      links: [],
      panels: [],
      templating: { list: [] },
      annotations: {
        list: [
          // Grafana's own annotations and alerts, as Grafana adds them on save.
          {
            builtIn: 1,
            datasource: { type: 'grafana', uid: '-- Grafana --' },
            enable: true,
            hide: true,
            iconColor: 'rgba(0, 211, 255, 1)',
            name: 'Annotations & Alerts',
            type: 'dashboard',
          },
        ],
      },
    },
    withUid(value): { uid: value },
    withDescription(value): { description: value },
    withTags(value): { tags: asArray(value) },
    withTimezone(value): { timezone: value },
    withRefresh(value): { refresh: value },
    withEditable(value=true): { editable: value },
    withPanels(value): { panels: asArray(value) },
    withVariables(value): { templating+: { list: asArray(value) } },
    withLinks(value): { links: asArray(value) },
    withAnnotationsMixin(value): { annotations+: { list+: asArray(value) } },
    time: {
      withFrom(value): { time+: { from: value } },
      withTo(value): { time+: { to: value } },
    },
    graphTooltip: {
      withSharedCrosshair(): { graphTooltip: 1 },
      withSharedTooltip(): { graphTooltip: 2 },
    },
    link: {
      dashboards: {
        new(title, tags): {
          title: title,
          type: 'dashboards',
          tags: asArray(tags),
          asDropdown: false,
          icon: 'external link',
          includeVars: false,
          keepTime: false,
          targetBlank: false,
          tooltip: '',
          url: '',
        },
        options: {
          withAsDropdown(value=true): { asDropdown: value },
          withIncludeVars(value=true): { includeVars: value },
          withKeepTime(value=true): { keepTime: value },
        },
      },
      link: {
        new(title, url): {
          title: title,
          type: 'link',
          url: url,
          asDropdown: false,
          icon: 'external link',
          includeVars: false,
          keepTime: false,
          tags: [],
          targetBlank: false,
          tooltip: '',
        },
        withIcon(value): { icon: value },
        withTooltip(value): { tooltip: value },
        options: {
          withTargetBlank(value=true): { targetBlank: value },
        },
      },
    },
    annotation: {
      withName(value): { name: value },
      withDatasource(value): { datasource: value },
      withEnable(value=true): { enable: value },
      withHide(value=true): { hide: value },
      withIconColor(value): { iconColor: value },
      // Prometheus-specific fields of an annotation query.
      withExpr(value): { expr: value },
      withStep(value): { step: value },
      withTitleFormat(value): { titleFormat: value },
      withTextFormat(value): { textFormat: value },
      withTagKeys(value): { tagKeys: value },
    },
    variable: {
      datasource: variableCommon {
        new(name, type): {
          type: 'datasource',
          name: name,
          query: type,
          regex: '',
          hide: 0,
          refresh: 1,
          options: [],
        },
        withRegex(value): { regex: value },
      },
      query: variableCommon {
        new(name, query=''): {
          type: 'query',
          name: name,
          query: query,
          definition: query,
          regex: '',
          hide: 0,
          refresh: 1,
          sort: 1,
          includeAll: false,
          multi: false,
          options: [],
          skipUrlSync: false,
        },
        withDatasourceFromVariable(variable): {
          datasource: { type: 'prometheus', uid: '${%s}' % variable.name },
        },
        withRegex(value): { regex: value },
        withSort(i=1): { sort: i },
        queryTypes: {
          withLabelValues(label, metric=''): {
            local q = if metric == '' then 'label_values(%s)' % label
            else 'label_values(%s, %s)' % [metric, label],
            query: q,
            definition: q,
          },
        },
        refresh: {
          onLoad(): { refresh: 1 },
          onTime(): { refresh: 2 },
        },
        selectionOptions: {
          withIncludeAll(value=true, customAllValue=null): {
            includeAll: value,
            [if customAllValue != null then 'allValue']: customAllValue,
          },
          withMulti(value=true): { multi: value },
        },
      },
      custom: variableCommon {
        // values: list of strings; the first is the default.
        new(name, values): {
          type: 'custom',
          name: name,
          query: std.join(',', values),
          hide: 0,
          includeAll: false,
          multi: false,
          skipUrlSync: false,
          current: { selected: true, text: values[0], value: values[0] },
          options: [
            { selected: i == 0, text: values[i], value: values[i] }
            for i in std.range(0, std.length(values) - 1)
          ],
        },
      },
    },
  },

  panel: {
    row: {
      new(title): { type: 'row', title: title, collapsed: false, panels: [] },
      withCollapsed(value=true): { collapsed: value },
      withRepeat(value): { repeat: value },
      withGridPos(y): { gridPos: { h: 1, w: 24, x: 0, y: y } },
    },

    timeSeries: withVizDefaults('timeseries') + {
      options+: vizOptions,
      fieldConfig: {
        defaults: {
          custom: {
            withDrawStyle(value): custom({ drawStyle: value }),
            withLineWidth(value): custom({ lineWidth: value }),
            withFillOpacity(value): custom({ fillOpacity: value }),
            withShowPoints(value): custom({ showPoints: value }),
            withSpanNulls(value): custom({ spanNulls: value }),
            withAxisSoftMin(value): custom({ axisSoftMin: value }),
            withAxisSoftMax(value): custom({ axisSoftMax: value }),
            withAxisLabel(value): custom({ axisLabel: value }),
            thresholdsStyle: {
              withMode(value): custom({ thresholdsStyle: { mode: value } }),
            },
          },
        },
      },
    },

    stat: panel('stat') + {
      // Grafana's defaults, written out (required in @grafana/schema).
      new(title): super.new(title) + {
        options+: {
          colorMode: 'value',
          graphMode: 'area',
          justifyMode: 'auto',
          orientation: 'auto',
          textMode: 'auto',
          wideLayout: true,
          showPercentChange: false,
          percentChangeColorMode: 'standard',
          reduceOptions: { calcs: ['lastNotNull'], fields: '', values: false },
        },
      },
      options+: {
        withColorMode(value): options({ colorMode: value }),
        withGraphMode(value): options({ graphMode: value }),
        withTextMode(value): options({ textMode: value }),
        withJustifyMode(value): options({ justifyMode: value }),
        reduceOptions: {
          withCalcs(value): options({ reduceOptions+: { calcs: asArray(value), fields: '', values: false } }),
        },
      },
    },

    stateTimeline: withVizDefaults('state-timeline') + {
      new(title): super.new(title) + { options+: { rowHeight: 0.9, alignValue: 'left' } },
      options+: vizOptions {
        withShowValue(value): options({ showValue: value }),
        withMergeValues(value=true): options({ mergeValues: value }),
        withRowHeight(value): options({ rowHeight: value }),
      },
      fieldConfig: {
        defaults: {
          custom: {
            withFillOpacity(value): custom({ fillOpacity: value }),
            withLineWidth(value): custom({ lineWidth: value }),
          },
        },
      },
    },

    heatmap: panel('heatmap') + {
      // The heatmap has its own legend and tooltip shapes; Grafana's defaults, written out.
      new(title): super.new(title) + {
        options+: {
          color+: { reverse: false },
          legend: { show: true },
          tooltip: { mode: 'single', yHistogram: false, showColorScale: false },
          exemplars: { color: 'rgba(255,0,255,0.7)' },
          showValue: 'auto',
        },
      },
      options+: vizOptions {
        withCalculate(value=true): options({ calculate: value }),
        withCellGap(value): options({ cellGap: value }),
        color: {
          withMode(value): options({ color+: { mode: value } }),
          withScheme(value): options({ color+: { scheme: value } }),
          withScale(value): options({ color+: { scale: value } }),
          withExponent(value): options({ color+: { exponent: value } }),
          withSteps(value): options({ color+: { steps: value } }),
          withFill(value): options({ color+: { fill: value } }),
          withReverse(value=true): options({ color+: { reverse: value } }),
        },
        rowsFrame: {
          withLayout(value): options({ rowsFrame+: { layout: value } }),
        },
        yAxis: {
          withUnit(value): options({ yAxis+: { unit: value } }),
          withDecimals(value): options({ yAxis+: { decimals: value } }),
          withAxisPlacement(value): options({ yAxis+: { axisPlacement: value } }),
        },
        cellValues: {
          withUnit(value): options({ cellValues+: { unit: value } }),
        },
        filterValues: {
          withLe(value): options({ filterValues+: { le: value } }),
        },
      },
    },

    // The xychart as Grafana 11 stores it (panelcfg v2: `mapping` and `series` with
    // field matchers). Set withPluginVersion: with an empty version Grafana runs its
    // pre-GA migration over these options.
    xyChart: withVizDefaults('xychart') + {
      options+: vizOptions {
        withMapping(value): options({ mapping: value }),
        withSeries(value): options({ series: asArray(value) }),
        series: {
          // One x/y pair; matchers are Grafana field matchers ({id, options}).
          new(x, y, name=null): {
            x: { matcher: { id: 'byName', options: x } },
            y: { matcher: { id: 'byName', options: y } },
            [if name != null then 'name']: { fixed: name },
          },
        },
      },
      fieldConfig: {
        defaults: {
          custom: {
            withShow(value): custom({ show: value }),
            withPointSize(value): custom({ pointSize: { fixed: value } }),
            withLineWidth(value): custom({ lineWidth: value }),
            withAxisLabel(value): custom({ axisLabel: value }),
            withAxisSoftMin(value): custom({ axisSoftMin: value }),
          },
        },
      },
    },
  },

  query: {
    prometheus: {
      new(datasource, expr): {
        datasource: { type: 'prometheus', uid: datasource },
        expr: expr,
      },
      withLegendFormat(value): { legendFormat: value },
      withInstant(value=true): { instant: value, range: !value },
      withRange(value=true): { range: value },
      withFormat(value): { format: value },
      withIntervalFactor(value): { intervalFactor: value },
      withRefId(value): { refId: value },
    },
  },

  util: {
    panel: {
      // RefIDs A, B, C, ... on the panel's targets, as grafonnet's util.panel.setRefIDs.
      setRefIDs(panel, overrideExistingIDs=true):
        if !std.objectHas(panel, 'targets') then panel
        else panel {
          targets: [
            panel.targets[i] + (
              if overrideExistingIDs || !std.objectHas(panel.targets[i], 'refId')
              then { refId: std.char(std.codepoint('A') + i) }
              else {}
            )
            for i in std.range(0, std.length(panel.targets) - 1)
          ],
        },
      // Unique panel ids 1..n in order, as grafonnet's util.panel.setPanelIDs.
      setPanelIDs(panels):
        [panels[i] { id: i + 1 } for i in std.range(0, std.length(panels) - 1)],
    },
    grid: {
      // Lay panels out left to right, wrapping at 24 columns; a row panel starts a new
      // line and takes the full width. Each panel keeps its own gridPos.w/h when set.
      wrapPanels(panels, panelWidth=8, panelHeight=8, startY=0):
        local step(acc, p) =
          if p.type == 'row' then
            local y = if acc.x == 0 then acc.y else acc.y + acc.rowH;
            acc {
              out+: [p { gridPos: { h: 1, w: 24, x: 0, y: y } }],
              x: 0,
              y: y + 1,
              rowH: 0,
            }
          else
            local w = if std.objectHas(p, 'gridPos') && std.objectHas(p.gridPos, 'w') then p.gridPos.w else panelWidth;
            local h = if std.objectHas(p, 'gridPos') && std.objectHas(p.gridPos, 'h') then p.gridPos.h else panelHeight;
            local wrap = acc.x + w > 24;
            local x = if wrap then 0 else acc.x;
            local y = if wrap then acc.y + acc.rowH else acc.y;
            local rowH = if wrap then h else std.max(acc.rowH, h);
            acc {
              out+: [p { gridPos: { h: h, w: w, x: x, y: y } }],
              x: x + w,
              y: y,
              rowH: rowH,
            };
        std.foldl(step, panels, { out: [], x: 0, y: startY, rowH: 0 }).out,
    },
  },
}
