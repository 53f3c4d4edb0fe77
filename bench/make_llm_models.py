#!/usr/bin/env python3
"""The LLM benchmark's models: a published model's configuration with random weights, built by
onnxruntime-genai's model builder in the formats published for it (bench/llm_bench.py measures them).

--model smollm2-135m (default; HuggingFaceTB/SmolLM2-135M's config.json): Llama architecture, hidden 576,
30 layers, 9 query heads on 3 key/value heads of width 64, FFN 1536, vocab 49152, tied embeddings, rope
theta 100000.
--model qwen2.5-0.5b (Qwen/Qwen2.5-0.5B's config.json): Qwen2 architecture (biased q/k/v projections),
hidden 896, 24 layers, 14 query heads on 2 key/value heads of width 64, FFN 4864, vocab 151936, tied
embeddings, rope theta 1000000: the size at which a q4 build's fixed costs (code, runtime) stop
dominating its peak RSS.
The weights are random (transformers' initializer, seeded); the tokenizer is the byte-level BPE fixture
(its ids are a subset of either vocabulary). The builder makes GroupQueryAttention with the
rotary embedding inside, SkipSimplifiedLayerNormalization, and for int4/int8 MatMulNBits weights with
the tied embedding as GatherBlockQuantized sharing the LM head's packed weight.

Builds (one folder each under --out-dir):
    fp32        float32 weights
    int4        MatMulNBits 4-bit, block 32, accuracy_level 4 (the builder's CPU default: ORT
                quantizes the activations to int8 per block)
    int4_acc1   the same weights, accuracy_level 1 (float32 activations, Transmuter's arithmetic)
    int8        MatMulNBits 8-bit, block 32, accuracy_level 4
    int8_acc1   the same, accuracy_level 1

Needs torch + transformers + onnxruntime-genai (the export environment, not CI):
    /opt/export-venv/bin/python bench/make_llm_models.py [--model qwen2.5-0.5b] [--only int4]
(folders under .cache/bench-models/<model>/, or --out-dir)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from make_genai_models import run_builder  # noqa: E402
TOKENIZER_DIR = ROOT / "tests" / "text" / "fixtures" / "bytelevel_bpe"
EOS = "<|endoftext|>"
# build name: builder precision and extra options.
BUILDS = {
    "fp32": ("fp32", []),
    "int4": ("int4", ["block_size=32", "accuracy_level=4"]),
    "int4_acc1": ("int4", ["block_size=32", "accuracy_level=1"]),
    "int8": ("int8", ["block_size=32", "accuracy_level=4"]),
    "int8_acc1": ("int8", ["block_size=32", "accuracy_level=1"]),
}


def smollm2_135m(eos_id: int) -> transformers.PreTrainedModel:
    config = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, head_dim=64, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, hidden_act="silu", bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def qwen2_5_0_5b(eos_id: int) -> transformers.PreTrainedModel:
    config = transformers.Qwen2Config(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True, hidden_act="silu", bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(config).eval()


# --model: the model factory and how build.json names it.
MODELS = {
    "smollm2-135m": (smollm2_135m, "SmolLM2-135M, random weights (seed 0)"),
    "qwen2.5-0.5b": (qwen2_5_0_5b, "Qwen2.5-0.5B, random weights (seed 0)"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2-135m")
    parser.add_argument("--out-dir", type=Path, help="default: .cache/bench-models/<model, - and . as _>")
    parser.add_argument("--only", nargs="*", choices=sorted(BUILDS), help="builds to make (default: all)")
    args = parser.parse_args()
    make_model, description = MODELS[args.model]
    out_dir = args.out_dir or ROOT / ".cache" / "bench-models" / args.model.replace("-", "_").replace(".", "_")
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(TOKENIZER_DIR / "tokenizer.json"),
                                                     eos_token=EOS, bos_token=EOS, pad_token=EOS)
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    model = make_model(eos_id)
    model.generation_config = transformers.GenerationConfig(bos_token_id=eos_id, eos_token_id=eos_id,
                                                            pad_token_id=eos_id, do_sample=False)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "checkpoint"
        model.save_pretrained(str(checkpoint))
        tokenizer.save_pretrained(str(checkpoint))
        for name in args.only or BUILDS:
            precision, extra = BUILDS[name]
            out = out_dir / name
            if out.exists():
                shutil.rmtree(out)
            run_builder(checkpoint, out, precision, extra, Path(tmp) / "cache")
            for file in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
                if (checkpoint / file).exists() and not (out / file).exists():
                    shutil.copy(checkpoint / file, out / file)
            (out / "build.json").write_text(json.dumps({
                "made_by": "bench/make_llm_models.py", "config": description,
                "precision": precision, "builder_options": extra}, indent=1) + "\n")
            size = sum(f.stat().st_size for f in out.glob("model.onnx*"))
            print(f"{out}: {size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
