"""Gzip bodies for /metrics: a cached deflate stream of the page, then the per-scrape tail.

Deflate blocks of two independent compressors, the first ended by a sync flush, concatenate
into one valid stream (pigz does the same), so the megabytes of a snapshot's page are
compressed once per snapshot and each scrape compresses only its small tail.

May import: the standard library.
"""

from __future__ import annotations

import struct
import zlib

#: Bytes of page text compressed at once by :func:`deflate_parts`.
DEFLATE_BATCH_BYTES = 1 << 20


def deflate_parts(parts: list[bytes]) -> tuple[bytes, int, int]:
    """The raw deflate stream of ``b"".join(parts)`` ended by a sync flush, its CRC-32 and
    length, without joining the whole text: the pieces are compressed in batches of about
    :data:`DEFLATE_BATCH_BYTES` (a 2,000-target page is over 20 MB of text, which a join
    would hold, beside its compressed copy, at the peak of every scrape)."""
    c = zlib.compressobj(1, zlib.DEFLATED, -15)
    out: list[bytes] = []
    crc = size = 0
    batch: list[bytes] = []
    held = 0
    for i, part in enumerate(parts):
        batch.append(part)
        held += len(part)
        if held >= DEFLATE_BATCH_BYTES or i == len(parts) - 1:
            data = b"".join(batch)
            out.append(c.compress(data))
            crc = zlib.crc32(data, crc)
            size += len(data)
            batch, held = [], 0
    out.append(c.flush(zlib.Z_SYNC_FLUSH))
    return b"".join(out), crc, size


def gzip_join(head: tuple[bytes, int, int], tail: bytes) -> bytes:
    """One gzip member: a cached deflate stream (``head``: sync-flushed deflate bytes, CRC-32
    and length of its data, from :meth:`SpecwatchCollector.exposition_deflate`) followed by
    ``tail`` compressed now. Deflate blocks of two independent compressors concatenate into
    one valid stream (pigz does the same), so the 5 MB head is compressed once per snapshot.
    """
    deflated, crc, size = head
    c = zlib.compressobj(1, zlib.DEFLATED, -15)
    rest = c.compress(tail) + c.flush()
    return b"".join((b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff", deflated, rest,
                     struct.pack("<II", zlib.crc32(tail, crc) & 0xFFFFFFFF,
                                 (size + len(tail)) & 0xFFFFFFFF)))
