"""What a benchmark records about the machine beside its figures: the CPU model and the load."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def machine() -> dict:
    """Load averages, core count, CPU model and the UTC time, taken before and after a run."""
    return {"loadavg": os.getloadavg(), "cpus": os.cpu_count(), "cpu": cpu_model(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
