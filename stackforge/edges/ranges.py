"""One member of a remote zip (a wheel), read by HTTP range requests and decompressed only as far as asked.

A wheel's table of contents is at its end (the zip's End of Central Directory, then the central
directory it points to), so a reader needs the tail, then the one member it wants: its local header
and as much of its compressed bytes as the wanted uncompressed prefix takes. A deflated member is
streamed through :func:`zlib.decompressobj`, a range at a time (256 KiB, doubling to 8 MiB), so
reading the first megabytes of a 400 MB shared object fetches a few megabytes, not the wheel.

A server that ignores ``Range`` (it answers 200 with the whole body) is read as one stream from the
start: the local headers are walked in order, a wanted member is decompressed as far as asked, the
others are skipped, and the response is closed once every wanted member was seen (or at the central
directory). Every byte that crossed the wire is counted (:attr:`RemoteZip.fetched`).

``file://`` URLs and plain paths are read from the disk the same way (ranges, counted), so a
find-links folder serves as an index does.

Network failures raise :class:`stackforge.edges.index.IndexUnreachableError` (one line: the URL and
the cause); a body that is no zip, or one this reader cannot walk, raises :class:`zipfile.BadZipFile`.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit
from urllib.request import url2pathname
from zipfile import BadZipFile

import requests

from stackforge.edges.index import TIMEOUT, IndexUnreachableError, unreachable_cause

T = TypeVar("T")

#: The first request asks for this much of the tail: the End of Central Directory (22 bytes plus a
#: comment of up to 64 KiB) and, for most wheels, the whole central directory with it.
TAIL_BYTES = 64 * 1024
FIRST_CHUNK = 256 * 1024
MAX_CHUNK = 8 * 1024 * 1024
_STREAM_CHUNK = 64 * 1024

_EOCD = struct.Struct("<IHHHHIIH")             # End of Central Directory
_EOCD_SIG = 0x06054B50
_ZIP64_LOCATOR = struct.Struct("<IIQI")
_ZIP64_LOCATOR_SIG = 0x07064B50
_ZIP64_EOCD = struct.Struct("<IQHHIIQQQQ")
_ZIP64_EOCD_SIG = 0x06064B50
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # central directory file header
_CENTRAL_SIG = 0x02014B50
_LOCAL = struct.Struct("<IHHHHHIIIHH")         # local file header
_LOCAL_SIG = 0x04034B50
_STORED, _DEFLATED = 0, 8
_HAS_DESCRIPTOR = 0x08                          # sizes follow the data, not in the local header


@dataclass(frozen=True, slots=True)
class ZipMember:
    """One member as the central directory (or, on a stream, its local header) gives it."""

    name: str
    header_offset: int        # where its local header starts
    compressed_size: int
    size: int
    method: int               # 0 stored, 8 deflated


class MemberBytes:
    """A member's uncompressed bytes, decompressed only as far as a reader asks.

    ``chunks`` yields the member's compressed bytes in order; it is advanced only while the
    decompressed bytes are fewer than what was asked, so an unread tail is never fetched. Memory
    stays bounded however far a reader goes: the first ``keep`` bytes are kept (an ELF object's
    headers and, usually, its symbol table) and, past them, only a window of ``window`` bytes behind
    the furthest read; asking for bytes that fell out of it raises :class:`ValueError` (read in order).
    """

    def __init__(self, member: ZipMember, chunks: Iterator[bytes], *, keep: int = 32 << 20,
                 window: int = 16 << 20) -> None:
        if member.method not in (_STORED, _DEFLATED):
            raise BadZipFile(f"{member.name}: compression method {member.method} is not stored or deflate")
        self.member = member
        self._chunks = chunks
        self._inflate = zlib.decompressobj(-15) if member.method == _DEFLATED else None
        self._keep, self._window_size = keep, window
        self._head = bytearray()
        self._window = bytearray()
        self._base = 0            # offset of the window's first byte
        self._produced = 0
        self._done = False

    @property
    def size(self) -> int:
        return self.member.size

    @property
    def decompressed(self) -> int:
        """How many uncompressed bytes were produced so far."""
        return self._produced

    def at(self, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of the uncompressed member.

        Raises:
            EOFError: the member ends before ``offset + length``.
            ValueError: those bytes were passed and dropped (not kept, outside the window).
        """
        end = offset + length
        self._fill(offset, end)
        if self.decompressed < end:
            raise EOFError(f"{self.member.name}: {end} bytes asked, the member has {self.decompressed}")
        if end <= len(self._head):
            return bytes(self._head[offset:end])
        if offset >= self._base:
            return bytes(self._window[offset - self._base:end - self._base])
        if offset < len(self._head) and self._base == len(self._head):
            return bytes(self._head[offset:]) + bytes(self._window[:end - self._base])
        raise ValueError(f"{self.member.name}: bytes {offset}..{end} were passed and dropped (read in order)")

    def prefix(self, length: int) -> bytes:
        """The first ``length`` bytes, or the whole member when it is shorter (``length`` <= ``keep``)."""
        self._fill(0, length)
        return bytes(self._head[:length])

    def drain(self) -> None:
        """Decompress to the end, keeping nothing new (a stream reader then knows where the member ends)."""
        self._fill(1 << 62, 1 << 62)

    def _fill(self, offset: int, wanted: int) -> None:
        while self.decompressed < wanted and not self._done:
            chunk = next(self._chunks, b"")
            if not chunk:
                self._done = True
                data = self._inflate.flush() if self._inflate is not None else b""
            else:
                data = self._inflate.decompress(chunk) if self._inflate is not None else chunk
                self._done = self._inflate is not None and self._inflate.eof
            self._append(data, offset)

    def _append(self, data: bytes, offset: int) -> None:
        self._produced += len(data)
        if len(self._head) < self._keep:
            room = self._keep - len(self._head)
            self._head += data[:room]
            data = data[room:]
            self._base = len(self._head)
        self._window += data
        # keep the bytes from ``window`` before the read's start onwards; drop older ones
        drop = min(len(self._window), max(0, offset - self._window_size - self._base))
        if drop:
            del self._window[:drop]
            self._base += drop

    def unused(self) -> bytes:
        """Compressed bytes handed over past the end of a deflate stream (a stream reader takes them back)."""
        return self._inflate.unused_data if self._inflate is not None else b""


class RemoteZip:
    """A zip at a URL (or a path), read a range at a time; :attr:`fetched` counts the bytes that came.

    The first request asks for the tail; a server that answers it with the whole body (no ``Range``
    support) turns this into a one-pass stream reader (:attr:`ranged` is then ``False``).

    Raises:
        IndexUnreachableError: the URL did not answer (the cause in a few words).
        BadZipFile: the answer is no zip this reader can walk.
    """

    def __init__(self, url: str, *, session: requests.Session | None = None,
                 timeout: float | tuple[float, float] = TIMEOUT, display_url: str | None = None) -> None:
        self.url = url
        self.display_url = display_url or url
        self._session = session or requests.Session()
        self._timeout = timeout
        self.fetched = 0
        self.requests = 0
        self._local: Path | None = _local_path(url)
        self._stream: _Stream | None = None
        self.size: int | None = None
        self._tail = b""
        self._members: list[ZipMember] | None = None
        if self._local is not None:
            self.ranged = True
            self.size = self._local.stat().st_size
            self._tail = self._read(max(0, self.size - TAIL_BYTES), min(self.size, TAIL_BYTES))
            return
        response = self._get({"Range": f"bytes=-{TAIL_BYTES}"}, stream=True)
        if response.status_code == 206:
            self.ranged = True
            self.size = _total_size(response.headers.get("Content-Range", ""))
            self._tail = self._consume(response)
        else:   # 200: the whole body, from its first byte
            self.ranged = False
            self._stream = _Stream(response, self)

    # --- what the zip holds ------------------------------------------------------------------------

    def members(self) -> list[ZipMember]:
        """Every member, from the central directory (ranged reads only)."""
        if not self.ranged or self.size is None:
            raise BadZipFile(f"{self.display_url}: the server ignores Range: no central directory to list")
        if self._members is None:
            self._members = _central_directory(self._tail, self.size, self._read)
        return self._members

    def read_members(self, wanted: Callable[[str], bool], read: Callable[[MemberBytes], T], *,
                     expected: Collection[str] = ()) -> dict[str, T]:
        """``read(member)`` for every member whose name ``wanted`` accepts, in the zip's order.

        On a stream (no ``Range``) the walk stops, and the response is closed, once every name in
        ``expected`` was read; without ``expected`` it goes on to the central directory.
        """
        if self.ranged:
            return {m.name: read(MemberBytes(m, self._ranged_chunks(m))) for m in self.members() if wanted(m.name)}
        assert self._stream is not None
        try:
            return self._stream.read_members(wanted, read, expected=set(expected))
        finally:
            self.close()

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()

    # --- ranged reads ------------------------------------------------------------------------------

    def _ranged_chunks(self, member: ZipMember) -> Iterator[bytes]:
        """The member's compressed bytes, a growing range at a time; the local header read with the first."""
        step = FIRST_CHUNK
        # the name and extra field come with the first range (a guess of 512 bytes; more is fetched below)
        head = self._read(member.header_offset, _LOCAL.size + min(step, member.compressed_size + 512))
        fields = _LOCAL.unpack_from(head)
        if fields[0] != _LOCAL_SIG:
            raise BadZipFile(f"{self.display_url}: no local header for {member.name} at {member.header_offset}")
        start = member.header_offset + _LOCAL.size + fields[9] + fields[10]
        end = start + member.compressed_size
        position = member.header_offset + len(head)
        if position > start:
            yield head[start - member.header_offset:min(len(head), end - member.header_offset)]
        position = max(position, start)
        while position < end:
            step = min(step * 2, MAX_CHUNK)
            chunk = self._read(position, min(step, end - position))
            if not chunk:
                raise BadZipFile(f"{self.display_url}: {member.name} ends early at {position}")
            position += len(chunk)
            yield chunk

    def _read(self, offset: int, length: int) -> bytes:
        if length <= 0:
            return b""
        if self._local is not None:
            with self._local.open("rb") as handle:
                handle.seek(offset)
                data = handle.read(length)
            self.fetched += len(data)
            self.requests += 1
            return data
        response = self._get({"Range": f"bytes={offset}-{offset + length - 1}"}, stream=True)
        if response.status_code != 206:
            response.close()
            raise BadZipFile(f"{self.display_url}: a range request answered {response.status_code} after the first "
                             "answered 206")
        return self._consume(response)

    def _get(self, headers: dict[str, str], *, stream: bool) -> requests.Response:
        self.requests += 1
        try:
            response = self._session.get(self.url, headers=headers, stream=stream, timeout=self._timeout)
            response.raise_for_status()
        except requests.RequestException as exc:
            raise IndexUnreachableError(self.display_url, unreachable_cause(exc, self.url)) from None
        return response

    def _consume(self, response: requests.Response) -> bytes:
        try:
            with response:
                data = response.content
        except requests.RequestException as exc:
            raise IndexUnreachableError(self.display_url, unreachable_cause(exc, self.url)) from None
        self.fetched += len(data)
        return data


class _Stream:
    """The whole body of a server that ignores ``Range``, read forward once; counted into its zip."""

    def __init__(self, response: requests.Response, owner: RemoteZip) -> None:
        self._response = response
        self._owner = owner
        self._chunks = response.iter_content(_STREAM_CHUNK)
        self._pending = bytearray()

    def take(self, length: int) -> bytes:
        """The next ``length`` bytes (fewer at the end of the body)."""
        while len(self._pending) < length:
            chunk = self._next()
            if not chunk:
                break
            self._pending += chunk
        data = bytes(self._pending[:length])
        del self._pending[:length]
        return data

    def _next(self) -> bytes:
        try:
            chunk = next(self._chunks, b"")
        except requests.RequestException as exc:
            raise IndexUnreachableError(self._owner.display_url, unreachable_cause(exc, self._owner.url)) from None
        self._owner.fetched += len(chunk)
        return chunk

    def give_back(self, data: bytes) -> None:
        self._pending[:0] = data

    def close(self) -> None:
        self._response.close()

    def read_members(self, wanted: Callable[[str], bool], read: Callable[[MemberBytes], T], *,
                     expected: set[str]) -> dict[str, T]:
        found: dict[str, T] = {}
        while not expected or not expected.issubset(found):
            head = self.take(_LOCAL.size)
            if len(head) < 4 or struct.unpack_from("<I", head)[0] != _LOCAL_SIG:
                break   # the central directory (or the end): every member was seen
            if len(head) < _LOCAL.size:
                raise BadZipFile(f"{self._owner.display_url}: truncated local header")
            _, _, flags, method, _, _, _, csize, size, name_len, extra_len = _LOCAL.unpack(head)
            name = self.take(name_len).decode("utf-8", errors="replace")
            self.take(extra_len)
            known_size = not flags & _HAS_DESCRIPTOR
            if not known_size and method != _DEFLATED:
                raise BadZipFile(f"{self._owner.display_url}: {name} is stored with its size after the data: "
                                 "it cannot be walked without the central directory")
            member = ZipMember(name, -1, csize, size, method)
            remaining = [csize] if known_size else None
            bytes_ = MemberBytes(member, self._member_chunks(remaining))
            if wanted(name):
                found[name] = read(bytes_)
            if remaining is not None:
                self._skip(remaining[0])
            else:   # the deflate stream's own end tells where the member ends, then its descriptor
                bytes_.drain()
                self.give_back(bytes_.unused())
                self._skip_descriptor()
        return found

    def _member_chunks(self, remaining: list[int] | None) -> Iterator[bytes]:
        while remaining is None or remaining[0] > 0:
            step = _STREAM_CHUNK if remaining is None else min(_STREAM_CHUNK, remaining[0])
            chunk = self.take(step)
            if not chunk:
                return
            if remaining is not None:
                remaining[0] -= len(chunk)
            yield chunk

    def _skip(self, length: int) -> None:
        while length > 0:
            skipped = len(self.take(min(length, MAX_CHUNK)))
            if not skipped:
                raise BadZipFile(f"{self._owner.display_url}: the body ends inside a member")
            length -= skipped

    def _skip_descriptor(self) -> None:
        head = self.take(4)
        sig = struct.unpack_from("<I", head)[0] if len(head) == 4 else 0
        # crc, sizes (zip64 descriptors have 8-byte sizes; wheels written by Python's zipfile use 4)
        self.take(12 if sig == 0x08074B50 else 8)


# --- the central directory -------------------------------------------------------------------------

def _central_directory(tail: bytes, size: int, read: Callable[[int, int], bytes]) -> list[ZipMember]:
    at = tail.rfind(struct.pack("<I", _EOCD_SIG))
    if at < 0 or len(tail) - at < _EOCD.size:
        raise BadZipFile("no End of Central Directory in the last 64 KiB: not a zip")
    tail_start = size - len(tail)
    _, _, _, _, count, cd_size, cd_offset, _ = _EOCD.unpack_from(tail, at)
    if 0xFFFFFFFF in (cd_size, cd_offset) or count == 0xFFFF:
        count, cd_size, cd_offset = _zip64_end(tail, at, tail_start, read)
    if cd_offset >= tail_start:
        directory = tail[cd_offset - tail_start:cd_offset - tail_start + cd_size]
    else:
        directory = read(cd_offset, cd_size)
    return _parse_central(directory, count)


def _zip64_end(tail: bytes, eocd_at: int, tail_start: int, read: Callable[[int, int], bytes]) -> tuple[int, int, int]:
    locator_at = eocd_at - _ZIP64_LOCATOR.size
    if locator_at < 0 or _ZIP64_LOCATOR.unpack_from(tail, locator_at)[0] != _ZIP64_LOCATOR_SIG:
        raise BadZipFile("zip64 sizes without a zip64 locator")
    offset = _ZIP64_LOCATOR.unpack_from(tail, locator_at)[2]
    record = (tail[offset - tail_start:offset - tail_start + _ZIP64_EOCD.size] if offset >= tail_start
              else read(offset, _ZIP64_EOCD.size))
    fields = _ZIP64_EOCD.unpack_from(record)
    if fields[0] != _ZIP64_EOCD_SIG:
        raise BadZipFile("no zip64 End of Central Directory where its locator points")
    return fields[7], fields[8], fields[9]


def _parse_central(directory: bytes, count: int) -> list[ZipMember]:
    members = []
    at = 0
    for _ in range(count):
        if at + _CENTRAL.size > len(directory):
            raise BadZipFile("the central directory ends early")
        fields = _CENTRAL.unpack_from(directory, at)
        if fields[0] != _CENTRAL_SIG:
            raise BadZipFile(f"no central directory header at {at}")
        method, csize, size, name_len, extra_len, comment_len, offset = (fields[4], fields[8], fields[9],
                                                                         fields[10], fields[11], fields[12], fields[16])
        start = at + _CENTRAL.size
        name = directory[start:start + name_len].decode("utf-8", errors="replace")
        extra = directory[start + name_len:start + name_len + extra_len]
        size, csize, offset = _zip64_sizes(extra, size, csize, offset)
        members.append(ZipMember(name, offset, csize, size, method))
        at = start + name_len + extra_len + comment_len
    return members


def _zip64_sizes(extra: bytes, size: int, csize: int, offset: int) -> tuple[int, int, int]:
    """Sizes and offset from the zip64 extra field, for those the fixed header marks 0xFFFFFFFF."""
    at = 0
    while at + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, at)
        if tag == 0x0001:
            values = list(struct.unpack_from(f"<{length // 8}Q", extra, at + 4))
            if size == 0xFFFFFFFF and values:
                size = values.pop(0)
            if csize == 0xFFFFFFFF and values:
                csize = values.pop(0)
            if offset == 0xFFFFFFFF and values:
                offset = values.pop(0)
            break
        at += 4 + length
    return size, csize, offset


def _total_size(content_range: str) -> int:
    """The total of ``Content-Range: bytes a-b/total``."""
    total = content_range.rpartition("/")[2].strip()
    if not total.isdigit():
        raise BadZipFile(f"a range answer without its total size (Content-Range: {content_range!r})")
    return int(total)


def _local_path(url: str) -> Path | None:
    scheme = urlsplit(url).scheme
    if scheme == "file":
        return Path(url2pathname(urlsplit(url).path))
    if scheme in ("http", "https"):
        return None
    return Path(url)
