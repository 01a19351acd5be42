"""The poll path: fetch each target's ``/metrics``, parse only the families specwatch reads,
keep reset-corrected history, derive the SD signals over windows and publish an immutable
snapshot. Nothing here renders metrics or knows what plugs in above it.

Owns, in the order a poll flows: ``config`` (targets and ``global``), ``discovery`` (file_sd,
sharding), ``poller`` (scheduling), ``fetch``, ``httpfast`` and ``httpheaders`` (one poll's
HTTP GET with deadlines and caps), ``fastparse`` and ``sources`` (the selective parser and
every vLLM/SGLang metric name), ``limits`` (series caps), ``history``, ``derive``,
``lazywindow`` and ``bimodality`` (windows and signals, computed when first read),
``pipeline`` (one poll's result into a new snapshot, with hooks), ``snapshot`` (the immutable
state).
"""
