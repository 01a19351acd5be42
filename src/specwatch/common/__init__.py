"""Shared foundations: the error types every command reports, secret redaction for logs, and
the strict YAML schema checker that both config files use.

Owns: ``errors`` (SpecwatchError, ConfigError: one message, an exit code), ``redact`` (log
filter that hides every registered secret), ``schema`` (read a YAML file, check it against
typed keys, point at the file and key on error), ``bundle`` (where the mixin sources, generated
rules and dashboards and the examples are: the copy packaged in the wheel, or the checkout),
``acceptance`` (E(α, k) of the i.i.d. acceptance model and its inverse, shared by the poll
path and the latency model).
"""
