"""Plug-ins of the exporter: each reads the poll path's snapshots through hooks, adds its own
slots and series, and knows nothing of the others.

Owns: ``host`` (the typed interface the application hands each plug-in's ``install``),
``live`` (live model predictions), ``pairs`` (measured A/B pairs), ``control`` (the SD
controller). Each plug-in owns its config section and its metric definitions.
"""
