"""The SD controller: decides from the exporter's snapshots (and Alertmanager notifications)
whether speculative decoding should be on for each model, with hysteresis, and carries the
decision out.

Owns: ``settings`` (the ``controller:`` config block), ``assess`` (observations and the model's
assessment of them), ``machine`` (the per-model state machine), ``receiver`` (the Alertmanager
webhook payload), ``controller`` (wiring to the exporter, status page, exposition),
``actuation`` (webhook and command actuators with retries).

May import: ``specwatch.poll`` (snapshots, derived signals, config), ``specwatch.model``,
``specwatch.web`` and ``specwatch.common``. Nothing below it imports the controller.
"""
