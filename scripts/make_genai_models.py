#!/usr/bin/env python3
"""Decoders made by onnxruntime-genai's model builder, with onnxruntime-genai's own greedy outputs.

onnxruntime-genai's builder (python -m onnxruntime_genai.models.builder) makes most of the LLM
exports published for ONNX Runtime: GroupQueryAttention with the rotary embedding inside,
SkipSimplifiedLayerNormalization, MatMulNBits weights for int4. This script rebuilds the tiny random
Llama of scripts/make_generation_models.py (same seed, same eos row scale) and tiny Qwen2, Phi-3,
Gemma, Gemma 2 and gpt-oss built here (an fp32 build must choose transformers' tokens), saves each
as a Hugging Face checkpoint with the fixture tokenizer, runs the builder on it for each precision in
PRECISIONS, and runs onnxruntime-genai's Generator (greedy) on the fixture's prompts.

Run by hand (needs torch, transformers 5.23, onnxruntime-genai; CI has none of them):
    /opt/export-venv/bin/python scripts/make_genai_models.py [--only FAMILY ...]

Writes tests/models/genai_<family>_fp16/ (FP16_BUILDS: model, inputs.json; a prefill against ORT) and
tests/pipelines/fixtures/genai_<family>_<precision>/ (BUILDS lists them):
    model.onnx, model.onnx.data   the builder's output
    genai_config.json             the builder's
    tokenizer.json, tokenizer_config.json, config.json, generation_config.json
    expected.json                 per prompt: its ids and onnxruntime-genai's greedy new token ids
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime_genai as og
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_generation_models as gen  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "pipelines" / "fixtures"
# precision: extra builder options. int4 asks for accuracy_level 1 (float32 activations): the builder's
# CPU default, 4, makes ORT quantize the activations to int8 per block, which Transmuter does not
# emulate (it computes level 4 in float32, within 1e-2 of ORT: scripts/contrib_cases/quantized_weights.py),
# so greedy tokens could not be compared exactly.
PRECISIONS = {"fp32": [], "int4": ["block_size=32", "accuracy_level=1"]}
# family: the precisions built for it. Llama is make_generation_models.py's; the qwen2 and phi3 fixtures
# there do not suit ORT's CPU GroupQueryAttention (qwen2's heads are 8 wide, phi3's partial rotary cache
# 4: it wants multiples of 16 and 8), so those and the other families are built here (FRESH) with
# 16-wide heads, and their greedy reference is transformers' generate().
BUILDS = {name: ["fp32", "int4"] for name in ("llama", "qwen2_h16", "phi3_h16", "gemma", "gemma2")}
# gpt-oss's int4 build reads the published checkpoint's MXFP4 expert tensors, which a random one lacks.
BUILDS["gpt_oss"] = ["fp32"]
BUILDS["lfm2_moe"] = ["fp32", "int4"]
PROMPTS = ["The quick brown fox", "Hello world", "one two three"]
MAX_NEW_TOKENS = 16


def small(config_class, **fields):
    """A tiny decoder's config: hidden 64 in 2 layers, 4 query heads of width 16 on 2 key/value heads
    (ORT's CPU GroupQueryAttention wants head and rotary widths in multiples of 16 and 8)."""
    shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False, initializer_range=0.3)
    shape.update(fields)
    return gen.eager(config_class(**shape))


# family: (model class, its config). Qwen2 gets random q/k/v biases (fresh ones are zero).
FRESH = {
    "qwen2_h16": lambda ids: (transformers.Qwen2ForCausalLM,
                              small(transformers.Qwen2Config, rms_norm_eps=1e-6, use_sliding_window=False, **ids)),
    # Phi-3: fused qkv_proj and gate_up_proj, full rotary.
    "phi3_h16": lambda ids: (transformers.Phi3ForCausalLM,
                             small(transformers.Phi3Config, original_max_position_embeddings=64, **ids)),
    # Gemma: embeddings scaled by sqrt(hidden), RMSNorm weights as 1 + w, tanh-GELU gated MLP.
    "gemma": lambda ids: (transformers.GemmaForCausalLM,
                          small(transformers.GemmaConfig, head_dim=16, hidden_activation="gelu_pytorch_tanh",
                                tie_word_embeddings=True, **ids)),
    # Gemma 2: attention logits soft-capped inside GroupQueryAttention, final logits soft-capped, norms
    # after attention and MLP too, a sliding window on every other layer.
    "gemma2": lambda ids: (transformers.Gemma2ForCausalLM,
                           small(transformers.Gemma2Config, head_dim=16, hidden_activation="gelu_pytorch_tanh",
                                 attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=8,
                                 query_pre_attn_scalar=16, tie_word_embeddings=True, **ids)),
    # gpt-oss: a mixture of 4 experts, 2 routed per token (com.microsoft MoE / QMoE with gpt-oss's clamped
    # SwiGLU), attention sinks (GroupQueryAttention's head_sink) and a sliding window on every other layer.
    "gpt_oss": lambda ids: (transformers.GptOssForCausalLM,
                            small(transformers.GptOssConfig, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                  sliding_window=8, **ids)),
    # LFM2-MoE: a short-convolution layer, an attention layer (q/k norms) and two MoE layers of 4
    # experts (2 routed, sigmoid router with an expert bias, fed to com.microsoft MoE / QMoE as
    # log-sigmoid scores) after one dense layer.
    "lfm2_moe": lambda ids: (transformers.Lfm2MoeForCausalLM,
                             small(transformers.Lfm2MoeConfig, num_hidden_layers=4, moe_intermediate_size=64,
                                   num_experts=4, num_experts_per_tok=2, num_dense_layers=1,
                                   layer_types=["conv", "full_attention", "conv", "full_attention"],
                                   tie_word_embeddings=True, **ids)),
}


def fresh_family(name: str, tokenizer):
    """A family built here (not in make_generation_models.py), with transformers' greedy generate() on the
    first prompt as its reference."""
    eos_id = tokenizer.convert_tokens_to_ids(gen.EOS)
    torch.manual_seed(gen.SEED)
    model_class, config = FRESH[name](gen.special_ids(len(tokenizer), eos_id))
    model = model_class(config)
    if name == "qwen2_h16":
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0.0, 0.3)
    gen.randomize_norms(model, torch.Generator().manual_seed(gen.SEED))
    model.eval()
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id, do_sample=False)
    ids = tokenizer(PROMPTS[0], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    single = {"name": "single", "prompts": [PROMPTS[0]], "new_token_ids": [out[0, ids.shape[1]:].tolist()]}
    return gen.Family(name, model, 17), {"cases": [single]}


def rebuild(name: str, tokenizer):
    if name in FRESH:
        return fresh_family(name, tokenizer)
    expected = json.loads((FIXTURES / f"{name}_decoder" / "expected.json").read_text())
    eos_id = expected["eos_token_id"]
    family = gen.build(name, len(tokenizer), eos_id)
    with torch.no_grad():
        row = gen.output_embedding_row(family, eos_id)
        row.copy_(row * expected["eos_logit_row_scale"])
    return family, expected


def run_builder(checkpoint: Path, out: Path, precision: str, extra: list[str], cache: Path) -> None:
    """onnxruntime-genai's model builder for the CPU on a saved checkpoint (extra: its --extra_options)."""
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(out),
               "-p", precision, "-e", "cpu", "-c", str(cache)]
    if extra:
        command += ["--extra_options", *extra]
    subprocess.run(command, check=True)


def greedy_genai(folder: Path, prompt_ids: list[int]) -> list[int]:
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt_ids) + MAX_NEW_TOKENS)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt_ids], dtype=np.int32))
    new = []
    while not generator.is_done():
        generator.generate_next_token()
        new.append(int(generator.get_next_tokens()[0]))
    return new


# fp16 builds for the CPU (the builder's -p fp16 -e cpu: MultiHeadAttention after a repeat_kv, float16
# weights and cache). ONNX Runtime 1.31.1 runs them only without a past (with one, its CPU session
# fails in the builder's mask subgraph's Expand or in a buffer reuse), so neither onnxruntime-genai's
# Generator nor a decode step can be the reference: they go to tests/models/ as a prefill (empty past)
# that tests/models/test_models.py compares with ORT's, logits and presents.
FP16_BUILDS = ["llama", "qwen2_h16", "phi3_h16", "gemma"]
MODELS = FIXTURES.parents[1] / "models"
FP16_TOLERANCE = {
    "tolerance": 0.05,
    "tolerance_reason": (
        "float16 decoder (onnxruntime-genai builder, -p fp16 -e cpu): ONNX Runtime computes each op in float16 and "
        "rounds after each; transmuter computes in float32 and rounds once at the outputs (--passes none: float16 "
        "as written). Logits reach 8.2-9.8, where a float16 ulp is 0.0078; worst measured over the Llama, Qwen2, "
        "Phi-3 and Gemma builds 0.0283 (3.6 ulps, Llama, with passes) and 0.0352 (4.5 ulps, Gemma, float16 as "
        "written); presents 0.0156 (2026-12-06). 0.05 is 6.4 ulps"),
}


def fp16_prefill_spec(name: str, model_path: Path, config) -> dict:
    """inputs.json for a genai fp16 build: batch 2 (the last row right-padded), 5 new tokens, empty past."""
    import onnx

    graph = onnx.load(str(model_path), load_external_data=False).graph
    inputs = [
        {"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence_length"], "kind": "token_ids",
         "range": [0, config.vocab_size]},
        {"name": "attention_mask", "dtype": "int64", "shape": ["batch", "past_sequence_length+sequence_length"],
         "kind": "attention_mask"},
        {"name": "position_ids", "dtype": "int64", "shape": ["batch", "sequence_length"], "kind": "position_ids"},
    ]
    head_size = config.hidden_size // config.num_attention_heads
    for value in graph.input:
        if value.name.startswith("past_key_values."):
            inputs.append({"name": value.name, "dtype": "float16",
                           "shape": ["batch", config.num_key_value_heads, "past_sequence_length", head_size],
                           "kind": "float"})
    known = {i["name"] for i in inputs}
    missing = [v.name for v in graph.input if v.name not in known]
    if missing:
        raise SystemExit(f"{name}: inputs this script does not know how to build: {missing}")
    return {"model": name, "dims": {"batch": 2, "sequence_length": 5, "past_sequence_length": 0},
            "inputs": inputs, "outputs": [v.name for v in graph.output],
            "generated_by": "scripts/make_genai_models.py",
            "about": "onnxruntime-genai builder, -p fp16 -e cpu; prefill only (see FP16_BUILDS in the script)",
            **FP16_TOLERANCE}


def build_fp16(family_name: str, tokenizer) -> None:
    family, _ = rebuild(family_name, tokenizer)
    out = MODELS / f"genai_{family_name}_fp16"
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "checkpoint"
        family.model.save_pretrained(str(checkpoint))
        for name in ("tokenizer.json", "tokenizer_config.json"):  # the builder reads them
            shutil.copy(FIXTURES / "llama_decoder" / name, checkpoint / name)
        built = Path(tmp) / "built"
        run_builder(checkpoint, built, "fp16", [], Path(tmp) / "cache")
        if out.exists():
            shutil.rmtree(out)
        out.mkdir()
        for name in ("model.onnx", "model.onnx.data"):
            shutil.copy(built / name, out / name)
        spec = fp16_prefill_spec(out.name, out / "model.onnx", family.model.config)
    (out / "inputs.json").write_text(json.dumps(spec, indent=2) + "\n")
    print(f"{out}: {len(spec['outputs'])} outputs")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(BUILDS), help="families to build (default: all)")
    parser.add_argument("--fp16-only", action="store_true", help="only the fp16 builds (FP16_BUILDS)")
    args = parser.parse_args()
    tokenizer = gen.load_tokenizer()
    if not args.fp16_only:
        for family_name in args.only or BUILDS:
            build_family(family_name, BUILDS[family_name], tokenizer)
    for family_name in FP16_BUILDS:
        if not args.only or family_name in args.only:
            build_fp16(family_name, tokenizer)
    return 0


def build_family(family_name: str, precisions: list[str], tokenizer) -> None:
    source = FIXTURES / "llama_decoder"  # every family here shares its tokenizer files
    family, source_expected = rebuild(family_name, tokenizer)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = Path(tmp) / "checkpoint"
        family.model.save_pretrained(str(checkpoint))
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(source / name, checkpoint / name)
        for precision in precisions:
            extra = PRECISIONS[precision]
            out = FIXTURES / f"genai_{family_name}_{precision}"
            if out.exists():
                shutil.rmtree(out)
            run_builder(checkpoint, out, precision, extra, Path(tmp) / "cache")
            for name in ("config.json",):
                shutil.copy(checkpoint / name, out / name)
            cases = []
            for prompt in PROMPTS:
                ids = tokenizer(prompt)["input_ids"]
                cases.append({"prompt": prompt, "prompt_token_ids": ids, "new_token_ids": greedy_genai(out, ids)})
            if precision == "fp32":
                # The fp32 build is the same model: its first prompt must give transformers' tokens.
                single = next(c for c in source_expected["cases"] if c["name"] == "single")
                want = single["new_token_ids"][0][:MAX_NEW_TOKENS]
                if single["prompts"][0] == PROMPTS[0] and cases[0]["new_token_ids"] != want:
                    raise SystemExit(f"{family_name} fp32 genai build differs from transformers: "
                                     f"{cases[0]['new_token_ids']} vs {want}")
            (out / "expected.json").write_text(json.dumps({
                "generated_by": "scripts/make_genai_models.py",
                "onnxruntime_genai": og.__version__ if hasattr(og, "__version__") else "unknown",
                "family": family_name,
                "precision": precision,
                "builder_options": extra,
                "max_new_tokens": MAX_NEW_TOKENS,
                "cases": cases,
            }, indent=2) + "\n")
            print(f"{out}: {[c['new_token_ids'][:6] for c in cases]}")


if __name__ == "__main__":
    sys.exit(main())
