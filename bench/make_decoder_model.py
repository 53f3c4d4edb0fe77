#!/usr/bin/env python3
"""The decode benchmark's model: a Llama-architecture decoder with random weights (TinyLlama's shape,
scaled down: hidden 512, 8 layers, 8 heads with 4 key/value heads (GQA), FFN 1536, vocab 32000, 4096
positions; 58M parameters, 233 MB fp32), exported as optimum's decoder-with-past (past_key_values.N.*
in, present.N.* out, position_ids), with the byte-level BPE fixture tokenizer beside it (its ids are a
subset of the vocabulary). Needs torch + transformers (the exporter), unlike the other bench models:

    /opt/export-venv/bin/python bench/make_decoder_model.py [--out-dir .cache/bench-models/llama_decoder]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from export_models import decoder_plan, eager, export  # noqa: E402

VOCAB, HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, POSITIONS = 32000, 512, 8, 8, 4, 1536, 4096


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=ROOT / ".cache" / "bench-models" / "llama_decoder")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = eager(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=POSITIONS,
        rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0))
    model = transformers.LlamaForCausalLM(config).eval()
    plan = decoder_plan("llama_decoder", model, LAYERS, KV_HEADS, HIDDEN // HEADS, VOCAB, 17, True)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    export(plan, args.out_dir / "model.onnx")
    config.to_json_file(str(args.out_dir / "config.json"))
    # No eos: every benchmark run generates exactly the tokens it asks for.
    (args.out_dir / "generation_config.json").write_text(json.dumps({"do_sample": False, "pad_token_id": 0}) + "\n")
    tokenizer = ROOT / "tests" / "text" / "fixtures" / "bytelevel_bpe"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / name, args.out_dir / name)
    print(args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
