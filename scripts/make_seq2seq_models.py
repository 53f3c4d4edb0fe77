#!/usr/bin/env python3
"""Tiny random encoder-decoder models (T5, BART) exported to ONNX in optimum's seq2seq layout, with
transformers' greedy generate() outputs on them: the fixtures of the C++ Text2TextGeneration tests.

Run by hand (needs torch and transformers 5.23, which CI does not have):
    /opt/export-venv/bin/python scripts/make_seq2seq_models.py [--only FAMILY ...]

For each family this writes tests/pipelines/fixtures/<family>_seq2seq/:
    encoder_model.onnx   input_ids, attention_mask [batch, encoder_sequence] -> last_hidden_state
    decoder files        optimum's names and signatures (fp32, TorchScript exporter, weights inline):
        decoder_model.onnx            input_ids [batch, decoder_sequence], encoder_attention_mask,
                                      encoder_hidden_states -> logits, present.N.decoder.key/value,
                                      present.N.encoder.key/value   (the first step: no past)
        decoder_with_past_model.onnx  input_ids, encoder_attention_mask, past_key_values.N.decoder.key/value
                                      [batch, heads, past, head_dim], past_key_values.N.encoder.key/value
                                      [batch, heads, encoder_sequence, head_dim] -> logits,
                                      present.N.decoder.key/value (the cross-attention past never changes)
        decoder_model_merged.onnx     the two above as the branches of one If on the bool input
                                      use_cache_branch, as optimum merges them (weights in the outer graph;
                                      the with-past branch passes the encoder past through as its
                                      present.N.encoder.*)
      t5 gets decoder_model.onnx + decoder_with_past_model.onnx, bart decoder_model_merged.onnx alone, so
      both layouts the Hub publishes are covered.
    tokenizer.json, tokenizer_config.json   t5: tests/text/fixtures/unigram (appends </s>), bart:
                                            tests/text/fixtures/bytelevel_bpe
    config.json, generation_config.json
    expected.json        greedy generate()'s new tokens (after the decoder start token) on the cases below

Cases: single (one text, 16 new tokens, use_cache True), single_no_cache (the same, use_cache False:
must agree), batch (three texts of different lengths, right padded as these tokenizers pad), penalty
(repetition_penalty 1.3, no_repeat_ngram_size 3), min_new_tokens, and stops_on_eos (a text whose output
ends on eos early). bart's generation_config.json sets forced_bos_token_id and forced_eos_token_id, as
BART checkpoints do, so their processors are covered too. Each family's eos row of the output projection
is scaled (the smallest factor from EOS_SCALES that gives a stops_on_eos case while the single case
still runs to its end), recorded in expected.json.

Each export is checked in onnxruntime (optimizations off) against PyTorch at shapes other than the
traced ones, and the merged decoder against its two parts.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import tokenizers
import torch
import transformers
from onnx import TensorProto, helper
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_models import randomize_norms  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
TEXT_FIXTURES = REPO_ROOT / "tests" / "text" / "fixtures"
OUT = REPO_ROOT / "tests" / "pipelines" / "fixtures"
SEED = 0
OPSET = 17
MAX_FOLDER_BYTES = 3 * 1024 * 1024
# fp32 PyTorch vs onnxruntime on the same graph, relative to the largest value compared: kernel summation
# order only.
EXPORT_TOLERANCE = 5e-5

assert transformers.__version__ == "5.23.0", transformers.__version__
warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()
torch.set_num_threads(1)

SINGLE_TEXTS = ["The quick brown fox jumps", "The weather today is", "We went to the market and bought"]
SINGLE_MAX_NEW_TOKENS = 16
BATCH_TEXTS = ["Hello", "Paris is the capital of France and", "The cat sat on"]
PENALTY = {"max_new_tokens": 16, "repetition_penalty": 1.3, "no_repeat_ngram_size": 3}
PENALTY_TEXTS = ["the cat sat on the mat and looked at the dog", "one two three one two three", "I loved it"]
MIN_NEW = {"max_new_tokens": 14, "min_new_tokens": 10}
EOS_MAX_NEW_TOKENS = 20
EOS_TEXTS = ["John Smith lives in", "a", "What is the capital of", "Once upon a time", "I loved this movie",
             "Berlin", "It was great", "The dog", "one two three", "Hello world", "the mat", "zzyzx tokens"]
EOS_STEPS = range(3, 9)  # below MIN_NEW's min_new_tokens, so that that case shows eos held back
EOS_SCALES = [round(1.0 + 0.1 * i, 1) for i in range(31)]


# ---------------------------------------------------------------------------------------------- models


def t5_model(tokenizer) -> transformers.PreTrainedModel:
    config = transformers.T5Config(
        vocab_size=tokenizer.get_vocab_size(),
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
        feed_forward_proj="gated-gelu",
        tie_word_embeddings=False,
        initializer_factor=1.0,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
    )
    config._attn_implementation = "eager"
    return transformers.T5ForConditionalGeneration(config)


def bart_model(tokenizer) -> transformers.PreTrainedModel:
    eos = tokenizer.token_to_id("<|endoftext|>")
    config = transformers.BartConfig(
        vocab_size=tokenizer.get_vocab_size(),
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        init_std=0.3,
        scale_embedding=True,
        tie_word_embeddings=False,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        decoder_start_token_id=eos,
        forced_bos_token_id=None,
        forced_eos_token_id=None,
    )
    config._attn_implementation = "eager"
    return transformers.BartForConditionalGeneration(config)


def reinitialize(model, generator: torch.Generator, gain: float, embedding_std: float) -> None:
    """Weights ~ N(0, (gain / sqrt(fan_in))^2), embeddings ~ N(0, embedding_std^2). The models' own initializations give
    these tiny configs near-constant outputs (T5's greedy output is pad after pad); larger weights give
    varied tokens, so that a wrong step shows in the tokens."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() < 2:
                continue
            embedding = "embed" in name or "shared" in name
            p.copy_(torch.randn(p.shape, generator=generator) * (embedding_std if embedding else gain / p.shape[-1] ** 0.5))


FAMILIES = {
    # name: (model builder, tokenizer fixture, decoder layout, gain of reinitialize: the largest of 1, 2, 3
    # whose outputs were not one token repeated)
    "t5": (t5_model, "unigram", "split", 3.0),
    "bart": (bart_model, "bytelevel_bpe", "merged", 1.0),
}


def generation_settings(family: str, tokenizer: tokenizers.Tokenizer) -> dict:
    if family == "t5":
        return {"decoder_start_token_id": 0, "eos_token_id": 1, "pad_token_id": 0}
    eos = tokenizer.token_to_id("<|endoftext|>")
    # BART checkpoints force <s> first and eos at the last position; this vocabulary's first word token
    # stands for <s>.
    return {"decoder_start_token_id": eos, "eos_token_id": eos, "pad_token_id": eos, "bos_token_id": eos,
            "forced_bos_token_id": tokenizer.token_to_id("The") or 5, "forced_eos_token_id": eos}


def num_layers(model) -> int:
    return model.config.decoder_layers if hasattr(model.config, "decoder_layers") else model.config.num_decoder_layers


def heads_and_dim(model) -> tuple[int, int]:
    c = model.config
    if c.model_type == "t5":
        return c.num_heads, c.d_kv
    return c.decoder_attention_heads, c.d_model // c.decoder_attention_heads


# ---------------------------------------------------------------------------------------------- wrappers


class Encoder(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_ids, attention_mask):
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def flat_presents(cache: EncoderDecoderCache, with_cross: bool) -> list:
    out = []
    for i, layer in enumerate(cache.self_attention_cache.layers):
        out += [layer.keys, layer.values]
        if with_cross:
            cross = cache.cross_attention_cache.layers[i]
            out += [cross.keys, cross.values]
    return out


def decoder_step(model, input_ids, encoder_attention_mask, encoder_hidden_states, cache, with_cross: bool):
    """One decoder call with the cache; logits and the flat presents (the cross-attention ones too when
    with_cross)."""
    out = model(
        encoder_outputs=(encoder_hidden_states,),
        attention_mask=encoder_attention_mask,
        decoder_input_ids=input_ids,
        past_key_values=cache,
        use_cache=True,
    )
    return (out.logits, *flat_presents(out.past_key_values, with_cross))


class DecoderFirstStep(torch.nn.Module):
    """decoder_model.onnx: no past; the cross-attention keys/values are computed and returned."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_attention_mask, encoder_hidden_states):
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        return decoder_step(self.model, input_ids, encoder_attention_mask, encoder_hidden_states, cache, True)


class DecoderWithPast(torch.nn.Module):
    """decoder_with_past_model.onnx: past self- and cross-attention keys/values in, the grown self-attention
    presents out. The encoder's hidden states are not an input (the cross-attention past replaces them);
    the model only needs a tensor of their shape to know that the layers attend across."""

    def __init__(self, model, layers: int, hidden: int):
        super().__init__()
        self.model = model
        self.layers = layers
        self.hidden = hidden

    def forward(self, input_ids, encoder_attention_mask, *flat_past):
        per_layer = [tuple(flat_past[4 * i : 4 * i + 4]) for i in range(self.layers)]
        cache = EncoderDecoderCache(per_layer)
        placeholder = torch.zeros(
            input_ids.shape[0], encoder_attention_mask.shape[1], self.hidden, dtype=torch.float32
        )
        return decoder_step(self.model, input_ids, encoder_attention_mask, placeholder, cache, False)


# ---------------------------------------------------------------------------------------------- export


def past_names(layers: int, prefix: str, with_cross: bool) -> list[str]:
    names = []
    for i in range(layers):
        parts = ["decoder.key", "decoder.value"] + (["encoder.key", "encoder.value"] if with_cross else [])
        names += [f"{prefix}.{i}.{part}" for part in parts]
    return names


def export(module, args, path, input_names, output_names, dynamic_axes):
    torch.onnx.export(
        module,
        args,
        str(path),
        input_names=input_names,
        output_names=output_names,
        dynamic_axes=dynamic_axes,
        opset_version=OPSET,
        do_constant_folding=True,
        dynamo=False,
    )
    module.eval()
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)


def ids_and_mask(rng, vocab, batch, length):
    ids = rng.integers(3, vocab, size=(batch, length)).astype(np.int64)
    mask = np.ones((batch, length), dtype=np.int64)
    if batch > 1:
        mask[-1, length - max(1, length // 3) :] = 0  # right padding, as these tokenizers pad
    return ids, mask


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def worst_difference(got: list, expected: list, what: str) -> float:
    worst = 0.0
    for g, e in zip(got, expected, strict=True):
        e = e.detach().numpy() if isinstance(e, torch.Tensor) else e
        if g.shape != e.shape:
            raise SystemExit(f"{what}: shape {g.shape} != {e.shape}")
        # Relative to the values' scale: these random logits reach the tens.
        scale = max(1.0, float(np.max(np.abs(e)))) if e.size else 1.0
        diff = float(np.max(np.abs(g - e))) / scale if g.size else 0.0
        if not diff <= EXPORT_TOLERANCE:
            raise SystemExit(f"{what}: max diff {diff} of the scale {scale}")
        worst = max(worst, diff)
    return worst


def export_family(model, out: Path, layout: str) -> float:
    """Writes the encoder and the decoder files; returns the worst ORT-vs-torch difference."""
    layers = num_layers(model)
    heads, head_dim = heads_and_dim(model)
    hidden = model.config.d_model
    vocab = model.config.vocab_size
    rng = np.random.default_rng(SEED)
    encoder, first, with_past = Encoder(model), DecoderFirstStep(model), DecoderWithPast(model, layers, hidden)

    ids, mask = ids_and_mask(rng, vocab, 2, 7)
    export(encoder, (torch.from_numpy(ids), torch.from_numpy(mask)), out / "encoder_model.onnx",
           ["input_ids", "attention_mask"], ["last_hidden_state"],
           {"input_ids": {0: "batch", 1: "encoder_sequence_length"},
            "attention_mask": {0: "batch", 1: "encoder_sequence_length"},
            "last_hidden_state": {0: "batch", 1: "encoder_sequence_length"}})

    present_with_cross = past_names(layers, "present", True)
    hidden_states = encoder(torch.from_numpy(ids), torch.from_numpy(mask)).detach()
    dec_ids = torch.from_numpy(rng.integers(3, vocab, size=(2, 3)).astype(np.int64))
    first_path = out / "decoder_model.onnx"
    axes = {"input_ids": {0: "batch", 1: "decoder_sequence_length"},
            "encoder_attention_mask": {0: "batch", 1: "encoder_sequence_length"},
            "encoder_hidden_states": {0: "batch", 1: "encoder_sequence_length"},
            "logits": {0: "batch", 1: "decoder_sequence_length"}}
    for name in present_with_cross:
        axes[name] = {0: "batch", 2: "decoder_sequence_length" if ".decoder." in name else "encoder_sequence_length"}
    export(first, (dec_ids, torch.from_numpy(mask), hidden_states), first_path,
           ["input_ids", "encoder_attention_mask", "encoder_hidden_states"], ["logits", *present_with_cross], axes)

    past_inputs = past_names(layers, "past_key_values", True)
    present_self = past_names(layers, "present", False)
    past_path = out / "decoder_with_past_model.onnx"
    with torch.no_grad():
        traced_first = first(dec_ids, torch.from_numpy(mask), hidden_states)
    axes = {"input_ids": {0: "batch", 1: "decoder_sequence_length"},
            "encoder_attention_mask": {0: "batch", 1: "encoder_sequence_length"},
            "logits": {0: "batch", 1: "decoder_sequence_length"}}
    for name in past_inputs:
        axes[name] = {0: "batch", 2: "past_decoder_sequence_length" if ".decoder." in name
                      else "encoder_sequence_length_out"}
    for name in present_self:
        axes[name] = {0: "batch", 2: "past_decoder_sequence_length+1"}
    step_ids = torch.from_numpy(rng.integers(3, vocab, size=(2, 1)).astype(np.int64))
    export(with_past, (step_ids, torch.from_numpy(mask), *traced_first[1:]), past_path,
           ["input_ids", "encoder_attention_mask", *past_inputs], ["logits", *present_self], axes)

    worst = check_exports(model, out, encoder, first, with_past, layers, hidden)
    if layout == "merged":
        merged = merge_decoders(onnx.load(str(first_path)), onnx.load(str(past_path)), layers)
        onnx.checker.check_model(merged, full_check=True)
        onnx.save(merged, str(out / "decoder_model_merged.onnx"))
        worst = max(worst, check_merged(out, layers, heads, head_dim, vocab))
        first_path.unlink()
        past_path.unlink()
    return worst


def check_exports(model, out, encoder, first, with_past, layers, hidden) -> float:
    rng = np.random.default_rng(SEED + 1)
    vocab = model.config.vocab_size
    enc, dec0, dec1 = (session(out / n) for n in ("encoder_model.onnx", "decoder_model.onnx",
                                                  "decoder_with_past_model.onnx"))
    worst = 0.0
    for batch, enc_len, dec_len in [(1, 5, 1), (3, 9, 2), (2, 4, 4)]:
        ids, mask = ids_and_mask(rng, vocab, batch, enc_len)
        with torch.no_grad():
            hidden_states = encoder(torch.from_numpy(ids), torch.from_numpy(mask))
        got = enc.run(None, {"input_ids": ids, "attention_mask": mask})
        worst = max(worst, worst_difference(got, [hidden_states], f"encoder at {batch}x{enc_len}"))
        dec_ids = rng.integers(3, vocab, size=(batch, dec_len)).astype(np.int64)
        with torch.no_grad():
            expected = first(torch.from_numpy(dec_ids), torch.from_numpy(mask), hidden_states)
        got = dec0.run(None, {"input_ids": dec_ids, "encoder_attention_mask": mask,
                              "encoder_hidden_states": hidden_states.numpy()})
        worst = max(worst, worst_difference(got, list(expected), f"decoder at {batch}x{dec_len}"))
        # Two steps with the past: the presents fed back, against the no-past decoder on the whole sequence.
        past = got[1:]
        sequence = dec_ids
        for step in range(2):
            new = rng.integers(3, vocab, size=(batch, 1)).astype(np.int64)
            sequence = np.concatenate([sequence, new], axis=1)
            feeds = {"input_ids": new, "encoder_attention_mask": mask}
            names = past_names(layers, "past_key_values", True)
            feeds.update(dict(zip(names, past)))
            stepped = dec1.run(None, feeds)
            with torch.no_grad():
                whole = first(torch.from_numpy(sequence), torch.from_numpy(mask), hidden_states)
            worst = max(worst, worst_difference([stepped[0][:, -1]], [whole[0][:, -1]],
                                                f"decoder with past, step {step} at {batch}"))
            # The next past: the grown self-attention presents, the cross-attention past unchanged.
            grown = iter(stepped[1:])
            past = [next(grown) if i % 4 < 2 else past[i] for i in range(4 * layers)]
    return worst


# ---------------------------------------------------------------------------------------------- merging


def merge_decoders(first: onnx.ModelProto, with_past: onnx.ModelProto, layers: int) -> onnx.ModelProto:
    """optimum's merged decoder: one If on use_cache_branch, the with-past graph in its then branch, the
    first-step graph in its else branch, every weight in the outer graph (names prefixed per branch, so two
    exports' generated names cannot collide)."""
    first = onnx.compose.add_prefix(first, "first_", rename_inputs=False)
    with_past = onnx.compose.add_prefix(with_past, "past_", rename_inputs=False)
    outputs = ["logits", *past_names(layers, "present", True)]

    def branch(model: onnx.ModelProto, prefix: str, passthrough: dict[str, str]) -> onnx.GraphProto:
        nodes = list(model.graph.node)
        branch_outputs = []
        for out in outputs:
            name = prefix + out
            if out in passthrough:
                name = f"{prefix}passthrough_{out}"
                nodes.append(helper.make_node("Identity", [passthrough[out]], [name]))
            branch_outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
        return helper.make_graph(nodes, prefix + "branch", [], branch_outputs)

    # In the with-past branch the encoder's present is the past it was given.
    passthrough = {f"present.{i}.encoder.{p}": f"past_key_values.{i}.encoder.{p}"
                   for i in range(layers) for p in ("key", "value")}
    then_branch = branch(with_past, "past_", passthrough)
    else_branch = branch(first, "first_", {})
    use_cache = helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1])
    by_name = {v.name: v for v in [*first.graph.input, *with_past.graph.input]}
    out_infos = {v.name.removeprefix("first_"): v for v in first.graph.output}
    input_names = ["input_ids", "encoder_attention_mask", "encoder_hidden_states",
                   *past_names(layers, "past_key_values", True)]
    inputs = [by_name[n] for n in input_names] + [use_cache]
    if_node = helper.make_node("If", ["use_cache_branch"], outputs, then_branch=then_branch,
                               else_branch=else_branch)
    graph = helper.make_graph([if_node], "merged_decoder", inputs, [rename(out_infos[o], o) for o in outputs],
                              initializer=[*first.graph.initializer, *with_past.graph.initializer])
    merged = helper.make_model(graph, opset_imports=first.opset_import, producer_name="make_seq2seq_models")
    merged.ir_version = first.ir_version
    return merged


def rename(info: onnx.ValueInfoProto, name: str) -> onnx.ValueInfoProto:
    renamed = onnx.ValueInfoProto()
    renamed.CopyFrom(info)
    renamed.name = name
    return renamed


def check_merged(out: Path, layers: int, heads: int, head_dim: int, vocab: int) -> float:
    """The merged file against the two files it came from, on both branches."""
    rng = np.random.default_rng(SEED + 2)
    merged, dec0, dec1 = (session(out / n) for n in ("decoder_model_merged.onnx", "decoder_model.onnx",
                                                     "decoder_with_past_model.onnx"))
    names = past_names(layers, "past_key_values", True)
    batch, enc_len, hidden = 2, 6, dec0.get_inputs()[2].shape[2]
    mask = np.ones((batch, enc_len), dtype=np.int64)
    states = rng.standard_normal((batch, enc_len, hidden)).astype(np.float32)
    ids = rng.integers(3, vocab, size=(batch, 2)).astype(np.int64)
    empty = {n: np.zeros((batch, heads, 0, head_dim), np.float32) for n in names}
    first = dec0.run(None, {"input_ids": ids, "encoder_attention_mask": mask, "encoder_hidden_states": states})
    got = merged.run(None, {"input_ids": ids, "encoder_attention_mask": mask, "encoder_hidden_states": states,
                            **empty, "use_cache_branch": np.array([False])})
    worst = worst_difference(got, first, "merged decoder, first step")
    step = rng.integers(3, vocab, size=(batch, 1)).astype(np.int64)
    past = dict(zip(names, first[1:]))
    expected = dec1.run(None, {"input_ids": step, "encoder_attention_mask": mask, **past})
    got = merged.run(None, {"input_ids": step, "encoder_attention_mask": mask, "encoder_hidden_states": states,
                            **past, "use_cache_branch": np.array([True])})
    self_presents = [got[1 + i] for i in range(4 * layers) if i % 4 < 2]
    worst = max(worst, worst_difference([got[0], *self_presents], expected, "merged decoder, with past"))
    return worst


# ---------------------------------------------------------------------------------------------- generate


def generate(model, tokenizer: tokenizers.Tokenizer, texts: list[str], **kwargs) -> tuple[list, list]:
    """Greedy generate on right-padded texts; returns the encoder ids per text and the new tokens per row."""
    encodings = tokenizer.encode_batch(texts)
    longest = max(len(e.ids) for e in encodings)
    pad = model.generation_config.pad_token_id
    ids = [e.ids + [pad] * (longest - len(e.ids)) for e in encodings]
    mask = [[1] * len(e.ids) + [0] * (longest - len(e.ids)) for e in encodings]
    with torch.no_grad():
        sequences = model.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                                   do_sample=False, **kwargs)
    # Drop the decoder start token.
    return [e.ids for e in encodings], sequences[:, 1:].tolist()


def record(tokenizer, name, texts, settings, model) -> dict:
    encoder_ids, rows = generate(model, tokenizer, texts, **settings)
    return {
        "name": name,
        "texts": texts,
        "generate": {"do_sample": False, **settings},
        "encoder_token_ids": encoder_ids,
        # The new tokens as generate() returns them: a row that ended on eos before the others is filled
        # with pad_token_id up to the longest row.
        "new_token_ids": rows,
        "decoded": [tokenizer.decode(r, skip_special_tokens=True) for r in rows],
    }


def eos_stop(model, tokenizer, text, eos, max_new_tokens) -> int | None:
    """After how many new tokens greedy generate chose eos by itself, or None (an eos that
    forced_eos_token_id puts at the last position does not count)."""
    _, rows = generate(model, tokenizer, [text], max_new_tokens=max_new_tokens)
    step = rows[0].index(eos) + 1 if eos in rows[0] else None
    return step if step is not None and step < max_new_tokens else None


def pick_eos_scale(model, tokenizer, eos) -> tuple[float, str, str]:
    """The smallest scale of eos's output row with which an EOS_TEXTS text stops on eos within EOS_STEPS
    while a SINGLE_TEXTS text runs to max_new_tokens."""
    with torch.no_grad():
        row = model.get_output_embeddings().weight[eos]
        original = row.clone()
        for scale in EOS_SCALES:
            row.copy_(original * scale)
            single = next((t for t in SINGLE_TEXTS
                           if eos_stop(model, tokenizer, t, eos, SINGLE_MAX_NEW_TOKENS) is None), None)
            stopping = next((t for t in EOS_TEXTS
                             if eos_stop(model, tokenizer, t, eos, EOS_MAX_NEW_TOKENS) in EOS_STEPS), None)
            if single is not None and stopping is not None:
                return scale, single, stopping
    raise SystemExit("no eos scale gives both a single case and a stops_on_eos case")


def cases(model, tokenizer, eos, single, stopping) -> list[dict]:
    out = [record(tokenizer, "single", [single], {"max_new_tokens": SINGLE_MAX_NEW_TOKENS, "use_cache": True},
                  model)]
    no_cache = record(tokenizer, "single_no_cache", [single],
                      {"max_new_tokens": SINGLE_MAX_NEW_TOKENS, "use_cache": False}, model)
    if no_cache["new_token_ids"] != out[0]["new_token_ids"]:
        raise SystemExit("use_cache=False disagrees with use_cache=True")
    out.append(no_cache)
    batch = record(tokenizer, "batch", BATCH_TEXTS, {"max_new_tokens": 12, "use_cache": True}, model)
    assert len({len(r) for r in batch["encoder_token_ids"]}) == len(BATCH_TEXTS), "text lengths must differ"
    out.append(batch)
    for text in PENALTY_TEXTS:
        _, plain = generate(model, tokenizer, [text], max_new_tokens=PENALTY["max_new_tokens"])
        penalized = record(tokenizer, "penalty", [text], {**PENALTY, "use_cache": True}, model)
        if penalized["new_token_ids"] != plain and eos not in penalized["new_token_ids"][0][:-1]:
            out.append(penalized)
            break
    else:
        raise SystemExit("the penalties change no PENALTY_TEXTS output")
    min_new = record(tokenizer, "min_new_tokens", [stopping], {**MIN_NEW, "use_cache": True}, model)
    assert len(min_new["new_token_ids"][0]) >= MIN_NEW["min_new_tokens"]
    out.append(min_new)
    stops = record(tokenizer, "stops_on_eos", [stopping], {"max_new_tokens": EOS_MAX_NEW_TOKENS, "use_cache": True},
                   model)
    assert stops["new_token_ids"][0][-1] == eos and len(stops["new_token_ids"][0]) < EOS_MAX_NEW_TOKENS
    out.append(stops)
    return out


# ---------------------------------------------------------------------------------------------- main


def make(family: str) -> None:
    build, tokenizer_name, layout, gain = FAMILIES[family]
    source = TEXT_FIXTURES / tokenizer_name
    tokenizer = tokenizers.Tokenizer.from_file(str(source / "tokenizer.json"))
    torch.manual_seed(SEED)
    model = build(tokenizer)
    reinitialize(model, torch.Generator().manual_seed(SEED), gain, 1.0)
    randomize_norms(model, torch.Generator().manual_seed(SEED))
    model.eval()
    settings = generation_settings(family, tokenizer)
    model.generation_config = transformers.GenerationConfig(do_sample=False, **settings)
    eos = settings["eos_token_id"]
    scale, single, stopping = pick_eos_scale(model, tokenizer, eos)

    out = OUT / f"{family}_seq2seq"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    worst = export_family(model, out, layout)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, out / name)
    model.config.to_json_file(str(out / "config.json"))
    (out / "generation_config.json").write_text(json.dumps({**settings, "do_sample": False}, indent=2) + "\n")
    expected = {
        "generated_by": "scripts/make_seq2seq_models.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "eos_row_scale": scale,
        "worst_export_difference": worst,
        "cases": cases(model, tokenizer, eos, single, stopping),
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")
    size = sum(p.stat().st_size for p in out.iterdir())
    if size > MAX_FOLDER_BYTES:
        raise SystemExit(f"{family}: {size} bytes, over {MAX_FOLDER_BYTES}")
    print(f"{family}: {size} bytes, eos scale {scale}, worst ORT-vs-torch {worst:.2e}, "
          f"files {sorted(p.name for p in out.glob('*.onnx'))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", choices=sorted(FAMILIES))
    args = parser.parse_args()
    for family in args.only or FAMILIES:
        make(family)


if __name__ == "__main__":
    main()
