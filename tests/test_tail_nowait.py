"""A backlog's reads never wait for the disk in the event loop: a slice not in the page cache yet is
left for a later poll (``TailResult.waiting``) and asked of the kernel ahead, and a file system
that never caches it ahead is still read after ``NOWAIT_POLLS`` polls."""

from __future__ import annotations

import os
from unittest import mock

import pytest

from gradmon.server import tail
from gradmon.server.tail import NOWAIT_POLLS, READAHEAD_BYTES, FileTailer

pytestmark = pytest.mark.skipif(tail._NOWAIT is None, reason="no preadv(RWF_NOWAIT) here")


def _log(tmp_path, n: int) -> str:
    path = str(tmp_path / "metrics.jsonl")
    with open(path, "wb") as f:
        f.writelines(b'{"type":"step","step":%d,"loss":0.5}\n' % i for i in range(n))
    return path


def test_an_uncached_slice_waits_for_a_later_poll_and_is_asked_ahead(tmp_path):
    path = _log(tmp_path, 2000)
    t = FileTailer(path)
    real = os.preadv
    cached = {"now": False}

    def preadv(fd, bufs, offset, flags=0):
        if flags and not cached["now"]:
            raise BlockingIOError(11, "not cached")
        return real(fd, bufs, offset, flags)

    with mock.patch.object(os, "preadv", preadv), mock.patch.object(os, "posix_fadvise") as advise:
        first = t.poll(4096)
        assert first.waiting and first.more and not first.lines  # (nothing read, nothing lost)
        start, length, kind = advise.call_args.args[1:]
        assert (start, kind) == (0, os.POSIX_FADV_WILLNEED) and 0 < length <= READAHEAD_BYTES
        cached["now"] = True
        got = []
        while True:
            res = t.poll(4096)
            assert not res.waiting
            got += res.lines
            if not res.more:
                break
    assert len(got) == 2000 and got[-1][0] == os.path.getsize(path)


def test_a_file_system_that_never_caches_ahead_is_still_read(tmp_path):
    path = _log(tmp_path, 50)
    t = FileTailer(path)

    def preadv(fd, bufs, offset, flags=0):
        raise BlockingIOError(11, "never cached")

    with mock.patch.object(os, "preadv", preadv):
        waits = [t.poll().waiting for _ in range(NOWAIT_POLLS)]
        res = t.poll()
    assert all(waits) and not res.waiting and len(res.lines) == 50 and not res.more


def test_a_partial_cached_read_is_no_shrunk_file(tmp_path):
    path = _log(tmp_path, 100)
    t = FileTailer(path)
    real = os.preadv

    def preadv(fd, bufs, offset, flags=0):  # only the first 100 bytes are cached
        view = memoryview(bufs[0])[:100]
        return real(fd, [view], offset, flags)

    with mock.patch.object(os, "preadv", preadv):
        res = t.poll()
        assert res.more and not res.waiting and t.size == os.path.getsize(path)
    lines = list(res.lines)
    while res.more:
        res = t.poll()
        lines += res.lines
    assert len(lines) == 100
