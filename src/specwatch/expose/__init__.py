"""Exposition: the catalogue of every series specwatch serves and the collector that renders a
snapshot as Prometheus text.

Owns: ``metricdefs`` (name, type, labels and HELP of each series; the metrics reference is
generated from it), ``collector`` (the snapshot as cached exposition bytes, plus the family
builders plug-ins register), ``gzipstream`` (gzip bodies from a cached deflate stream).
"""
