"""The deflate stream of a page compressed piece by piece, in batches.

Protected behaviour: whatever the pieces and the batch size, the stream inflates to the
pieces joined, its CRC-32 and length are those of the joined bytes, and with
:func:`gzip_join` it makes one gzip member that decompresses to the page and the tail.
"""

from __future__ import annotations

import gzip
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specwatch.expose import gzipstream


@given(parts=st.lists(st.binary(max_size=300), max_size=40),
       batch=st.integers(min_value=1, max_value=2000))
def test_pieces_in_batches_give_the_stream_of_the_joined_page(parts: list[bytes],
                                                              batch: int) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gzipstream, "DEFLATE_BATCH_BYTES", batch)
        deflated, crc, size = gzipstream.deflate_parts(parts)
    page = b"".join(parts)
    assert zlib.decompressobj(-15).decompress(deflated) == page
    assert crc == zlib.crc32(page) and size == len(page)
    body = gzipstream.gzip_join((deflated, crc, size), b"# tail\nx 1.0\n")
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    assert d.decompress(body) + d.flush() == page + b"# tail\nx 1.0\n" == gzip.decompress(body)
    assert d.eof and d.unused_data == b""
