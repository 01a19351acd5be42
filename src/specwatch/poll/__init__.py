"""The poll path: fetch each target's ``/metrics``, parse only the families specwatch reads,
keep reset-corrected history, derive the SD signals over windows and publish an immutable
snapshot. Nothing here renders metrics or knows what plugs in above it.

Owns, in the order a poll flows: ``config`` (targets and ``global``), ``discovery`` (file_sd,
sharding), ``poller`` (scheduling), the ``fetch`` subpackage (one poll's HTTP GET with
deadlines and caps), ``fastparse`` and ``sources`` (the selective parser; every engine's names
come from ``specwatch.engines``), ``limits`` (series caps), the ``windows`` subpackage
(history, and the windowed signals computed when first read), ``pipeline`` (one poll's result
into a new snapshot, with hooks), ``snapshot`` (the immutable state).
"""
