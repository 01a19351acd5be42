"""The reader of file-backed secrets (tokens, passwords, header values).

A secret file is small: a bearer token, a password, a header value. The reader takes at
most :data:`SECRET_FILE_MAX_BYTES` from a *regular* file (a symbolic link to one is
followed, so the Kubernetes Secret volume layout ``token -> ..data/token`` works) through
:mod:`specwatch.common.boundedfile`, and refuses anything else with one line naming the
config key and the file: a device such as ``/dev/zero`` or a FIFO would otherwise be read
until memory runs out (or block forever), and a file that is not UTF-8 text would end in a
traceback. Nothing of the file's content
appears in an error.
"""

from __future__ import annotations

from specwatch.common import boundedfile, redact
from specwatch.common.errors import ConfigError

#: Largest secret file read (64 KiB): far above any token, password or header value, and
#: small enough that a mistaken path costs nothing.
SECRET_FILE_MAX_BYTES = boundedfile.SECRET.limit


def read_secret_file(path: str, where: str) -> str:
    """The stripped text of the secret file ``path``; ``where`` names the config key (it
    starts every error line). Registers the secret with :mod:`specwatch.common.redact`.

    Raises :class:`ConfigError` when the file cannot be opened, is not a regular file
    (after following symbolic links), is over :data:`SECRET_FILE_MAX_BYTES`, is not UTF-8
    or holds only blanks.
    """
    data = boundedfile.read_bytes(path, boundedfile.SECRET, where=where)
    try:
        value = data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: {path!r} is not UTF-8 text (invalid byte at offset "
                          f"{exc.start})") from None
    if not value:
        raise ConfigError(f"{where}: the file {path!r} is empty")
    redact.register(value)
    return value
