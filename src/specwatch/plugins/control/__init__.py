"""The SD controller: decides from the exporter's snapshots (and Alertmanager notifications)
whether speculative decoding should be on for each model, with hysteresis, and carries the
decision out.

Owns: ``settings`` (the ``controller:`` config section), ``assess`` (observations and the
model's assessment of them), ``machine`` (the per-model state machine), ``receiver`` (the
Alertmanager webhook payload), ``controller`` (wiring to the exporter, status page,
exposition), ``actuation`` (webhook and command actuators with retries), ``metrics`` (the
series' definitions).
"""
