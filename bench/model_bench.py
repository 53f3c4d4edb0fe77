#!/usr/bin/env python3
"""Transmuter vs ONNX Runtime on one real model, in one run; also the measuring functions
that bench/suite.py (`bench/run`, the issue-8 suite) uses for every case.

Measures, on the same machine and in the same run:
  * load: wall time and peak RSS of a fresh process that loads the model
    (`transmuter info MODEL`) vs a fresh Python process that creates an ORT
    InferenceSession (graph optimizations at default ORT_ENABLE_ALL and disabled).
    Each is also reported minus an "empty" process of the same kind
    (`transmuter operators`; `python -c "import onnxruntime"`) to separate
    process start-up and library loading from model loading;
  * cold start: load + first inference in a fresh process (peak RSS here
    includes the weights actually touched);
  * latency at batch 1, sequence 128: `transmuter bench --mode eager|compiled`
    vs `session.run`, same thread count (ORT intra_op_num_threads = OpenBLAS
    threads = --threads), reported as transmuter/ORT ratios. The four
    (eager, compiled, ORT default, ORT optimizations off) are measured in
    interleaved rounds, so a burst of load does not land on one of them only;
    the reported latency is the median of the rounds' medians and each ratio
    the median of the per-round ratios;
  * how much of the machine other processes used meanwhile (/proc/stat minus
    our own CPU time), to tell a quiet run from a disturbed one.
  * agreement: max |transmuter - ORT| of every output, so a fast wrong answer
    does not go unnoticed.

Run with the project venv:
    .venv/bin/python bench/model_bench.py --transmuter build/transmuter
Writes <out-dir>/<name>.json (raw) and <out-dir>/<name>.md (tables); needs GNU time
(/usr/bin/time) for the peak RSS of child processes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO_ROOT / ".cache/models/paraphrase-MiniLM-L3-v2/model.onnx"
VOCAB_SIZE = 30522  # BERT uncased
ORT_LEVELS = {"default": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
              "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transmuter", default=str(REPO_ROOT / "build/transmuter"), help="the CLI binary")
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--name", default="minilm_l3_b1_s128", help="results file stem")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--threads", type=int, default=2, help="ORT intra-op threads = OPENBLAS_NUM_THREADS")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--rounds", type=int, default=10, help="interleaved latency rounds")
    p.add_argument("--load-repeats", type=int, default=5, help="fresh processes per load measurement")
    p.add_argument("--out-dir", default=str(REPO_ROOT / "bench/results"))
    return p.parse_args()


# --- how busy the machine was with other work --------------------------------

def busy_cpu_seconds() -> float:
    """CPU seconds spent busy by all processes since boot (/proc/stat, all cores)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds of this process and of every child it has waited for (recursively)."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


class OtherLoad:
    """Share of the machine's cores that other processes used between start() and stop():
    0 means the benchmark had the machine to itself; 0.5 on 2 cores means a whole core
    went to someone else, and timings of 2-thread code are then not comparable."""

    def __init__(self) -> None:
        self.busy, self.own, self.wall = busy_cpu_seconds(), own_cpu_seconds(), time.monotonic()

    def share(self) -> float:
        wall = time.monotonic() - self.wall
        other = (busy_cpu_seconds() - self.busy) - (own_cpu_seconds() - self.own)
        return max(0.0, other) / (wall * os.cpu_count())


# --- inputs ------------------------------------------------------------------

def make_inputs(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"input_ids": rng.integers(0, VOCAB_SIZE, size=(batch, seq), dtype=np.int64),
            "attention_mask": np.ones((batch, seq), dtype=np.int64)}


def save_inputs(inputs: dict[str, np.ndarray], folder: Path) -> list[str]:
    """Writes NAME.npy files; returns the CLI arguments `--input NAME=FILE`."""
    args = []
    for name, array in inputs.items():
        path = folder / f"{name}.npy"
        np.save(path, array)
        args += ["--input", f"{name}={path}"]
    return args


# --- fresh-process measurements ---------------------------------------------

def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["OPENBLAS_NUM_THREADS"] = str(threads)
    env["TRANSMUTER_NUM_THREADS"] = str(threads)  # the kernels' pool (it takes every core otherwise)
    return env


def run_fresh(cmd: list[str], env: dict[str, str]) -> dict:
    """Wall time and stdout of one process."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, env=env, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return {"wall_s": wall, "stdout": proc.stdout, "stderr": proc.stderr}


GNU_TIME = "/usr/bin/time"


def run_fresh_rusage(cmd: list[str], env: dict[str, str]) -> dict:
    """Like run_fresh, plus the child's own peak RSS.

    The peak RSS comes from GNU time (`%M`, KiB), not from os.wait4 here: Linux
    carries a process's peak RSS across fork and exec, so a child of this Python
    process (numpy and onnxruntime loaded, ~55 MiB) would never report less than
    that. GNU time is a small parent, so its floor is a few MiB.
    """
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        timed = [GNU_TIME, "-f", "%M", "-o", rss.name, *cmd]
        start = time.perf_counter()
        proc = subprocess.run(timed, capture_output=True, env=env, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        peak_kib = int(rss.read().split()[-1])
    return {"wall_s": wall, "peak_rss_mib": peak_kib / 1024.0, "stdout": proc.stdout, "stderr": proc.stderr}


def inner_seconds(sample: dict) -> float | None:
    """A child's own timing of its work: `inner_s: X` (ORT's child) or `load_ms: X` (`transmuter info`)."""
    if m := re.search(r"inner_s: ([0-9.eE+-]+)", sample["stdout"]):
        return float(m.group(1))
    if m := re.search(r"load_ms: ([0-9.eE+-]+)", sample["stdout"]):
        return float(m.group(1)) / 1e3
    return None


def summarize_fresh(cmd: list[str], samples: list[dict]) -> dict:
    """Median wall, median peak RSS and, when the child prints its own timing, its median (inner_s)."""
    result = {"cmd": cmd,
              "wall_s": statistics.median(s["wall_s"] for s in samples),
              "peak_rss_mib": statistics.median(s["peak_rss_mib"] for s in samples),
              "wall_s_all": [s["wall_s"] for s in samples]}
    inner = [t for t in map(inner_seconds, samples) if t is not None]
    if inner:
        result["inner_s"] = statistics.median(inner)
        result["inner_s_all"] = inner
    return result


def repeat_fresh(cmd: list[str], env: dict[str, str], repeats: int) -> dict:
    """summarize_fresh of `repeats` fresh processes running `cmd`."""
    return summarize_fresh(cmd, [run_fresh_rusage(cmd, env) for _ in range(repeats)])


ORT_CHILD = """
import sys, time, numpy as np
import onnxruntime as ort
model, level, threads, action = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if action == "import":
    sys.exit(0)
so = ort.SessionOptions()
so.graph_optimization_level = {"default": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                               "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}[level]
so.intra_op_num_threads = threads
so.inter_op_num_threads = 1
t = time.perf_counter()
sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
if action == "run":
    feeds = {name: np.load(path) for name, path in (a.split("=", 1) for a in sys.argv[5:])}
    sess.run(None, feeds)
print(f"inner_s: {time.perf_counter() - t}")
"""


def ort_child_cmd(model: str, level: str, threads: int, action: str, feeds: list[str] = ()) -> list[str]:
    return [sys.executable, "-c", ORT_CHILD, model, level, str(threads), action, *feeds]


def measure_load(args, input_args: list[str], out_dir: Path) -> dict:
    env, n = child_env(args.threads), args.load_repeats
    feeds = [a for a in input_args if a != "--input"]
    results = {
        "transmuter_empty": repeat_fresh([args.transmuter, "operators"], env, n),
        "transmuter_info": repeat_fresh([args.transmuter, "info", args.model], env, n),
        "ort_empty": repeat_fresh(ort_child_cmd(args.model, "default", args.threads, "import"), env, n),
    }
    for level in ORT_LEVELS:
        results[f"ort_session_{level}"] = repeat_fresh(ort_child_cmd(args.model, level, args.threads, "load"), env, n)
    for mode in ("eager", "compiled"):
        cmd = [args.transmuter, "run", args.model, *input_args, "--mode", mode, "--output-dir", str(out_dir / mode)]
        results[f"transmuter_first_run_{mode}"] = repeat_fresh(cmd, env, n)
    for level in ORT_LEVELS:
        results[f"ort_first_run_{level}"] = repeat_fresh(ort_child_cmd(args.model, level, args.threads, "run", feeds),
                                                        env, n)
    return results


# --- latency -----------------------------------------------------------------

LATENCY_LINE = re.compile(r"latency_ms: mean ([0-9.eE+-]+)\s+median ([0-9.eE+-]+)\s+min ([0-9.eE+-]+)\s+max ([0-9.eE+-]+)")


def transmuter_bench(transmuter: str, model: str, input_args: list[str], mode: str, warmup: int, runs: int,
                     threads: int, extra_args: list[str] = (), env_extra: dict[str, str] | None = None) -> dict:
    """One `transmuter bench` in a fresh process, under GNU time: latency, first call, peak RSS."""
    cmd = [transmuter, "bench", model, *input_args, "--mode", mode, "--warmup", str(max(1, warmup)),
           "--runs", str(runs), *extra_args]
    env = child_env(threads)
    env.update(env_extra or {})
    proc = run_fresh_rusage(cmd, env)
    m = LATENCY_LINE.search(proc["stdout"])
    if not m:
        raise RuntimeError(f"unexpected `transmuter bench` output:\n{proc['stdout']}")
    mean, median, low, high = map(float, m.groups())
    result = {"mean_ms": mean, "median_ms": median, "min_ms": low, "max_ms": high,
              "process_wall_s": proc["wall_s"], "peak_rss_mib": proc["peak_rss_mib"]}
    first = re.search(r"first_call_ms: ([0-9.eE+-]+)", proc["stdout"])
    if first:  # printed by builds from issue 8 on
        result["first_call_ms"] = float(first.group(1))
    # --mode compiled reports its segments and graph breaks on stderr.
    stats = re.search(r"compiled: .*", proc["stderr"])
    if stats:
        result["compile_stats"] = stats.group(0)
    return result


def transmuter_latency(args, input_args: list[str], mode: str) -> dict:
    return transmuter_bench(args.transmuter, args.model, input_args, mode, args.warmup, args.runs, args.threads)


def ort_session(model: str, level: str, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ORT_LEVELS[level]
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def ort_latency(sess: ort.InferenceSession, inputs: dict[str, np.ndarray], warmup: int, runs: int) -> dict:
    for _ in range(warmup):
        sess.run(None, inputs)
    ms = []
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(None, inputs)
        ms.append((time.perf_counter() - t) * 1e3)
    return {"mean_ms": statistics.fmean(ms), "median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms)}


def measure_latency(args, inputs: dict[str, np.ndarray], input_args: list[str]) -> dict:
    sessions = {level: ort_session(args.model, level, args.threads) for level in ORT_LEVELS}
    rounds: dict[str, list[dict]] = {"transmuter_eager": [], "transmuter_compiled": [],
                                     **{f"ort_{level}": [] for level in ORT_LEVELS}}
    for _ in range(args.rounds):
        rounds["transmuter_eager"].append(transmuter_latency(args, input_args, "eager"))
        rounds["transmuter_compiled"].append(transmuter_latency(args, input_args, "compiled"))
        for level, sess in sessions.items():
            rounds[f"ort_{level}"].append(ort_latency(sess, inputs, args.warmup, args.runs))
    latency = {name: {"median_ms": statistics.median(r["median_ms"] for r in runs), "rounds": runs}
               for name, runs in rounds.items()}
    # Ratios of measurements taken seconds apart, round by round: the host's speed drifts
    # (ORT alone moved between ~8.5 and ~13 ms from one round to the next on an otherwise
    # idle VM), and a ratio of neighbours cancels most of that drift.
    for name, entry in latency.items():
        for level in ORT_LEVELS:
            per_round = [mine["median_ms"] / ort["median_ms"] for mine, ort in zip(rounds[name], rounds[f"ort_{level}"])]
            entry[f"ratio_to_ort_{level}"] = statistics.median(per_round)
    return latency


# --- agreement ---------------------------------------------------------------

def output_agreement(args, inputs: dict[str, np.ndarray], out_dir: Path) -> dict:
    """Max abs difference per output between transmuter (files from the first-run step) and ORT."""
    sess = ort_session(args.model, "default", args.threads)
    names = [o.name for o in sess.get_outputs()]
    expected = dict(zip(names, sess.run(None, inputs)))
    agreement = {}
    for mode in ("eager", "compiled"):
        for name, ref in expected.items():
            path = out_dir / mode / (re.sub(r"[^A-Za-z0-9._-]", "_", name) + ".npy")
            got = np.load(path)
            agreement[f"{mode}:{name}"] = float(np.max(np.abs(got.astype(np.float64) - ref))) \
                if got.shape == ref.shape else f"shape {got.shape} != {ref.shape}"
    return agreement


# --- report ------------------------------------------------------------------

def cpu_info() -> dict:
    """CPU model, family/model numbers and the SIMD flags that decide which kernels run."""
    fields: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "cpu family", "model", "flags") and key not in fields:
            fields[key] = value.strip()
    flags = set(fields.get("flags", "").split())
    return {"cpu": fields.get("model name", platform.processor()), "cpu_family": fields.get("cpu family"),
            "cpu_model": fields.get("model"), "avx2": "avx2" in flags, "fma": "fma" in flags,
            "avx512f": "avx512f" in flags}


def git_commit() -> str:
    """HEAD of the repository, with `+dirty` when tracked files differ from it."""
    def git(*cmd: str) -> str:
        return subprocess.run(["git", "-C", str(REPO_ROOT), *cmd], capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine_info(threads: int) -> dict:
    return {**cpu_info(), "cores": os.cpu_count(), "threads_used": threads, "onnxruntime": ort.__version__,
            "python": platform.python_version(), "loadavg_start": os.getloadavg(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": git_commit()}


def markdown(results: dict) -> str:
    load, lat = results["load"], results["latency"]
    te, oe = load["transmuter_empty"], load["ort_empty"]
    lines = ["| Fresh process | wall (ms) | minus empty process (ms) | in-process (ms) | peak RSS (MiB) |",
             "|---|---:|---:|---:|---:|"]

    def row(label, r, empty):
        inner = f"{r['inner_s'] * 1e3:.0f}" if "inner_s" in r else "-"
        lines.append(f"| {label} | {r['wall_s'] * 1e3:.0f} | {(r['wall_s'] - empty['wall_s']) * 1e3:.0f} | {inner} "
                     f"| {r['peak_rss_mib']:.0f} |")

    row("transmuter, empty (`operators`)", te, te)
    row("transmuter `info` (load)", load["transmuter_info"], te)
    row("ORT, empty (`import onnxruntime`)", oe, oe)
    for level in ORT_LEVELS:
        row(f"ORT session, optimizations {level}", load[f"ort_session_{level}"], oe)
    for mode in ("eager", "compiled"):
        row(f"transmuter `run` {mode} (load + 1st inference)", load[f"transmuter_first_run_{mode}"], te)
    for level in ORT_LEVELS:
        row(f"ORT session {level} + 1st inference", load[f"ort_first_run_{level}"], oe)

    lines += ["", "| Latency, batch 1 x seq 128 | median (ms) | / ORT default | / ORT disabled |",
              "|---|---:|---:|---:|"]
    for name in ("transmuter_eager", "transmuter_compiled", "ort_default", "ort_disabled"):
        entry = lat[name]
        lines.append(f"| {name} | {entry['median_ms']:.2f} | {entry['ratio_to_ort_default']:.2f} "
                     f"| {entry['ratio_to_ort_disabled']:.2f} |")
    lines += ["", "Latency: median over rounds of each round's median; ratios: median over rounds of the "
              "ratio within the round."]
    return "\n".join(lines) + "\n"


def main() -> int:
    args = parse_args()
    if not os.access(GNU_TIME, os.X_OK):
        sys.exit(f"{GNU_TIME} (GNU time) is needed to measure the peak RSS of child processes: apt-get install time")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    inputs = make_inputs(args.batch, args.seq)
    results = {"machine": machine_info(args.threads), "model": args.model, "transmuter": args.transmuter,
               "batch": args.batch, "seq": args.seq, "warmup": args.warmup, "runs": args.runs, "rounds": args.rounds,
               "load_repeats": args.load_repeats}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        input_args = save_inputs(inputs, tmp)
        other = OtherLoad()
        results["load"] = measure_load(args, input_args, tmp)
        results["max_abs_diff_vs_ort"] = output_agreement(args, inputs, tmp)
        results["machine"]["other_cpu_share_load"] = other.share()
        other = OtherLoad()
        results["latency"] = measure_latency(args, inputs, input_args)
        results["machine"]["other_cpu_share_latency"] = other.share()
    results["machine"]["loadavg_end"] = os.getloadavg()
    for r in results["load"].values():
        r["cmd"] = ["<ORT child script>" if c == ORT_CHILD else c for c in r["cmd"]]
    table = markdown(results)
    (out_dir / f"{args.name}.json").write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / f"{args.name}.md").write_text(table)
    print(table)
    print("max |transmuter - ORT| per output:", json.dumps(results["max_abs_diff_vs_ort"], indent=1))
    machine = results["machine"]
    print(f"load average start {machine['loadavg_start']} end {machine['loadavg_end']}; share of the cores used by "
          f"other processes: {machine['other_cpu_share_load']:.1%} (load part), "
          f"{machine['other_cpu_share_latency']:.1%} (latency part)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
