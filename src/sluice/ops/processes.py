"""Whether a process is still running, for the launchers and the namespaces they clean up."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from typing import IO, Any


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is not a zombie (an exited child not yet reaped, which
    still answers kill(0) but holds nothing any more).

    A process whose first thread is a zombie while other threads still end (exit_group under
    load, or a first thread that ended alone) still runs: it holds its sockets and files until
    its last thread has ended, and its exit status cannot be collected before."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().split(")")[-1].split()[0] != "Z":
                return True
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


#: Processes `spawn_detached` started and nothing has reaped yet: only these does `reap` collect
#: (a child someone holds a Popen for is theirs to wait for, with its exit status).
_DETACHED: set[int] = set()


def reap(pid: int) -> None:
    """Collect the exit status of a process `spawn_detached` started, if it exited (a zombie
    holds a process-table slot until then); nothing for any other process."""
    if pid not in _DETACHED:
        return
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        reaped = pid
    if reaped == pid:
        _DETACHED.discard(pid)


def forget_detached(pid: int) -> None:
    """``pid`` was reaped elsewhere (its exit status read): not one `reap` collects any more."""
    _DETACHED.discard(pid)


def spawn_detached(argv: Sequence[str], log: IO[Any], umask: int) -> int:
    """Start ``argv`` in a session of its own, its output to ``log``, and return its pid. This
    process's own waits reap it (``os.waitpid``), and only they: the exit status is what tells a
    broker that found its port taken from one that failed otherwise.

    A ``Popen`` dropped while its process runs goes on subprocess's list of orphans, and every
    later ``Popen`` in this process reaps that list (any thread's), taking the exit status before
    the launcher reads it. The object is dropped here as one whose child subprocess need not wait
    for (``_child_created``: CPython's flag for exactly that); the launcher's stops `reap` it."""
    proc = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        umask=umask,
    )  # fmt: skip
    proc._child_created = False  # type: ignore[attr-defined]
    _DETACHED.add(proc.pid)
    return proc.pid
