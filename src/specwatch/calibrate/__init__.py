"""Calibration: fit the latency model's coefficients from benchmark results (vllm bench JSON,
CSV) or from a Prometheus, and report how well they fit.

Owns: ``inputfiles`` and ``inputs`` (reading and validating measured points), ``prometheus``,
``measured`` and ``traffic`` (points and load from Prometheus), ``leastsq`` (the linear
form's least squares), ``fit`` (the linear fit per system), ``saturation`` and
``load_range`` (the saturation form over the whole load range), ``results`` and
``summaries`` (what a fit produces and says), ``evidence`` (what the runs vouch for),
``report`` with ``reportfmt``, ``markdown`` and ``plots`` (JSON, tables, parameters file,
drift, summary.md, PNGs), ``command`` (``specwatch calibrate``).
"""
