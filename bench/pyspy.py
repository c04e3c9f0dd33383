"""Profiles of Sluice's brokers while a benchmark runs: py-spy (pinned in the `bench` extra)
samples each broker process, and the top frames are printed.

`Profiler(directory, pids)` starts one `py-spy record --format raw` per pid (collapsed stacks,
one line per distinct stack with its sample count; `--idle` off, so only samples where the
process ran Python count) and `stop()` ends them (SIGINT: py-spy writes its file and exits).
`summary(path)` reads a collapsed-stack file and gives the frames with the most samples where
they are the innermost frame (self) and anywhere on the stack (total), as fractions of all
samples: what the profile's top frames are, for bench/RESULTS.md.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

#: py-spy's frame text: "function (file:line)"; the line number is dropped to sum a function
_LINE = re.compile(r":\d+\)$")


def py_spy() -> str | None:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    return found if Path(found).exists() else None


@dataclass
class Profile:
    samples: int
    self_top: list[tuple[str, float]]
    total_top: list[tuple[str, float]]


def _frame(text: str) -> str:
    """A frame without its line number, and its file named from the package on."""
    text = _LINE.sub(")", text.strip())
    for marker in ("/site-packages/", "/src/", "/lib/python3.11/"):
        if marker in text:
            head, _, tail = text.partition("(")
            return f"{head}({tail.split(marker, 1)[1]}" if marker in tail else text
    return text


def summary(path: Path, top: int = 12) -> Profile:
    self_counts: Counter[str] = Counter()
    total_counts: Counter[str] = Counter()
    samples = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_frame(f) for f in stack.split(";") if f.strip()]
        if not frames:
            continue
        samples += n
        self_counts[frames[-1]] += n
        for f in set(frames[1:]):  # the thread's own name (the first "frame") is not a function
            total_counts[f] += n
    if samples == 0:
        return Profile(0, [], [])
    return Profile(
        samples,
        [(f, c / samples) for f, c in self_counts.most_common(top)],
        [(f, c / samples) for f, c in total_counts.most_common(top)],
    )


class Profiler:
    def __init__(self, directory: Path, pids: dict[str, int], rate: int = 200) -> None:
        exe = py_spy()
        if exe is None:
            raise SystemExit("py-spy is not installed: pip install -e '.[bench]'")
        directory.mkdir(parents=True, exist_ok=True)
        self.paths = {name: directory / f"{name}.txt" for name in pids}
        self.procs = [self._record(exe, pid, rate, self.paths[name]) for name, pid in pids.items()]

    @staticmethod
    def _record(exe: str, pid: int, rate: int, output: Path) -> subprocess.Popen[bytes]:
        argv = [exe, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate), "--nonblocking"]
        return subprocess.Popen(
            [*argv, "--output", str(output)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def stop(self) -> dict[str, Profile]:
        for p in self.procs:
            p.send_signal(signal.SIGINT)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return {name: summary(path) for name, path in self.paths.items() if path.exists()}


def print_profiles(label: str, profiles: dict[str, Profile], top: int = 12) -> None:
    for name, prof in profiles.items():
        print(f"profile {label} {name}: {prof.samples} samples", flush=True)
        for kind, frames in (("self", prof.self_top), ("total", prof.total_top)):
            for frame, share in frames[:top]:
                print(f"  {kind} {share * 100:5.1f}%  {frame}", flush=True)
