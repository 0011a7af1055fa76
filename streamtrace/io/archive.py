"""Archives as inputs: tar (plain, gzip or zstd compressed) and zip.

An archive is told by its content, never its name: zip by the bytes ``PK``
at the start, tar by the header of its first member (after the gzip/zstd
layer, which :mod:`.source` removes as for any input).  A member is named
``ARCHIVE!MEMBER``; that name works wherever a trace path does.

Members are read without unpacking the archive: a zip member or a member
of an uncompressed tar file is read in place (and can be read again); a
member of a compressed tar is streamed out of the archive, and the source
spools it while reading, as it does any input that cannot be reopened.
"""
from __future__ import annotations

import os
import tarfile
import zipfile
import zlib
from typing import BinaryIO, Callable

from ..errors import TraceError

ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")  # a zip with members, an empty zip
TAR_BLOCK = 512
MEMBER_SEPARATOR = "!"
_SHOWN_MEMBERS = 8  # member names listed in a refusal


def kind_of(decoded_head: bytes, compression: str) -> str | None:
    """``"zip"``, ``"tar"`` or None, from the first decompressed bytes (zip:
    only uncompressed, as zip compresses its members itself)."""
    if compression == "none" and decoded_head.startswith(ZIP_MAGICS):
        return "zip"
    if _is_tar_header(decoded_head[:TAR_BLOCK]):
        return "tar"
    return None


def _is_tar_header(block: bytes) -> bool:
    """A POSIX/GNU tar header (``ustar`` magic), or an old one whose checksum holds."""
    if len(block) < TAR_BLOCK:
        return False
    if block[257:262] == b"ustar":
        return True
    try:
        stored = int(block[148:156].strip(b" \0") or b"-1", 8)
    except ValueError:
        return False
    return stored == sum(block[:148]) + 8 * 0x20 + sum(block[156:])


def split_member(spec: object) -> tuple[str, str] | None:
    """``(archive, member)`` for a name ``ARCHIVE!MEMBER`` whose archive is an
    existing file (a file whose own name holds ``!`` is taken as it is)."""
    if not isinstance(spec, str) or MEMBER_SEPARATOR not in spec or os.path.exists(spec):
        return None
    at = spec.find(MEMBER_SEPARATOR)
    while at >= 0:
        if os.path.isfile(spec[:at]):
            return spec[:at], spec[at + 1:]
        at = spec.find(MEMBER_SEPARATOR, at + 1)
    return None


def outer_path(spec: str) -> str:
    """The file a trace name lives in: the archive for a member, else the name itself."""
    found = split_member(spec)
    return found[0] if found else spec


def _is_trace_candidate(name: str) -> bool:
    """Not the metadata archivers add (macOS resource forks, Finder files)."""
    base = name.rstrip("/").rsplit("/", 1)[-1]
    return not (name.startswith("__MACOSX/") or base.startswith("._") or base == ".DS_Store")


class ArchiveError(TraceError):
    """The archive itself cannot be read."""


def list_members(kind: str, local_path: str | None, open_decoded: Callable[[], BinaryIO]) -> list[str]:
    """The regular files of an archive, in archive order.

    ``local_path``: the archive on disk (zip needs it; a plain tar is then
    listed by seeking); ``open_decoded``: a fresh decompressed reading.
    """
    try:
        if kind == "zip":
            with zipfile.ZipFile(local_path) as archive:
                return [info.filename for info in archive.infolist()
                        if not info.is_dir() and _is_trace_candidate(info.filename)]
        tar, closers = _open_tar(local_path, open_decoded)
        try:
            return [info.name for info in tar if info.isfile() and _is_trace_candidate(info.name)]
        finally:
            for closer in closers:
                closer.close()
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, OSError) as exc:
        raise ArchiveError(f"cannot list the {kind} archive: {exc}") from None


def _open_tar(local_path: str | None, open_decoded: Callable[[], BinaryIO]) -> tuple[tarfile.TarFile, list]:
    """A tar reading (seekable on an uncompressed local file, else a stream)
    and what to close when done with it, the tar last."""
    if local_path is not None and is_plain_file(local_path):
        tar = tarfile.open(local_path, mode="r:")
        return tar, [tar]
    decoded = open_decoded()
    try:
        tar = tarfile.open(fileobj=decoded, mode="r|")
    except BaseException:
        decoded.close()
        raise
    return tar, [tar, decoded]


def is_plain_file(path: str) -> bool:
    """Is the file neither gzip nor zstd compressed (so a tar in it can be seeked)?"""
    with open(path, "rb") as handle:
        head = handle.read(4)
    return not head.startswith((b"\x1f\x8b", b"\x28\xb5\x2f\xfd"))


def reopenable(kind: str, local_path: str | None) -> bool:
    """Can a member be read again from its start without reading the archive up to it?"""
    return local_path is not None and (kind == "zip" or is_plain_file(local_path))


class MemberReader:
    """The raw bytes of one member; errors of the archive layer become
    :class:`ArchiveError` (or ``EOFError`` when the archive ends early)."""

    def __init__(self, kind: str, local_path: str | None, open_decoded: Callable[[], BinaryIO], member: str) -> None:
        self._closers: list = []
        try:
            if kind == "zip":
                archive = zipfile.ZipFile(local_path)
                self._closers.append(archive)
                self._file = archive.open(member)
            else:
                tar, closers = _open_tar(local_path, open_decoded)
                self._closers.extend(reversed(closers))
                self._file = _tar_member(tar, member)
        except (tarfile.TarError, zipfile.BadZipFile, zlib.error, OSError, RuntimeError, NotImplementedError) as exc:
            self.close()  # RuntimeError: an encrypted zip member; NotImplementedError: an unknown compression
            raise ArchiveError(f"cannot read member {member!r}: {exc}") from None
        except KeyError:
            self.close()
            raise ArchiveError(f"the archive has no member {member!r}") from None

    def read(self, size: int = -1) -> bytes:
        try:
            return self._file.read(size)
        except tarfile.ReadError as exc:
            if "unexpected end" in str(exc):
                raise EOFError(str(exc)) from None
            raise ArchiveError(f"corrupt tar archive: {exc}") from None
        except (tarfile.TarError, zipfile.BadZipFile, zlib.error) as exc:
            raise ArchiveError(f"corrupt archive member: {exc}") from None

    def close(self) -> None:
        for closer in reversed(self._closers):
            closer.close()
        self._closers.clear()


def _tar_member(tar: tarfile.TarFile, member: str) -> BinaryIO:
    for info in tar:
        if info.name == member and info.isfile():
            extracted = tar.extractfile(info)
            if extracted is not None:
                return extracted
    raise KeyError(member)


def refusal(kind: str, members: list[str], path: str) -> TraceError:
    """The error for an archive that does not hold exactly one trace."""
    if not members:
        return TraceError(f"is a {kind} archive with no files in it", path=path)
    shown = ", ".join(members[:_SHOWN_MEMBERS]) + (", ..." if len(members) > _SHOWN_MEMBERS else "")
    naming = f" (or name one: {path}{MEMBER_SEPARATOR}MEMBER)" if os.path.isfile(path) else ""
    return TraceError(f"is a {kind} archive holding {len(members)} files ({shown}); a command reads an archive "
                      f"holding one trace, merge one holding rank files{naming}", path=path)
