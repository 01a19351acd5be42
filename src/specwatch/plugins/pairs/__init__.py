"""Measured A/B pairs: two targets fed the same traffic, one with SD and one without, binned by
arrival rate and compared.

Owns: ``plugin`` (pair config, sharding keys, binning and the pair series), ``stats`` (the
speedup ratio, its interval and the bucket checks).

May import: ``specwatch.poll``, ``specwatch.expose``, ``specwatch.common``.
"""
