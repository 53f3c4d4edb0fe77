#!/usr/bin/env python3
"""Decode benchmark: `transmuter generate` against a greedy decode loop driven through ONNX Runtime on
the same export (bench/make_decoder_model.py), rounds alternating, same thread count.

Per engine and round: the prompt is prefilled, then N tokens are generated greedily; the figure is the
per-token latency of the decode steps (the first token excluded): Transmuter's from the summary line
`transmuter generate` prints (tokens/s after the first token), ORT's from timing its loop's steps
(session.run on one token with the past fed back, plus the argmax). Both generate the same tokens (checked).
Also: the compiled plans Transmuter's decode steps built, and peak RSS for 1,000 vs 10,000 generated
tokens in one process (flat memory: the static cache is preallocated and reused).

    .venv/bin/python bench/decode_bench.py [--model DIR] [--new-tokens 256] [--rounds 5]
Writes bench/results/decode/<UTC time>.json and docs/decode_performance.md.
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
import onnxruntime as ort
from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from host import machine, save_run  # noqa: E402
PROMPT = "The quick brown fox jumps over the lazy dog, and then"
SUMMARY = re.compile(r"(\d+) prompt tokens, (\d+) generated; first token after ([\d.]+) ms, then ([\d.]+) tokens/s;"
                     r" ([\d.]+) s in all(?:; (\d+) compiled plans)?")


class OrtLoop:
    """optimum's decode loop: prefill with an empty past, then one token per step with the presents
    fed back as the past, greedy argmax of the last logits."""

    def __init__(self, model: Path, threads: int):
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(model / "model.onnx"), options, providers=["CPUExecutionProvider"])
        self.past = [i for i in self.session.get_inputs() if i.name.startswith("past_key_values.")]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def generate(self, ids: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
        kv_heads, head_dim = self.past[0].shape[1], self.past[0].shape[3]
        feed = {p.name: np.zeros((1, kv_heads, 0, head_dim), np.float32) for p in self.past}
        tokens, step_times = list(ids), []
        step_ids = np.array([ids], np.int64)
        for step in range(new_tokens):
            start = time.perf_counter()
            length = len(tokens)
            feed["input_ids"] = step_ids
            feed["attention_mask"] = np.ones((1, length), np.int64)
            feed["position_ids"] = np.arange(length - step_ids.shape[1], length, dtype=np.int64)[None]
            out = dict(zip(self.outputs, self.session.run(None, feed)))
            next_id = int(np.argmax(out["logits"][0, -1]))
            for p in self.past:
                feed[p.name] = out[p.name.replace("past_key_values", "present")]
            tokens.append(next_id)
            step_ids = np.array([[next_id]], np.int64)
            if step > 0:
                step_times.append(time.perf_counter() - start)
        return tokens[len(ids):], step_times


def run_transmuter(binary: Path, model: Path, prompts: list[str], new_tokens: int, mode: str,
                   passes: str = "default") -> tuple[str, list[dict]]:
    result = subprocess.run([str(binary), "generate", str(model), "--max-new-tokens", str(new_tokens), "--mode", mode,
                             "--jsonl", "--passes", passes],
                            input="\n".join(prompts) + "\n", capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"transmuter generate failed:\n{result.stderr}")
    summaries = []
    for match in SUMMARY.finditer(result.stderr):
        summaries.append({"prompt_tokens": int(match[1]), "generated": int(match[2]), "first_token_ms": float(match[3]),
                          "tokens_per_s": float(match[4]), "total_s": float(match[5]),
                          "plans": int(match[6]) if match[6] else None})
    return result.stdout, summaries


def peak_rss_kib(binary: Path, model: Path, prompts: int, new_tokens: int) -> int:
    result = subprocess.run(["/usr/bin/time", "-f", "%M", str(binary), "generate", str(model), "--max-new-tokens",
                             str(new_tokens), "--mode", "compiled", "--jsonl"], input="\n".join([PROMPT] * prompts) + "\n",
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"transmuter generate failed:\n{result.stderr}")
    return int(result.stderr.strip().splitlines()[-1])


def write_doc(result: dict, path: Path) -> None:
    m = result["machine_before"]
    rows = []
    for r in result["rounds"]:
        rows.append(f"| {r['round']} | {r['ort_ms']:.2f} | {r['transmuter_ms']:.2f} | {r['ratio']:.2f} | "
                    f"{r['plans']} | {r['loadavg'][0]:.2f} |")
    memory = result["memory"]
    text = f"""# Decode performance

Generated by `bench/decode_bench.py` from `{result['json']}`; do not edit by hand.

Model: `bench/make_decoder_model.py` (Llama architecture, random weights: hidden 512, 8 layers, 8 heads /
4 key-value heads, vocab 32000; 58M parameters, fp32), exported as optimum's decoder with past. Prompt
{result['prompt_tokens']} tokens, {result['new_tokens']} new tokens, greedy, batch 1, {result['threads']} threads
for both engines. Transmuter: `transmuter generate --mode compiled` (static cache, one compiled plan for
the decode steps); ONNX Runtime {ort.__version__} (default graph optimizations): the optimum-style loop
(dynamic past fed back, numpy argmax). Per-token latency of the decode steps, the first token excluded,
rounds alternating between the engines.

CPU: {m['cpu']} ({m['cpus']} cores); load average at the start {m['loadavg'][0]:.2f}, at the end
{result['machine_after']['loadavg'][0]:.2f}; {m['date']}.

| round | ORT ms/token | Transmuter ms/token | Transmuter / ORT | compiled plans | load |
|---|---|---|---|---|---|
{chr(10).join(rows)}

Median of the rounds' ratios: **{result['median_ratio']:.2f}**. Both engines generated the same tokens: {result['same_tokens']}.

Memory: peak RSS of one `transmuter generate` process generating {memory['small_tokens']} tokens
({memory['small_prompts']} prompts) {memory['small_kib'] / 1024:.0f} MiB, {memory['large_tokens']} tokens
({memory['large_prompts']} prompts) {memory['large_kib'] / 1024:.0f} MiB (ratio {memory['ratio']:.3f}).
"""
    path.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=ROOT / ".cache" / "bench-models" / "llama_decoder")
    parser.add_argument("--binary", type=Path, default=Path(os.environ.get("TRANSMUTER_BIN", ROOT / "build" / "transmuter")))
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--memory-prompts", type=int, default=40, help="prompts of 250 tokens for the RSS check")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--passes", default="default", help="Transmuter's load-time passes (transmuter --passes)")
    parser.add_argument("--no-write", action="store_true", help="print only: no JSON, no docs/decode_performance.md")
    args = parser.parse_args()

    tokenizer = Tokenizer.from_file(str(args.model / "tokenizer.json"))
    ids = tokenizer.encode(PROMPT).ids
    ort_loop = OrtLoop(args.model, args.threads)
    result = {"machine_before": machine(), "prompt_tokens": len(ids), "new_tokens": args.new_tokens,
              "threads": args.threads, "passes": args.passes, "rounds": []}
    ort_loop.generate(ids, 8)  # warm-up
    same_tokens = True
    for round_index in range(args.rounds):
        order = ["ort", "transmuter"] if round_index % 2 == 0 else ["transmuter", "ort"]
        figures = {}
        for engine in order:
            if engine == "ort":
                tokens, steps = ort_loop.generate(ids, args.new_tokens)
                figures["ort_ms"] = statistics.median(steps) * 1e3
                ort_tokens = tokens
            else:
                text, summaries = run_transmuter(args.binary, args.model, [PROMPT], args.new_tokens, "compiled", args.passes)
                figures["transmuter_ms"] = 1e3 / summaries[0]["tokens_per_s"]
                figures["plans"] = summaries[0]["plans"]
                ours = json.loads(text.splitlines()[0])["tokens"]
        same_tokens &= ours == ort_tokens
        figures.update(round=round_index + 1, ratio=figures["transmuter_ms"] / figures["ort_ms"], loadavg=os.getloadavg())
        result["rounds"].append(figures)
        print(f"round {round_index + 1}: ORT {figures['ort_ms']:.2f} ms/token, Transmuter {figures['transmuter_ms']:.2f}"
              f" ms/token, ratio {figures['ratio']:.2f}, plans {figures['plans']}, load {figures['loadavg'][0]:.2f}", flush=True)
    result["same_tokens"] = same_tokens
    result["median_ratio"] = statistics.median(r["ratio"] for r in result["rounds"])

    if args.no_write:
        return 0
    per_prompt = 250
    small, large = max(1, args.memory_prompts // 10), args.memory_prompts
    small_kib = peak_rss_kib(args.binary, args.model, small, per_prompt)
    large_kib = peak_rss_kib(args.binary, args.model, large, per_prompt)
    result["memory"] = {"small_prompts": small, "small_tokens": small * per_prompt, "small_kib": small_kib,
                        "large_prompts": large, "large_tokens": large * per_prompt, "large_kib": large_kib,
                        "ratio": large_kib / small_kib}
    print(f"peak RSS: {small * per_prompt} tokens {small_kib / 1024:.0f} MiB, {large * per_prompt} tokens "
          f"{large_kib / 1024:.0f} MiB")
    result["machine_after"] = machine()

    save_run(result, ROOT, "decode", "decode_performance.md", write_doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
