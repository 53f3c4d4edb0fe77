"""What a benchmark records beside its figures (the CPU model, the load) and where it saves them."""

from __future__ import annotations

import json
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


def save_run(result: dict, root: Path, kind: str, doc: str, write_doc) -> None:
    """Writes a run's figures to bench/results/<kind>/<UTC time>.json (its path recorded in result["json"]),
    then the generated page docs/<doc> from them."""
    out_dir = root / "bench" / "results" / kind
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    result["json"] = str(json_path.relative_to(root))
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    write_doc(result, root / "docs" / doc)
    print(f"wrote {json_path.relative_to(root)} and docs/{doc}")
