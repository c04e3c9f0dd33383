"""What the processes Sluice starts write is their owner's alone: data directories 0700, log files
0600, and the processes themselves (ZooKeeper, brokers, workers) run with umask 077, so every
segment, checkpoint, snapshot and log they create is private too. A log or a segment holds
records, task definitions' references, principals and addresses; a secured cluster's are no
one else's to read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

#: the umask of every process Sluice starts: files 0600 and directories 0700 at most
PRIVATE_UMASK = 0o077


def private_umask() -> int:
    """Make this process create private files from now on; the umask it had."""
    return os.umask(PRIVATE_UMASK)


def private_dir(path: Path) -> Path:
    """Create ``path`` (and its parents) if need be, and make it 0700: a directory of the
    project's own (a broker's data, ZooKeeper's), so one left more open by an earlier version is
    closed too."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def open_private_log(path: str | Path) -> BinaryIO:
    """Open a process's log for appending, 0600 (an existing one too)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")
