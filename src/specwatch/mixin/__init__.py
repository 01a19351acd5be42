"""The Jsonnet mixin renderer: turns ``mixin.libsonnet`` and ``config.libsonnet`` into the
Prometheus rule files and Grafana dashboards, with the user's overrides.

Owns: ``render`` (evaluate the mixin with the jsonnet library, write and check generated files),
``command`` (`specwatch mixin render --out DIR --set KEY=VALUE`, for users of the wheel).

The mixin's queries name the exporter's series by string; nothing here imports the exporter.
"""
