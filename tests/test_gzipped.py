"""gzip output in pieces: texts compressed elsewhere for their place give
the same file as the text written here, and every gzip reader reads it."""
from __future__ import annotations

import gzip
import io
import sys
import zlib

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from streamtrace.errors import TraceError
from streamtrace.io.gzipped import GzipPieces, compresses_elsewhere

pytestmark = pytest.mark.skipif(not compresses_elsewhere(), reason="needs isal's crc32_combine")


def written(parts: list[bytes], placed: list[bool], level: int) -> bytes:
    """The gzip file of ``parts`` in order, each written here or (where
    ``placed``) prepared by :meth:`GzipPieces.placed` as a worker would."""
    raw = io.BytesIO()
    out = GzipPieces(raw, level)
    last = b""
    for part, elsewhere in zip(parts, placed):
        if elsewhere:
            out.add_placed(memoryview(GzipPieces.placed(part, out.position, last, level)))
        else:
            out.write(part)
        last = part[-1:] or last
    out.close()
    return raw.getvalue()


@given(parts=st.lists(st.binary(max_size=700) | st.sampled_from([b"", b'{"ph":"X","name":"k"},\n' * 40]),
                      max_size=30),
       placed=st.lists(st.booleans(), min_size=30, max_size=30),
       level=st.sampled_from([1, 2, 6]))
@example(parts=[b"{" * 256, b"}" * 700, b"," * 68, b"x" * 600], placed=[False, True, True, True] + [False] * 26,
         level=1)  # texts that start on a piece boundary, after one that did and one that covers none
@settings(max_examples=150, deadline=None)
def test_texts_placed_elsewhere_give_the_same_file(parts, placed, level, monkeypatch_piece):
    whole = b"".join(parts)
    file = written(parts, placed, level)
    assert file == written([whole], [False], level)
    assert gzip.decompress(file) == whole
    assert zlib.decompress(file, wbits=31) == whole


@pytest.fixture(scope="module")
def monkeypatch_piece():
    """Pieces of 256 bytes: the parts above straddle them, cover several, or fit inside one."""
    size, GzipPieces.PIECE = GzipPieces.PIECE, 256
    yield
    GzipPieces.PIECE = size


def test_a_placed_text_must_start_its_pieces_at_a_boundary():
    """A text prepared for another place would corrupt the stream: refused."""
    out = GzipPieces(io.BytesIO(), 1)
    out.write(b"x" * 10)
    with pytest.raises(TraceError, match="piece boundary"):
        out.add_placed(memoryview(GzipPieces.placed(b"y" * (3 * GzipPieces.PIECE), 0, b"", 1)))


def test_an_empty_stream_is_an_empty_gzip_file():
    raw = io.BytesIO()
    GzipPieces(raw, 1).close()
    assert gzip.decompress(raw.getvalue()) == b""


def test_writing_survives_a_profiler_that_keeps_frames():
    """A sampling profiler (Dask's workers run one) may keep a frame, and
    its locals, after the call returned: the stream never resizes a buffer
    that such a local may still view."""
    kept = []

    def keep(frame, event, arg):
        if event == "return":
            kept.append(frame)

    raw = io.BytesIO()
    sys.setprofile(keep)
    try:
        out = GzipPieces(raw, 1)
        for _ in range(5):
            out.write(b'{"ph":"X"},\n' * 9_000)
        out.close()
    finally:
        sys.setprofile(None)
    assert gzip.decompress(raw.getvalue()) == b'{"ph":"X"},\n' * 45_000
