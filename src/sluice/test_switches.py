"""Test-only switches that turn one guarantee off, so the drills' tests can show each drill is
able to fail (a drill that passes whatever the code does proves nothing), and fault points: kill
the process right before or after its N-th target commit, or stop it with SIGSTOP at an armed
pause point.

How a switch reaches a process, and why a deployment cannot turn one on by accident:

* Only the process entry points (`sluice broker start`, `sluice worker start`, `sluice apply`)
  call `for_process()`, once. Everything below them takes a `Switches` as a constructor option
  (all off by default) and never reads the environment.
* A switch is honoured only when the test harness armed it with `armed()`: it writes the
  switches to a file in a private directory of its own, with a random token for the run and the
  harness's own process id and start time, and gives the child `SWITCHES_FILE` (that file) and
  `SWITCHES_TOKEN` (the token). `read_armed` honours the file only if it is a regular file owned
  by this user and writable by no one else (its directory too), holds that token, and names a
  harness process that is still running; the harness deletes it when its block ends. So an
  environment copied from a test run into a deployment names a file that is gone, foreign or
  stale: the process logs a WARNING and runs with every guarantee on.
* The old bare variables (`SLUICE_TEST_UNSAFE_ACKS_ALL=1`, ...) turn nothing off; a process that
  sees one logs a WARNING saying it ignored it.
* A process with any switch on logs a WARNING at start naming each one and its guarantee.

Imports nothing of Sluice.
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

log = logging.getLogger("sluice.test_switches")

#: The switches file a harness armed (`armed`), and the token of its run written in it.
SWITCHES_FILE = "SLUICE_TEST_SWITCHES_FILE"
SWITCHES_TOKEN = "SLUICE_TEST_SWITCHES_TOKEN"

#: Variables that were switches when a bare `=1` turned a guarantee off. Now they do nothing; a
#: process that sees one says so, so a test or a deployment still setting one is noticed.
BARE_VARIABLES = (
    "SLUICE_TEST_UNSAFE_ACKS_ALL",
    "SLUICE_TEST_DISABLE_LEADERLESS_SWEEP",
    "SLUICE_TEST_DISABLE_EPOCH_FENCE",
    "SLUICE_TEST_DISABLE_REASSIGNMENT",
    "SLUICE_TEST_DISABLE_TARGET_FENCE",
    "SLUICE_TEST_DISABLE_VERSION_GUARD",
    "SLUICE_TEST_SHARED_EVENT_POSITION",
    "SLUICE_TEST_CRASH_AT",
    "SLUICE_TEST_PAUSE_DIR",
)

#: "after-staging": the executors staged the batch's rows in the target and the driver is about to
#: commit them (staging.py); N counts batches there, as it counts commits at the other two.
CRASH_POINTS = ("before-commit", "after-commit", "after-staging")
#: "capture-produce": a captured change is about to be produced to the log; "apply-commit": a
#: micro-batch was read and is about to be committed to the target; "txn-markers": a transaction
#: coordinator wrote PrepareCommit/PrepareAbort and is about to write the markers.
PAUSE_POINTS = ("capture-produce", "apply-commit", "txn-markers")


@dataclass(frozen=True, slots=True)
class Switches:
    """What one process turns off; everything on unless a harness armed it (`for_process`)."""

    #: acks=all is acknowledged as soon as the leader appended (as acks=1 is): incident A's loss.
    unsafe_acks_all: bool = False
    #: The controller elects only for partitions whose leader it just saw die, never for
    #: partitions already leaderless (Kafka's behaviour that left incident B's partition so).
    disable_leaderless_sweep: bool = False
    #: Controller writes skip the /controller_epoch version check (I4 off).
    disable_epoch_fence: bool = False
    #: The controller ignores /admin/reassign_partitions, so a drain never moves anything.
    disable_reassignment: bool = False
    #: Targets accept a commit under any fencing epoch (the stale-epoch check is off).
    disable_target_fence: bool = False
    #: Targets write rows without comparing source positions (the version guard is off).
    disable_version_guard: bool = False
    #: Every row change of a binlog rows event gets the event's end position, as before each
    #: change had its own: changes of one row in one statement tie, and the target keeps an
    #: older image.
    shared_event_position: bool = False
    #: "before-commit:N" or "after-commit:N": the process kills itself with SIGKILL right before
    #: or right after its N-th target commit (counting from 1); "after-staging:N": when the
    #: executors have staged the rows of its N-th commit, before the commit begins.
    crash_at: str = ""
    #: A directory: at a pause point (PAUSE_POINTS) named by a file in it, the process deletes
    #: the file and stops itself with SIGSTOP (a GC pause landing exactly there) until someone
    #: sends SIGCONT. Drills arm a point by creating the file.
    pause_dir: str = ""

    def __post_init__(self) -> None:
        point, _, number = self.crash_at.partition(":")
        if self.crash_at and (point not in CRASH_POINTS or not number.isdigit()):
            raise ValueError(
                f"crash_at must be before-commit:N, after-commit:N or after-staging:N, not {self.crash_at!r}"
            )

    def on(self) -> dict[str, bool | str]:
        """The switches that are on, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name)}


#: Every guarantee on: the default of every constructor that takes switches.
OFF = Switches()

#: What each switch turns off, for the WARNING a process logs when one is on.
GUARANTEES = {
    "unsafe_acks_all": "I1: acks=all is acknowledged only once the ISR has the record",
    "disable_leaderless_sweep": "I5: the controller elects leaders for partitions left leaderless",
    "disable_epoch_fence": "I4: controller writes are fenced by /controller_epoch",
    "disable_reassignment": "drain: the controller moves replicas off a draining broker",
    "disable_target_fence": "I8: targets refuse commits under a stale fencing epoch",
    "disable_version_guard": "I8: targets never replace a row with an older source position",
    "shared_event_position": "I8: every row change of a binlog event has a position of its own",
    "crash_at": "availability: the process kills itself at a target commit (fault point)",
    "pause_dir": "availability: the process stops itself at armed pause points (fault point)",
}
assert set(GUARANTEES) == {f.name for f in fields(Switches)}


class NotArmedError(ValueError):
    """The environment names switches that this process will not honour; the message says why."""


# --- the process side ------------------------------------------------------------------------------


@functools.cache
def for_process() -> Switches:
    """This process's switches, loaded from its environment once (process entry points only)."""
    return load(os.environ)


def load(environ: Mapping[str, str]) -> Switches:
    """The switches `environ` arms (every one off unless a harness armed them), logging a WARNING
    for every variable ignored and for every switch that is on."""
    for name in BARE_VARIABLES:
        if name in environ:
            log.warning(
                'event=test_switch_ignored variable=%s reason="a bare variable turns nothing off; '
                'tests arm switches with sluice.test_switches.armed" guarantees=all_on',
                name,
            )
    path, token = environ.get(SWITCHES_FILE), environ.get(SWITCHES_TOKEN)
    if path is None and token is None:
        return OFF
    try:
        switches = read_armed(path, token)
    except NotArmedError as exc:
        log.warning('event=test_switches_ignored file=%s reason="%s" guarantees=all_on', path, exc)
        return OFF
    for name, value in switches.on().items():
        what = GUARANTEES[name]
        log.warning('event=test_switch_on name=%s value=%s guarantee="%s" file=%s', name, value, what, path)
    return switches


def read_armed(path: str | None, token: str | None) -> Switches:
    """The switches in the file a harness armed; NotArmedError unless every check of the module
    docstring holds."""
    if not path or not token:
        raise NotArmedError(f"{SWITCHES_FILE} and {SWITCHES_TOKEN} are set together by the test harness")
    file = Path(path)
    _check_private(file.parent, stat.S_ISDIR, "directory")
    _check_private(file, stat.S_ISREG, "file")
    try:
        doc = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise NotArmedError(f"unreadable switches file: {exc}") from None
    if not isinstance(doc, dict) or not hmac.compare_digest(str(doc.get("token", "")), token):
        raise NotArmedError(f"the file does not hold the token in {SWITCHES_TOKEN} (not this run's)")
    harness = doc.get("harness") or {}
    pid, started = harness.get("pid"), harness.get("started")
    if not isinstance(pid, int) or started is None or _process_start(pid) != started:
        raise NotArmedError(f"the harness process that armed it (pid {pid}) is no longer running")
    return _parse_switches(doc.get("switches"))


def _check_private(path: Path, is_kind: Callable[[int], bool], kind: str) -> None:
    """`path` is a `kind` (not a link) owned by this user and writable by no one else."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise NotArmedError(
            f"no switches {kind} {path} ({exc.strerror}): the run that armed it is over, or the "
            "variable was copied from elsewhere"
        ) from None
    if not is_kind(st.st_mode):
        raise NotArmedError(f"{path} is not a {kind}")
    if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise NotArmedError(f"{path} is owned by uid {st.st_uid} or writable by others")


def _parse_switches(values: Any) -> Switches:
    if not isinstance(values, dict):
        raise NotArmedError("the file holds no switches object")
    for name, value in values.items():
        if name not in GUARANTEES:
            raise NotArmedError(f"unknown switch {name!r} (known: {', '.join(GUARANTEES)})")
        kind = type(getattr(OFF, name))
        if type(value) is not kind:
            raise NotArmedError(f"switch {name} must be a {kind.__name__}, not {value!r}")
    try:
        return Switches(**values)
    except ValueError as exc:
        raise NotArmedError(str(exc)) from None


def _process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks after boot), or None if there is no such process:
    with the pid, it names one process, never a later one that reused the pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text.rsplit(")", 1)[1].split()[19])  # field 22, starttime


# --- the harness side ------------------------------------------------------------------------------


@contextmanager
def armed(switches: Switches) -> Iterator[dict[str, str]]:
    """Arm `switches` for processes this harness starts inside the block: yields the variables
    to put in their environment. The file is private to this user, carries a fresh random token
    and this process's id and start time, and is deleted when the block ends."""
    directory = Path(tempfile.mkdtemp(prefix="sluice-test-switches-"))  # mode 0700
    token = secrets.token_hex(16)
    path = directory / "switches.json"
    doc = {
        "token": token,
        "harness": {"pid": os.getpid(), "started": _process_start(os.getpid())},
        "switches": asdict(switches),
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(doc, out)
    try:
        yield {SWITCHES_FILE: str(path), SWITCHES_TOKEN: token}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# --- fault points ----------------------------------------------------------------------------------

_commits = 0


def crash_point(switches: Switches, where: str, *, count: bool = False) -> None:
    """Die with SIGKILL here if `switches.crash_at` names this point and commit number.

    `count` advances the process's commit counter (call it once per commit, at "before-commit")."""
    global _commits
    if count:
        _commits += 1
    if not switches.crash_at:
        return
    point, _, number = switches.crash_at.partition(":")
    # at "after-staging" the commit it precedes is not counted yet
    reached = _commits + 1 if where == "after-staging" else _commits
    if point == where and int(number) == reached:
        _signal_this_thread("SIGKILL")


def pause_point(switches: Switches, where: str) -> None:
    """Stop this process with SIGSTOP here if `switches.pause_dir` holds an armed file for this
    point."""
    if not switches.pause_dir:
        return
    assert where in PAUSE_POINTS, where
    armed_file = os.path.join(switches.pause_dir, where)
    try:
        os.unlink(armed_file)  # one pause per arming; unlink is atomic, so two threads never both stop
    except FileNotFoundError:
        return
    _signal_this_thread("SIGSTOP")


def _signal_this_thread(name: str) -> None:
    """Send the signal to the calling thread itself (tgkill), not to the process: the kernel
    then acts on it as this thread leaves the call, so the thread is stopped or killed exactly
    here. Sent to the process, it may be taken by another thread while this one runs on for
    milliseconds (into the transaction it was meant to stop in front of)."""
    import signal
    import threading

    signal.pthread_kill(threading.get_ident(), getattr(signal, name))
