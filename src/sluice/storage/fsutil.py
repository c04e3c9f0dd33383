"""Small file-system helpers: atomic replace and directory fsync."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(directory: Path) -> None:
    """fsync a directory so that renames and creations inside it are durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data``: write ``path.tmp``, (fsync), rename, (fsync the dir).

    Readers see either the old or the new content, never a mix. Without ``durable`` a crash may
    leave the old content (or, on some file systems, an empty file: callers must validate).
    """
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable:
        fsync_dir(path.parent)


def pread_exact(fd: int, size: int, pos: int) -> bytes:
    """Read up to ``size`` bytes at ``pos``, looping over short reads; shorter only at EOF."""
    data = os.pread(fd, size, pos)
    if len(data) == size or not data:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = os.pread(fd, size - got, pos + got)
        if not more:
            break
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def write_all(fd: int, data: bytes | bytearray | memoryview, pos: int) -> None:
    """pwrite all of ``data`` at ``pos``."""
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, pos)
        view = view[n:]
        pos += n
