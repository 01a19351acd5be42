"""Live model predictions: the latency model applied to each model's derived signals.

Owns: ``plugin`` (the target hook that fills each model's prediction slot, and its series).

May import: ``specwatch.poll``, ``specwatch.expose``, ``specwatch.model``, ``specwatch.common``.
"""
