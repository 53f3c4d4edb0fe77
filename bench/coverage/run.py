#!/usr/bin/env python3
"""The coverage matrix (issue 11): every file of the corpus (bench/coverage/make_corpus.py) and every real
export kept in the repo's tests, run in Transmuter and compared with ONNX Runtime, into docs/coverage.md.

    bench/coverage/run [--corpus DIR] [--only ARCH,...] [--flavours F,...] [--doc FILE] [--json FILE]

Per file: seeded inputs from its inputs.json (tests/models/model_inputs.py) at its two shapes ("dims" and
"dims_alt"); ONNX Runtime with graph optimizations off is the reference; Transmuter runs the file as a user
would (`transmuter run`, load-time passes on) in eager and in compiled mode. A file matches when every output
of every shape and mode is within its flavour's tolerance (FLAVOUR_TOLERANCE) of ORT's. A file that does not
match is triaged: a load error naming operators without an implementation gives "missing op"; outputs beyond
the tolerance run scripts/diff.py on the same inputs, which names the first node whose value differs (passes
off, then on if the file's own nodes all agree); any other error is recorded with its message.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "models"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "scripts"))
from diff import compare_values  # noqa: E402  (scripts/diff.py: the same element-wise rule)
from model_inputs import build_inputs  # noqa: E402

SEED = 1234
MODES = ("eager", "compiled")
RUN_TIMEOUT_S = 600

# (atol, rtol) per flavour: |Transmuter - ORT| <= atol + rtol * |ORT| at every element of every output.
# fp32 files (and their int8 / q4 forms, whose integer arithmetic both engines do exactly, with the same
# float scales): summation order and vectorized exp/erf/tanh only, ~1e-6 seen on the repo's model tests; 1e-4
# leaves that 100x headroom and still catches a wrong axis, mask or bias (>= 1e-2). fp16 files: a few units in
# the last place of half precision after a dozen layers (the repo's fp16 model tests need 1e-2).
DEFAULT_TOLERANCE = (1e-4, 1e-4)
FLAVOUR_TOLERANCE = {"fp16": (1e-2, 1e-2)}


@dataclass
class Entry:
    arch: str
    family: str
    flavour: str
    path: Path
    spec: dict
    source: str  # "corpus" or "real"

    @property
    def about(self) -> str:
        return self.spec.get("about", "")


@dataclass
class Result:
    arch: str
    family: str
    flavour: str
    path: str
    source: str
    about: str
    status: str  # match | mismatch | missing_op | error (Transmuter's) | ort_error
    worst: float | None = None  # largest |Transmuter - ORT| over outputs, shapes and modes
    modes_matched: list[str] = field(default_factory=list)
    detail: str = ""
    first_divergence: dict | None = None
    notes: str = ""  # what was not compared, and why
    seconds: float = 0.0


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", type=Path, default=REPO / ".cache" / "coverage")
    p.add_argument("--only", help="architectures, comma-separated")
    p.add_argument("--flavours", help="flavours, comma-separated")
    p.add_argument("--transmuter", type=Path, default=Path(os.environ.get("TRANSMUTER_BIN",
                                                                           REPO / "build" / "transmuter")))
    p.add_argument("--doc", type=Path, default=REPO / "docs" / "coverage.md")
    p.add_argument("--json", type=Path, help="raw results (default: bench/results/coverage/latest.json for a full "
                                             "run, WORK/partial.json with --only or --flavours)")
    p.add_argument("--work", type=Path, default=REPO / ".cache" / "coverage-runs")
    p.add_argument("--no-real", action="store_true", help="leave out the real exports")
    p.add_argument("--real-cache", type=Path, default=REPO / ".cache" / "coverage-real")
    # Test-only: the eager runs (and the triage) perturb this node's outputs, a known divergence to find.
    p.add_argument("--perturb-node", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ---- what to run -------------------------------------------------------------------------------------------

def corpus_entries(corpus: Path) -> tuple[list[Entry], dict]:
    manifest_path = corpus / "manifest.json"
    if not manifest_path.is_file():
        raise SystemExit(f"{manifest_path}: no corpus manifest (make it: bench/coverage/make_corpus.py)")
    manifest = json.loads(manifest_path.read_text())
    entries = []
    for f in manifest["files"]:
        if f["status"] != "ok":
            continue
        path = corpus / f["path"]
        spec = json.loads((path.parent / "inputs.json").read_text())
        entries.append(Entry(f["arch"], f["family"], f["flavour"], path, spec, "corpus"))
    return entries, manifest


def real_entries(cache: Path) -> list[Entry]:
    """Published exports: those registry packages ship (bench/coverage/real_exports.py) and the real model
    the repo's model tests fetch."""
    import real_exports  # noqa: PLC0415 - beside this file

    entries = []
    for export in real_exports.EXPORTS:
        try:
            path = real_exports.fetch(export, cache)
        except Exception as error:  # noqa: BLE001 - a package that cannot be fetched is reported, not fatal
            print(f"{export.name}: not fetched: {error}", file=sys.stderr)
            continue
        spec = json.loads((path.parent / "inputs.json").read_text())
        entries.append(Entry(export.name, export.family, "published", path, spec, "real"))
    for spec_path in sorted((REPO / "tests" / "models").glob("*/inputs.json")):
        spec = json.loads(spec_path.read_text())
        if "fetch" not in spec:
            continue
        fetched = subprocess.run([sys.executable, str(REPO / spec["fetch"])], capture_output=True, text=True)
        if fetched.returncode != 0:
            print(f"{spec['fetch']} failed: {fetched.stderr.strip()[-300:]}", file=sys.stderr)
            continue
        path = Path(fetched.stdout.strip().splitlines()[-1])
        spec = {**spec, "about": f"{spec.get('about', '')}; {spec['fetch']}"}
        entries.append(Entry(spec["model"], spec.get("family", "text encoder"), "published", path, spec, "real"))
    return entries


# ---- running one file --------------------------------------------------------------------------------------

def sanitize(name: str) -> str:
    """The file name `transmuter run` gives an output."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


class NondeterministicReference(Exception):
    """ORT gave two different results for the same inputs: it read memory it never wrote."""


def ort_outputs(path: Path, inputs: dict) -> dict[str, np.ndarray]:
    """ORT's outputs (optimizations off), computed twice: a reference that changes between two runs on the
    same inputs (seen: a sliding-window GroupQueryAttention fed a padded batch returns uninitialized cache
    rows) is no reference, and raises NondeterministicReference."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 4
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    first, second = session.run(names, inputs), session.run(names, inputs)
    for name, a, b in zip(names, first, second):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind in "fc":
            same = np.allclose(a, b, rtol=1e-6, atol=1e-6, equal_nan=True)
        else:
            same = np.array_equal(a, b)
        if not same:
            raise NondeterministicReference(f"ORT's '{name}' differs between two runs on the same inputs")
    return dict(zip(names, first))


def last_error_line(stderr: str) -> str:
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


MISSING_OPS = re.compile(r"operator\(s\) have no implementation: (.*)")


def transmuter_failure(stderr: str) -> tuple[str, str]:
    """(status, detail) of a failed `transmuter run`: the operators without an implementation, or the error."""
    text = " ".join(stderr.split())
    missing = MISSING_OPS.search(text)
    if missing:
        ops = sorted(set(re.findall(r"([\w.]+ \w+) \(opset \d+\)", missing.group(1))))
        return "missing_op", ", ".join(ops) if ops else missing.group(1)[:200]
    return "error", last_error_line(stderr).removeprefix("transmuter run: error: ")[:300]


def triage(entry: Entry, input_files: dict[str, Path], transmuter: Path, work: Path,
           perturb_node: str | None) -> dict | None:
    """scripts/diff.py on the failing inputs: the first divergent node, passes off, then on."""
    for passes in ("none", "default"):
        report = work / f"diff_{passes}.json"
        cmd = [sys.executable, str(REPO / "scripts" / "diff.py"), str(entry.path), "--transmuter", str(transmuter),
               "--json", str(report), "--passes", passes]
        for name, path in input_files.items():
            cmd += ["--input", f"{name}={path}"]
        if perturb_node:
            cmd += ["--perturb-node", perturb_node]
        subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        if not report.is_file():
            return None
        result = json.loads(report.read_text())
        if result.get("status") == "diverged":
            return {**result["first_divergence"], "passes": passes}
    return None


def check(entry: Entry, transmuter: Path, work_root: Path, perturb_node: str | None = None) -> Result:
    start = time.perf_counter()
    tolerance = FLAVOUR_TOLERANCE.get(entry.flavour, DEFAULT_TOLERANCE)
    result = Result(entry.arch, entry.family, entry.flavour, str(entry.path.relative_to(REPO))
                    if entry.path.is_relative_to(REPO) else str(entry.path), entry.source,
                    entry.about.split(";")[-1].strip() if entry.source == "real" else "", "match")
    work = work_root / sanitize(entry.arch) / entry.flavour
    shutil.rmtree(work, ignore_errors=True)
    shapes = [entry.spec["dims"]] + ([entry.spec["dims_alt"]] if entry.spec.get("dims_alt") else [])
    worst = 0.0
    mismatch = None  # (shape index, mode, detail, input files) of the first output beyond the tolerance
    matched_modes = set(MODES)
    skipped_shapes, compared_shapes = [], 0
    for s, dims in enumerate(shapes):
        shape_dir = work / f"shape{s}"
        shape_dir.mkdir(parents=True)
        inputs = build_inputs(entry.spec["inputs"], dims, np.random.default_rng(SEED))
        input_files = {}
        for name, value in inputs.items():
            input_files[name] = shape_dir / f"{sanitize(name)}.in.npy"
            np.save(input_files[name], value)
        try:
            expected = ort_outputs(entry.path, inputs)
        except NondeterministicReference as error:  # this shape has no reference; another may
            skipped_shapes.append(f"shape {s + 1}: {error}")
            continue
        except Exception as error:  # noqa: BLE001 - recorded, the matrix goes on
            result.status, result.detail = "ort_error", str(error).strip().splitlines()[0][:300]
            break
        compared_shapes += 1
        for mode in MODES:
            out_dir = shape_dir / mode
            cmd = [str(transmuter), "run", str(entry.path), "--mode", mode, "--output-dir", str(out_dir)]
            for name, path in input_files.items():
                cmd += ["--input", f"{name}={path}"]
            if perturb_node and mode == "eager":
                cmd += ["--perturb-node", perturb_node]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
            if proc.returncode != 0:
                result.status, result.detail = transmuter_failure(proc.stderr)
                result.detail = f"{mode}: {result.detail}" if result.status == "error" else result.detail
                result.seconds = time.perf_counter() - start
                return result
            for name, reference in expected.items():
                ours = np.load(out_dir / f"{sanitize(name)}.npy")
                within, error, _, why = compare_values(ours, np.asarray(reference), *tolerance,
                                                       float_widths_may_differ=False)
                error = float("inf") if error is None else error  # shapes or dtypes differ
                worst = max(worst, error) if not np.isnan(error) else float("nan")
                if not within:
                    matched_modes.discard(mode)
                    if mismatch is None:
                        mismatch = (s, mode, f"{mode}, shape {s + 1}, output '{name}': {why} (max abs {error:.3g})",
                                    input_files, shape_dir)
    if result.status == "match" and compared_shapes == 0:
        result.status, result.detail = "ort_error", "; ".join(skipped_shapes)
    elif skipped_shapes:
        result.notes = "; ".join(skipped_shapes) + " (skipped)"
    if result.status == "match":
        result.worst = worst
        result.modes_matched = sorted(matched_modes)
        if mismatch is not None:
            result.status, result.detail = "mismatch", mismatch[2]
            result.first_divergence = triage(entry, mismatch[3], transmuter, mismatch[4], perturb_node)
    result.seconds = time.perf_counter() - start
    return result


# ---- the document ------------------------------------------------------------------------------------------

FLAVOUR_ORDER = ["fp32", "with_past", "ort_optimized", "fp16", "int8_dynamic", "q4", "genai_fp32", "genai_int4",
                 "dynamo", "optimum", "optimum_merged", "fp32_encoder", "fp32_decoder", "with_past_decoder",
                 "int8_dynamic_encoder", "int8_dynamic_decoder", "optimum_encoder", "optimum_decoder",
                 "optimum_with_past", "published"]
FAMILY_ORDER = ["text encoder", "decoder", "encoder-decoder", "vision", "audio"]


def cell(r: Result) -> str:
    if r.status == "match":
        return (f"✓ {r.worst:.0e}" if r.worst else "✓ 0") + (" (1 shape)" if r.notes else "")
    if r.status == "missing_op":
        return "✗ missing " + r.detail.replace("ai.onnx ", "")
    if r.status == "mismatch":
        if r.first_divergence:
            d = r.first_divergence
            return (f"✗ {d['op_type']} '{d['name'] or d['output']}'" + (" (passes)" if d["passes"] == "default" else "")
                    + (" (1-step rounding)" if is_rounding_step(d) else ""))
        only = "compiled" if r.modes_matched == ["eager"] else "eager" if r.modes_matched == ["compiled"] else ""
        return f"✗ {only + ' ' if only else ''}outputs differ (no single node)".strip()
    return f"✗ {r.status.replace('_', ' ')}"


def is_rounding_step(d: dict) -> bool:
    """A first divergence of an integer value (a quantizer's output) by one step at a few elements."""
    return "(exact type)" in d.get("reason", "") and d.get("max_abs") == 1.0


def sort_key(values: list[str], order: list[str]):
    return sorted(values, key=lambda v: (order.index(v) if v in order else len(order), v))


def markdown(results: list[Result], manifest: dict, meta: dict) -> str:
    compared = [r for r in results if r.status != "ort_error"]
    corpus = [r for r in compared if r.source == "corpus"]
    real = [r for r in compared if r.source == "real"]
    matched = [r for r in corpus if r.status == "match"]
    archs = sorted({r.arch for r in corpus})
    failed_exports = [f for f in manifest.get("files", []) if f["status"] != "ok"]
    lines = ["# Coverage: Hugging Face architectures × export flavours, against ONNX Runtime", "",
             "Generated by `bench/coverage/run` (do not edit). Each cell: one ONNX file of the corpus "
             "(`bench/coverage/make_corpus.py`: tiny random-weight exports), run by `transmuter run` (load-time passes "
             "on) in eager and compiled mode at two input shapes and compared with ONNX Runtime (graph optimizations "
             "off) on the same seeded inputs. ✓ and the largest absolute error over every output, shape and mode; ✗ "
             "and why: a missing operator, or the first node whose value differs (`scripts/diff`, passes off; "
             "\"(passes)\" when only the load-time passes' graph differs), or the error. Tolerances: "
             f"|T − ORT| ≤ atol + rtol·|ORT| with (atol, rtol) = {DEFAULT_TOLERANCE} for fp32, int8 and q4 files, "
             f"{FLAVOUR_TOLERANCE['fp16']} for fp16 (bench/coverage/run.py says why).", "",
             f"- **Run**: {meta['date']}, commit {meta['commit']}, {meta['cpu']}, {meta['minutes']:.1f} min; "
             f"corpus made with {', '.join(f'{k} {v}' for k, v in sorted(manifest.get('versions', {}).items()))}.",
             f"- **Corpus**: {len(archs)} architectures, {len(corpus)} files compared"
             f"{f', {len(failed_exports)} exports that failed or that ORT could not run (listed at the end)' if failed_exports else ''}.",
             f"- **Matched ORT in both modes**: {len(matched)} of {len(corpus)} files "
             f"({100.0 * len(matched) / max(1, len(corpus)):.1f} %)"
             + (f"; real exports: {sum(r.status == 'match' for r in real)} of {len(real)}." if real else "."), ""]
    by_flavour = {}
    for r in corpus:
        by_flavour.setdefault(r.flavour, []).append(r)
    lines += ["| flavour | files | matched |", "|---|---:|---:|"]
    for flavour in sort_key(list(by_flavour), FLAVOUR_ORDER):
        rs = by_flavour[flavour]
        lines.append(f"| {flavour} | {len(rs)} | {sum(r.status == 'match' for r in rs)} |")
    lines.append("")
    for family in sort_key(sorted({r.family for r in corpus}), FAMILY_ORDER):
        rs = [r for r in corpus if r.family == family]
        flavours = sort_key(sorted({r.flavour for r in rs}), FLAVOUR_ORDER)
        lines += [f"## {family[0].upper() + family[1:]}", "",
                  "| architecture | " + " | ".join(flavours) + " |", "|---|" + "---|" * len(flavours)]
        for arch in sorted({r.arch for r in rs}):
            cells = {r.flavour: cell(r) for r in rs if r.arch == arch}
            lines.append(f"| {arch} | " + " | ".join(cells.get(f, "") for f in flavours) + " |")
        lines.append("")
    if real:
        lines += ["## Real exports", "", "Published ONNX files that registry packages ship, at pinned versions and "
                  "checksums (bench/coverage/real_exports.py; the real MiniLM is the model tests' own, "
                  "scripts/fetch_real_model.py), run the same way.", "", "| model | kind | from | result |",
                  "|---|---|---|---|"]
        lines += [f"| {r.arch} | {r.family} | {r.about} | {cell(r)} |" for r in real]
        lines.append("")
    failures = [r for r in compared if r.status != "match"]
    if failures:
        lines += ["## Failures", ""]
        for r in failures:
            where = ""
            if r.first_divergence:
                d = r.first_divergence
                where = (f" First divergence (scripts/diff, passes {d['passes']}): node #{d['index']} '{d['name']}' "
                         f"({d['op_type']}), output '{d['output']}' {d['dtype']}{d['shape']}: "
                         f"{d['reason'] or 'max abs %.3g' % d['max_abs']}.")
                if is_rounding_step(d):
                    where += (" Integers one step apart where every earlier value, this node's float input included, "
                              "agrees with ORT's within the per-dtype tolerance: a value at a rounding boundary that "
                              "the two engines' float arithmetic puts on either side.")
            lines.append(f"- {r.arch} / {r.flavour} (`{r.path}`): {r.status.replace('_', ' ')}: {r.detail}.{where}")
        lines.append("")
    noted = [r for r in compared if r.notes]
    if noted:
        lines += ["## Notes", "", "Files compared at one shape only (\"(1 shape)\" in their cell):", ""]
        lines += [f"- {r.arch} / {r.flavour}: {r.notes}." for r in noted]
        lines.append("")
    no_reference = [r for r in results if r.status == "ort_error"]
    if no_reference:
        lines += ["## No reference", "", "ONNX Runtime could not run these files here (not counted above):", ""]
        lines += [f"- {r.arch} / {r.flavour}: {r.detail}" for r in no_reference]
        lines.append("")
    if failed_exports:
        lines += ["## Exports not in the matrix", "", "The corpus maker could not make these, or ORT could not run "
                  "them (so there is no reference):", ""]
        lines += [f"- {f['arch']} / {f['flavour']}: {f.get('error', '')[:300]}" for f in failed_exports]
        lines.append("")
    return "\n".join(lines)


def machine() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cpus)"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.transmuter.exists():
        raise SystemExit(f"{args.transmuter}: not found (./scripts/setup builds it)")
    started = time.perf_counter()
    entries, manifest = corpus_entries(args.corpus)
    if not args.no_real:
        entries += real_entries(args.real_cache)
    if args.only:
        entries = [e for e in entries if e.arch in args.only.split(",")]
    if args.flavours:
        entries = [e for e in entries if e.flavour in args.flavours.split(",")]
    results = []
    for i, entry in enumerate(entries, 1):
        r = check(entry, args.transmuter, args.work, args.perturb_node)
        results.append(r)
        print(f"[{i}/{len(entries)}] {entry.arch:24s} {entry.flavour:16s} {cell(r)[:90]}  ({r.seconds:.1f} s)",
              flush=True)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    # Changes to what a run writes (the document, the results) do not make the code dirty.
    if subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "--", ".",
                       ":!docs/coverage.md", ":!bench/results/coverage"], capture_output=True, text=True).stdout.strip():
        commit += "+dirty"
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit,
            "cpu": machine(), "minutes": (time.perf_counter() - started) / 60}
    full = not args.only and not args.flavours
    if args.json is None:
        args.json = REPO / "bench" / "results" / "coverage" / "latest.json" if full else args.work / "partial.json"
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"meta": meta, "versions": manifest.get("versions", {}),
                                     "results": [asdict(r) for r in results]}, indent=1) + "\n")
    if full:
        args.doc.write_text(markdown(results, manifest, meta))
        print(f"wrote {args.doc.relative_to(REPO) if args.doc.is_relative_to(REPO) else args.doc}")
    matched = sum(r.status == "match" for r in results)
    print(f"{matched} of {len(results)} files match ORT in both modes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
