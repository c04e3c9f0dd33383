"""The README's main command, shortened: `sluice demo` ends with the target equal to the truth."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_demo_ends_with_the_target_equal_to_the_source(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sluice.ops.cli", "demo", "--dir", str(tmp_path / "demo"),
         "--duration", "14", "--rate", "1000"],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert "OK: the target equals the source" in text
    assert "kill -9 of broker" in text and "restarted" in text
    assert "missing" in text and "different" in text  # the comparison table was printed
    assert "cluster stopped" in text
