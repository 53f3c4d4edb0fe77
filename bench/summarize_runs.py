#!/usr/bin/env python3
"""Medians over repeated bench/run_all.sh runs, as the markdown tables of docs/performance.md.

On a shared 2-core machine one run can land on a burst of someone else's work;
the median over several runs (each in its own RESULTS_DIR) is the number to
quote, and the min-max range shows how much to trust it.

    .venv/bin/python bench/summarize_runs.py bench/results/runs/* [--out bench/results/summary.md]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

BLAS_VARIANTS = {"blas_reference": "reference BLAS (as shipped)", "blas_openblas_1thread": "OpenBLAS, 1 thread",
                 "blas_openblas": "OpenBLAS, 2 threads"}
MODEL_FILE = "minilm_l3_b1_s128.json"


def spread(values: list[float], fmt: str, unit: str = "") -> str:
    """`median (min-max)`, or just the value for a single run."""
    med = format(statistics.median(values), fmt) + unit
    if len(values) == 1:
        return med
    return f"{med} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def load_json(run: Path, name: str) -> dict | None:
    path = run / name
    return json.loads(path.read_text()) if path.exists() else None


def other_shares(run: Path) -> dict[str, float]:
    """Share of the cores other processes used during each part of a run (absent in old runs)."""
    shares = {}
    for variant in BLAS_VARIANTS:
        data = load_json(run, f"{variant}.json")
        if data and all("other_cpu_share" in r for r in data["results"]):
            shares[variant] = max(r["other_cpu_share"] for r in data["results"])
    model = load_json(run, MODEL_FILE)
    for part in ("load", "latency"):
        if model and f"other_cpu_share_{part}" in model["machine"]:
            shares[f"model {part}"] = model["machine"][f"other_cpu_share_{part}"]
    return shares


def blas_table(runs: list[Path]) -> list[str]:
    by_variant = {v: [d for d in (load_json(r, f"{v}.json") for r in runs) if d] for v in BLAS_VARIANTS}
    shapes = [(r["m"], r["k"], r["n"], r["label"]) for r in next(d for d in by_variant.values() if d)[0]["results"]]
    lines = ["| M×K×N | " + " | ".join(f"MLX, {label}" for label in BLAS_VARIANTS.values())
             + " | direct, OpenBLAS 2 threads | MLX / direct (2 threads) | OpenBLAS 2 threads / reference |",
             "|---|" + "---:|" * (len(BLAS_VARIANTS) + 3)]
    for i, (m, k, n, label) in enumerate(shapes):
        cells = [spread([d["results"][i]["mlx_gflops"] for d in by_variant[v]], ".1f") for v in BLAS_VARIANTS]
        fast = by_variant["blas_openblas"]
        cells.append(spread([d["results"][i]["direct_gflops"] for d in fast], ".1f"))
        cells.append(spread([d["results"][i]["mlx_over_direct"] for d in fast], ".3f"))
        ref = statistics.median(d["results"][i]["mlx_gflops"] for d in by_variant["blas_reference"])
        cells.append(spread([d["results"][i]["mlx_gflops"] / ref for d in fast], ".0f", "×"))
        lines.append(f"| {m}×{k}×{n} ({label}) | " + " | ".join(cells) + " |")
    return lines


def load_table(models: list[dict]) -> list[str]:
    rows = [("transmuter `info` (load)", "transmuter_info", "transmuter_empty"),
            ("ORT session, optimizations default", "ort_session_default", "ort_empty"),
            ("ORT session, optimizations disabled", "ort_session_disabled", "ort_empty"),
            ("transmuter `run` eager (load + 1st inference)", "transmuter_first_run_eager", "transmuter_empty"),
            ("transmuter `run` compiled (load + 1st inference)", "transmuter_first_run_compiled", "transmuter_empty"),
            ("ORT default: session + 1st inference", "ort_first_run_default", "ort_empty"),
            ("ORT disabled: session + 1st inference", "ort_first_run_disabled", "ort_empty"),
            ("empty transmuter process (`operators`)", "transmuter_empty", "transmuter_empty"),
            ("empty Python process (`import onnxruntime`)", "ort_empty", "ort_empty")]
    lines = ["| Fresh process | wall (ms) | minus empty process (ms) | peak RSS (MiB) | minus empty (MiB) |",
             "|---|---:|---:|---:|---:|"]
    for label, key, empty in rows:
        wall = [m["load"][key]["wall_s"] * 1e3 for m in models]
        net = [(m["load"][key]["wall_s"] - m["load"][empty]["wall_s"]) * 1e3 for m in models]
        rss = [m["load"][key]["peak_rss_mib"] for m in models]
        net_rss = [m["load"][key]["peak_rss_mib"] - m["load"][empty]["peak_rss_mib"] for m in models]
        lines.append(f"| {label} | {spread(wall, '.0f')} | {spread(net, '.0f')} | {spread(rss, '.0f')} "
                     f"| {spread(net_rss, '.0f')} |")
    return lines


def ratio(latency: dict, key: str, level: str) -> float:
    """transmuter/ORT within one run: per-round ratios when recorded, else of the medians."""
    entry = latency[key]
    if f"ratio_to_ort_{level}" in entry:
        return entry[f"ratio_to_ort_{level}"]
    return entry["median_ms"] / latency[f"ort_{level}"]["median_ms"]


def latency_table(models: list[dict]) -> list[str]:
    lines = ["| Batch 1 × seq 128, 2 threads | median (ms) | / ORT default | / ORT optimizations off |",
             "|---|---:|---:|---:|"]
    labels = {"transmuter_eager": "transmuter eager", "transmuter_compiled": "transmuter compiled",
              "ort_default": "ORT, optimizations default", "ort_disabled": "ORT, optimizations off"}
    for key, label in labels.items():
        ms = [m["latency"][key]["median_ms"] for m in models]
        # Each run's ratio (itself the median of per-round ratios), then their median over runs.
        to_default = [ratio(m["latency"], key, "default") for m in models]
        to_off = [ratio(m["latency"], key, "disabled") for m in models]
        lines.append(f"| {label} | {spread(ms, '.2f')} | {spread(to_default, '.2f')} | {spread(to_off, '.2f')} |")
    return lines


def phase_table(models: list[dict], split_ms: float) -> list[str]:
    """Rounds grouped by ORT's own speed in that round. On this VM the host's speed changes in
    phases of tens of seconds (ORT: ~9 vs ~12.5 ms); ORT, using both cores, slows more than
    Transmuter, whose non-BLAS work runs on one thread, so the ratio depends on the phase."""
    keys = ("transmuter_eager", "transmuter_compiled", "ort_default", "ort_disabled")
    phases: dict[str, list[tuple[float, ...]]] = {f"ORT default < {split_ms:g} ms": [],
                                                  f"ORT default >= {split_ms:g} ms": []}
    for m in models:
        for rnd in zip(*[[r["median_ms"] for r in m["latency"][k]["rounds"]] for k in keys]):
            phases[list(phases)[0 if rnd[2] < split_ms else 1]].append(rnd)
    lines = ["| Rounds | count | eager (ms) | compiled (ms) | ORT default (ms) | eager / ORT | compiled / ORT |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, rounds in phases.items():
        if not rounds:
            continue
        med = [statistics.median(r[i] for r in rounds) for i in range(4)]
        eager_ratio = statistics.median(r[0] / r[2] for r in rounds)
        compiled_ratio = statistics.median(r[1] / r[2] for r in rounds)
        lines.append(f"| {name} | {len(rounds)} | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.2f} | {eager_ratio:.2f} "
                     f"| {compiled_ratio:.2f} |")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="RESULTS_DIRs of bench/run_all.sh")
    p.add_argument("--out", type=Path, help="write the markdown here too")
    p.add_argument("--split-ort-ms", type=float, default=None,
                   help="also group latency rounds by ORT default's latency below/above this (e.g. 11)")
    p.add_argument("--max-other-share", type=float, default=None,
                   help="leave out runs where other processes used more than this share of the cores "
                        "in any part (e.g. 0.1)")
    args = p.parse_args()

    runs, notes = [], []
    for run in sorted(args.runs):
        shares = other_shares(run)
        text = ", ".join(f"{k} {v:.0%}" for k, v in shares.items()) or "not recorded"
        busy = args.max_other_share is not None and any(v > args.max_other_share for v in shares.values())
        notes.append(f"- {run.name}: other processes' share of the cores: {text}" + (" — left out" if busy else ""))
        if not busy:
            runs.append(run)
    if not runs:
        raise SystemExit("every run was left out by --max-other-share")
    models = [m for m in (load_json(r, MODEL_FILE) for r in runs) if m]
    loads = [" ".join(f"{x:.2f}" for x in m["machine"]["loadavg_start"]) for m in models]
    out = [f"Runs: {len(runs)} ({', '.join(r.name for r in runs)}); each cell is the median (min-max) over runs.",
           f"Load average at the start of each model benchmark: {'; '.join(loads)}.", *notes, "",
           "## fp32 matmul GFLOPS", ""] + blas_table(runs)
    if models:
        out += ["", "## Load time and peak RSS (fresh processes, median of 5 each per run)", ""] + load_table(models)
        out += ["", "## Latency", ""] + latency_table(models)
        if args.split_ort_ms is not None:
            out += ["", "Per round, grouped by the machine's speed in that round (ORT's latency):", ""]
            out += phase_table(models, args.split_ort_ms)
        diffs = [v for m in models for v in m["max_abs_diff_vs_ort"].values() if isinstance(v, float)]
        mismatches = [v for m in models for v in m["max_abs_diff_vs_ort"].values() if not isinstance(v, float)]
        out += ["", f"Max |transmuter - ORT| over all outputs, modes and runs: {max(diffs):.2e}"
                + (f"; shape mismatches: {mismatches}" if mismatches else "")]
    text = "\n".join(out) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
