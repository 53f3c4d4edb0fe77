#!/usr/bin/env python3
"""LLM benchmark with real shapes: SmolLM2-135M's or Qwen2.5-0.5B's configuration (bench/make_llm_models.py:
random weights, built by onnxruntime-genai's model builder in fp32, int4 and int8), Transmuter against an
ONNX Runtime loop on the same files, rounds alternating, same thread count.

Each engine runs in a fresh process per round (so load time and peak RSS are its own), in an order
that alternates by round:
  * transmuter: `transmuter generate DIR --mode compiled --jsonl` under /usr/bin/time (peak RSS) on
    the prompt twice: each call's summary line gives the first token's latency (the prefill) and the
    tokens/s after it (the decode steps). The first call's decode includes compiling the step's plan
    (reported as "cold"); the second reuses it and is the one compared. Load time from `transmuter
    info` (load + passes, e.g. packing);
  * ort: this script with --ort-worker: InferenceSession (default graph optimizations) timed as the
    load, then the loop onnxruntime-genai runs for these models: the whole prompt with an empty past,
    then one token per step with the presents fed back and the attention mask grown, numpy argmax.
Both engines decode greedily with eos banned for the first --new-tokens tokens (transmuter's
--min-new-tokens), so every round generates the same number of tokens.

Reported per build: load ms, prefill ms for --prompt-tokens tokens, decode ms per token (median of
the steps), peak RSS against the file size + the KV cache of the whole context (float32: 2 x layers x
kv heads x head size x 4 bytes a token), and how many leading tokens the two engines agree on
(accuracy_level 4 builds make ORT quantize the activations to int8, which Transmuter does not, so
their greedy paths may part; the *_acc1 builds compute the same float32 math in both).

    .venv/bin/python bench/llm_bench.py [--models .cache/bench-models/smollm2_135m] [--builds int4 int8 ...]
        [--rounds 3] [--prompt-tokens 128] [--new-tokens 64] [--doc llm_performance.md] [--no-write]
Writes bench/results/llm/<UTC time>.json and docs/<--doc> (docs/llm_performance_qwen2_5_0_5b.md for the
Qwen2.5-0.5B builds: --models .cache/bench-models/qwen2_5_0_5b --builds int4 --doc ...).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from host import machine, save_run  # noqa: E402
SUMMARY = re.compile(r"(\d+) prompt tokens, (\d+) generated; first token after ([\d.]+) ms, then ([\d.]+) tokens/s")
LOAD_LINE = re.compile(r"load_ms: ([\d.]+)")
TEXT = ("The history of the town goes back to a small market by the river, where farmers from the hills sold "
        "wool, cheese and timber to boatmen who carried them down to the coast. ")


def prompt_of(folder: Path, count: int) -> tuple[list[int], str]:
    """The benchmark prompt: its first `count` token ids and their text (what transmuter re-encodes)."""
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = tokenizer.encode(TEXT * (1 + count // 8), add_special_tokens=False).ids
    if len(ids) < count:
        raise SystemExit(f"the prompt text gives only {len(ids)} tokens")
    return ids[:count], tokenizer.decode(ids[:count])


# ---------------------------------------------------------------------------------------------
# ONNX Runtime, in its own process.

def ort_worker(folder: Path, ids: list[int], new_tokens: int, threads: int, eos: int) -> dict:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    start = time.perf_counter()
    session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
    load_ms = (time.perf_counter() - start) * 1e3
    inputs = {i.name: i for i in session.get_inputs()}
    past = [i for i in inputs.values() if i.name.startswith("past_key_values.")]
    outputs = [o.name for o in session.get_outputs()]
    id_type = np.int32 if inputs["input_ids"].type == "tensor(int32)" else np.int64
    mask_type = np.int32 if inputs["attention_mask"].type == "tensor(int32)" else np.int64
    # genai builds leave the head size symbolic (kv_cache_dim): config.json has it.
    config = json.loads((folder / "config.json").read_text())
    kv_heads = config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    feed = {p.name: np.zeros((1, kv_heads, 0, head_dim), np.float32) for p in past}
    tokens, step_ms, prefill_ms = list(ids), [], 0.0
    step_ids = np.array([ids], id_type)
    for step in range(new_tokens):
        start = time.perf_counter()
        feed["input_ids"] = step_ids
        feed["attention_mask"] = np.ones((1, len(tokens)), mask_type)
        out = dict(zip(outputs, session.run(None, feed)))
        logits = out["logits"][0, -1]
        logits[eos] = -np.inf  # min_new_tokens = new_tokens: eos never ends the run
        next_id = int(np.argmax(logits))
        for p in past:
            feed[p.name] = out[p.name.replace("past_key_values", "present")]
        tokens.append(next_id)
        step_ids = np.array([[next_id]], id_type)
        elapsed = (time.perf_counter() - start) * 1e3
        if step == 0:
            prefill_ms = elapsed
        else:
            step_ms.append(elapsed)
    return {"load_ms": load_ms, "prefill_ms": prefill_ms, "decode_ms": statistics.median(step_ms),
            "tokens": tokens[len(ids):]}


def run_ort(folder: Path, ids: list[int], new_tokens: int, threads: int, eos: int) -> dict:
    request = json.dumps({"folder": str(folder), "ids": ids, "new_tokens": new_tokens, "threads": threads, "eos": eos})
    result = subprocess.run(["/usr/bin/time", "-f", "%M", sys.executable, __file__, "--ort-worker"], input=request,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"the ORT worker failed:\n{result.stderr}")
    figures = json.loads(result.stdout)
    figures["peak_rss_mib"] = int(result.stderr.strip().splitlines()[-1]) / 1024
    return figures


# ---------------------------------------------------------------------------------------------
# Transmuter.

def run_transmuter(binary: Path, folder: Path, prompt: str, new_tokens: int, threads: int) -> dict:
    """Two generate calls in one process: the first ("cold") compiles the decode step's plan, the second
    reuses it (what a server or a chat's later turns see); both are reported, the warm one compared."""
    env = dict(os.environ, TRANSMUTER_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS="1")
    info = subprocess.run([str(binary), "info", str(folder / "model.onnx")], capture_output=True, text=True, env=env)
    if info.returncode != 0:
        raise SystemExit(f"transmuter info failed:\n{info.stderr}")
    load_ms = float(LOAD_LINE.search(info.stdout)[1])
    result = subprocess.run(["/usr/bin/time", "-f", "%M", str(binary), "generate", str(folder), "--mode", "compiled",
                             "--max-new-tokens", str(new_tokens), "--min-new-tokens", str(new_tokens), "--jsonl"],
                            input=f"{prompt}\n{prompt}\n", capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise SystemExit(f"transmuter generate failed:\n{result.stderr}")
    cold, warm = SUMMARY.findall(result.stderr)[:2]
    lines = result.stdout.splitlines()
    if json.loads(lines[0])["tokens"] != json.loads(lines[1])["tokens"]:
        raise SystemExit("transmuter generated different tokens for the same prompt in one process")
    return {"load_ms": load_ms, "prefill_ms": float(warm[2]), "decode_ms": 1e3 / float(warm[3]),
            "cold_prefill_ms": float(cold[2]), "cold_decode_ms": 1e3 / float(cold[3]),
            "prompt_tokens": int(warm[0]), "tokens": json.loads(lines[0])["tokens"],
            "peak_rss_mib": int(result.stderr.strip().splitlines()[-1]) / 1024}


# ---------------------------------------------------------------------------------------------

def model_facts(folder: Path, context: int) -> dict:
    config = json.loads((folder / "config.json").read_text())
    layers, kv_heads = config["num_hidden_layers"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    kv_mib = 2 * layers * kv_heads * head_dim * 4 * context / 2**20
    file_mib = sum(f.stat().st_size for f in folder.glob("model.onnx*")) / 2**20
    build = json.loads((folder / "build.json").read_text()) if (folder / "build.json").exists() else {}
    shape = {"name": build.get("config", folder.parent.name), "architecture": (config.get("architectures") or ["?"])[0],
             "hidden": config["hidden_size"], "layers": layers, "heads": config["num_attention_heads"],
             "kv_heads": kv_heads, "head_dim": head_dim, "ffn": config["intermediate_size"],
             "vocab": config["vocab_size"], "tied": bool(config.get("tie_word_embeddings"))}
    return {"file_mib": file_mib, "kv_cache_mib": kv_mib, "builder_options": build.get("builder_options"),
            "precision": build.get("precision"), "eos": config.get("eos_token_id"), "model": shape}


def agreed_prefix(a: list[int], b: list[int]) -> int:
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


def bench_build(args, name: str, binary: Path) -> dict:
    folder = args.models / name
    ids, prompt = prompt_of(folder, args.prompt_tokens)
    facts = model_facts(folder, len(ids) + args.new_tokens)
    rounds = []
    for index in range(args.rounds):
        order = ["ort", "transmuter"] if index % 2 == 0 else ["transmuter", "ort"]
        figures = {}
        for engine in order:
            if engine == "ort":
                figures["ort"] = run_ort(folder, ids, args.new_tokens, args.threads, facts["eos"])
            else:
                figures["transmuter"] = run_transmuter(binary, folder, prompt, args.new_tokens, args.threads)
        t, o = figures["transmuter"], figures["ort"]
        if t["prompt_tokens"] != len(ids):
            raise SystemExit(f"transmuter read {t['prompt_tokens']} prompt tokens, ORT {len(ids)}")
        figures.update(round=index + 1, loadavg=os.getloadavg(), agreed_tokens=agreed_prefix(t["tokens"], o["tokens"]),
                       decode_ratio=t["decode_ms"] / o["decode_ms"], prefill_ratio=t["prefill_ms"] / o["prefill_ms"])
        for engine in ("transmuter", "ort"):
            del figures[engine]["tokens"]
        rounds.append(figures)
        print(f"{name} round {index + 1}: decode {t['decode_ms']:.2f} vs ORT {o['decode_ms']:.2f} ms/token "
              f"({figures['decode_ratio']:.2f}), prefill {t['prefill_ms']:.0f} vs {o['prefill_ms']:.0f} ms, load "
              f"{t['load_ms']:.0f} vs {o['load_ms']:.0f} ms, RSS {t['peak_rss_mib']:.0f} vs {o['peak_rss_mib']:.0f} MiB, "
              f"agreed {figures['agreed_tokens']}/{args.new_tokens}, load avg {figures['loadavg'][0]:.2f}", flush=True)

    def median(engine: str, key: str) -> float:
        return statistics.median(r[engine][key] for r in rounds)

    keys = ("load_ms", "prefill_ms", "decode_ms", "peak_rss_mib")
    summary = {engine: {key: median(engine, key) for key in keys} for engine in ("transmuter", "ort")}
    summary["transmuter"]["cold_decode_ms"] = median("transmuter", "cold_decode_ms")
    summary["decode_ratio"] = statistics.median(r["decode_ratio"] for r in rounds)
    summary["prefill_ratio"] = statistics.median(r["prefill_ratio"] for r in rounds)
    summary["rss_over_file_plus_kv"] = summary["transmuter"]["peak_rss_mib"] / (facts["file_mib"] + facts["kv_cache_mib"])
    return {"build": name, "prompt_tokens": len(ids), **facts, "rounds": rounds, "summary": summary}


def model_line(m: dict) -> str:
    """The model's configuration in words, from its config.json and build.json (bench_build's "model")."""
    name = m["name"].split(",")[0]
    return (f"{name}'s configuration with random weights (`bench/make_llm_models.py`: {m['architecture']}, hidden "
            f"{m['hidden']}, {m['layers']} layers, {m['heads']} query heads on {m['kv_heads']} key/value heads of width "
            f"{m['head_dim']}, FFN {m['ffn']}, vocab {m['vocab']}{', tied embeddings' if m['tied'] else ''})")


def write_doc(result: dict, path: Path) -> None:
    m = result["machine_before"]
    rows = []
    for b in result["builds"]:
        s, t, o = b["summary"], b["summary"]["transmuter"], b["summary"]["ort"]
        agreed = min(r["agreed_tokens"] for r in b["rounds"])
        rows.append(f"| {b['build']} | {b['file_mib']:.0f} | {t['load_ms']:.0f} / {o['load_ms']:.0f} | "
                    f"{t['prefill_ms']:.0f} / {o['prefill_ms']:.0f} ({s['prefill_ratio']:.2f}) | "
                    f"{t['decode_ms']:.2f} / {o['decode_ms']:.2f} (**{s['decode_ratio']:.2f}**) | "
                    f"{t['cold_decode_ms']:.2f} | "
                    f"{t['peak_rss_mib']:.0f} / {o['peak_rss_mib']:.0f} ({s['rss_over_file_plus_kv']:.2f}) | "
                    f"{agreed}/{result['new_tokens']} |")
    text = f"""# LLM performance (real shapes)

Generated by `bench/llm_bench.py` from `{result['json']}`; do not edit by hand.

Model: {model_line(result['builds'][0]['model'])}, built
by onnxruntime-genai's model builder (GroupQueryAttention with rotary inside, SkipSimplifiedLayerNormalization;
int4/int8: MatMulNBits block 32, the tied embedding as GatherBlockQuantized). Batch 1, a prompt of
{result['prompt_tokens']} tokens, {result['new_tokens']} new tokens (greedy, eos banned), {result['threads']}
threads for both engines, each engine in a fresh process per round, rounds alternating. Transmuter:
`transmuter generate --mode compiled` (static cache); ONNX Runtime {result['ort_version']} (default graph
optimizations) in the loop onnxruntime-genai runs. Medians over {result['rounds']} rounds; ratios are
medians of per-round ratios (Transmuter / ORT). accuracy_level 4 (the builder's CPU default) makes both
engines round the activations to int8 per block (Transmuter as ORT does, then an integer GEMV). A last-bit
float difference flips an int8 rounding now and then, and the layers amplify it: Transmuter's own two
level-4 GEMVs, equal but for the order of their sums, give logits 0.7 % of the largest apart after
Qwen2.5-0.5B's 24 layers (2026-12-03). So the level-4 builds' greedy paths may part early; the *_acc1
builds (float32 in both engines) are the like-for-like check.

CPU: {m['cpu']} ({m['cpus']} cores); load average at the start {m['loadavg'][0]:.2f}, at the end
{result['machine_after']['loadavg'][0]:.2f}; {m['date']}.

| build | file MiB | load ms (T / ORT) | prefill ms (T / ORT, ratio) | decode ms/token (T / ORT, ratio) | T's first call, decode ms/token (plan compiled) | peak RSS MiB (T / ORT, T / (file + KV)) | tokens agreed |
|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}

KV cache of the whole context in float32: {result['builds'][0]['kv_cache_mib']:.1f} MiB.
Per-round figures and load averages are in the JSON.
"""
    path.write_text(text)


def main() -> int:
    if "--ort-worker" in sys.argv:
        request = json.loads(sys.stdin.read())
        print(json.dumps(ort_worker(Path(request["folder"]), request["ids"], request["new_tokens"], request["threads"],
                                    request["eos"])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=Path, default=ROOT / ".cache" / "bench-models" / "smollm2_135m")
    parser.add_argument("--builds", nargs="+", default=["fp32", "int4_acc1", "int4", "int8_acc1", "int8"])
    parser.add_argument("--binary", type=Path, default=Path(os.environ.get("TRANSMUTER_BIN", ROOT / "build" / "transmuter")))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--doc", default="llm_performance.md", help="the page under docs/ the run writes")
    parser.add_argument("--no-write", action="store_true", help="print only: no JSON, no docs page")
    args = parser.parse_args()

    import onnxruntime as ort
    result = {"machine_before": machine(), "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
              "threads": args.threads, "rounds": args.rounds, "ort_version": ort.__version__, "builds": []}
    for name in args.builds:
        result["builds"].append(bench_build(args, name, args.binary))
    result["machine_after"] = machine()
    if args.no_write:
        return 0
    save_run(result, ROOT, "llm", args.doc, write_doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
