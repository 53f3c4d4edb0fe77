#!/usr/bin/env python3
"""Make the coverage corpus: tiny random-weight ONNX exports of many Hugging Face architectures.

The corpus of issue 11 ("Coverage matrix across Hugging Face architectures"): for each architecture
in ARCHS, a model built from a small config (never from_pretrained: no Hub access is needed), seeded,
exported to ONNX in several "flavours", each file validated in ONNX Runtime before it is listed.

Usage (the export environment: torch, transformers, onnx, onnxruntime, onnxruntime-genai, onnxscript;
bench/coverage/requirements.txt pins them):

    /opt/export-venv/bin/python bench/coverage/make_corpus.py [--out DIR] [--only ARCH,...]
        [--flavours fp32,with_past,...] [--force] [--list] [--verbose]

--out defaults to .cache/coverage/ under the repository root. An existing file that was validated
(its model.onnx and inputs.json exist) is kept unless --force. One architecture's or flavour's
failure never stops the others: it is recorded in the manifest with its error's last line (--verbose
prints the traceback). The flavours made from the fp32 file make it first if it is missing.

Weights are seeded (torch.manual_seed(0)) and rescaled (randomize) so that activations and logits are
O(1); the same command makes byte-identical files.

Flavours (FLAVOURS; which ones an architecture gets is in its ARCHS entry):
    fp32           torch.onnx.export(dynamo=False), the TorchScript exporter; dynamic batch / sequence
                   (/ image size where the model allows). Decoders: input_ids, attention_mask
                   [, position_ids] -> logits, no cache.
    with_past      decoders: input_ids, attention_mask (past + new), [position_ids,]
                   past_key_values.N.key/value -> logits, present.N.key/value (optimum's names).
                   Encoder-decoders: with_past_decoder (past_key_values.N.decoder/encoder.key/value).
    ort_optimized  onnxruntime.transformers.optimizer.optimize_model on the fp32 file (OPTIMIZER_LEVEL)
    fp16           onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=False):
                   float16 weights, math and float inputs/outputs
    int8_dynamic   onnxruntime.quantization.quantize_dynamic (QInt8 weights, per_channel=False,
                   reduce_range=True: see quantize_int8)
    q4             MatMulNBitsQuantizer (4 bits, block_size 32, symmetric)
    genai          onnxruntime_genai.models.builder on the model saved with save_pretrained:
                   genai_fp32 and/or genai_int4 (-e cpu)
    dynamo         torch.onnx.export(dynamo=True)
An encoder-decoder's parts are separate files: fp32_encoder, fp32_decoder (the first decoder step: no
past in, presents out), with_past_decoder, and <flavour>_encoder / <flavour>_decoder for the others.

Layout of --out:
    <arch>/<flavour>/model.onnx     weights inline (genai_*: also the builder's genai_config.json)
    <arch>/<flavour>/inputs.json    tests/models/model_inputs.py's format:
        {"model": arch, "opset": N, "dims": {...}, "dims_alt": {...},
         "inputs": [{"name", "dtype", "shape", "kind", "range"?, "value"?}, ...], "outputs": [...],
         + "arch", "family", "flavour", "about", "generated_by", "validation" (what was checked)}
        dims and dims_alt are two shapes the file was run at in ONNX Runtime (graph optimizations
        off); fp32 and dynamo files also matched PyTorch there and at the traced shape, within
        TOLERANCE * max(1, max |PyTorch output|).
    manifest.json
        {"generator": "bench/coverage/make_corpus.py", "versions": {package: version},
         "files": [{"arch", "family", "flavour", "path" (relative to --out), "status": "ok" |
                    "export_failed", "error" (failed only), "bytes"}, ...]}
        rewritten each run from the files on disk, this run's failures, and the previous manifest's
        failures of files this run did not try.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import onnxruntime as ort
import torch
import transformers
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / ".cache" / "coverage"
sys.path.insert(0, str(REPO_ROOT / "tests" / "models"))
from model_inputs import build_inputs  # noqa: E402  (the runner's input builder)
from corpus_common import randomize, selected, summarize  # noqa: E402  (beside this file)

GENERATOR = "bench/coverage/make_corpus.py"
SEED = 0
OPSET = 17
DYNAMO_OPSET = 18
# fp32 PyTorch vs ONNX Runtime on the same graph differ only by summation order: max |diff| must be
# within TOLERANCE * max(1, max |torch output|) (random logits can reach the tens).
TOLERANCE = 1e-4
MAX_FILE_BYTES = 5 * 1024 * 1024  # a warning, not a failure
OPTIMIZER_LEVEL = 1  # optimize_model's opt_level: ORT's basic graph optimizations, then its fusions
Q4 = {"bits": 4, "block_size": 32, "is_symmetric": True}
FLAVOURS = ["fp32", "with_past", "dynamo", "ort_optimized", "fp16", "int8_dynamic", "q4", "genai"]
DERIVED = ["ort_optimized", "fp16", "int8_dynamic", "q4"]  # made from the fp32 file
FAMILIES = ["text encoder", "decoder", "encoder-decoder", "vision", "audio"]
VERSIONED = ["torch", "transformers", "onnx", "onnxruntime", "onnxruntime-genai", "onnxscript", "numpy",
             "tokenizers", "safetensors", "protobuf", "ml_dtypes", "onnx-ir"]

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
ort.set_default_logger_severity(3)
torch.set_num_threads(1)


class FlavourFailed(Exception):
    """A flavour could not be made or did not validate; the message goes to the manifest."""


# =============================================================================================== specs
# A part is one ONNX graph of a torch module; its inputs.json entries are build_inputs' format.


def spec(name, shape, kind, dtype="int64", value_range=None) -> dict:
    entry = {"name": name, "dtype": dtype, "shape": shape, "kind": kind}
    if value_range is not None:
        entry["range"] = list(value_range)
    return entry


@dataclass
class Part:
    module: torch.nn.Module
    inputs: list[dict]
    outputs: list[str]
    dynamic_axes: dict
    trace_dims: dict  # the export traces at these
    dims: dict  # inputs.json "dims"
    dims_alt: dict  # inputs.json "dims_alt": another batch and/or length
    opset: int = OPSET


def make_feeds(entries: list[dict], dims: dict, rng: np.random.Generator) -> dict:
    """build_inputs, with "float" entries in their own dtype (float16 for fp16 files), as the runner's."""
    as32 = [dict(e, dtype="float32") if e["kind"] == "float" else e for e in entries]
    values = build_inputs(as32, dims, rng)
    return {e["name"]: values[e["name"]].astype(e["dtype"]) for e in entries}


def torch_args(feeds: dict, entries: list[dict]) -> tuple:
    return tuple(torch.from_numpy(feeds[e["name"]]) for e in entries)


# ============================================================================================ wrappers
# Flat tensor-in / tensor-out signatures for the exporters.


def fields_of(output, names: list[str]) -> list[str]:
    """The names among `names` that the model output carries as tensors."""
    return [n for n in names if isinstance(getattr(output, n, None), torch.Tensor)]


class Fields(torch.nn.Module):
    """model(**dict(zip(input_names, args)), **fixed) -> the named fields of its output."""

    def __init__(self, model, input_names: list[str], output_names: list[str], fixed: dict | None = None):
        super().__init__()
        self.model, self.input_names, self.output_names = model, input_names, output_names
        self.fixed = fixed or {}

    def forward(self, *args):
        out = self.model(**dict(zip(self.input_names, args)), **self.fixed)
        return tuple(getattr(out, n) for n in self.output_names)


class DecoderWithPast(torch.nn.Module):
    """input_ids, attention_mask[, position_ids], past k/v pairs (flat) -> logits, present k/v pairs."""

    def __init__(self, model, num_layers: int, with_position_ids: bool):
        super().__init__()
        self.model, self.num_layers, self.with_position_ids = model, num_layers, with_position_ids

    def forward(self, input_ids, attention_mask, *rest):
        position_ids = rest[0] if self.with_position_ids else None
        flat = rest[1:] if self.with_position_ids else rest
        pairs = [(flat[2 * i], flat[2 * i + 1]) for i in range(self.num_layers)]
        extra = {"position_ids": position_ids} if self.with_position_ids else {}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                         past_key_values=DynamicCache(ddp_cache_data=pairs), use_cache=True, **extra)
        presents = []
        for layer in out.past_key_values.layers:
            presents += [layer.keys, layer.values]
        return (out.logits, *presents)


class Seq2SeqEncoder(torch.nn.Module):
    def __init__(self, model, with_mask: bool):
        super().__init__()
        self.encoder, self.with_mask = model.get_encoder(), with_mask

    def forward(self, inputs, attention_mask=None):
        if self.with_mask:
            return self.encoder(inputs, attention_mask=attention_mask).last_hidden_state
        return self.encoder(inputs).last_hidden_state


def seq2seq_step(model, input_ids, mask, hidden, cache, with_cross: bool):
    extra = {"attention_mask": mask} if mask is not None else {}
    out = model(encoder_outputs=(hidden,), decoder_input_ids=input_ids, past_key_values=cache, use_cache=True,
                **extra)
    presents = []
    for i, layer in enumerate(out.past_key_values.self_attention_cache.layers):
        presents += [layer.keys, layer.values]
        if with_cross:
            cross = out.past_key_values.cross_attention_cache.layers[i]
            presents += [cross.keys, cross.values]
    return (out.logits, *presents)


class Seq2SeqDecoder(torch.nn.Module):
    """optimum's decoder_model: input_ids, [encoder_attention_mask,] encoder_hidden_states -> logits,
    present.N.decoder.key/value, present.N.encoder.key/value."""

    def __init__(self, model, with_mask: bool):
        super().__init__()
        self.model, self.with_mask = model, with_mask

    def forward(self, input_ids, *rest):
        mask, hidden = rest if self.with_mask else (None, rest[0])
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        return seq2seq_step(self.model, input_ids, mask, hidden, cache, True)


class Seq2SeqDecoderWithPast(torch.nn.Module):
    """optimum's decoder_with_past_model: input_ids, [encoder_attention_mask,] past_key_values.N.
    decoder/encoder.key/value -> logits, present.N.decoder.key/value. The encoder's hidden states are
    not an input (the cross-attention past replaces them): a zero tensor of their shape stands in."""

    def __init__(self, model, num_layers: int, hidden_size: int, with_mask: bool):
        super().__init__()
        self.model, self.num_layers, self.hidden_size, self.with_mask = model, num_layers, hidden_size, with_mask

    def forward(self, input_ids, *rest):
        mask = rest[0] if self.with_mask else None
        flat = rest[1:] if self.with_mask else rest
        cache = EncoderDecoderCache([tuple(flat[4 * i: 4 * i + 4]) for i in range(self.num_layers)])
        encoder_length = flat[2].shape[2]
        placeholder = torch.zeros(input_ids.shape[0], encoder_length, self.hidden_size, dtype=torch.float32)
        return seq2seq_step(self.model, input_ids, mask, placeholder, cache, False)


# =============================================================================================== plans
# How an architecture's model becomes parts. Each returns {part suffix: Part}; the suffix is "" for a
# single-graph model, "_encoder" / "_decoder" for an encoder-decoder's parts.

BATCH_SEQ = ["batch", "sequence_length"]


def text_dims(batch, seq):
    return {"batch": batch, "sequence_length": seq}


def forward_takes(model, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


def text_parts(arch: Arch, model) -> dict[str, Part]:
    vocab = model.config.vocab_size
    inputs = [spec("input_ids", BATCH_SEQ, "token_ids", value_range=(0, vocab))]
    if forward_takes(model, "attention_mask"):
        inputs.append(spec("attention_mask", BATCH_SEQ, "attention_mask"))
    if arch.token_types:
        inputs.append(spec("token_type_ids", BATCH_SEQ, "token_type_ids", value_range=(0, arch.token_types)))
    names = [e["name"] for e in inputs]
    module = Fields(model, names, [])
    trace = text_dims(2, arch.seq_lengths[0])
    example = make_feeds(inputs, trace, np.random.default_rng(SEED))
    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v) for k, v in example.items()})
    module.output_names = fields_of(out, arch.fields or ["last_hidden_state", "pooler_output"])
    axes = {n: {0: "batch", 1: "sequence_length"} for n in names}
    for name in module.output_names:
        value = getattr(out, name)
        axes[name] = {0: "batch", 1: "sequence_length"} if value.dim() >= 3 else {0: "batch"}
    return {"": Part(module, inputs, module.output_names, axes, trace, text_dims(2, arch.seq_lengths[1]),
                     text_dims(3, arch.seq_lengths[2]), arch.opset)}


def decoder_parts(arch: Arch, model) -> dict[str, Part]:
    """fp32: the plain forward, no cache -> logits."""
    vocab = model.config.vocab_size
    inputs = [spec("input_ids", BATCH_SEQ, "token_ids", value_range=(0, vocab)),
              spec("attention_mask", BATCH_SEQ, "attention_mask")]
    if forward_takes(model, "position_ids"):
        inputs.append(spec("position_ids", BATCH_SEQ, "position_ids"))
    names = [e["name"] for e in inputs]
    axes = {n: {0: "batch", 1: "sequence_length"} for n in [*names, "logits"]}
    module = Fields(model, names, ["logits"], {"use_cache": False})
    return {"": Part(module, inputs, ["logits"], axes, text_dims(2, 8), text_dims(2, 7), text_dims(3, 12),
                     arch.opset)}


def past_dims(batch, seq, past):
    return {"batch": batch, "sequence_length": seq, "past_sequence_length": past}


def decoder_past_parts(arch: Arch, model) -> dict[str, Part]:
    """with_past: optimum's decoder_with_past names. Cache shapes are read off a forward."""
    with torch.no_grad():
        out = model(input_ids=torch.zeros(1, 3, dtype=torch.int64), use_cache=True)
    shapes = [tuple(layer.keys.shape) for layer in out.past_key_values.layers]
    value_shapes = [tuple(layer.values.shape) for layer in out.past_key_values.layers]
    with_position_ids = forward_takes(model, "position_ids")
    total = "past_sequence_length+sequence_length"
    inputs = [spec("input_ids", BATCH_SEQ, "token_ids", value_range=(0, model.config.vocab_size)),
              spec("attention_mask", ["batch", total], "attention_mask")]
    if with_position_ids:
        inputs.append(spec("position_ids", BATCH_SEQ, "position_ids"))
    axes = {"input_ids": {0: "batch", 1: "sequence_length"}, "attention_mask": {0: "batch", 1: "total_sequence_length"},
            "logits": {0: "batch", 1: "sequence_length"}}
    if with_position_ids:
        axes["position_ids"] = {0: "batch", 1: "sequence_length"}
    outputs = ["logits"]
    for i, (k_shape, v_shape) in enumerate(zip(shapes, value_shapes)):
        for part, shape in (("key", k_shape), ("value", v_shape)):
            name = f"past_key_values.{i}.{part}"
            inputs.append(spec(name, ["batch", shape[1], "past_sequence_length", shape[3]], "float", "float32"))
            axes[name] = {0: "batch", 2: "past_sequence_length"}
            outputs.append(f"present.{i}.{part}")
            axes[outputs[-1]] = {0: "batch", 2: "total_sequence_length"}
    module = DecoderWithPast(model, len(shapes), with_position_ids)
    return {"": Part(module, inputs, outputs, axes, past_dims(2, 4, 3), past_dims(2, 3, 5), past_dims(3, 1, 6),
                     arch.opset)}


def image_dims(arch: Arch, batch, scale=1):
    dims = {"batch": batch}
    if arch.dynamic_image:
        dims.update(height=arch.image * scale, width=arch.image * scale)
    return dims


def pixel_spec(arch: Arch, name="pixel_values") -> dict:
    hw = ["height", "width"] if arch.dynamic_image else [arch.image, arch.image]
    return spec(name, ["batch", arch.channels, *hw], "float", "float32")


def image_parts(arch: Arch, model) -> dict[str, Part]:
    inputs = [pixel_spec(arch)]
    axes = {"pixel_values": {0: "batch", 2: "height", 3: "width"} if arch.dynamic_image else {0: "batch"}}
    return generic_parts(arch, model, inputs, axes, image_dims(arch, 2), image_dims(arch, 1),
                         image_dims(arch, 3, 2 if arch.dynamic_image else 1),
                         ["last_hidden_state", "pooler_output"])


def audio_parts(arch: Arch, model) -> dict[str, Part]:
    """Raw waveform models (input_values [batch, samples]) or fixed-size spectrogram ones (AST)."""
    if arch.audio_shape:  # a fixed [frames, bins] input
        inputs = [spec("input_values", ["batch", *arch.audio_shape], "float", "float32")]
        axes = {"input_values": {0: "batch"}}
        dims = ({"batch": 2}, {"batch": 2}, {"batch": 3})
    else:
        inputs = [spec("input_values", ["batch", "samples"], "float", "float32")]
        axes = {"input_values": {0: "batch", 1: "samples"}}
        dims = ({"batch": 2, "samples": 800}, {"batch": 2, "samples": 640}, {"batch": 1, "samples": 1200})
    return generic_parts(arch, model, inputs, axes, *dims, ["last_hidden_state"])


def clip_parts(arch: Arch, model) -> dict[str, Part]:
    """A text+image dual encoder: input_ids, attention_mask, pixel_values (the same batch)."""
    vocab = model.config.text_config.vocab_size
    inputs = [spec("input_ids", BATCH_SEQ, "token_ids", value_range=(0, vocab)),
              spec("attention_mask", BATCH_SEQ, "attention_mask"), pixel_spec(arch)]
    axes = {"input_ids": {0: "batch", 1: "sequence_length"}, "attention_mask": {0: "batch", 1: "sequence_length"},
            "pixel_values": {0: "batch"}}
    dims = [{"batch": b, "sequence_length": s} for b, s in ((2, 8), (2, 7), (3, 5))]
    return generic_parts(arch, model, inputs, axes, *dims, ["logits_per_image", "text_embeds", "image_embeds"])


def generic_parts(arch, model, inputs, axes, trace, dims, dims_alt, default_fields) -> dict[str, Part]:
    """One graph: the model called with the inputs by name, returning arch.fields (or default_fields)."""
    names = [e["name"] for e in inputs]
    module = Fields(model, names, [])
    example = make_feeds(inputs, trace, np.random.default_rng(SEED))
    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v) for k, v in example.items()})
    module.output_names = fields_of(out, arch.fields or default_fields)
    if not module.output_names:
        raise FlavourFailed(f"none of the outputs {arch.fields or default_fields} in {type(out).__name__}")
    for name in module.output_names:
        axes[name] = {0: "batch"}
    return {"": Part(module, inputs, module.output_names, axes, trace, dims, dims_alt, arch.opset)}


def seq2seq_dims(batch, enc, dec, past=None, text=True):
    dims = {"batch": batch, "encoder_sequence_length": enc, "decoder_sequence_length": dec}
    if not text:  # Whisper: the encoder length is fixed
        del dims["encoder_sequence_length"]
    if past is not None:
        dims["past_decoder_sequence_length"] = past
    return dims


def seq2seq_parts(arch: Arch, model) -> dict[str, Part]:
    """optimum's seq2seq layout: encoder, decoder (first step), decoder with past (with_past only).

    Text models: the encoder takes input_ids + attention_mask and the decoders an encoder_attention_mask.
    Whisper (arch.audio_shape): the encoder takes input_features [batch, mels, frames] of a fixed size,
    no mask anywhere, and the encoder length is fixed too."""
    config = model.config
    vocab = config.vocab_size
    text = not arch.audio_shape
    d_model = config.d_model
    enc_len = "encoder_sequence_length" if text else config.max_source_positions
    if text:
        enc_inputs = [spec("input_ids", ["batch", enc_len], "token_ids", value_range=(0, vocab)),
                      spec("attention_mask", ["batch", enc_len], "attention_mask")]
        enc_axes = {n: {0: "batch", 1: enc_len} for n in ("input_ids", "attention_mask", "last_hidden_state")}
    else:
        enc_inputs = [spec("input_features", ["batch", *arch.audio_shape], "float", "float32")]
        enc_axes = {"input_features": {0: "batch"}, "last_hidden_state": {0: "batch"}}
    encoder = Seq2SeqEncoder(model, text)
    enc_dims = [{"batch": b, "encoder_sequence_length": e} if text else {"batch": b}
                for b, e in ((2, 9), (2, 7), (3, 5))]
    parts = {"_encoder": Part(encoder, enc_inputs, ["last_hidden_state"], enc_axes, *enc_dims, arch.opset)}

    dec_ids = spec("input_ids", ["batch", "decoder_sequence_length"], "token_ids", value_range=(0, vocab))
    mask = [spec("encoder_attention_mask", ["batch", enc_len], "attention_mask")] if text else []
    hidden = spec("encoder_hidden_states", ["batch", enc_len, d_model], "float", "float32")
    first = Seq2SeqDecoder(model, text)
    # Cache shapes, read off a first step.
    feeds = make_feeds([dec_ids, *mask, hidden], seq2seq_dims(1, 4, 2, text=text), np.random.default_rng(SEED))
    with torch.no_grad():
        presents = first(*(torch.from_numpy(v) for v in feeds.values()))[1:]
    layers = len(presents) // 4
    heads, head_dim = presents[0].shape[1], presents[0].shape[3]
    present_names = [f"present.{i}.{who}.{kv}" for i in range(layers) for who in ("decoder", "encoder")
                     for kv in ("key", "value")]
    axes = {"input_ids": {0: "batch", 1: "decoder_sequence_length"},
            "encoder_hidden_states": {0: "batch", 1: enc_len} if text else {0: "batch"},
            "logits": {0: "batch", 1: "decoder_sequence_length"}}
    if text:
        axes["encoder_attention_mask"] = {0: "batch", 1: enc_len}
    for name in present_names:
        axes[name] = {0: "batch", 2: "decoder_sequence_length"} if ".decoder." in name \
            else ({0: "batch", 2: enc_len} if text else {0: "batch"})
    parts["_decoder"] = Part(first, [dec_ids, *mask, hidden], ["logits", *present_names], axes,
                             seq2seq_dims(2, 9, 4, text=text), seq2seq_dims(2, 7, 3, text=text),
                             seq2seq_dims(3, 5, 1, text=text), arch.opset)

    past_inputs, axes = [], {"input_ids": {0: "batch", 1: "decoder_sequence_length"},
                             "logits": {0: "batch", 1: "decoder_sequence_length"}}
    if text:
        axes["encoder_attention_mask"] = {0: "batch", 1: enc_len}
    for i in range(layers):
        for who, length in (("decoder", "past_decoder_sequence_length"), ("encoder", enc_len)):
            for kv in ("key", "value"):
                name = f"past_key_values.{i}.{who}.{kv}"
                past_inputs.append(spec(name, ["batch", heads, length, head_dim], "float", "float32"))
                axes[name] = {0: "batch", 2: length} if isinstance(length, str) else {0: "batch"}
    self_presents = [f"present.{i}.decoder.{kv}" for i in range(layers) for kv in ("key", "value")]
    for name in self_presents:
        axes[name] = {0: "batch", 2: "total_decoder_sequence_length"}
    parts["with_past_decoder"] = Part(
        Seq2SeqDecoderWithPast(model, layers, d_model, text), [dec_ids, *mask, *past_inputs],
        ["logits", *self_presents], axes, seq2seq_dims(2, 9, 1, 4, text), seq2seq_dims(2, 7, 1, 5, text),
        seq2seq_dims(3, 5, 2, 3, text), arch.opset)
    return parts


PLANS = {"text": text_parts, "decoder": decoder_parts, "image": image_parts, "audio": audio_parts,
         "clip": clip_parts, "seq2seq": seq2seq_parts}


# ======================================================================================= architectures


@dataclass
class Arch:
    name: str
    family: str  # one of FAMILIES
    config: Callable[[], transformers.PretrainedConfig]
    model_class: object  # a transformers Auto* or model class: built with from_config / _from_config
    plan: str  # a key of PLANS
    flavours: tuple[str, ...]
    optimizer: str | None = None  # optimize_model's model_type (ort_optimized)
    genai: tuple[str, ...] = ()  # builder precisions: fp32, int4
    fields: list[str] | None = None  # output fields to export (default: per plan)
    token_types: int = 0  # > 0: a token_type_ids input with values in [0, token_types)
    seq_lengths: tuple[int, int, int] = (8, 7, 13)  # text encoders: traced, dims, dims_alt sequence lengths
    image: int = 32
    channels: int = 3
    dynamic_image: bool = False  # height and width dynamic
    audio_shape: tuple | None = None  # fixed non-batch input dims (AST, Whisper)
    opset: int = OPSET
    experts: str | None = None  # MoE: transformers' experts_implementation (batched_mm traces without
    #                             data-dependent loops over the experts)
    notes: str = ""


TEXT = ("fp32", "ort_optimized", "fp16", "int8_dynamic")
TEXT_Q4 = TEXT + ("q4",)
DECODER = ("fp32", "with_past", "int8_dynamic", "q4")
SEQ2SEQ = ("fp32", "with_past")
H = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)  # BERT-style sizes
V = 512  # vocabulary of the text models
# wav2vec2-style audio encoders: a 3-layer conv feature extractor (20x downsampling), 2 transformer layers
WAV = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
           conv_dim=(16, 16, 16), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=8,
           num_conv_pos_embedding_groups=4, vocab_size=32)


def bert_like(cls, **fields):
    return lambda: cls(**{**H, "vocab_size": V, "max_position_embeddings": 128, **fields})


def llama_like(cls, **fields):
    """A decoder config: hidden 64, 4 heads of 16 on 2 key/value heads, 2 layers."""
    return lambda: cls(**{**H, "vocab_size": V, "num_key_value_heads": 2, "max_position_embeddings": 128,
                          "tie_word_embeddings": False, **fields})


T = transformers
AM, LM, S2S = T.AutoModel, T.AutoModelForCausalLM, T.AutoModelForSeq2SeqLM

ARCHS: list[Arch] = [
    # ------------------------------------------------------------------ text encoders
    Arch("bert", "text encoder", bert_like(T.BertConfig), AM, "text", TEXT_Q4 + ("dynamo",), "bert", token_types=2),
    Arch("roberta", "text encoder", bert_like(T.RobertaConfig, pad_token_id=1), AM, "text", TEXT + ("dynamo",),
         "bert"),
    Arch("distilbert", "text encoder",
         lambda: T.DistilBertConfig(vocab_size=V, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                    max_position_embeddings=128), AM, "text", TEXT_Q4 + ("dynamo",), "bert"),
    Arch("deberta_v2", "text encoder",
         bert_like(T.DebertaV2Config, relative_attention=True, position_buckets=16, max_relative_positions=32,
                   pos_att_type=["p2c", "c2p"], type_vocab_size=0), AM, "text", TEXT, "bert"),
    Arch("deberta", "text encoder",
         bert_like(T.DebertaConfig, relative_attention=True, max_relative_positions=32,
                   pos_att_type=["p2c", "c2p"], type_vocab_size=0), AM, "text", TEXT, "bert"),
    Arch("albert", "text encoder", bert_like(T.AlbertConfig, embedding_size=32), AM, "text", TEXT, "bert",
         token_types=2),
    Arch("electra", "text encoder", bert_like(T.ElectraConfig, embedding_size=32), AM, "text", TEXT, "bert",
         token_types=2),
    Arch("xlm_roberta", "text encoder", bert_like(T.XLMRobertaConfig, pad_token_id=1), AM, "text", TEXT, "bert"),
    Arch("camembert", "text encoder", bert_like(T.CamembertConfig, pad_token_id=1), AM, "text", TEXT, "bert"),
    Arch("mpnet", "text encoder", bert_like(T.MPNetConfig, pad_token_id=1), AM, "text", TEXT, "bert"),
    Arch("modernbert", "text encoder",
         lambda: T.ModernBertConfig(vocab_size=V, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                    intermediate_size=128, max_position_embeddings=128, global_attn_every_n_layers=2,
                                    local_attention=4, pad_token_id=0), AM, "text", TEXT_Q4 + ("dynamo",), "bert",
         opset=18),
    Arch("nomic_bert", "text encoder", bert_like(T.NomicBertConfig), AM, "text", TEXT, "bert", token_types=2),
    Arch("convbert", "text encoder", bert_like(T.ConvBertConfig, embedding_size=64, conv_kernel_size=3), AM, "text",
         TEXT, "bert", token_types=2),
    Arch("funnel", "text encoder",
         lambda: T.FunnelConfig(vocab_size=V, block_sizes=[1, 1], block_repeats=[1, 1], num_decoder_layers=1,
                                d_model=64, n_head=4, d_head=16, d_inner=128), T.FunnelModel, "text",
         TEXT + ("dynamo",), None,
         token_types=3, seq_lengths=(8, 6, 12)),
    Arch("mobilebert", "text encoder",
         bert_like(T.MobileBertConfig, embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32,
                   num_feedforward_networks=2), AM, "text", TEXT, "bert", token_types=2),
    Arch("squeezebert", "text encoder",
         bert_like(T.SqueezeBertConfig, embedding_size=64, q_groups=2, k_groups=2, v_groups=2, post_attention_groups=2,
                   intermediate_groups=4, output_groups=4), AM, "text", TEXT, None, token_types=2),
    Arch("ernie", "text encoder", bert_like(T.ErnieConfig, task_type_vocab_size=3, use_task_id=False), AM, "text",
         TEXT, "bert", token_types=2),
    Arch("longformer", "text encoder", bert_like(T.LongformerConfig, attention_window=4, pad_token_id=1), AM,
         "text", ("fp32", "dynamo"), seq_lengths=(8, 12, 16), notes="lengths a multiple of attention_window"),
    Arch("roformer", "text encoder", bert_like(T.RoFormerConfig, embedding_size=64), AM, "text", TEXT, None,
         token_types=2),
    Arch("megatron_bert", "text encoder", bert_like(T.MegatronBertConfig), AM, "text", TEXT, "bert", token_types=2),
    Arch("rembert", "text encoder",
         bert_like(T.RemBertConfig, input_embedding_size=32, output_embedding_size=32), AM, "text", ("fp32",),
         token_types=2),
    Arch("xlm", "text encoder",
         lambda: T.XLMConfig(vocab_size=V, emb_dim=64, n_layers=2, n_heads=4, max_position_embeddings=128), AM,
         "text", ("fp32", "int8_dynamic")),
    Arch("fnet", "text encoder", bert_like(T.FNetConfig), AM, "text", ("fp32", "dynamo"), token_types=2),
    Arch("esm", "text encoder",
         bert_like(T.EsmConfig, pad_token_id=1, mask_token_id=2, position_embedding_type="rotary"), AM, "text",
         ("fp32", "fp16")),
    Arch("bert_for_sequence_classification", "text encoder", bert_like(T.BertConfig, num_labels=3),
         T.AutoModelForSequenceClassification, "text", ("fp32", "int8_dynamic"), token_types=2, fields=["logits"],
         notes="a task head: the BERT/E5/BGE/GTE-style pooled classifier"),

    # ------------------------------------------------------------------ decoders
    Arch("gpt2", "decoder",
         lambda: T.GPT2Config(vocab_size=V, n_positions=128, n_embd=64, n_layer=2, n_head=4), LM, "decoder",
         DECODER + ("ort_optimized", "fp16", "dynamo"), "gpt2"),
    Arch("gptj", "decoder",
         lambda: T.GPTJConfig(vocab_size=V, n_positions=128, n_embd=64, n_layer=2, n_head=4, rotary_dim=8), LM,
         "decoder", DECODER),
    Arch("gpt_neox", "decoder",
         lambda: T.GPTNeoXConfig(**H, vocab_size=V, max_position_embeddings=128, rotary_pct=0.5), LM, "decoder",
         DECODER + ("ort_optimized",), "gpt_neox"),
    Arch("gpt_neo", "decoder",
         lambda: T.GPTNeoConfig(vocab_size=V, max_position_embeddings=128, hidden_size=64, num_layers=2, num_heads=4,
                                attention_types=[[["global", "local"], 1]], window_size=4), LM, "decoder", DECODER),
    Arch("opt", "decoder",
         lambda: T.OPTConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
                             max_position_embeddings=128, word_embed_proj_dim=64), LM, "decoder", DECODER),
    Arch("bloom", "decoder", lambda: T.BloomConfig(vocab_size=V, hidden_size=64, n_layer=2, n_head=4), LM,
         "decoder", DECODER),
    Arch("falcon", "decoder",
         lambda: T.FalconConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                num_kv_heads=2, new_decoder_architecture=True, alibi=False), LM, "decoder", DECODER),
    Arch("llama", "decoder", llama_like(T.LlamaConfig), LM, "decoder",
         DECODER + ("fp16", "genai", "dynamo"), genai=("fp32", "int4"), opset=18),
    Arch("mistral", "decoder", llama_like(T.MistralConfig, sliding_window=None), LM, "decoder",
         DECODER + ("genai",), genai=("fp32",)),
    Arch("mixtral", "decoder",
         llama_like(T.MixtralConfig, num_local_experts=4, num_experts_per_tok=2, sliding_window=None), LM,
         "decoder", DECODER, experts="batched_mm", opset=18),
    Arch("qwen2", "decoder", llama_like(T.Qwen2Config, use_sliding_window=False), LM, "decoder",
         DECODER + ("fp16", "genai"), genai=("fp32", "int4"), opset=18),
    Arch("qwen3", "decoder", llama_like(T.Qwen3Config, head_dim=16, use_sliding_window=False), LM, "decoder",
         DECODER + ("ort_optimized", "genai"), "qwen3", genai=("fp32",), opset=18),
    Arch("qwen2_moe", "decoder",
         llama_like(T.Qwen2MoeConfig, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                    shared_expert_intermediate_size=64, use_sliding_window=False), LM, "decoder", DECODER,
         experts="batched_mm"),
    Arch("qwen3_moe", "decoder",
         llama_like(T.Qwen3MoeConfig, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                    use_sliding_window=False), LM, "decoder", DECODER, experts="batched_mm"),
    Arch("phi", "decoder",
         llama_like(T.PhiConfig, partial_rotary_factor=0.5, num_attention_heads=2, num_key_value_heads=2), LM,
         "decoder", DECODER + ("genai",), genai=("fp32",),
         notes="2 heads of 32: onnxruntime's GroupQueryAttention wants the rotary half-width a multiple of 8"),
    Arch("phi3", "decoder", llama_like(T.Phi3Config, original_max_position_embeddings=128, pad_token_id=0), LM,
         "decoder", DECODER + ("fp16", "genai"), genai=("fp32", "int4"), opset=18),
    Arch("gemma", "decoder",
         llama_like(T.GemmaConfig, head_dim=16, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),
         LM, "decoder", DECODER + ("genai",), genai=("fp32",), opset=18),
    Arch("gemma2", "decoder",
         llama_like(T.Gemma2Config, head_dim=16, hidden_activation="gelu_pytorch_tanh", sliding_window=4,
                    attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=16,
                    tie_word_embeddings=True), LM, "decoder", DECODER + ("genai",), genai=("fp32",)),
    Arch("gemma3_text", "decoder",
         llama_like(T.Gemma3TextConfig, head_dim=16, sliding_window=4, query_pre_attn_scalar=16,
                    layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=True), LM,
         "decoder", DECODER + ("genai",), genai=("fp32",)),
    Arch("stablelm", "decoder", llama_like(T.StableLmConfig, partial_rotary_factor=0.5), LM, "decoder", DECODER),
    Arch("granite", "decoder",
         llama_like(T.GraniteConfig, embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=2.0,
                    attention_multiplier=0.25), LM, "decoder", DECODER + ("genai",), genai=("fp32",)),
    Arch("olmo", "decoder", llama_like(T.OlmoConfig, clip_qkv=8.0), LM, "decoder", DECODER + ("genai",),
         genai=("fp32",)),
    Arch("olmo2", "decoder", llama_like(T.Olmo2Config), LM, "decoder", DECODER),
    Arch("smollm", "decoder", llama_like(T.LlamaConfig, tie_word_embeddings=True, num_key_value_heads=1), LM,
         "decoder", ("fp32", "with_past"), notes="SmolLM(2) is a Llama config: tied embeddings, 1 kv head"),
    Arch("smollm3", "decoder", llama_like(T.SmolLM3Config, no_rope_layer_interval=2, pad_token_id=0), LM, "decoder",
         ("fp32", "with_past")),
    Arch("codegen", "decoder",
         lambda: T.CodeGenConfig(vocab_size=V, n_positions=128, n_ctx=128, n_embd=64, n_layer=2, n_head=4,
                                 rotary_dim=8), LM, "decoder", DECODER),
    Arch("starcoder2", "decoder", llama_like(T.Starcoder2Config, sliding_window=None), LM, "decoder", DECODER),
    Arch("gpt_bigcode", "decoder",
         lambda: T.GPTBigCodeConfig(vocab_size=V, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                                    multi_query=True), LM, "decoder", DECODER),
    Arch("mpt", "decoder",
         lambda: T.MptConfig(vocab_size=V, d_model=64, n_layers=2, n_heads=4, max_seq_len=128), LM, "decoder",
         ("fp32", "with_past")),
    Arch("biogpt", "decoder", bert_like(T.BioGptConfig), LM, "decoder", ("fp32", "with_past")),
    Arch("xglm", "decoder",
         lambda: T.XGLMConfig(vocab_size=V, d_model=64, num_layers=2, attention_heads=4, ffn_dim=128,
                              max_position_embeddings=128), LM, "decoder", ("fp32", "with_past")),
    Arch("persimmon", "decoder", llama_like(T.PersimmonConfig, partial_rotary_factor=0.5), LM, "decoder",
         ("fp32", "with_past")),
    Arch("cohere", "decoder", llama_like(T.CohereConfig, logit_scale=0.5), LM, "decoder",
         ("fp32", "with_past", "dynamo")),
    Arch("glm", "decoder", llama_like(T.GlmConfig, head_dim=16, partial_rotary_factor=0.5, pad_token_id=0), LM,
         "decoder", ("fp32", "with_past", "dynamo")),
    Arch("nemotron", "decoder", llama_like(T.NemotronConfig, partial_rotary_factor=0.5), LM, "decoder",
         ("fp32", "with_past")),
    Arch("helium", "decoder", llama_like(T.HeliumConfig, head_dim=16), LM, "decoder",
         ("fp32", "with_past", "dynamo")),
    Arch("gpt_oss", "decoder",
         llama_like(T.GptOssConfig, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=4), LM,
         "decoder", ("fp32", "with_past"), experts="batched_mm"),

    # ------------------------------------------------------------------ encoder-decoders
    Arch("t5", "encoder-decoder",
         lambda: T.T5Config(vocab_size=V, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                            num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20,
                            decoder_start_token_id=0), S2S, "seq2seq", SEQ2SEQ + ("int8_dynamic",)),
    Arch("flan_t5", "encoder-decoder",
         lambda: T.T5Config(vocab_size=V, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                            num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20,
                            feed_forward_proj="gated-gelu", tie_word_embeddings=False, decoder_start_token_id=0),
         S2S, "seq2seq", SEQ2SEQ, notes="T5 v1.1 / Flan-T5: gated GELU, untied head"),
    Arch("bart", "encoder-decoder",
         lambda: T.BartConfig(vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2,
                              encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                              decoder_ffn_dim=128, max_position_embeddings=128), S2S, "seq2seq",
         SEQ2SEQ + ("int8_dynamic",), opset=18),
    Arch("mbart", "encoder-decoder",
         lambda: T.MBartConfig(vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2,
                               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                               decoder_ffn_dim=128, max_position_embeddings=128), S2S, "seq2seq", SEQ2SEQ),
    Arch("marian", "encoder-decoder",
         lambda: T.MarianConfig(vocab_size=V, decoder_vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2,
                                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                decoder_ffn_dim=128, max_position_embeddings=128, pad_token_id=V - 1,
                                decoder_start_token_id=V - 1), S2S, "seq2seq", SEQ2SEQ),
    Arch("pegasus", "encoder-decoder",
         lambda: T.PegasusConfig(vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2,
                                 encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                 decoder_ffn_dim=128, max_position_embeddings=128), S2S, "seq2seq", SEQ2SEQ),
    Arch("m2m_100", "encoder-decoder",
         lambda: T.M2M100Config(vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2,
                                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                decoder_ffn_dim=128, max_position_embeddings=128), S2S, "seq2seq", SEQ2SEQ),
    Arch("blenderbot_small", "encoder-decoder",
         lambda: T.BlenderbotSmallConfig(vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2,
                                         encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                         decoder_ffn_dim=128, max_position_embeddings=128), S2S, "seq2seq",
         SEQ2SEQ),
    Arch("whisper", "encoder-decoder",
         lambda: T.WhisperConfig(vocab_size=V, num_mel_bins=16, d_model=64, encoder_layers=2, decoder_layers=2,
                                 encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                 decoder_ffn_dim=128, max_source_positions=16, max_target_positions=64,
                                 decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                 suppress_tokens=None, begin_suppress_tokens=None),
         T.WhisperForConditionalGeneration, "seq2seq", SEQ2SEQ, audio_shape=(16, 32), opset=18),

    # ------------------------------------------------------------------ vision
    Arch("vit", "vision",
         lambda: T.ViTConfig(**H, image_size=32, patch_size=8), AM, "image",
         ("fp32", "ort_optimized", "fp16", "int8_dynamic", "q4", "dynamo"), "vit", opset=18),
    Arch("deit", "vision", lambda: T.DeiTConfig(**H, image_size=32, patch_size=8), AM, "image",
         ("fp32", "ort_optimized", "fp16"), "vit"),
    Arch("beit", "vision",
         lambda: T.BeitConfig(**H, image_size=32, patch_size=8, use_relative_position_bias=True), AM, "image",
         ("fp32", "fp16")),
    Arch("data2vec_vision", "vision",
         lambda: T.Data2VecVisionConfig(**H, image_size=32, patch_size=8, use_relative_position_bias=True), AM,
         "image", ("fp32",)),
    Arch("dinov2", "vision",
         lambda: T.Dinov2Config(**H, image_size=32, patch_size=8, mlp_ratio=2), AM, "image",
         ("fp32", "ort_optimized", "fp16"), "vit", opset=18),
    Arch("swin", "vision",
         lambda: T.SwinConfig(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                              window_size=4), AM, "image", ("fp32", "ort_optimized", "fp16", "int8_dynamic"),
         "swin", opset=18),
    Arch("swinv2", "vision",
         lambda: T.Swinv2Config(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                window_size=4), AM, "image", ("fp32",)),
    Arch("convnext", "vision",
         lambda: T.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2), AM, "image",
         ("fp32", "fp16", "int8_dynamic", "dynamo"), dynamic_image=True, opset=18),
    Arch("convnextv2", "vision",
         lambda: T.ConvNextV2Config(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2), AM, "image",
         ("fp32", "fp16"), dynamic_image=True),
    Arch("resnet", "vision",
         lambda: T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck"),
         AM, "image", ("fp32", "fp16", "int8_dynamic"), dynamic_image=True),
    Arch("mobilenet_v2", "vision",
         lambda: T.MobileNetV2Config(depth_multiplier=0.25, image_size=32), AM, "image", ("fp32", "fp16"),
         dynamic_image=True),
    Arch("mobilenet_v1", "vision",
         lambda: T.MobileNetV1Config(depth_multiplier=0.25, image_size=32), AM, "image", ("fp32",),
         dynamic_image=True),
    Arch("efficientnet", "vision",
         lambda: T.EfficientNetConfig(image_size=32, width_coefficient=0.25, depth_coefficient=0.25,
                                      hidden_dim=320), AM, "image", ("fp32",), dynamic_image=True),
    Arch("regnet", "vision",
         lambda: T.RegNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8), AM,
         "image", ("fp32",), dynamic_image=True),
    Arch("mobilevit", "vision",
         lambda: T.MobileViTConfig(image_size=32, patch_size=2, hidden_sizes=[16, 24, 32],
                                   neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32], num_attention_heads=2), AM,
         "image", ("fp32",)),
    Arch("segformer", "vision",
         lambda: T.SegformerConfig(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                                   patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                                   decoder_hidden_size=32, num_labels=3), T.SegformerForSemanticSegmentation,
         "image", ("fp32",), fields=["logits"], dynamic_image=True),
    Arch("levit", "vision",
         lambda: T.LevitConfig(image_size=32, hidden_sizes=[32, 48], num_attention_heads=[2, 2], depths=[1, 1],
                               key_dim=[8, 8], drop_path_rate=0, mlp_ratio=[2, 2], attention_ratio=[2, 2],
                               down_ops=[["Subsample", 8, 2, 4, 2, 2]]), AM, "image", ("fp32",)),
    Arch("poolformer", "vision",
         lambda: T.PoolFormerConfig(hidden_sizes=[16, 32], depths=[1, 1], num_encoder_blocks=2,
                                    patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1]), AM, "image", ("fp32",),
         dynamic_image=True),
    Arch("yolos", "vision",
         lambda: T.YolosConfig(**H, image_size=[32, 32], patch_size=8, num_detection_tokens=4),
         T.YolosForObjectDetection, "image", ("fp32",), fields=["logits", "pred_boxes"]),
    Arch("detr", "vision",
         lambda: T.DetrConfig(use_timm_backbone=False, use_pretrained_backbone=False,
                              backbone_config=T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 48, 64],
                                                             depths=[1, 1, 1, 1], out_features=["stage4"]),
                              d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                              decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=8,
                              num_labels=3), T.DetrForObjectDetection, "image", ("fp32",),
         fields=["logits", "pred_boxes"], image=64),
    Arch("sam_vision", "vision",
         lambda: T.SamVisionConfig(hidden_size=32, output_channels=16, num_hidden_layers=2, num_attention_heads=2,
                                   image_size=32, patch_size=4, window_size=4, global_attn_indexes=[1], mlp_dim=64),
         AM, "image", ("fp32",), fields=["image_embeds", "last_hidden_state"],
         notes="SAM's image encoder (SamVisionModel)"),
    Arch("clip", "vision",
         lambda: T.CLIPConfig(text_config=dict(**H, vocab_size=V, max_position_embeddings=64),
                              vision_config=dict(**H, image_size=32, patch_size=8), projection_dim=32),
         AM, "clip", ("fp32", "fp16", "int8_dynamic"), opset=18),
    Arch("siglip", "vision",
         lambda: T.SiglipConfig(text_config=dict(**H, vocab_size=V, max_position_embeddings=64),
                                vision_config=dict(**H, image_size=32, patch_size=8)), AM, "clip", ("fp32",)),

    # ------------------------------------------------------------------ audio
    Arch("wav2vec2", "audio", lambda: T.Wav2Vec2Config(**WAV), AM, "audio",
         ("fp32", "fp16", "int8_dynamic")),
    Arch("hubert", "audio", lambda: T.HubertConfig(**WAV), AM, "audio", ("fp32",)),
    Arch("wavlm", "audio", lambda: T.WavLMConfig(**WAV, num_buckets=16, max_bucket_distance=64), AM, "audio",
         ("fp32",)),
    Arch("data2vec_audio", "audio", lambda: T.Data2VecAudioConfig(**{**WAV, "num_conv_pos_embeddings": 4}), AM,
         "audio", ("fp32",)),
    Arch("ast", "audio",
         lambda: T.ASTConfig(**H, patch_size=8, num_mel_bins=16, max_length=32, frequency_stride=8, time_stride=8),
         AM, "audio", ("fp32", "ort_optimized"), "vit", audio_shape=(32, 16)),
]

ARCH_BY_NAME = {a.name: a for a in ARCHS}
assert len(ARCH_BY_NAME) == len(ARCHS) and all(a.family in FAMILIES and a.plan in PLANS for a in ARCHS)


# ====================================================================================== model building


def build_model(arch: Arch) -> torch.nn.Module:
    """The architecture's model from its config, seeded, with weights large enough to matter."""
    torch.manual_seed(SEED)
    config = arch.config()
    kwargs = {"attn_implementation": "eager"}
    if arch.experts:
        kwargs["experts_implementation"] = arch.experts
    cls = arch.model_class
    model = cls.from_config(config, **kwargs) if hasattr(cls, "from_config") else cls._from_config(config, **kwargs)
    randomize(model, torch.Generator().manual_seed(SEED))
    return model.eval()


def config_size(config, *names) -> int:
    """The first of names that the (text) config has as an int; 0 when none (the optimizer then detects)."""
    for source in (config, getattr(config, "text_config", None)):
        for name in names:
            value = getattr(source, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return 0


# ========================================================================================== validation


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def feeds_for(entries: list[dict], dims: dict, index: int) -> dict:
    # The same inputs for a dims entry in every flavour of a file (float16 ones are these, rounded).
    return make_feeds(entries, dims, np.random.default_rng(SEED + 1 + index))


def run_ort(path: Path, entries: list[dict], outputs: list[str], shapes: list[dict]) -> list[list[np.ndarray]]:
    """Runs the file at each dims; fails on an error or a non-finite output."""
    sess = session(path)
    results = []
    for index, dims in enumerate(shapes):
        try:
            got = sess.run(outputs, feeds_for(entries, dims, index))
        except Exception as error:  # noqa: BLE001
            raise FlavourFailed(f"onnxruntime at {dims}: {last_line(error)}") from None
        for name, value in zip(outputs, got):
            if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
                raise FlavourFailed(f"onnxruntime at {dims}: output {name} is not finite")
        results.append(got)
    return results


def worst_diff(got: list[np.ndarray], expected: list[np.ndarray], names: list[str], where: str,
               tolerance: float | None) -> float:
    worst = 0.0
    for name, g, e in zip(names, got, expected, strict=True):
        if g.shape != e.shape:
            raise FlavourFailed(f"{name} at {where}: shape {list(g.shape)}, PyTorch {list(e.shape)}")
        if not g.size:
            continue
        e64 = e.astype(np.float64)
        diff = float(np.max(np.abs(g.astype(np.float64) - e64)))
        scale = max(1.0, float(np.max(np.abs(e64))))
        if tolerance is not None and not diff <= tolerance * scale:
            raise FlavourFailed(f"{name} at {where}: max |onnxruntime - PyTorch| {diff:.3g} > "
                                f"{tolerance} * {scale:.3g}")
        worst = max(worst, diff / scale)
    return worst


def check_against_torch(path: Path, part: Part) -> dict:
    """ORT (optimizations off) vs the PyTorch module at the traced shape, dims and dims_alt."""
    shapes = [part.dims, part.dims_alt, part.trace_dims]
    got = run_ort(path, part.inputs, part.outputs, shapes)
    worst = 0.0
    for index, (dims, values) in enumerate(zip(shapes, got)):
        feeds = feeds_for(part.inputs, dims, index)
        with torch.no_grad():
            expected = part.module(*torch_args(feeds, part.inputs))
        expected = [e.numpy() for e in (expected if isinstance(expected, (tuple, list)) else [expected])]
        worst = max(worst, worst_diff(values, expected, part.outputs, json.dumps(dims), TOLERANCE))
    return {"onnxruntime_runs": ["dims", "dims_alt", "traced"],
            "max_rel_diff_vs_pytorch": float(f"{worst:.3g}"), "tolerance_vs_pytorch": TOLERANCE}


def check_against_file(path: Path, entries: list[dict], outputs: list[str], spec_: dict, reference: Path) -> dict:
    """Runs at dims and dims_alt; records (does not judge) the difference from the fp32 file's outputs."""
    shapes = [spec_["dims"], spec_["dims_alt"]]
    got = run_ort(path, entries, outputs, shapes)
    ref_spec = json.loads((reference.parent / "inputs.json").read_text())
    expected = run_ort(reference, ref_spec["inputs"], outputs, shapes) if set(outputs) <= set(ref_spec["outputs"]) \
        else None
    info = {"onnxruntime_runs": ["dims", "dims_alt"]}
    if expected is not None:
        worst = max(worst_diff(g, e, outputs, "", None) for g, e in zip(got, expected))
        info["max_rel_diff_vs_fp32"] = float(f"{worst:.3g}")
    return info


# ============================================================================================ flavours


@dataclass
class Job:
    """One architecture's run: its model, its parts (built on first use) and its output folder."""

    arch: Arch
    folder: Path  # <out>/<arch>
    model: torch.nn.Module | None = None
    _parts: dict | None = None

    @property
    def parts(self) -> dict[str, Part]:
        """{"": Part} or {"_encoder", "_decoder"}, plus the with_past part(s) under their file flavour."""
        if self._parts is None:
            self._parts = PLANS[self.arch.plan](self.arch, self.model)
            if self.arch.plan == "decoder" and "with_past" in self.arch.flavours:
                self._parts["with_past"] = decoder_past_parts(self.arch, self.model)[""]
        return self._parts


def file_flavours(arch: Arch, selected: list[str]) -> list[tuple[str, str, str]]:
    """(flavour, file flavour, part key) for each file the architecture gets among the selected flavours."""
    suffixes = ["_encoder", "_decoder"] if arch.plan == "seq2seq" else [""]
    files = []
    for flavour in FLAVOURS:
        if flavour not in arch.flavours or flavour not in selected:
            continue
        if flavour == "ort_optimized" and not arch.optimizer:  # the optimizer has no model type for it
            continue
        if flavour == "with_past":
            key = "with_past_decoder" if arch.plan == "seq2seq" else "with_past"
            files.append((flavour, key, key))
        elif flavour == "genai":
            files += [(flavour, f"genai_{precision}", "") for precision in arch.genai]
        else:
            files += [(flavour, flavour + suffix, suffix) for suffix in suffixes]
    return files


def opset_of(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def write_spec(folder: Path, job: Job, flavour: str, entries: list[dict], outputs: list[str], dims: dict,
               dims_alt: dict, about: str, validation: dict) -> None:
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    spec_ = {"model": job.arch.name, "opset": opset_of(model), "dims": dims, "dims_alt": dims_alt,
             "inputs": entries, "outputs": outputs, "arch": job.arch.name, "family": job.arch.family,
             "flavour": flavour, "about": about, "generated_by": GENERATOR, "validation": validation}
    (folder / "inputs.json").write_text(json.dumps(spec_, indent=2) + "\n")


def export_torchscript(part: Part, path: Path) -> None:
    args = torch_args(make_feeds(part.inputs, part.trace_dims, np.random.default_rng(SEED)), part.inputs)
    torch.onnx.export(part.module, args, str(path), input_names=[e["name"] for e in part.inputs],
                      output_names=part.outputs, dynamic_axes=part.dynamic_axes, opset_version=part.opset,
                      do_constant_folding=True, dynamo=False)
    part.module.eval()  # the exporter restores the training flag; make sure it is off


def export_dynamo(part: Part, path: Path) -> None:
    args = torch_args(make_feeds(part.inputs, part.trace_dims, np.random.default_rng(SEED)), part.inputs)
    # Every dynamic axis Dim.AUTO (torch.export finds the relations); the forward's *args is one tuple.
    auto = torch.export.Dim.AUTO
    shapes = tuple({axis: auto for axis in part.dynamic_axes.get(e["name"], {})} for e in part.inputs)
    torch.onnx.export(part.module, args, str(path), input_names=[e["name"] for e in part.inputs],
                      output_names=part.outputs, dynamic_shapes=(shapes,), opset_version=DYNAMO_OPSET,
                      dynamo=True, external_data=False, optimize=True, verbose=False)
    part.module.eval()


def make_traced(job: Job, folder: Path, flavour: str, key: str, exporter) -> None:
    """fp32, with_past, dynamo: export the part, then check it against PyTorch."""
    part = job.parts[key]
    path = folder / "model.onnx"
    exporter(part, path)
    model = onnx.load(str(path), load_external_data=False)
    outputs = [o.name for o in model.graph.output]
    if outputs != part.outputs:
        raise FlavourFailed(f"graph outputs {outputs} != {part.outputs}")
    validation = check_against_torch(path, part)
    kind = "dynamo=True" if exporter is export_dynamo else "dynamo=False (TorchScript)"
    about = f"torch.onnx.export {kind}, opset {opset_of(model)}, of {type(job.model).__name__}"
    if job.arch.notes:
        about += f" ({job.arch.notes})"
    write_spec(folder, job, flavour, part.inputs, part.outputs, part.dims, part.dims_alt, about, validation)


def derived(job: Job, folder: Path, flavour: str, key: str, transform: Callable[[Path, Path], str]) -> None:
    """A flavour made from the fp32 file of the same part: transform(source, target) -> its description."""
    source = job.folder / f"fp32{key}" / "model.onnx"
    if not (source.parent / "inputs.json").exists():
        raise FlavourFailed(f"needs fp32{key}, which did not export")
    path = folder / "model.onnx"
    about = transform(source, path)
    src_spec = json.loads((source.parent / "inputs.json").read_text())
    model = onnx.load(str(path), load_external_data=False)
    graph_inputs = {i.name: onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type).name
                    for i in model.graph.input}
    known = {e["name"] for e in src_spec["inputs"]}
    if set(graph_inputs) - known:
        raise FlavourFailed(f"graph inputs without a spec: {sorted(set(graph_inputs) - known)}")
    entries = [dict(e, dtype=graph_inputs[e["name"]]) for e in src_spec["inputs"] if e["name"] in graph_inputs]
    outputs = [o.name for o in model.graph.output]
    validation = check_against_file(path, entries, outputs, src_spec, source)
    write_spec(folder, job, flavour, entries, outputs, src_spec["dims"], src_spec["dims_alt"], about, validation)


def ort_optimize(job: Job):
    from onnxruntime.transformers.optimizer import optimize_model

    config = job.model.config
    heads = config_size(config, "num_attention_heads", "n_head", "encoder_attention_heads", "num_heads")
    hidden = config_size(config, "hidden_size", "n_embd", "d_model", "dim")
    if job.arch.plan == "image" and isinstance(getattr(config, "num_heads", None), list):
        heads = hidden = 0  # per-stage heads (Swin): let the optimizer detect them

    def transform(source: Path, target: Path) -> str:
        optimized = optimize_model(str(source), model_type=job.arch.optimizer, num_heads=heads, hidden_size=hidden,
                                   opt_level=OPTIMIZER_LEVEL, use_gpu=False)
        onnx.save(optimized.model, str(target))
        fused = sorted({n.op_type for n in optimized.model.graph.node if n.domain == "com.microsoft"})
        return (f"fp32 file after onnxruntime {ort.__version__} transformers optimizer (model_type="
                f"{job.arch.optimizer}, num_heads={heads}, hidden_size={hidden}, opt_level={OPTIMIZER_LEVEL}, "
                f"use_gpu=False); com.microsoft ops: {', '.join(fused) or 'none'}")

    return transform


def to_fp16(job: Job):
    from onnxruntime.transformers.float16 import convert_float_to_float16

    def transform(source: Path, target: Path) -> str:
        onnx.save(convert_float_to_float16(onnx.load(str(source)), keep_io_types=False), str(target))
        return ("fp32 file through onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types=False): "
                "float16 weights, math, float inputs and outputs")

    return transform


def quantize_int8(job: Job):
    """quantize_dynamic, QInt8 weights per tensor. reduce_range=True (7-bit weights): ONNX Runtime's x86
    u8 x s8 kernel without VNNI sums pairs of products in saturating int16, which full-range weights can
    overflow (scripts/make_int8_models.py measured it); with 7 bits ORT's results are exact on every CPU."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    def transform(source: Path, target: Path) -> str:
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8, per_channel=False,
                         reduce_range=True)
        return ("fp32 file through onnxruntime.quantization.quantize_dynamic(QInt8, per_channel=False, "
                "reduce_range=True)")

    return transform


def quantize_q4(job: Job):
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    def transform(source: Path, target: Path) -> str:
        quantizer = MatMulNBitsQuantizer(onnx.load(str(source)), **Q4)
        quantizer.process()
        model = quantizer.model.model if hasattr(quantizer.model, "model") else quantizer.model
        count = sum(n.op_type == "MatMulNBits" for n in model.graph.node)
        if not count:
            raise FlavourFailed("MatMulNBitsQuantizer quantized no MatMul (no constant weight with K % 32 == 0)")
        onnx.save(model, str(target))
        return (f"fp32 file through onnxruntime MatMulNBitsQuantizer(bits=4, block_size=32, is_symmetric=True): "
                f"{count} MatMulNBits")

    return transform


# The builder's options per precision. int4: accuracy_level 1 (float32 activations), as
# scripts/make_genai_models.py explains: level 4 quantizes activations to int8 per block.
GENAI_PRECISIONS = {"fp32": [], "int4": ["block_size=32", "accuracy_level=1"]}
# dims and dims_alt of a builder graph: the first two of these that ONNX Runtime runs. Its CPU
# GroupQueryAttention refuses some: a prefill without past when the model has a sliding window (the cache
# must hold the window), and a batch over 1 with both a past and more than one new token.
GENAI_SHAPES = [past_dims(2, 5, 0), past_dims(2, 1, 6), past_dims(1, 4, 5)]


def save_tokenizer(folder: Path, vocab_size: int) -> None:
    """A word-level tokenizer over the model's vocabulary: the builder loads one (AutoTokenizer)."""
    import tokenizers

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", bos_token="t1",
                                                eos_token="t2", pad_token="t0")
    fast.save_pretrained(str(folder))


def make_genai(job: Job, folder: Path, flavour: str) -> None:
    precision = flavour.removeprefix("genai_")
    config = job.model.config
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint, built = Path(tmp) / "checkpoint", Path(tmp) / "built"
        job.model.save_pretrained(str(checkpoint))
        save_tokenizer(checkpoint, config.vocab_size)
        command = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint), "-o", str(built),
                   "-p", precision, "-e", "cpu", "-c", str(Path(tmp) / "cache")]
        if GENAI_PRECISIONS[precision]:
            command += ["--extra_options", *GENAI_PRECISIONS[precision]]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
            errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception)\b", line)]
            raise FlavourFailed(f"builder: {(errors or lines or ['exit ' + str(done.returncode)])[-1]}")
        model = onnx.load(str(built / "model.onnx"))  # with its external data, saved inline below
        onnx.save(model, str(folder / "model.onnx"))
        shutil.copy(built / "genai_config.json", folder / "genai_config.json")
    entries, outputs = genai_spec(model, config)
    ran, refused = [], []
    for dims in GENAI_SHAPES:
        try:
            run_ort(folder / "model.onnx", entries, outputs, [dims])
            ran.append(dims)
        except FlavourFailed as error:
            refused.append({"dims": dims, "error": str(error)})
        if len(ran) == 2:
            break
    if len(ran) < 2:
        raise FlavourFailed(refused[0]["error"])
    about = (f"onnxruntime_genai.models.builder -p {precision} -e cpu {' '.join(GENAI_PRECISIONS[precision])} on "
             f"{type(job.model).__name__} saved by save_pretrained; genai_config.json beside it")
    validation = {"onnxruntime_runs": ["dims", "dims_alt"]}
    if refused:
        validation["onnxruntime_refused"] = refused
    write_spec(folder, job, flavour, entries, outputs, ran[0], ran[1], about, validation)


def genai_spec(model: onnx.ModelProto, config) -> tuple[list[dict], list[str]]:
    """inputs.json entries for a builder graph: decoder inputs + past_key_values.N.key/value."""
    entries = []
    for value in model.graph.input:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name
        name = value.name
        if name == "input_ids":
            entries.append(spec(name, BATCH_SEQ, "token_ids", dtype, (0, config.vocab_size)))
        elif name == "attention_mask":
            entries.append(spec(name, ["batch", "past_sequence_length+sequence_length"], "attention_mask", dtype))
        elif name == "position_ids":
            entries.append(spec(name, BATCH_SEQ, "position_ids", dtype))
        elif name.startswith("past_key_values."):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]
            heads = dims[1] or config.num_key_value_heads
            head_dim = dims[3] or getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            entries.append(spec(name, ["batch", heads, "past_sequence_length", head_dim], "float", dtype))
        else:
            raise FlavourFailed(f"builder graph input {name}: no input kind for it")
    return entries, [o.name for o in model.graph.output]


def make_file(job: Job, flavour: str, file_flavour: str, key: str) -> None:
    folder = job.folder / file_flavour
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    if flavour in ("fp32", "with_past"):
        make_traced(job, folder, file_flavour, key, export_torchscript)
    elif flavour == "dynamo":
        make_traced(job, folder, file_flavour, key, export_dynamo)
    elif flavour == "genai":
        make_genai(job, folder, file_flavour)
    else:
        maker = {"ort_optimized": ort_optimize, "fp16": to_fp16, "int8_dynamic": quantize_int8, "q4": quantize_q4}
        derived(job, folder, file_flavour, key, maker[flavour](job))


def last_line(error: BaseException) -> str:
    """The error's last line; for torch.export's long reports, the line after "## Exception summary"."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if "## Exception summary" in lines and lines.index("## Exception summary") + 1 < len(lines):
        lines = lines[: lines.index("## Exception summary") + 2]
    text = lines[-1] if lines else ""
    name = type(error).__name__
    text = text if isinstance(error, FlavourFailed) else f"{name}: {text}"
    return text[:400]


def is_ok(folder: Path) -> bool:
    return (folder / "model.onnx").exists() and (folder / "inputs.json").exists()


def run_arch(arch: Arch, selected: list[str], out: Path, force: bool) -> list[dict]:
    """Makes the architecture's missing (or, with force, all) files; returns this run's failures."""
    job = Job(arch, out / arch.name)
    files = file_flavours(arch, selected)
    todo = [f for f in files if force or not is_ok(job.folder / f[1])]
    # A derived flavour needs its part's fp32 file: make it too when it is neither on disk nor selected.
    for flavour, _, key in list(todo):
        prerequisite = ("fp32", f"fp32{key}", key)
        if flavour in DERIVED and prerequisite not in todo and not is_ok(job.folder / prerequisite[1]):
            todo.insert(0, prerequisite)
    kept = [f[1] for f in files if f not in todo]
    if kept:
        print(f"{arch.name:32s} kept: {', '.join(kept)}", flush=True)
    if not todo:
        return []
    failures = []
    try:
        job.model = build_model(arch)
    except Exception as error:  # noqa: BLE001
        message = f"building the model: {last_line(error)}"
        if "--verbose" in sys.argv:
            traceback.print_exc()
        for _, file_flavour, _ in todo:
            print(f"{arch.name:32s} {file_flavour:22s} FAILED {message}", flush=True)
            failures.append({"arch": arch.name, "flavour": file_flavour, "error": message})
        return failures
    for flavour, file_flavour, key in todo:
        start = time.monotonic()
        try:
            make_file(job, flavour, file_flavour, key)
            path = job.folder / file_flavour / "model.onnx"
            size = path.stat().st_size
            flag = "  (over 5 MB)" if size > MAX_FILE_BYTES else ""
            print(f"{arch.name:32s} {file_flavour:22s} ok     {size / 1024:8.0f} KiB  "
                  f"{time.monotonic() - start:5.1f} s{flag}", flush=True)
        except Exception as error:  # noqa: BLE001
            message = last_line(error)
            if not isinstance(error, FlavourFailed) and "--verbose" in sys.argv:
                traceback.print_exc()
            shutil.rmtree(job.folder / file_flavour, ignore_errors=True)
            print(f"{arch.name:32s} {file_flavour:22s} FAILED {message}", flush=True)
            failures.append({"arch": arch.name, "flavour": file_flavour, "error": message})
    return failures


# ============================================================================================ manifest


def versions() -> dict:
    found = {"python": platform.python_version()}
    for package in VERSIONED:
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def write_manifest(out: Path, failures: list[dict], tried: set[tuple[str, str]]) -> dict:
    """From the files on disk, this run's failures, and the previous manifest's failures of files this run
    did not try (and that are not on disk now)."""
    entries = {}
    for spec_path in sorted(out.glob("*/*/inputs.json")):
        folder = spec_path.parent
        if not (folder / "model.onnx").exists():
            continue
        spec_ = json.loads(spec_path.read_text())
        arch = folder.parent.name
        family = spec_.get("family") or (ARCH_BY_NAME[arch].family if arch in ARCH_BY_NAME else "")
        entries[(arch, folder.name)] = {"arch": arch, "family": family, "flavour": folder.name,
                                        "path": f"{arch}/{folder.name}/model.onnx", "status": "ok",
                                        "bytes": (folder / "model.onnx").stat().st_size}
    previous = out / "manifest.json"
    old_failures = []
    if previous.exists():
        try:
            old_failures = [f for f in json.loads(previous.read_text()).get("files", [])
                            if f.get("status") == "export_failed"]
        except (json.JSONDecodeError, AttributeError):
            old_failures = []
    for failure in [*(f for f in old_failures if (f["arch"], f["flavour"]) not in tried), *failures]:
        key = (failure["arch"], failure["flavour"])
        if key in entries:
            continue
        arch = ARCH_BY_NAME.get(failure["arch"])
        entries[key] = {"arch": failure["arch"], "family": arch.family if arch else failure.get("family", ""),
                        "flavour": failure["flavour"], "path": f"{failure['arch']}/{failure['flavour']}/model.onnx",
                        "status": "export_failed", "error": failure["error"], "bytes": 0}
    manifest = {"generator": GENERATOR, "versions": versions(), "files": [entries[k] for k in sorted(entries)]}
    previous.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


# ================================================================================================ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="corpus folder (default: .cache/coverage)")
    parser.add_argument("--only", help="comma-separated architecture names (default: all; --list shows them)")
    parser.add_argument("--flavours", help=f"comma-separated flavours (default: all of {','.join(FLAVOURS)})")
    parser.add_argument("--force", action="store_true", help="remake files that exist")
    parser.add_argument("--list", action="store_true", help="print the architectures and their flavours, and exit")
    parser.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    args = parser.parse_args()

    archs = [ARCH_BY_NAME[n] for n in selected(parser, args.only, list(ARCH_BY_NAME), "architectures")]
    flavours = selected(parser, args.flavours, FLAVOURS, "flavours")
    if args.list:
        for arch in archs:
            files = [f[1] for f in file_flavours(arch, flavours)]
            print(f"{arch.name:32s} {arch.family:16s} {' '.join(files)}")
        print(f"{len(archs)} architectures, {sum(len(file_flavours(a, flavours)) for a in archs)} files")
        return 0

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    failures, tried = [], set()
    for arch in archs:
        tried.update((arch.name, f[1]) for f in file_flavours(arch, flavours))
        failures += run_arch(arch, flavours, out, args.force)
    manifest = write_manifest(out, failures, tried)
    summarize(manifest["files"], FLAVOURS, time.monotonic() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
