"""What the benchmarks that compare ours with TFRA in child processes share: running a
child that prints one `RESULT {json}` line, medians, the load average, and writing the
results record."""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
from typing import Any, Dict, List, Optional


def tfra_available() -> bool:
    """Whether TFRA is importable here (it only installs next to TF 2.16.x)."""
    try:
        return importlib.util.find_spec("tensorflow_recommenders_addons") is not None
    except Exception:  # a broken install counts as absent
        return False


def median(xs: List[float]) -> Optional[float]:
    """The median (the mean of the middle two for an even count); None for no values."""
    xs = sorted(xs)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


def loadavg() -> Optional[float]:
    """The 1-minute load average (the machine is shared; results record it)."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except OSError:
        return None


def print_result(result: Dict[str, Any]) -> None:
    """A child's output: one line the parent finds."""
    print("RESULT " + json.dumps(result), flush=True)


def spawn_child(cmd: List[str], env: Dict[str, str]):
    """Runs `cmd`; returns `(result dict or None, stderr tail)`."""
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        tail = proc.stderr[-3000:]
        print(f"child failed (rc {proc.returncode}): {' '.join(cmd[2:])}\n{tail}", file=sys.stderr)
        return None, tail
    return json.loads(line[0][len("RESULT "):]), ""


def write_record(out: str, benchmark: str, tf_version: str, load_start, **fields) -> None:
    """Writes the results file: machine and run facts, then `fields`."""
    record = {
        "benchmark": benchmark,
        "date": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(sys.argv),
        "tf": tf_version,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_start": load_start,
        "load_end": loadavg(),
        **fields,
    }
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
    print(f"wrote {out}")
