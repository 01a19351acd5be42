"""The whole metric catalogue, in the order the metrics reference lists it: the exposition
hub's series, then the live model's, the controller's, the measured pairs' and last the
controller's Alertmanager receiver's.

Why here: only the application knows every plug-in; each plug-in's ``metrics`` module
registers its definitions with :mod:`specwatch.expose.metricdefs` on import, and this module
fixes their order for scripts/generate_docs.py and the tests.
"""

from __future__ import annotations

from specwatch.expose import metricdefs
from specwatch.expose.metricdefs import MetricDef
from specwatch.plugins.control import metrics as control_metrics
from specwatch.plugins.live import metrics as live_metrics
from specwatch.plugins.pairs import metrics as pairs_metrics

METRICS: tuple[MetricDef, ...] = (
    *metricdefs.METRICS, *live_metrics.METRICS, *control_metrics.METRICS,
    *pairs_metrics.METRICS, *control_metrics.RECEIVER_METRICS)
BY_NAME: dict[str, MetricDef] = {m.name: m for m in METRICS}
