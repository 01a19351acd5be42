"""The poll path: fetch each target's ``/metrics``, parse only the families specwatch reads,
keep reset-corrected history, derive the SD signals over windows, publish an immutable
snapshot, and expose it as Prometheus metrics.

Owns, in the order a poll flows: ``config`` (serve config schema), ``discovery`` (file_sd,
sharding), ``poller`` (scheduling), ``fetch`` and ``httpheaders`` (one poll's HTTP GET with
deadlines and caps), ``fastparse`` and ``sources`` (the selective parser and every
vLLM/SGLang metric name), ``limits`` (series caps), ``history``, ``derive`` and
``lazywindow`` (windows and signals, computed when first read), ``pipeline`` (one poll's
result into a new snapshot), ``snapshot`` (the immutable state), ``collector``
(exposition), ``metricdefs`` (the table of every series specwatch serves, the layers above
included: name, type, labels, HELP; the metrics reference is generated from it).

May import: ``specwatch.common`` and ``specwatch.web``. Never the model, the controller, the
simulator or calibration: predictions and control plug in as hooks from ``specwatch.app``.
"""
