// specwatch monitoring mixin: Prometheus alerts, recording rules and Grafana dashboards for
// speculative decoding, in the monitoring-mixins convention. Render it with
// `make generate` (scripts/generate.py); adapt it by merging into `_config` (README).
(import 'config.libsonnet')
+ (import 'alerts/rules.libsonnet')
+ (import 'alerts/alerts.libsonnet')
+ (import 'alerts/measured.libsonnet')
+ (import 'dashboards/dashboards.libsonnet')
