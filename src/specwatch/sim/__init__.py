"""The simulated vLLM: a discrete-event engine with continuous batching and speculative
decoding that serves a real vLLM-shaped ``/metrics`` page, driven by scenario files.

Owns: ``scenario`` (scenario files and the packaged ones in ``data/scenarios``) with
``validation`` (strict YAML checks) and ``distributions`` (lengths and α, with their truths),
``costs`` (coefficients to step costs), ``engine`` (one engine core's event loop),
``simulation`` (every engine of a scenario, restarts), ``stats`` (vLLM counters and
histograms), ``server`` (``specwatch simulate``: the HTTP page and control endpoints).
"""
