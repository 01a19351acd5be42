"""Calibration: fit the latency model's coefficients from benchmark results (vllm bench JSON,
CSV) or from a Prometheus, and report how well they fit.

Owns: ``inputs`` (reading and validating measured points), ``prometheus`` (the same points
from a Prometheus range query), ``fit`` (least-squares fit per system), ``report`` (tables,
plots, parameters file), ``command`` (``specwatch calibrate``).

May import: ``specwatch.model`` and ``specwatch.common`` (scipy and matplotlib lazily, from the
``analysis`` extra). Never the exporter, the controller or the simulator.
"""
