"""The hardened HTTP server that every specwatch process serves from (the exporter's
``/metrics``, the controller's receiver, the simulator's pages) and the exporter-toolkit style
web configuration (TLS, client certificates, basic auth, reload).

Owns: ``server`` (deadlines, in-flight cap, connection limits, routing), ``webconfig``
(web-config.yml parsing and the TLS/auth state it produces).

It knows nothing of metrics, the model or the controller: routes are handed to it.
"""
