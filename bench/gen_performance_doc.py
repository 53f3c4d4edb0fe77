#!/usr/bin/env python3
"""docs/performance.md from the raw JSON of one bench/run (bench/suite.py).

    .venv/bin/python bench/gen_performance_doc.py bench/results/suite/<run>.json [MORE.json ...] \
        [--out docs/performance.md]

Several JSON files merge into one document: of several measurements of a case, the quietest (least
CPU used by other processes) is shown, e.g. a full run plus a rerun of the cases it had to skip or
that ran while others were building.

Every figure in the output comes from that JSON, except the BLAS section, which quotes
bench/results/summary.md (bench/run_all.sh) with its own date and machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
BLAS_THREADING_DIR = REPO_ROOT / "bench/results/blas_threading"
Q4_DIR = REPO_ROOT / "bench/results/q4"
LLM_DIR = REPO_ROOT / "bench/results/llm"
BLAS_SUMMARY = REPO_ROOT / "bench/results/summary.md"
# Issue 8's targets ("How it is checked").
TARGETS = {"encoder": 0.9, "vit": 0.9, "cnn": 1.0}
EAGER_OVER_COMPILED = 1.3
FIRST_COMPILE_OVER_EAGER = 2.0
LOAD_OVER_ORT = 0.2
RSS_OVER_WEIGHTS = 1.1
# Flagged when max |Transmuter - ORT| exceeds this times max(1, max |ORT|): fp32 engines that
# sum in different orders differ by a few ulps per op, ~1e-6 relative over a deep model.
AGREEMENT_TOL = 1e-4
# Rows where other processes used more than this share of the cores are marked "(noisy)".
NOISY_SHARE = 0.25


def fmt(value, spec: str = ".2f", missing: str = "–") -> str:
    return missing if value is None else format(value, spec)


def mark(ok: bool | None) -> str:
    return "–" if ok is None else ("yes" if ok else "**no**")


def noisy(case: dict) -> bool:
    return case["machine_after"]["other_cpu_share"] > NOISY_SHARE


def verdict(ok: bool | None, case: dict) -> str:
    """yes/no against a target, marked when other processes took so much of the machine that the
    comparison says little (ORT's two threads lose more to them than Transmuter's mostly serial work)."""
    return mark(ok) + (" (noisy)" if ok is not None and noisy(case) else "")


def load_note(case: dict) -> str:
    before, after = case["machine_before"]["loadavg"][0], case["machine_after"]["loadavg"][0]
    return f"{before:.2f}→{after:.2f}, {case['machine_after']['other_cpu_share']:.0%}"


def ok_cases(data: dict) -> list[dict]:
    return [c for c in data["cases"] if "error" not in c]


def timed_cases(data: dict) -> list[dict]:
    """The cases with latency, load and RSS figures (the `export` cases have agreement and first call only)."""
    return [c for c in ok_cases(data) if "latency" in c]


def shape_text(case: dict) -> str:
    return " ".join(f"{k} {'×'.join(map(str, v))}" for k, v in case["inputs"].items())


def output_tolerance(entry: dict) -> float:
    """Integer outputs (ids, masks) must match exactly; float ones within AGREEMENT_TOL of their scale."""
    if not entry.get("dtype", "float32").startswith("float"):
        return 0.0
    return AGREEMENT_TOL * max(1.0, entry["max_abs_ref"])


def worst_diff(case: dict, mode: str) -> tuple[float | None, float, bool]:
    """Max |diff| over the mode's outputs, max |ORT| over its float outputs, and whether all agree."""
    entries = [v for k, v in case["agreement"].items() if k.startswith(mode + ":")]
    if any("error" in v or not v["finite"] for v in entries):
        return None, 0.0, False
    scale = max((v["max_abs_ref"] for v in entries if v.get("dtype", "float32").startswith("float")), default=0.0)
    agrees = all(v["max_abs"] <= output_tolerance(v) for v in entries)
    return max(v["max_abs"] for v in entries), scale, agrees


def disagreements(data: dict, tol: float) -> list[str]:
    """Cases whose outputs differ from ORT by more than `tol` (max abs), or failed."""
    bad = []
    for case in data["cases"]:
        if "error" in case:
            bad.append(f"{case['case']}: {case['error'][:200]}")
            continue
        for key, v in case["agreement"].items():
            if "error" in v or not v["finite"] or v["max_abs"] > tol:
                bad.append(f"{case['case']} {key}: {v}")
    return bad


def run_line(suite: dict, source: str, cases: list[str]) -> str:
    m = suite["machine"]
    line = f"`{source}`: {m['date']}, commit {m['commit']}, `{' '.join(suite['command'])}`, "
    if "duration_s" in suite:
        line += (f"{suite['duration_s'] / 60:.1f} min; load average {m['loadavg_start'][0]:.2f} at the start, "
                 f"{m['loadavg_end'][0]:.2f} at the end")
    else:
        line += f"load average {m['loadavg_start'][0]:.2f} at the start; **interrupted**"
    return line + (f"; cases here: {', '.join(cases)}." if cases else "; no case of it is shown.")


def header(data: dict) -> list[str]:
    runs = data["runs"]
    m = runs[0]["suite"]["machine"]
    simd = ", ".join(f"{f} {'yes' if m[f] else 'no'}" for f in ("avx2", "fma", "avx512f"))
    sources = ", ".join(f"`{r['source']}`" for r in runs)
    cpus = {(r["suite"]["machine"]["cpu"], r["suite"]["machine"]["cpu_model"]) for r in runs}
    lines = [
        f"<!-- GENERATED by bench/gen_performance_doc.py from {sources}; do not edit by hand: change the "
        "generator or rerun bench/run. -->",
        "# Performance",
        "",
        "Transmuter against ONNX Runtime on CPU. Every figure below is generated from the raw JSON of "
        f"`bench/run` ({sources}). Ratios are Transmuter / ORT: below 1 Transmuter is faster.",
        "",
        "## Machine and runs",
        "",
        f"- **CPU**: {m['cpu']} (`/proc/cpuinfo` family {m['cpu_family']}, model {m['cpu_model']}; {simd}), "
        f"{m['cores']} cores seen; {m['threads_used']} threads for each engine."
        + ("" if len(cpus) == 1 else f" **The runs saw different CPUs**: {sorted(cpus)}."),
    ]
    for r in runs:
        names = [c["case"] for c in data["cases"] if c.get("run") == r["source"]]
        lines.append("- **Run** " + run_line(r["suite"], r["source"], names))
    return lines + [
        f"- **Software**: ONNX Runtime {m['onnxruntime']}, Python {m['python']}.",
        "- **Load column**: every table row carries the 1-minute load average before→after that case and "
        "the share of the cores *other* processes used while it ran (`/proc/stat` minus our own CPU time). "
        "On 2 cores, 50% means a whole core went to someone else and that row's timings are not trustworthy.",
        "",
    ]


def targets_section(data: dict) -> list[str]:
    lines = ["## Issue 8 targets at a glance", "",
             "| case | compiled / ORT default | target | met | eager / compiled (≤ 1.3) | met | load, other CPU |",
             "|---|---:|---:|---|---:|---|---|"]
    for c in timed_cases(data):
        lat = c["latency"]
        ratio = lat["transmuter_compiled"]["ratio_to_ort_default"]
        eager = lat["transmuter_eager"]["ratio_to_compiled"]
        target = TARGETS[c["group"]]
        lines.append(f"| {c['case']} | {ratio:.2f} | {target:.1f} | {verdict(ratio <= target, c)} | {eager:.2f} "
                     f"| {verdict(eager <= EAGER_OVER_COMPILED, c)} | {load_note(c)} |")
    quiet = [c for c in timed_cases(data) if not noisy(c)]
    lines += ["", f"*(noisy)*: other processes used more than {NOISY_SHARE:.0%} of the cores during that case; "
              "ORT's two threads lose more to them than Transmuter's mostly single-threaded work, so such a ratio "
              f"flatters Transmuter by an unknown amount. Quiet cases here: {len(quiet)} of {len(timed_cases(data))}."]
    return lines + [""]


def latency_section(data: dict) -> list[str]:
    lines = ["## Latency", "",
             "`transmuter bench MODEL --input ... --mode eager|compiled --warmup W --runs R` in a fresh process each "
             "round, against `session.run` in the suite's process, ORT with default optimizations "
             "(ORT_ENABLE_ALL) and with them off; the four alternate round by round (order reversed every "
             "other round). Latency: median over rounds of each round's median (ms). Ratios: median over rounds "
             "of the ratio within the round, which cancels most of the host's drift.", "",
             "| case | inputs | eager | compiled | ORT default | ORT off | eager / ORT | compiled / ORT "
             "| compiled / ORT off | eager / compiled | rounds × runs | load, other CPU |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for c in timed_cases(data):
        lat, plan = c["latency"], c["plan"]
        lines.append(
            f"| {c['case']} | {shape_text(c)} | {lat['transmuter_eager']['median_ms']:.2f} "
            f"| {lat['transmuter_compiled']['median_ms']:.2f} | {lat['ort_default']['median_ms']:.2f} "
            f"| {lat['ort_disabled']['median_ms']:.2f} | {lat['transmuter_eager']['ratio_to_ort_default']:.2f} "
            f"| {lat['transmuter_compiled']['ratio_to_ort_default']:.2f} "
            f"| {lat['transmuter_compiled']['ratio_to_ort_disabled']:.2f} "
            f"| {lat['transmuter_eager']['ratio_to_compiled']:.2f} | {plan['rounds']} × {plan['runs']} "
            f"| {load_note(c)} |")
    failed = [c for c in data["cases"] if "error" in c]
    if failed:
        lines += ["", "Cases without figures (failed, or skipped by --max-minutes):", ""]
        lines += [f"- `{c['case']}`: {c['error'].strip().splitlines()[-1][:300]}" for c in failed]
    passes = {c["plan"]["passes"] for c in timed_cases(data)}
    lines += ["", f"Transmuter load-time passes: {', '.join(sorted(passes))}."]
    return lines + [""]


def agreement_section(data: dict) -> list[str]:
    lines = ["## Agreement with ORT", "",
             "Max |Transmuter − ORT (optimizations off)| over every element of every output, from "
             "`transmuter run --output-dir` in each mode on the benchmark's inputs. Flagged when it exceeds "
             f"{AGREEMENT_TOL:g} × max(1, max |ORT|) for a float output (integer outputs must match exactly): "
             "the engines sum in different orders, which costs a few ulps per op in fp32, not more. "
             "max |ORT| is over the float outputs. A statically quantized export in QDQ form computes in float "
             "between its QuantizeLinear nodes with optimizations off, while Transmuter (passes on, on an "
             "AVX512-VNNI CPU) and ORT's default optimizations both run it as the integer operators it stands "
             "for (QLinearConv, QLinearAdd), which round once: the output moves by a step of its quantization "
             "scale where a value lies at a rounding boundary (mobilenetv2_int8_qdq and _s8_qdq: ~0.014, "
             "Transmuter's logits equal to ORT's optimized run's; the QOperator form, integer throughout, "
             "matches exactly). A dynamically quantized export (minilm_l6_int8) quantizes each activation to 8 "
             "bits at run time, so a float that lies at a rounding boundary lands one step away when its last "
             "ulp differs: `scripts/diff` on MiniLM-L6 int8 at 16 tokens (passes on or off) finds the first "
             "680 of 738 values within 1e-6 of ORT's and then one element of one DynamicQuantizeLinear output "
             "one step off, which moves the output by up to ~4e-3.", "",
             "| case | eager | compiled | max \\|ORT\\| | agrees |", "|---|---:|---:|---:|---|"]
    for c in ok_cases(data):
        eager, ref, eager_ok = worst_diff(c, "eager")
        compiled, _, compiled_ok = worst_diff(c, "compiled")
        ok = eager_ok and compiled_ok
        lines.append(f"| {c['case']} | {fmt(eager, '.2e', 'MISMATCH')} | {fmt(compiled, '.2e', 'MISMATCH')} "
                     f"| {ref:.3g} | {mark(ok)} |")
    return lines + [""]


def first_call_section(data: dict) -> list[str]:
    lines = ["## First call", "",
             "The first call of a fresh process (load excluded: `first_call_ms` of `transmuter bench`). With an "
             "**empty** MLX kernel cache (`$TRANSMUTER_KERNEL_CACHE` pointed at a new empty folder), compiled mode "
             "compiles every fused kernel with the system compiler; the issue's target is ≤ 2× the eager first "
             "call. Each empty-cache figure is the median of three fresh processes per mode, alternating (runs "
             "before 2026-12-07 17:00 UTC took one). *Warm cache*: the median first call of the latency rounds, whose kernels were already on disk. "
             "Before it first compiles anything, MLX asks the shell whether `g++` runs (2.8 ms of a fork and two "
             "execs on this machine); `transmuter bench --mode compiled` starts that probe before it loads the model "
             "(`prepare_to_compile()`), so the load hides it (runs before 2026-12-07 19:30 UTC paid it in the first "
             "call). The `*_export_b1` rows are the issue's named architectures as torch exports "
             "(`bench/coverage/make_corpus.py`, fp32: tiny seeded configs, 16 tokens, 32×32 images), measured for this "
             "table and agreement only.",
             "", "| case | compiled, empty cache (ms) | eager, empty cache (ms) | ratio | met | kernels compiled "
             "| compiled, warm cache (ms) | eager, warm (ms) | load, other CPU |",
             "|---|---:|---:|---:|---|---:|---:|---:|---|"]
    for c in ok_cases(data):
        f = c.get("first_compile")
        lat = c.get("latency", {})  # the export cases have no latency rounds, so no warm-cache figure
        warm = (lat.get("transmuter_compiled", {}).get("first_call_ms_warm_cache"),
                lat.get("transmuter_eager", {}).get("first_call_ms_warm_cache"))
        if f:
            ratio = f.get("ratio_compiled_to_eager")
            lines.append(f"| {c['case']} | {fmt(f['compiled']['first_call_ms'], '.0f')} "
                         f"| {fmt(f['eager']['first_call_ms'], '.0f')} | {fmt(ratio, '.1f')} "
                         f"| {verdict(None if ratio is None else ratio <= FIRST_COMPILE_OVER_EAGER, c)} "
                         f"| {f['compiled']['kernels_compiled']} | {fmt(warm[0], '.0f')} | {fmt(warm[1], '.0f')} "
                         f"| {load_note(c)}" + (f"; empty-cache columns: {f['load_note']} (another run)" if
                                                 "load_note" in f else "") + " |")
        else:
            lines.append(f"| {c['case']} | – | – | – | – | – | {fmt(warm[0], '.0f')} | {fmt(warm[1], '.0f')} "
                         f"| {load_note(c)} |")
    return lines + [""]


def load_section(data: dict) -> list[str]:
    empty = data["suite"]["empty_processes"]
    te, oe = empty["transmuter_empty"]["wall_s"], empty["ort_empty"]["wall_s"]
    lines = ["## Load time", "",
             "Fresh processes: `transmuter info MODEL` against a Python process creating an ORT `InferenceSession` "
             "(default optimizations), median of the repeats. *In-process*: each program's own clock around the "
             "model's load (`load_ms` of `transmuter info`: `transmuter::load`; ORT: the `InferenceSession` "
             "constructor), which leaves out the process start, the dynamic linking and Python's import of "
             "onnxruntime; the target, Transmuter ≤ 0.2× ORT's session creation, is judged on it: the columns give each "
             "engine's median over the repeats, the ratio is the median of the repeats' ratios, the two engines "
             "alternating (runs from 2026-12-07 20:00 UTC, 5 repeats; before, 3 repeats of one engine and then the "
             "other, ratio of the medians). *Wall*: the "
             "whole processes, and *net* that less the same program doing no model work (`transmuter operators`: "
             f"{te * 1e3:.0f} ms; `python -c 'import onnxruntime'`: {oe * 1e3:.0f} ms, measured once at the start "
             "of the run: under a changing load an ORT session can take barely more than that, and its net figure "
             "is then left out, –).", "",
             "| model | weights (MiB) | in-process (ms) | ORT in-process (ms) | in-process ratio | met | wall (ms) "
             "| net | ORT wall (ms) | net | net ratio | load, other CPU |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    seen = set()
    for c in timed_cases(data):
        if c["model_path"] in seen:
            continue
        seen.add(c["model_path"])
        t_load, o_load = c["load"]["transmuter_info"], c["load"]["ort_session_default"]
        info, sess = t_load["wall_s"], o_load["wall_s"]
        net_t, net_o = max(info - te, 0.0), sess - oe
        net_ratio = net_t / net_o if net_o > 0.1 * sess else None
        t_in, o_in = t_load.get("inner_s"), o_load.get("inner_s")
        # The median of alternating repeats' ratios where the run has them (from 2026-12-07 20:00 UTC), else
        # the ratio of the medians.
        in_ratio = c["load"].get("inner_ratio_median", t_in / o_in if t_in is not None and o_in else None)
        lines.append(f"| {c['model']} | {c['weights_mib']:.1f} | {fmt(t_in * 1e3 if t_in else None, '.1f')} "
                     f"| {fmt(o_in * 1e3 if o_in else None, '.1f')} | {fmt(in_ratio)} "
                     f"| {verdict(None if in_ratio is None else in_ratio <= LOAD_OVER_ORT, c)} "
                     f"| {info * 1e3:.0f} | {net_t * 1e3:.0f} | {sess * 1e3:.0f} "
                     f"| {fmt(net_o * 1e3 if net_ratio else None, '.0f')} | {fmt(net_ratio)} | {load_note(c)} |")
    return lines + [""]


def rss_section(data: dict) -> list[str]:
    empty = data["suite"]["empty_processes"]
    lines = ["## Peak memory", "",
             "Peak RSS (GNU time `%M`) of fresh processes: Transmuter's `run` (load + first inference) in each "
             "mode and its `bench` process (all the rounds' runs, maximum over rounds), against ORT's session + "
             "first inference in a fresh Python process. A `run compiled` that compiled kernels also counts the "
             "system compiler it started (GNU time reports the largest of the process and its children), "
             "so read the `bench compiled` column, whose kernels were on disk. *Activations*: the most bytes of "
             "intermediate values that running the file's nodes in order must hold at once, each freed after its "
             "last reader, inputs and outputs held throughout (bench/activations.py). */ (weights + activations)* "
             "divides Transmuter's compiled `bench` peak, less the empty process "
             f"({empty['transmuter_empty']['peak_rss_mib']:.0f} MiB: the binary and its libraries), by their sum; "
             f"the issue's target is ≤ {RSS_OVER_WEIGHTS}. *: ORT's figure was taken once per model, at that "
             "model's first case's shape (runs before the suite measured it per case).", "",
             "| case | weights (MiB) | activations (MiB) | run eager | run compiled | bench compiled | ORT run "
             "| / (weights + activations) | met | load, other CPU |", "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    base = empty["transmuter_empty"]["peak_rss_mib"]
    for c in timed_cases(data):
        bench_rss = c["latency"]["transmuter_compiled"]["peak_rss_mib"]
        # Runs before the per-case ORT run measured it once per model, at the model's first shape (*).
        ort_run = (f"{c['ort_first_run']['peak_rss_mib']:.0f}" if "ort_first_run" in c
                   else f"{c['load']['ort_first_run_default']['peak_rss_mib']:.0f}*")
        # Runs before the activations were estimated show "–" and no verdict.
        activation = c.get("activations_mib")
        ratio = (bench_rss - base) / max(c["weights_mib"] + (activation or 0.0), 1e-9)
        verdict = ("yes" if ratio <= RSS_OVER_WEIGHTS else "**no**") if activation is not None else "–"
        lines.append(f"| {c['case']} | {c['weights_mib']:.1f} | "
                     f"{'–' if activation is None else f'{activation:.1f}'} "
                     f"| {c['first_run']['eager']['peak_rss_mib']:.0f} "
                     f"| {c['first_run']['compiled']['peak_rss_mib']:.0f} | {bench_rss:.0f} | {ort_run} "
                     f"| {ratio:.2f} | {verdict} | {load_note(c)} |")
    return lines + [""]


def blas_section() -> list[str]:
    lines = ["## BLAS: fp32 matmul through MLX (bench/run_all.sh)", "",
             "MLX's CPU matmul calls `cblas_sgemm`. The wheel ships a reference BLAS (single-threaded, ~5 "
             "GFLOPS); the `transmuter` target links OpenBLAS ahead of MLX so the dynamic linker binds MLX's "
             "`cblas_sgemm` to OpenBLAS, and the CTest `blas_is_openblas` (`bench/blas_binding_check.cpp`) "
             "fails if a binary linked to transmuter resolves it anywhere else. `bench/blas_gflops.cpp`, built "
             "once against MLX alone and once against transmuter, measures MLX's matmul against a direct call of "
             "the same symbol (GFLOPS = 2·M·N·K / median time)."]
    if BLAS_SUMMARY.exists():
        text = BLAS_SUMMARY.read_text()
        start = text.find("## fp32 matmul GFLOPS")
        table = text[start:].split("\n## ", 1)[0].splitlines()[1:] if start >= 0 else []
        if table:
            lines += ["", "Not part of this run: quoted from `bench/results/summary.md` (5 runs of "
                      "`bench/run_all.sh`, 2026-11-29, on a CPU of family 25 model 17 with AVX-512; see "
                      "`bench/results/README.md`). Median (min-max) over the runs:", *table]
    return lines + [""]


def blas_threading_section() -> list[str]:
    """The newest bench/blas_threading.py run: which BLAS set-up the build keeps, and why."""
    runs = sorted(BLAS_THREADING_DIR.glob("*.json"))
    lines = ["## BLAS threading (bench/blas_threading.py)", "",
             "The same `build/transmuter` under several BLAS set-ups chosen by environment variables "
             "(Debian's OpenBLAS pthread build with all cores or one thread, its OpenMP build with passive or "
             "active waiting, Intel MKL from the `mkl` wheel with GNU OpenMP or sequential threading), alternating "
             "round by round; ratios are per-round medians against the default (OpenBLAS pthread, all cores)."]
    if not runs:
        return lines + ["", "No run recorded yet.", ""]
    data = json.loads(runs[-1].read_text())
    lines += ["", f"Run `{relative(runs[-1])}`: {data['cpu']}; {data['mode']} mode; load average "
              f"{data['load_before'][0]:.2f} before, {data['load_after'][0]:.2f} after.", ""]
    variants = list(next(iter(data["cases"].values())).keys())
    lines += ["| case | " + " | ".join(variants) + " |", "|---|" + "---:|" * len(variants)]
    for name, rows in data["cases"].items():
        cells = [f"{rows[v]['median_ms']:.2f} ms ({rows[v]['ratio']:.2f})" for v in variants]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Decision: the build keeps OpenBLAS's pthread build with all cores. No other set-up was faster "
              "on a quiet machine: one thread and MKL (on this AMD CPU) were slower, the OpenMP build about even. "
              "Profiles still show OpenBLAS's two threads waiting for each other in `sched_yield` inside a call; "
              "none of these set-ups removed that, so it is left to own GEMM work (docs/roadmap.md). Rerun this "
              "on a new CPU before changing the BLAS.", ""]
    return lines


def newest_llm_runs() -> dict[str, tuple[Path, dict]]:
    """The newest bench/llm_bench.py run per model (the SmolLM2 and Qwen2.5 shapes), by the doc it wrote."""
    runs: dict[str, tuple[Path, dict]] = {}
    for path in sorted(LLM_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        model = data["builds"][0].get("model") if data.get("builds") else None
        if isinstance(model, dict):  # runs before 2026-12-03 did not record the model
            runs[model["name"]] = (path, data)
    return runs


def quantized_section() -> list[str]:
    """Issue 7's figures: the q4 GEMV against the memory bandwidth and the LLM decode against ORT, from the
    newest bench/q4_bench.py and bench/llm_bench.py runs (their own pages have every column)."""
    lines = ["## Quantized products and LLM decoding (bench/q4_bench.py, bench/llm_bench.py)", "",
             "Summaries of the newest runs of the two LLM benchmarks; every column, the method and the per-round "
             "figures are in [quantized_performance.md](quantized_performance.md), "
             "[llm_performance.md](llm_performance.md) and "
             "[llm_performance_qwen2_5_0_5b.md](llm_performance_qwen2_5_0_5b.md). Targets (issue 7): the q4 GEMV "
             "at M = 1 from memory at >= 70 % of the measured read bandwidth; int8 and q4 decode <= 1.0x ORT's "
             "per token; the q4 decoder's peak RSS <= 1.2x (file + KV cache)."]
    q4_runs = sorted(Q4_DIR.glob("*.json"))
    if q4_runs:
        data = json.loads(q4_runs[-1].read_text())
        load = data["load_before"].split("load average:")[-1].strip()
        lines += ["", f"q4 GEMV, run `{relative(q4_runs[-1])}` ({data['cpu']}, load average {load} before): "
                  f"read bandwidth {data['bandwidth']['read_gbps']:.1f} GB/s.", "",
                  "| shape | weights | Transmuter level 0 | Transmuter level 4 | ORT level 0 | ORT level 4 |",
                  "|---|---|---:|---:|---:|---:|"]
        for case in data["cases"]:
            engines = case["engines"]
            where = "from memory" if case["layers"] > 1 else "in cache"

            def cell(name: str) -> str:
                e = engines[name]
                return f"{e['median_ms']:.3f} ms, {100 * e['share_of_bandwidth']:.0f} %"
            lines.append(f"| {case['m']}x{case['k']}x{case['n']} | {where} | {cell('transmuter')} | "
                         f"{cell('transmuter_int8')} | {cell('ort_fp32')} | {cell('ort_int8')} |")
        lines += ["", "(% of the read bandwidth; at M = 128 the products are compute-bound and the share means little.)"]
    for model, (path, data) in newest_llm_runs().items():
        machine = data["machine_before"]
        lines += ["", f"Decode, {model}: run `{relative(path)}`, {data['rounds']} rounds, {machine['cpu']}, load "
                  f"{machine['loadavg'][0]:.2f} before and {data['machine_after']['loadavg'][0]:.2f} after, "
                  f"prompt {data['prompt_tokens']} tokens + {data['new_tokens']} new, {data['threads']} threads.", "",
                  "| build | decode ms/token (T / ORT) | ratio | prefill ratio | peak RSS / (file + KV) |",
                  "|---|---:|---:|---:|---:|"]
        for build in data["builds"]:
            summary = build["summary"]
            lines.append(f"| {build['build']} | {summary['transmuter']['decode_ms']:.2f} / "
                         f"{summary['ort']['decode_ms']:.2f} | **{summary['decode_ratio']:.2f}** | "
                         f"{summary['prefill_ratio']:.2f} | {summary['rss_over_file_plus_kv']:.2f} |")
    return lines + [""]


def method_section() -> list[str]:
    return ["## Method and models", "",
            "- **Threads**: ORT `intra_op_num_threads = 2`, `inter_op_num_threads = 1`; Transmuter "
            "`OPENBLAS_NUM_THREADS=2`. MLX runs every CPU op on one stream thread; only BLAS (and own kernels, "
            "where they exist) use the second core.",
            "- **Models**: `paraphrase-MiniLM-L3-v2` is the real PyTorch export (`scripts/fetch_real_model.py`). "
            "Every other model is built by `bench/make_bench_models.py` with onnx.helper + numpy: seeded random "
            "weights in the node patterns a PyTorch opset-17 export produces (LayerNormalization, Erf GELU, MatMul "
            "+ Add bias, Reshape/Transpose heads, Div by sqrt(d), additive mask, Softmax; Conv with BatchNorm "
            "folded into its bias, Relu / Clip(0, 6) / HardSwish, SE blocks with HardSigmoid). Sizes: "
            "`minilm_l6` 6 layers × 384 (12 heads, FFN 1536, vocab 30522), `bert_base` 12 × 768 (FFN 3072), "
            "`vit_base` patch 16 at 224, 12 × 768, `resnet50` bottlenecks 3-4-6-3 at 224, `mobilenetv2` at 224, "
            "`pplcnet_cls` (scale 0.35, 3×48×192, 2 classes) and `pplcnet_rec` (scale 0.5, 3×48×320, strides "
            "(2,1), 6625-class CTC head), `convnext_atto` (depths 2-2-6-2, dims 40-320) for the first-compile "
            "latency. Random weights make the timings meaningful, not the outputs. The `*_export_b1` cases (first call "
            "and agreement only) are `torch.onnx.export` files of Hugging Face architectures from the coverage "
            "corpus (`bench/coverage/make_corpus.py --flavours fp32`: DeBERTa-v2, DeBERTa, BERT, CLIP, ConvNeXt, "
            "ConvNeXt-V2 with hidden sizes 16-64 and a 512-token vocabulary), made on first use when the corpus's venv "
            "exists.",
            "- **Inputs**: token ids uniform in [0, vocabulary), token types 0 and an all-ones mask; images N(0, 1); "
            "seeded.",
            "- **Runs per process**: chosen per case from ORT's latency so each engine gets about the same timed "
            "work per round (the *rounds × runs* column): 5 rounds under 30 ms, 3 up to 1 s (300 ms before "
            "2026-12-07 19:40 UTC), and above that 2 rounds of 1 warm-up + 2 runs per process (ViT-base b8 takes "
            "seconds per run). "
            "`bert_base_b8_s128` runs only when named (`--cases`).",
            "- **Noise**: other sessions share the machine. Each row carries its load; compare rows only when "
            "their other-CPU share is low.", ""]


def profile_section() -> list[str]:
    return ["## Where the time goes", "",
            "Not measured by this suite: `bench/profile_model.sh BUILD_DIR eager|compiled` records a perf profile of "
            "`transmuter bench` on MiniLM-L3 with a breakdown per thread (outputs of an older build in "
            "`bench/results/minilm_profile_{eager,compiled}.txt`). Before issue 8's kernels, the MLX stream thread "
            "ran every non-BLAS op on one core (JIT-compiled fused elementwise kernels, scalar), M=1 matmuls went to "
            "sgemm and MLX's `slow_conv_2D` dominated the depthwise CNNs. Since then LayerNorm (+ residual + bias), "
            "GELU/bias epilogues, softmax and attention, depthwise conv, the matrix products (own GEMM, weights "
            "packed at load) and group-1 convolutions run on Transmuter's own kernels (docs/architecture.md "
            "\"CPU kernels\"), compiled plans no longer fuse on the CPU, and the profiles of the encoders and of "
            "ResNet-50 are 60-75 % the GEMM's register tiles. `bench/gemm_bench --packed-only MxKxN ...` times the "
            "GEMM per shape, `bench/ort_matmul.py MxKxN ...` ONNX Runtime's MatMul on the same shapes (run them "
            "alternately: single runs vary by up to 2x on this host). Profile before optimizing, then rerun this "
            "suite.", ""]


def reproduce_section() -> list[str]:
    return ["## Reproduce", "", "```sh",
            "./scripts/setup                      # venv, OpenBLAS, build/",
            "bench/run [--max-minutes 40]        # every case: JSON + this file (33 min at load 8-12 on 2 cores)",
            "bench/run --quick                    # small cases, few runs (~2 min); doc next to the JSON",
            "bench/run --cases minilm_l3_b1_s128,resnet50_b1 [--passes none|default]",
            "bench/run --list                     # the case names",
            ".venv/bin/python bench/gen_performance_doc.py bench/results/suite/<run>.json [<rerun>.json ...] \\",
            "    --out docs/performance.md      # several runs: per case the quietest measurement",
            "bench/run_all.sh                     # the BLAS GFLOPS benchmark and the single-model load/latency one",
            "```", "",
            "`bench/run` builds `build/transmuter` when missing (`ninja -C build transmuter_cli`), builds the "
            "models into `.cache/bench-models/`, and takes `/tmp/transmuter-bench.lock` so two benchmarks never "
            "overlap. The CTest `bench_suite_smoke` runs `bench/run --quick --cases tiny_encoder_b1_s16` end to "
            "end (no timing assertions).", ""]


def relative(path: Path | str) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def merge(runs: list[tuple[dict, Path | str]]) -> dict:
    """Several bench/run outputs as one: of the measurements of one case, the one taken while other
    processes used the smallest share of the cores wins (a failed or skipped one never replaces a
    measured one). Each case keeps the name of its run."""
    def other_share(case: dict) -> float:
        return case["machine_after"]["other_cpu_share"] if "error" not in case else float("inf")

    cases: dict[str, dict] = {}
    for data, source in runs:
        for case in data["cases"]:
            earlier = cases.get(case["case"])
            if earlier is None or other_share(case) < other_share(earlier):
                chosen = {**case, "run": relative(source)}
                if earlier is not None and "first_compile" in earlier and "first_compile" not in case:
                    # A rerun without the empty-cache measurement keeps the earlier one, with its load.
                    chosen["first_compile"] = {**earlier["first_compile"], "load_note": load_note(earlier)}
                cases[case["case"]] = chosen
    first = runs[0][0]
    return {"suite": first["suite"], "runs": [{"suite": d["suite"], "source": relative(src)} for d, src in runs],
            "cases": list(cases.values())}


def render(data: dict, source: Path | str | None = None) -> str:
    """Markdown of one run (`data` as bench/suite.py writes it) or of merge()'s result."""
    if "runs" not in data:
        data = merge([(data, source or "(unsaved)")])
    sections = [header(data), targets_section(data), latency_section(data), agreement_section(data),
                first_call_section(data), load_section(data), rss_section(data), quantized_section(), method_section(),
                profile_section(),
                blas_section(), blas_threading_section(), reproduce_section()]
    return "\n".join(line for section in sections for line in section)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", type=Path, nargs="+", help="one run, or several merged (per case, the "
                   "quietest measurement is shown)")
    p.add_argument("--out", type=Path, help="default: stdout")
    args = p.parse_args()
    text = render(merge([(json.loads(path.read_text()), path) for path in args.json]))
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
