#!/usr/bin/env python3
"""The benchmark suite of issue 8: Transmuter vs ONNX Runtime on encoders, CNNs and a ViT.

Run it through `bench/run` (project venv, builds build/transmuter when missing). Per case, in
one run and on the same inputs:
  * agreement: max |Transmuter - ORT (optimizations off)| of every output, eager and
    compiled (`transmuter run --output-dir`), so a fast wrong answer shows;
  * latency: `transmuter bench --mode eager|compiled` (a fresh process each round) and ORT
    `session.run` with default optimizations and with them off, same threads (ORT
    intra_op 2 / inter_op 1, OPENBLAS_NUM_THREADS 2), alternating round by round (the order
    reversed every other round); medians of the rounds' medians and medians of the
    per-round ratios Transmuter / ORT;
  * load time: fresh `transmuter info` vs a fresh Python process creating an ORT session
    (and both "empty" processes, to subtract start-up), once per model file;
  * peak RSS (GNU time %M) of Transmuter's load + first inference and of its bench process,
    and of ORT's session + first inference, next to the size of the weights;
  * first call: every `transmuter bench` prints its first call's time; for the cases marked
    `first_compile` a compiled and an eager process also run with an EMPTY MLX kernel cache
    ($TRANSMUTER_KERNEL_CACHE pointed at a fresh folder), the issue's first-compile latency.
    The `export` cases are torch exports of Hugging Face architectures (DeBERTa-v2, CLIP,
    ConvNeXt, ...: the coverage corpus's fp32 files, tiny random configs) measured for agreement
    and that first call only; made on first use when the coverage corpus's venv is there.
Every case records the CPU, load average before/after, the share of the cores other
processes used meanwhile, the date and the commit.

Writes the raw JSON (--out) and the markdown generated from it (--doc, by
bench/gen_performance_doc.py).
"""

from __future__ import annotations

import argparse
import json
import re
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import activations  # noqa: E402
import gen_performance_doc  # noqa: E402
import make_bench_models  # noqa: E402
import model_bench as mb  # noqa: E402

REPO_ROOT = mb.REPO_ROOT
REAL_MINILM = REPO_ROOT / ".cache/models/paraphrase-MiniLM-L3-v2/model.onnx"


@dataclass
class Case:
    name: str
    model: str  # "minilm_l3" (the real export) or a make_bench_models.MODELS key
    group: str  # encoder | cnn | vit, for the targets
    dims: dict[str, int]  # symbolic dimension -> value
    vocab: int = 30522
    quick: bool = False  # part of --quick
    first_compile: bool = False  # also measure the first call with an empty kernel cache
    optional: bool = False  # only when named in --cases (too long for the default full run)
    first_compile_only: bool = False  # agreement and the empty-cache first call; no latency, load or RSS
    notes: list[str] = field(default_factory=list)


def encoder_cases(model: str, shapes, quick_shapes=(), first_compile=False, vocab=30522) -> list[Case]:
    return [Case(f"{model}_b{b}_s{s}", model, "encoder", {"batch": b, "batch_size": b, "sequence": s,
                                                          "sequence_length": s}, vocab, (b, s) in quick_shapes,
                 first_compile and i == 0) for i, (b, s) in enumerate(shapes)]


def image_cases(model: str, group: str, batches, quick_batches=(), first_compile=False) -> list[Case]:
    return [Case(f"{model}_b{b}", model, group, {"batch": b}, quick=b in quick_batches,
                 first_compile=first_compile and i == 0) for i, b in enumerate(batches)]


# The coverage corpus (bench/coverage/make_corpus.py, fp32 flavour: torch.onnx.export of a seeded tiny
# config). The first compiles that took minutes were a tiny DeBERTa-v2 (251 s), CLIP and ConvNeXt:
# these exports keep every shape op and small elementwise chain a real export has, which is what MLX's
# compiler fused and built one kernel at a time.
CORPUS = REPO_ROOT / ".cache/coverage"
EXPORT_ARCHS = ["deberta_v2", "deberta", "bert", "clip", "convnext", "convnextv2"]
EXPORT_DIMS = {"batch": 1, "sequence_length": 16, "height": 32, "width": 32}


def export_cases() -> list[Case]:
    return [Case(f"{arch}_export_b1", f"export:{arch}", "export", EXPORT_DIMS, vocab=512, first_compile=True,
                 first_compile_only=True) for arch in EXPORT_ARCHS]


ENCODER_SHAPES = [(1, 16), (1, 128), (32, 128)]
CASES = [
    *encoder_cases("tiny_encoder", [(1, 16)], vocab=1000),  # the CTest smoke case; not in the default list
    *encoder_cases("minilm_l3", ENCODER_SHAPES, quick_shapes=[(1, 16)], first_compile=True),
    *encoder_cases("minilm_l6", ENCODER_SHAPES, first_compile=True),
    *encoder_cases("minilm_l6_int8", [(1, 16), (1, 128)]),  # quantize_dynamic's int8 export
    *encoder_cases("bert_base", [(1, 128)]),
    Case("bert_base_b8_s128", "bert_base", "encoder", {"batch": 8, "sequence": 128}, optional=True),
    *image_cases("resnet50", "cnn", [1, 8]),
    *image_cases("mobilenetv2", "cnn", [1, 8], quick_batches=[1]),
    *image_cases("mobilenetv2_int8_qdq", "cnn", [1]),  # quantize_static's int8 exports (issue 7)
    *image_cases("mobilenetv2_int8_qoperator", "cnn", [1]),
    *image_cases("mobilenetv2_int8_s8_qdq", "cnn", [1]),  # quantize_static's defaults: int8 activations too
    *image_cases("pplcnet_cls", "cnn", [8], quick_batches=[8]),
    *image_cases("pplcnet_rec", "cnn", [1]),
    *image_cases("convnext_atto", "cnn", [1], first_compile=True),
    *export_cases(),
    *image_cases("vit_base", "vit", [1, 8]),  # b8 last: the longest, the first cut by --max-minutes
]
SMOKE_ONLY = {"tiny_encoder_b1_s16"}
HEAVY_MS = 1000.0  # ORT latency above which a case gets 2 rounds, 1 warm-up and 2 runs per process


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transmuter", default=str(REPO_ROOT / "build/transmuter"))
    p.add_argument("--quick", action="store_true", help="few rounds and runs, the small cases (about 2 minutes)")
    p.add_argument("--cases", help="comma-separated case names (see --list)")
    p.add_argument("--list", action="store_true", help="print the cases and exit")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, help="latency rounds (default: 5 for cases under 30 ms, else 3; quick: 2)")
    p.add_argument("--target-ms", type=float, help="timed work per engine and round; sets the runs per process "
                   "from ORT's latency (default 1500, quick 300)")
    p.add_argument("--passes", choices=["none", "default"], help="passed to Transmuter as --passes (when the CLI "
                   "has it); unset: the CLI's default")
    p.add_argument("--no-first-compile", action="store_true", help="skip the empty-kernel-cache measurements")
    p.add_argument("--max-minutes", type=float, help="start no case after this many minutes; the cases left are "
                   "recorded as skipped")
    p.add_argument("--load-repeats", type=int, help="fresh processes per engine and load measurement, alternating "
                   "(default 5, quick 1)")
    p.add_argument("--out", type=Path, help="raw JSON (default bench/results/suite/<UTC time>[-quick].json)")
    p.add_argument("--doc", type=Path, help="generated markdown (default: docs/performance.md for a full run "
                   "of every case, else next to the JSON)")
    p.add_argument("--require-agreement", type=float, metavar="TOL",
                   help="exit 1 unless every output agrees with ORT within TOL (max abs)")
    return p.parse_args()


def select_cases(args) -> list[Case]:
    if args.cases:
        by_name = {c.name: c for c in CASES}
        unknown = [n for n in args.cases.split(",") if n not in by_name]
        if unknown:
            sys.exit(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(by_name)}")
        return [by_name[n] for n in args.cases.split(",")]
    return [c for c in CASES if c.name not in SMOKE_ONLY and not c.optional and (c.quick or not args.quick)]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- models and inputs ---------------------------------------------------------------

def corpus_python() -> Path | None:
    """An interpreter with the coverage corpus's pins: $COVERAGE_PYTHON or the venv bench/coverage/run
    installs (several GB of torch, so the suite never installs it itself)."""
    path = Path(os.environ.get("COVERAGE_PYTHON", REPO_ROOT / ".cache/coverage-venv/bin/python"))
    return path if os.access(path, os.X_OK) else None


def export_path(arch: str) -> Path:
    """The corpus's fp32 export of `arch`, made first (a few seconds) when missing and an interpreter can."""
    path = CORPUS / arch / "fp32/model.onnx"
    command = ["bench/coverage/make_corpus.py", "--only", arch, "--flavours", "fp32"]
    if not path.exists() and (python := corpus_python()) is not None:
        log(f"making {path.relative_to(REPO_ROOT)} ({' '.join(command)})")
        subprocess.run([str(python), *command], cwd=REPO_ROOT, check=True, stdout=subprocess.DEVNULL)
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing and no interpreter has the corpus's pins (.cache/coverage-venv "
                                f"from bench/coverage/run, or $COVERAGE_PYTHON); then run {' '.join(command)}")
    return path


def model_path(case: Case) -> Path:
    if case.model.startswith("export:"):
        return export_path(case.model.removeprefix("export:"))
    if case.model != "minilm_l3":
        return make_bench_models.ensure_model(case.model)
    if not REAL_MINILM.exists():
        log("fetching paraphrase-MiniLM-L3-v2 (scripts/fetch_real_model.py)")
        subprocess.run([sys.executable, str(REPO_ROOT / "scripts/fetch_real_model.py")], check=True)
    return REAL_MINILM


def weights_mib(path: Path) -> float:
    """Bytes of every initializer, from its shape and dtype (the data stays in the file)."""
    model = onnx.load(str(path), load_external_data=False)
    total = 0
    for t in model.graph.initializer:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        total += int(np.prod(t.dims, dtype=np.int64)) * itemsize
    return total / 2**20


def make_inputs(case: Case, session) -> dict[str, np.ndarray]:
    """Token ids uniform in [0, vocab), token types 0 and an all-ones mask; images N(0, 1). Seeded."""
    rng = np.random.default_rng(0)
    inputs = {}
    for meta in session.get_inputs():
        shape = [d if isinstance(d, int) else case.dims[d] for d in meta.shape]
        if meta.type == "tensor(int64)":
            if meta.name == "input_ids":
                inputs[meta.name] = rng.integers(0, case.vocab, size=shape, dtype=np.int64)
            else:
                inputs[meta.name] = (np.zeros if meta.name == "token_type_ids" else np.ones)(shape, np.int64)
        else:
            inputs[meta.name] = rng.standard_normal(shape).astype(np.float32)
    return inputs


# --- measurements ---------------------------------------------------------------------

def timed_ort_ms(session, inputs, repeats: int = 2) -> float:
    session.run(None, inputs)
    ms = []
    for _ in range(repeats):
        t = time.perf_counter()
        session.run(None, inputs)
        ms.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ms)


def agreement(args, model: Path, input_args: list[str], reference: dict[str, np.ndarray], tmp: Path,
              extra: list[str]) -> tuple[dict, dict]:
    """Transmuter's outputs (fresh `run` processes, also giving load + first inference RSS) vs ORT."""
    env = mb.child_env(args.threads)
    diffs, first_runs = {}, {}
    for mode in ("eager", "compiled"):
        out_dir = tmp / f"out_{mode}"
        cmd = [args.transmuter, "run", str(model), *input_args, "--mode", mode, "--output-dir", str(out_dir), *extra]
        run = mb.run_fresh_rusage(cmd, env)
        first_runs[mode] = {"wall_s": run["wall_s"], "peak_rss_mib": run["peak_rss_mib"]}
        for name, ref in reference.items():
            got = np.load(out_dir / (re.sub(r"[^A-Za-z0-9._-]", "_", name) + ".npy"))
            if got.shape != ref.shape:
                diffs[f"{mode}:{name}"] = {"error": f"shape {list(got.shape)} != ORT's {list(ref.shape)}"}
                continue
            diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
            diffs[f"{mode}:{name}"] = {"dtype": str(ref.dtype), "max_abs": float(diff.max()) if diff.size else 0.0,
                                       "max_abs_ref": float(np.abs(ref).max()) if ref.size else 0.0,
                                       "finite": bool(np.isfinite(got).all())}
    return diffs, first_runs


def load_measurements(args, model: Path, repeats: int) -> dict:
    """`transmuter info` and an ORT session in fresh processes, alternating (the order reversed every other
    repeat), with the median of the per-repeat ratios of their own load timings: on a VM whose fresh pages
    the host backs on first touch, one process's load can take several times another's."""
    env = mb.child_env(args.threads)
    commands = {"transmuter_info": [args.transmuter, "info", str(model)],
                "ort_session_default": mb.ort_child_cmd(str(model), "default", args.threads, "load")}
    samples = {name: [] for name in commands}
    for repeat in range(repeats):
        for name in (list(commands) if repeat % 2 == 0 else list(reversed(commands))):
            samples[name].append(mb.run_fresh_rusage(commands[name], env))
    result = {name: mb.summarize_fresh(commands[name], runs) for name, runs in samples.items()}
    pairs = zip(map(mb.inner_seconds, samples["transmuter_info"]), map(mb.inner_seconds, samples["ort_session_default"]))
    ratios = [ours / ort for ours, ort in pairs if ours is not None and ort]
    if ratios:
        result["inner_ratio_per_repeat"] = ratios
        result["inner_ratio_median"] = statistics.median(ratios)
    return result


def ort_first_run(args, model: Path, feeds: list[str]) -> dict:
    """A fresh Python process: ORT session (default optimizations) + one inference; its peak RSS."""
    return mb.repeat_fresh(mb.ort_child_cmd(str(model), "default", args.threads, "run", feeds),
                           mb.child_env(args.threads), 1)


def latency_rounds(args, model: Path, input_args: list[str], inputs, sessions: dict, rounds: int, runs: int,
                   warmup: int, extra: list[str]) -> dict:
    engines = {
        "transmuter_eager": lambda: mb.transmuter_bench(args.transmuter, str(model), input_args, "eager", warmup, runs,
                                                        args.threads, extra),
        "transmuter_compiled": lambda: mb.transmuter_bench(args.transmuter, str(model), input_args, "compiled",
                                                           warmup, runs, args.threads, extra),
        **{f"ort_{level}": (lambda s=s: mb.ort_latency(s, inputs, warmup, runs)) for level, s in sessions.items()},
    }
    measured: dict[str, list[dict]] = {name: [] for name in engines}
    for r in range(rounds):
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for name in order:
            measured[name].append(engines[name]())
    latency = {name: {"median_ms": statistics.median(x["median_ms"] for x in rs), "rounds": rs}
               for name, rs in measured.items()}

    def per_round(a: str, b: str) -> float:
        return statistics.median(x["median_ms"] / y["median_ms"] for x, y in zip(measured[a], measured[b]))

    for name, entry in latency.items():
        for level in sessions:
            entry[f"ratio_to_ort_{level}"] = per_round(name, f"ort_{level}")
    latency["transmuter_eager"]["ratio_to_compiled"] = per_round("transmuter_eager", "transmuter_compiled")
    for mode in ("eager", "compiled"):
        firsts = [x["first_call_ms"] for x in measured[f"transmuter_{mode}"] if "first_call_ms" in x]
        if firsts:  # a warm kernel cache: every process after the first finds the kernels on disk
            latency[f"transmuter_{mode}"]["first_call_ms_warm_cache"] = statistics.median(firsts)
        latency[f"transmuter_{mode}"]["peak_rss_mib"] = max(x["peak_rss_mib"] for x in measured[f"transmuter_{mode}"])
    return latency


FIRST_COMPILE_TRIES = 3


def first_compile(args, model: Path, input_args: list[str], extra: list[str]) -> dict:
    """First call of a fresh process with an empty MLX kernel cache, compiled vs eager: medians of
    FIRST_COMPILE_TRIES alternating pairs of processes (one process is one sample: a burst of someone
    else's load once made a 9 ms call 23 ms)."""
    result = {"method": f"transmuter bench --warmup 1 --runs 1 with $TRANSMUTER_KERNEL_CACHE a new empty folder, "
                        f"median of {FIRST_COMPILE_TRIES} fresh processes per mode, alternating; first_call_ms is "
                        f"the first run_once + eval, load excluded"}
    tries = {"compiled": [], "eager": []}
    for _ in range(FIRST_COMPILE_TRIES):
        for mode in ("compiled", "eager"):
            cache = Path(tempfile.mkdtemp(prefix="transmuter-kernels-"))  # mode 0700, as the cache requires
            try:
                r = mb.transmuter_bench(args.transmuter, str(model), input_args, mode, 1, 1, args.threads, extra,
                                        {"TRANSMUTER_KERNEL_CACHE": str(cache)})
                kernels = sum(1 for _ in cache.rglob("*.so"))
            finally:
                shutil.rmtree(cache, ignore_errors=True)
            tries[mode].append({"first_call_ms": r.get("first_call_ms"), "process_wall_s": r["process_wall_s"],
                                "kernels_compiled": kernels, "peak_rss_mib": r["peak_rss_mib"]})
    for mode, runs in tries.items():
        firsts = [t["first_call_ms"] for t in runs if t["first_call_ms"] is not None]
        result[mode] = {"first_call_ms": statistics.median(firsts) if firsts else None,
                        "process_wall_s": statistics.median(t["process_wall_s"] for t in runs),
                        "kernels_compiled": max(t["kernels_compiled"] for t in runs),
                        "peak_rss_mib": max(t["peak_rss_mib"] for t in runs), "tries": runs}
    if result["compiled"]["first_call_ms"] and result["eager"]["first_call_ms"]:
        result["ratio_compiled_to_eager"] = result["compiled"]["first_call_ms"] / result["eager"]["first_call_ms"]
    return result


def run_case(args, case: Case, plan: dict, load_cache: dict) -> dict:
    model = model_path(case)
    result = {"case": case.name, "model": case.model, "model_path": str(model.relative_to(REPO_ROOT)),
              "group": case.group, "dims": case.dims, "weights_mib": weights_mib(model),
              "machine_before": {"loadavg": os.getloadavg(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}
    extra = ["--passes", args.passes] if args.passes else []
    other = mb.OtherLoad()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        t = time.perf_counter()
        sessions = {level: mb.ort_session(str(model), level, args.threads) for level in mb.ORT_LEVELS}
        result["ort_session_in_process_s"] = time.perf_counter() - t
        inputs = make_inputs(case, sessions["default"])
        input_args = mb.save_inputs(inputs, tmp)
        result["inputs"] = {k: list(v.shape) for k, v in inputs.items()}
        if case.first_compile_only:
            names = [o.name for o in sessions["disabled"].get_outputs()]
            reference = dict(zip(names, sessions["disabled"].run(None, inputs)))
            result["agreement"], result["first_run"] = agreement(args, model, input_args, reference, tmp, extra)
            if not args.no_first_compile:
                log(f"{case.name}: first call with an empty kernel cache")
                result["first_compile"] = first_compile(args, model, input_args, extra)
            result["machine_after"] = {"loadavg": os.getloadavg(), "other_cpu_share": other.share()}
            return result
        result["activations_mib"] = activations.peak_live_bytes(model, inputs) / 2**20
        names = [o.name for o in sessions["disabled"].get_outputs()]
        reference = dict(zip(names, sessions["disabled"].run(None, inputs)))
        est_ms = timed_ort_ms(sessions["default"], inputs)
        # Heavy cases (ViT-base b8 takes seconds per run) get the fewest calls that still give per-round
        # ratios; the rest get more rounds, where a burst of someone else's load weighs less.
        heavy = est_ms >= HEAVY_MS and not args.quick
        rounds = args.rounds or (2 if args.quick or heavy else (5 if est_ms < 30 else 3))
        min_runs = 2 if heavy else plan["min_runs"]
        warmup = 1 if heavy else plan["warmup"]
        runs = int(min(plan["max_runs"], max(min_runs, round(plan["target_ms"] / max(est_ms, 1e-3)))))
        result["plan"] = {"ort_estimate_ms": est_ms, "rounds": rounds, "runs": runs, "warmup": warmup,
                          "passes": args.passes or "(CLI default)"}
        log(f"{case.name}: ORT ~{est_ms:.1f} ms; {rounds} rounds x {runs} runs")
        result["agreement"], result["first_run"] = agreement(args, model, input_args, reference, tmp, extra)
        key = str(model)
        if key not in load_cache:  # load time does not depend on the input shape
            load_cache[key] = load_measurements(args, model, plan["load_repeats"])
        result["load"] = load_cache[key]
        result["ort_first_run"] = ort_first_run(args, model, [a for a in input_args if a != "--input"])
        result["latency"] = latency_rounds(args, model, input_args, inputs, sessions, rounds, runs, warmup, extra)
        if case.first_compile and not args.no_first_compile:
            log(f"{case.name}: first call with an empty kernel cache")
            result["first_compile"] = first_compile(args, model, input_args, extra)
    result["machine_after"] = {"loadavg": os.getloadavg(), "other_cpu_share": other.share()}
    return result


def cli_checks_passes(transmuter: str) -> bool:
    """Whether the CLI knows --passes. It takes any `--name value` without complaint, so ask it to
    load a model with a bad value: a CLI that knows the option refuses it."""
    model = make_bench_models.ensure_model("tiny_encoder")
    proc = subprocess.run([transmuter, "info", str(model), "--passes", "no-such-value"], capture_output=True, text=True)
    return proc.returncode != 0 and "--passes" in proc.stdout + proc.stderr


def empty_processes(args, repeats: int) -> dict:
    env = mb.child_env(args.threads)
    return {"transmuter_empty": mb.repeat_fresh([args.transmuter, "operators"], env, repeats),
            "ort_empty": mb.repeat_fresh(mb.ort_child_cmd("-", "default", args.threads, "import"), env, repeats)}


def strip_child_script(obj):
    """The ORT child's source is long; the JSON names it instead of repeating it."""
    if isinstance(obj, dict):
        return {k: strip_child_script(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [("<ORT child script in model_bench.py>" if x == mb.ORT_CHILD else strip_child_script(x)) for x in obj]
    return obj


def main() -> int:
    args = parse_args()
    if args.list:
        for c in CASES:
            print(f"{c.name:24s} {c.group:8s} quick={c.quick} first_compile={c.first_compile} optional={c.optional}")
        return 0
    if not os.access(mb.GNU_TIME, os.X_OK):
        sys.exit(f"{mb.GNU_TIME} (GNU time) is needed for peak RSS: apt-get install time")
    cases = select_cases(args)
    if args.passes and not cli_checks_passes(args.transmuter):
        sys.exit(f"{args.transmuter} has no --passes option; build a newer one (main has it from issue 8 on)")
    plan = ({"target_ms": args.target_ms or 300, "min_runs": 2, "max_runs": 10, "warmup": 1,
             "load_repeats": args.load_repeats or 1} if args.quick else
            {"target_ms": args.target_ms or 1500, "min_runs": 3, "max_runs": 200, "warmup": 5,
             "load_repeats": args.load_repeats or 5})
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = args.out or REPO_ROOT / f"bench/results/suite/{stamp}{'-quick' if args.quick else ''}.json"
    full_default = not args.quick and not args.cases
    doc = args.doc or (REPO_ROOT / "docs/performance.md" if full_default else out.with_suffix(".md"))
    started = time.perf_counter()
    suite = {"command": ["bench/run", *sys.argv[1:]], "quick": args.quick, "plan": plan,
             "machine": mb.machine_info(args.threads), "transmuter": args.transmuter}
    if os.environ.get("BENCH_COMMIT"):  # set by bench/run when git cannot see the tree from here
        suite["machine"]["commit"] = os.environ["BENCH_COMMIT"]
    log(f"{len(cases)} case(s): {', '.join(c.name for c in cases)}")
    suite["empty_processes"] = empty_processes(args, plan["load_repeats"])
    results, load_cache = [], {}
    out.parent.mkdir(parents=True, exist_ok=True)
    for case in cases:
        minutes = (time.perf_counter() - started) / 60
        if args.max_minutes is not None and minutes > args.max_minutes:
            log(f"{case.name}: skipped, {minutes:.0f} min > --max-minutes {args.max_minutes:g}")
            results.append({"case": case.name, "model": case.model, "group": case.group,
                             "error": f"skipped: the run had used {minutes:.0f} of --max-minutes {args.max_minutes:g}"})
            continue
        try:
            results.append(run_case(args, case, plan, load_cache))
        except Exception as error:  # one broken case must not hide the others' figures
            log(f"{case.name}: FAILED: {error}")
            results.append({"case": case.name, "model": case.model, "group": case.group, "error": str(error)[-3000:]})
        # Written after every case, so an interrupted run keeps what it measured.
        out.write_text(json.dumps(strip_child_script({"suite": {**suite, "partial": True}, "cases": results}),
                                  indent=1) + "\n")
    suite["machine"]["loadavg_end"] = os.getloadavg()
    suite["duration_s"] = time.perf_counter() - started
    data = strip_child_script({"suite": suite, "cases": results})
    out.write_text(json.dumps(data, indent=1) + "\n")
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(gen_performance_doc.render(data, out))
    log(f"wrote {out} and {doc} in {suite['duration_s']:.0f} s")
    if args.require_agreement is not None:  # the CTest smoke run: check what was written, too
        written = json.loads(out.read_text())
        missing = [c.name for c in cases if not any(r["case"] == c.name and "latency" in r for r in written["cases"])]
        missing += [c.name for c in cases if f"| {c.name} |" not in doc.read_text()]
        if missing:
            log(f"no figures written for: {', '.join(missing)}")
            return 1
        bad = gen_performance_doc.disagreements(data, args.require_agreement)
        if bad:
            log("outputs disagree with ORT: " + "; ".join(bad))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
