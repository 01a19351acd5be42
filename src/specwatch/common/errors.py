"""Exceptions shared by every CLI so that bad input always ends with one message and exit 2."""


class SpecwatchError(Exception):
    """A user-facing error: the message names the file, line or field and what was expected."""

    exit_code = 2


class ConfigError(SpecwatchError):
    """Bad configuration, parameters, scenario or input file."""
