"""Measured A/B pairs: two targets fed the same traffic, one with SD and one without, binned by
arrival rate and compared.

Owns: ``settings`` (the ``pairs:`` and ``pair_options:`` config section, sharding keys),
``plugin`` (binning and the pair series), ``metrics`` (the series' definitions), ``stats`` (the
speedup ratio, its interval and the bucket checks).
"""
