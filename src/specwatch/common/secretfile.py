"""The one reader of file-backed secrets (tokens, passwords, header values).

A secret file is small: a bearer token, a password, a header value. The reader takes at
most :data:`SECRET_FILE_MAX_BYTES` from a *regular* file (a symbolic link to one is
followed, so the Kubernetes Secret volume layout ``token -> ..data/token`` works) and
refuses anything else with one line naming the config key and the file: a device such as
``/dev/zero`` or a FIFO would otherwise be read until memory runs out (or block forever),
and a file that is not UTF-8 text would end in a traceback. Nothing of the file's content
appears in an error.
"""

from __future__ import annotations

import os
import stat

from specwatch.common import redact
from specwatch.common.errors import ConfigError

#: Largest secret file read (64 KiB): far above any token, password or header value, and
#: small enough that a mistaken path costs nothing.
SECRET_FILE_MAX_BYTES = 64 * 1024


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_secret_file(path: str, where: str) -> str:
    """The stripped text of the secret file ``path``; ``where`` names the config key (it
    starts every error line). Registers the secret with :mod:`specwatch.common.redact`.

    Raises :class:`ConfigError` when the file cannot be opened, is not a regular file
    (after following symbolic links), is over :data:`SECRET_FILE_MAX_BYTES`, is not UTF-8
    or holds only blanks.
    """
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused just below).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path!r}: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{where}: {path!r} is {_kind(info.st_mode)}, not a regular "
                              f"file: point it at a file holding only the secret")
        limit = SECRET_FILE_MAX_BYTES
        if info.st_size > limit:
            raise ConfigError(f"{where}: {path!r} is {info.st_size} bytes, over the "
                              f"{limit // 1024} KiB limit for a secret file")
        chunks: list[bytes] = []
        got = 0
        while got <= limit:  # st_size may be 0 or stale (procfs, a file being written)
            chunk = os.read(fd, limit + 1 - got)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise ConfigError(f"{where}: {path!r} is over the {limit // 1024} KiB limit "
                              f"for a secret file")
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path!r}: {exc.strerror}") from exc
    finally:
        os.close(fd)
    try:
        value = b"".join(chunks).decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where}: {path!r} is not UTF-8 text (invalid byte at offset "
                          f"{exc.start})") from None
    if not value:
        raise ConfigError(f"{where}: the file {path!r} is empty")
    redact.register(value)
    return value
