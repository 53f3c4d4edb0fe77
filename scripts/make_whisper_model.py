#!/usr/bin/env python3
"""A tiny random Whisper exported to ONNX in optimum's seq2seq layout, with greedy generate() outputs on
it: the fixture of Text2TextGeneration's encoder-input path (input_features instead of text).

Run by hand (needs torch and transformers 5.23, which CI does not have):
    /opt/export-venv/bin/python scripts/make_whisper_model.py

Writes tests/pipelines/fixtures/whisper_seq2seq/:
    encoder_model.onnx            input_features [batch, 8 mel bins, 32 frames] -> last_hidden_state
    decoder_model.onnx            input_ids, encoder_hidden_states -> logits, present.N.decoder/encoder.*
    decoder_with_past_model.onnx  input_ids, past_key_values.N.decoder/encoder.* -> logits, present.N.decoder.*
                                  (Whisper's decoder takes no encoder attention mask)
    tokenizer.json, tokenizer_config.json   tests/text/fixtures/bytelevel_bpe
    config.json, generation_config.json     suppress_tokens and begin_suppress_tokens, as Whisper's have
    expected.json                 the cases' input_features, the decoder prompt and the new tokens

The references come from transformers' generic GenerationMixin.generate (what generate() does for any
encoder-decoder), given the input features and a decoder prompt that starts with decoder_start_token_id
(Whisper's <|startoftranscript|><|lang|><|task|>): WhisperForConditionalGeneration.generate's own logic
(language detection, timestamps, long-form audio) is not what the C++ side reproduces. Each file is
checked against PyTorch in onnxruntime (optimizations off).
"""

from __future__ import annotations

import json
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import tokenizers
import torch
import transformers
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.generation.utils import GenerationMixin

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_models import randomize_norms  # noqa: E402
from make_seq2seq_models import (  # noqa: E402
    EXPORT_TOLERANCE, OPSET, SEED, TEXT_FIXTURES, flat_presents, past_names, reinitialize, session,
    worst_difference)

OUT = Path(__file__).resolve().parents[1] / "tests" / "pipelines" / "fixtures" / "whisper_seq2seq"
MEL_BINS, FRAMES = 8, 32  # Whisper's encoder takes exactly 2 x max_source_positions frames
MAX_NEW_TOKENS = 16

assert transformers.__version__ == "5.23.0", transformers.__version__
warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()
torch.set_num_threads(1)


def build(tokenizer: tokenizers.Tokenizer) -> tuple[transformers.WhisperForConditionalGeneration, dict]:
    eos = tokenizer.token_to_id("<|endoftext|>")
    # The decoder prompt's tokens stand for <|startoftranscript|>, a language and a task.
    start, language, task = tokenizer.token_to_id("The"), tokenizer.token_to_id("en"), tokenizer.token_to_id("the")
    settings = {"decoder_start_token_id": start, "eos_token_id": eos, "pad_token_id": eos, "bos_token_id": eos,
                # Tokens this model generates often (162) and first (147) without them, so that both
                # processors change the outputs (checked in main()).
                "suppress_tokens": [162, 250], "begin_suppress_tokens": [eos, 147]}
    config = transformers.WhisperConfig(
        vocab_size=tokenizer.get_vocab_size(), num_mel_bins=MEL_BINS, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_source_positions=FRAMES // 2, max_target_positions=64, tie_word_embeddings=False,
        decoder_start_token_id=start, eos_token_id=eos, pad_token_id=eos, bos_token_id=eos,
        suppress_tokens=None, begin_suppress_tokens=None)
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = transformers.WhisperForConditionalGeneration(config)
    reinitialize(model, torch.Generator().manual_seed(SEED), 1.0, 1.0)
    randomize_norms(model, torch.Generator().manual_seed(SEED))
    model.eval()
    model.generation_config = transformers.GenerationConfig(do_sample=False, **settings)
    return model, {**settings, "prompt": [start, language, task]}


class Encoder(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_features):
        return self.encoder(input_features=input_features).last_hidden_state


def step(model, input_ids, encoder_hidden_states, cache, with_cross):
    out = model(encoder_outputs=(encoder_hidden_states,), decoder_input_ids=input_ids, past_key_values=cache,
                use_cache=True)
    return (out.logits, *flat_presents(out.past_key_values, with_cross))


class FirstStep(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_hidden_states):
        return step(self.model, input_ids, encoder_hidden_states, EncoderDecoderCache(DynamicCache(), DynamicCache()),
                    True)


class WithPast(torch.nn.Module):
    """The cross-attention past replaces the hidden states; a placeholder of their shape tells the layers to
    attend across (its values are never read)."""

    def __init__(self, model, layers: int):
        super().__init__()
        self.model, self.layers = model, layers

    def forward(self, input_ids, *flat_past):
        cache = EncoderDecoderCache([tuple(flat_past[4 * i: 4 * i + 4]) for i in range(self.layers)])
        placeholder = torch.zeros(input_ids.shape[0], flat_past[2].shape[2], self.model.config.d_model)
        return step(self.model, input_ids, placeholder, cache, False)


def export(module, args, path, inputs, outputs, axes):
    torch.onnx.export(module, args, str(path), input_names=inputs, output_names=outputs, dynamic_axes=axes,
                      opset_version=OPSET, do_constant_folding=True, dynamo=False)
    module.eval()
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)


def export_all(model, layers: int) -> float:
    rng = np.random.default_rng(SEED)
    vocab = model.config.vocab_size
    encoder, first, with_past = Encoder(model), FirstStep(model), WithPast(model, layers)
    features = torch.from_numpy(rng.standard_normal((2, MEL_BINS, FRAMES)).astype(np.float32))
    export(encoder, (features,), OUT / "encoder_model.onnx", ["input_features"], ["last_hidden_state"],
           {"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}})
    with torch.no_grad():
        states = encoder(features)
    ids = torch.from_numpy(rng.integers(3, vocab, size=(2, 3)).astype(np.int64))
    presents = past_names(layers, "present", True)
    axes = {"input_ids": {0: "batch", 1: "decoder_sequence_length"}, "encoder_hidden_states": {0: "batch"},
            "logits": {0: "batch", 1: "decoder_sequence_length"}}
    axes.update({n: {0: "batch", 2: "decoder_sequence_length"} for n in presents if ".decoder." in n})
    axes.update({n: {0: "batch"} for n in presents if ".encoder." in n})
    export(first, (ids, states), OUT / "decoder_model.onnx", ["input_ids", "encoder_hidden_states"],
           ["logits", *presents], axes)
    with torch.no_grad():
        traced = first(ids, states)
    past_inputs, self_presents = past_names(layers, "past_key_values", True), past_names(layers, "present", False)
    axes = {"input_ids": {0: "batch", 1: "decoder_sequence_length"}, "logits": {0: "batch", 1: "decoder_sequence_length"}}
    axes.update({n: {0: "batch", 2: "past_decoder_sequence_length"} for n in past_inputs if ".decoder." in n})
    axes.update({n: {0: "batch"} for n in past_inputs if ".encoder." in n})
    axes.update({n: {0: "batch", 2: "past_decoder_sequence_length+1"} for n in self_presents})
    export(with_past, (ids[:, :1], *traced[1:]), OUT / "decoder_with_past_model.onnx", ["input_ids", *past_inputs],
           ["logits", *self_presents], axes)
    return check(model, encoder, first, layers)


def check(model, encoder, first, layers) -> float:
    """Each file against PyTorch at other batch sizes; two cached steps against the whole sequence."""
    rng = np.random.default_rng(SEED + 1)
    vocab = model.config.vocab_size
    enc, dec0, dec1 = (session(OUT / n) for n in ("encoder_model.onnx", "decoder_model.onnx",
                                                  "decoder_with_past_model.onnx"))
    worst = 0.0
    for batch, dec_len in [(1, 1), (3, 2)]:
        features = rng.standard_normal((batch, MEL_BINS, FRAMES)).astype(np.float32)
        with torch.no_grad():
            states = encoder(torch.from_numpy(features))
        worst = max(worst, worst_difference(enc.run(None, {"input_features": features}), [states], "encoder"))
        ids = rng.integers(3, vocab, size=(batch, dec_len)).astype(np.int64)
        got = dec0.run(None, {"input_ids": ids, "encoder_hidden_states": states.numpy()})
        with torch.no_grad():
            worst = max(worst, worst_difference(got, list(first(torch.from_numpy(ids), states)), "decoder"))
        past, sequence = got[1:], ids
        for _ in range(2):
            new = rng.integers(3, vocab, size=(batch, 1)).astype(np.int64)
            sequence = np.concatenate([sequence, new], axis=1)
            stepped = dec1.run(None, {"input_ids": new, **dict(zip(past_names(layers, "past_key_values", True), past))})
            with torch.no_grad():
                whole = first(torch.from_numpy(sequence), states)
            worst = max(worst, worst_difference([stepped[0][:, -1]], [whole[0][:, -1]], "decoder with past"))
            grown = iter(stepped[1:])
            past = [next(grown) if i % 4 < 2 else past[i] for i in range(4 * layers)]
    assert worst <= EXPORT_TOLERANCE
    return worst


def generate(model, features: np.ndarray, prompt: list[int], **kwargs) -> list[list[int]]:
    """transformers' generic encoder-decoder generate(); the new tokens after the prompt."""
    decoder_input_ids = torch.tensor([prompt] * features.shape[0])
    with torch.no_grad():
        out = GenerationMixin.generate(model, input_features=torch.from_numpy(features),
                                       decoder_input_ids=decoder_input_ids, do_sample=False, **kwargs)
    return out[:, len(prompt):].tolist()


def main() -> None:
    tokenizer = tokenizers.Tokenizer.from_file(str(TEXT_FIXTURES / "bytelevel_bpe" / "tokenizer.json"))
    model, settings = build(tokenizer)
    prompt = settings.pop("prompt")
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    layers = model.config.decoder_layers
    worst = export_all(model, layers)
    rng = np.random.default_rng(SEED + 2)
    features = rng.standard_normal((3, MEL_BINS, FRAMES)).astype(np.float32)
    cases = []
    for name, rows, kwargs in [("single", features[:1], {"use_cache": True}),
                               ("single_no_cache", features[:1], {"use_cache": False}),
                               ("batch", features, {"use_cache": True}),
                               ("penalty", features[1:2], {"use_cache": True, "repetition_penalty": 1.3,
                                                           "no_repeat_ngram_size": 2})]:
        new = generate(model, rows, prompt, max_new_tokens=MAX_NEW_TOKENS, **kwargs)
        cases.append({"name": name, "input_features": rows.tolist(), "generate": {"max_new_tokens": MAX_NEW_TOKENS,
                      **{k: v for k, v in kwargs.items() if k != "use_cache"}}, "new_token_ids": new})
    assert cases[0]["new_token_ids"] == cases[1]["new_token_ids"], "use_cache=False disagrees"
    for c in cases:  # the suppressed tokens are never generated, the begin-suppressed ones not first
        for row in c["new_token_ids"]:
            assert not set(row) & set(settings["suppress_tokens"]) and row[0] not in settings["begin_suppress_tokens"]
    free = generate(model, features, prompt, max_new_tokens=MAX_NEW_TOKENS, suppress_tokens=None,
                    begin_suppress_tokens=None)
    assert all(f != c for f, c in zip(free, cases[2]["new_token_ids"])), "the suppression changes no row"
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TEXT_FIXTURES / "bytelevel_bpe" / name, OUT / name)
    model.config.to_json_file(str(OUT / "config.json"))
    (OUT / "generation_config.json").write_text(json.dumps({**settings, "do_sample": False}, indent=2) + "\n")
    (OUT / "expected.json").write_text(json.dumps({
        "generated_by": "scripts/make_whisper_model.py", "torch": torch.__version__,
        "transformers": transformers.__version__, "worst_export_difference": worst, "decoder_prompt": prompt,
        "mel_bins": MEL_BINS, "frames": FRAMES, "cases": cases}) + "\n")
    size = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"whisper: {size} bytes, worst ORT-vs-torch {worst:.2e}; " +
          "; ".join(f"{c['name']}: {c['new_token_ids']}" for c in cases))


if __name__ == "__main__":
    main()
