// grafanaDashboards: file name -> dashboard. The defaults every dashboard shares (stable
// uid, title prefix, tags, links, time settings, the datasource on every panel, refIds and
// panel ids) are applied here, once, as kubernetes-mixin's dashboards/defaults does.
local exporter = import 'exporter.libsonnet';
local g = import 'lib/g.libsonnet';
local overview = import 'sd-overview.libsonnet';

{
  local c = $._config,
  local gc = c.grafana,

  local withDefaults(file, dashboard) =
    local panel(p) =
      if p.type == 'row' then p
      else g.util.panel.setRefIDs(
        p
        + g.panel.timeSeries.queryOptions.withDatasource('prometheus', '${datasource}')
        + g.panel.timeSeries.withPluginVersion(gc.pluginVersion)
      );
    dashboard
    + g.dashboard.withUid(c.dashboardUIDs[file])
    + { title: gc.dashboardNamePrefix + dashboard.title }
    + g.dashboard.withTags(gc.dashboardTags)
    + g.dashboard.withTimezone(gc.timezone)
    + g.dashboard.withRefresh(gc.refresh)
    + g.dashboard.time.withFrom(gc.timeFrom)
    + g.dashboard.graphTooltip.withSharedCrosshair()
    + g.dashboard.withEditable(false)
    + g.dashboard.withLinks([
      g.dashboard.link.dashboards.new('specwatch', gc.dashboardTags[0:1])
      + g.dashboard.link.dashboards.options.withAsDropdown()
      + g.dashboard.link.dashboards.options.withIncludeVars()
      + g.dashboard.link.dashboards.options.withKeepTime(),
      // What to do when a panel looks wrong, and the rules behind its thresholds: the
      // runbook, and Grafana's alert list filtered to this bundle's alerts (its label).
      g.dashboard.link.link.new('Runbook', std.split(c.runbookURLPattern, '#')[0])
      + g.dashboard.link.link.withIcon('doc')
      + g.dashboard.link.link.withTooltip('What each specwatch alert means and what to do')
      + g.dashboard.link.link.options.withTargetBlank(),
      g.dashboard.link.link.new('Alert rules', '/alerting/list?search=%s' % std.join('%20', [
        'label:%s%%3D%s' % [k, c.alertLabels[k]]
        for k in std.objectFields(c.alertLabels)
      ]))
      + g.dashboard.link.link.withIcon('bolt')
      + g.dashboard.link.link.withTooltip('The specwatch alert rules and their state in Grafana Alerting'),
    ])
    + { panels: g.util.panel.setPanelIDs([panel(p) for p in dashboard.panels]) }
    // What the dashboard needs, as Grafana's export writes it: the minimum Grafana
    // version, the data source type and every panel type it uses.
    + {
      __requires: [
        { type: 'grafana', id: 'grafana', name: 'Grafana', version: gc.minVersion },
        { type: 'datasource', id: 'prometheus', name: 'Prometheus', version: '1.0.0' },
      ] + [
        { type: 'panel', id: type, name: type, version: '' }
        for type in std.set([p.type for p in dashboard.panels if p.type != 'row'])
      ],
    },

  grafanaDashboards+:: {
    [file]: withDefaults(file, {
      'specwatch-sd-overview.json': overview.new(c { recordedNames: $._recordedNames }),
      'specwatch-exporter.json': exporter.new(c),
    }[file])
    for file in ['specwatch-sd-overview.json', 'specwatch-exporter.json']
  },
}
