"""Spark-level faults for the commands tests start: a Python worker that does not connect back.

Under CPU starvation Spark's fixed 10 s wait for a new Python process to connect back
(PythonWorkerFactory.createSimpleWorker) runs out, and the query fails with "Python worker
failed to connect back." (issue 32: the streaming source's runner, started at each query start
by PythonStreamingSourceRunner.init). `ConnectBackFault` reproduces that failure on demand, on
any machine: the interpreter Spark starts its Python processes with (PYSPARK_PYTHON, which
`pipeline.session.spark_session` leaves to the environment) is a script that, for chosen starts
of the streaming source's runner, does not connect back; every other start (the executors'
workers, the other runners) runs what Sluice itself hands Spark (`sluice-spark-python`). No
switch in Sluice's code: the fault is in the interpreter the test hands Spark. `source_runners`
finds the runner of a running query, for a test to kill (a Python worker that dies under a
running query).
"""

from __future__ import annotations

import os
import shlex
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from sluice.pipeline.session import spark_python

#: the module Spark runs for a Python streaming source (pyspark 4.x)
SOURCE_RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
#: what Spark says when one does not connect back (the query's failure, as the commands show it)
CONNECT_BACK_FAILED = "Python worker failed to connect back"

_SCRIPT = """#!/bin/bash
# Written by tests/support/spark_faults.py: starts {after}.. of {runner} (counting from 0) up to
# {times} of them do not connect back to Spark ({how}); everything else runs {python}.
case " $* " in
*" {runner} "*)
    n=0
    while ! mkdir {state}/start-$n 2>/dev/null; do n=$((n + 1)); done
    if [ "$n" -ge {after} ] && [ "$n" -lt {end} ]; then
        mkdir {state}/fault-$n
        echo "spark_faults: start $n of the source runner: this Python worker does not connect back" >&2
        {hang_up}exit 1
    fi
    ;;
esac
exec {python} "$@"
"""
#: connect to the port Spark waits on, and close it before the handshake
_HANG_UP = 'exec 3<>"/dev/tcp/127.0.0.1/$PYTHON_WORKER_FACTORY_PORT" && exec 3>&-\n        '


@dataclass(frozen=True, slots=True)
class ConnectBackFault:
    """Of the streaming source runners Spark starts, the `after`-th (from 0) and the `times - 1`
    after it do not connect back. Silent, they exit, and Spark fails the query after its 10 s
    (SocketTimeoutException), as on the starved machine; with `hang_up` they connect and hang up
    before the handshake, and Spark fails the query at once with the same "Python worker failed
    to connect back." (EOFException): the same failure of the query, without the wait."""

    directory: Path
    times: int
    after: int = 0

    @classmethod
    def arm(cls, directory: Path, times: int, after: int = 0, *, hang_up: bool = False) -> ConnectBackFault:
        assert times >= 0 and after >= 0
        state = directory / "state"  # a directory per runner started, and per fault injected
        state.mkdir(parents=True)
        script = directory / "python"
        script.write_text(
            _SCRIPT.format(
                after=after,
                end=after + times,
                times=times,
                runner=SOURCE_RUNNER,
                how="it hangs up" if hang_up else "it exits",
                hang_up=_HANG_UP if hang_up else "",
                state=shlex.quote(str(state)),
                # what Sluice hands Spark itself (`sluice-spark-python`, which connects back before
                # its imports): with the bare interpreter here, an unfaulted start of the runner
                # under two busy loops missed Spark's 10 s as it did before the launcher
                python=shlex.quote(spark_python()),
            )
        )
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        return cls(directory, times, after)

    def env(self) -> dict[str, str]:
        """The environment of a command whose Spark driver gets the fault (its driver and
        executors inherit it)."""
        return {"PYSPARK_PYTHON": str(self.directory / "python")}

    def injected(self) -> int:
        """How many runners were refused so far."""
        return sum(1 for name in os.listdir(self.directory / "state") if name.startswith("fault-"))

    def started(self) -> int:
        """How many runners Spark started so far (refused ones included)."""
        return sum(1 for name in os.listdir(self.directory / "state") if name.startswith("start-"))


def source_runners(pid: int) -> list[int]:
    """The streaming source runners running below process `pid` (a command's Spark driver's)."""
    from tests.support.processes import descendants

    found = []
    for child in descendants(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if SOURCE_RUNNER.encode() in argv:
            found.append(child)
    return found


_SLOW_IMPORT = """#!/bin/bash
# Written by tests/support/spark_faults.py: Python processes whose import of {slowed} takes
# {delay_s} s more, as the imports of a starved machine do; the source runner is started
# {how}. Everything else runs as `{python} "$@"` would, with the same delay.
exec {python} -c '
import sys, time
from importlib.abc import MetaPathFinder

class Slow(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "{slowed}":
            sys.meta_path.remove(self)
            time.sleep({delay_s})
        return None

sys.meta_path.insert(0, Slow())
args = sys.argv[1:]
if args[:2] == ["-m", "{runner}"] and {launcher}:
    from sluice.pipeline.spark_python import main
    main(args)
else:
    import runpy
    sys.argv = [args[1], *args[2:]]
    runpy.run_module(args[1], run_name="__main__", alter_sys=True)
' "$@"
"""


@dataclass(frozen=True, slots=True)
class SlowImportInterpreter:
    """The interpreter Spark starts its Python processes with, every import of `slowed` (pyarrow,
    which every PySpark worker imports) taking `delay_s` longer: the starved machine's slow
    imports, on any machine. With `launcher` the streaming source's runner is started the way
    Sluice starts it (pipeline.spark_python: connect back first, import after); without, as
    `python -m` starts it (import first, then connect back: past Spark's 10 s when `delay_s` is
    more). Every other process runs its module as `python -m` would."""

    directory: Path

    @classmethod
    def write(
        cls, directory: Path, *, delay_s: float, launcher: bool, slowed: str = "pyarrow"
    ) -> SlowImportInterpreter:
        directory.mkdir(parents=True, exist_ok=True)
        script = directory / "python"
        script.write_text(
            _SLOW_IMPORT.format(
                slowed=slowed,
                delay_s=delay_s,
                runner=SOURCE_RUNNER,
                launcher=launcher,
                how="as Sluice starts it (connect back, then import)"
                if launcher
                else "as `python -m` starts it",
                python=shlex.quote(sys.executable),
            )
        )
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        return cls(directory)

    def env(self) -> dict[str, str]:
        return {"PYSPARK_PYTHON": str(self.directory / "python")}
