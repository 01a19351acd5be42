"""Live model predictions: the latency model applied to each model's derived signals.

Owns: ``plugin`` (its config keys, the target hook that fills each model's prediction slot,
and the family builder), ``metrics`` (its series' definitions).
"""
