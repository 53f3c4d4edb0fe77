#!/usr/bin/env python3
"""Add Hugging Face Optimum exports to the coverage corpus, the merged decoder among them.

Optimum (`optimum-cli export onnx`, `optimum.exporters.onnx.main_export`) made many of the ONNX files on
the Hugging Face Hub. This script makes tiny random-weight models of 24 architectures with it (ARCHS), in the
layout of bench/coverage/make_corpus.py, so that the coverage runner (bench/coverage/run.py) compares
them with ONNX Runtime like the rest of the corpus. Nothing comes from the Hub: each model is built from a
transformers config (seeded, weights rescaled as make_corpus.py does), saved with save_pretrained into a
temporary folder, and exported from that folder.

Optimum needs transformers < 4.58, which the main export environment (transformers 5) cannot have, so it
runs in a venv of its own, from bench/coverage/requirements-optimum.txt (Python 3.11):

    python3 -m venv .cache/coverage-optimum-venv
    .cache/coverage-optimum-venv/bin/pip install -r bench/coverage/requirements-optimum.txt
    .cache/coverage-optimum-venv/bin/python bench/coverage/make_optimum.py [--out DIR] [--only ARCH,...]
        [--force] [--verbose]

then compare the files:

    .venv/bin/python bench/coverage/run.py --no-real \
        --flavours optimum,optimum_encoder,optimum_decoder,optimum_with_past,optimum_merged

--out defaults to .cache/coverage/. A file whose model.onnx and inputs.json exist is kept unless --force.
A failure (building, exporting, or running a file in ONNX Runtime) never stops the run: it is printed and
recorded in the manifest with its error's last line (--verbose prints the traceback).

Flavours (file flavour: which of optimum's files, from which export):
    optimum            main_export's single model.onnx: text encoders (feature-extraction), vision models,
                       and decoders (text-generation-with-past: one graph with past_key_values.N.key/value
                       inputs that takes a past of length 0 on the first step; optimum >= 1.14's layout).
    optimum_encoder    encoder-decoders: encoder_model.onnx.
    optimum_decoder    decoder_model.onnx: the first decoder step, no past in, present.* out.
    optimum_with_past  encoder-decoders: decoder_with_past_model.onnx (one new token, self- and
                       cross-attention past in, self-attention present out).
    optimum_merged     decoder_model_merged.onnx: optimum's merge_decoders of decoder_model and
                       decoder_with_past_model, an If on the bool input use_cache_branch whose branches share
                       the weights in the outer graph.
Encoder-decoders (text2text-generation-with-past, automatic-speech-recognition-with-past) get all four of
their files from one main_export. Optimum >= 1.14 exports a decoder-only model as the one model.onnx; its
former split (optimum < 1.14, then `--legacy`, which optimum-onnx no longer has; the layout of the decoder-only
decoder_model_merged.onnx files on the Hub) is the export of two configs of the same model, use_past_in_inputs
False and True, whose post-processing merges them: legacy_decoder_split() makes main_export do that again
for the decoder files.
That export's decoder_with_past_model.onnx is the `optimum` model.onnx again (the same config and model),
so it is not kept twice.

Inputs (inputs.json, tests/models/model_inputs.py's format, as make_corpus.py writes it): the graph's own
dim names (batch_size -> batch), two shapes in "dims" and "dims_alt". The files that also run the first
step (a decoder's `optimum` model.onnx, the merged ones) take a past at one shape and none at the other,
as optimum's ORTModelForCausalLM / ORTModelForSeq2SeqLM feed them on the first step of generate(): past
tensors of length 0 (the cross-attention past too) and, for a merged file, use_cache_branch false. So
"dims" is a decoding step (one new token after a past of 5, use_cache 1: the cache branch) and "dims_alt"
the first step (past 0, use_cache 0: the branch without cache); the bool entry's "value" is the dim name
"use_cache". A merged encoder-decoder's cross-attention past has its own
length, past_encoder_sequence_length: the encoder's length in the cache branch, 0 in the other.

Each file is listed as ok only after ONNX Runtime (CPU, graph optimizations off) ran it at both shapes with
finite outputs. Recorded, not judged, in inputs.json "validation": optimum's own check of the export
against PyTorch (main_export's validation, at its dummy shapes), and for a merged file the largest
difference of each branch from the unmerged file it was made of, on the same inputs.

Layout (as make_corpus.py's):
    <arch>/<flavour>/model.onnx     weights inline (optimum writes external data, copied beside it, only past
                                    2 GB or with FORCE_ONNX_EXTERNAL_DATA)
    <arch>/<flavour>/inputs.json
    manifest.json                   entries of this script's files added or replaced (status ok or
                                    export_failed, with the error), the others kept as they are; the
                                    packages this script ran with are added to "versions" as "optimum",
                                    "optimum-onnx" and "optimum <package>" (its transformers, torch, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every model comes from a local folder
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / ".cache" / "coverage"
sys.path.insert(0, str(REPO_ROOT / "tests" / "models"))
from model_inputs import build_inputs  # noqa: E402  (the runner's input builder)
from corpus_common import randomize, selected, summarize  # noqa: E402  (beside this file)

GENERATOR = "bench/coverage/make_optimum.py"
SEED = 0
OPSET = 18
FLAVOURS = ["optimum", "optimum_encoder", "optimum_decoder", "optimum_with_past", "optimum_merged"]
VERSIONED = ["torch", "transformers", "onnx", "onnxruntime", "tokenizers", "safetensors", "huggingface-hub",
             "accelerate", "numpy", "protobuf"]

warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
ort.set_default_logger_severity(3)
torch.set_num_threads(1)


class FileFailed(Exception):
    """A file could not be made or did not run; the message goes to the manifest."""


# ======================================================================================= architectures


@dataclass
class Arch:
    name: str  # make_corpus.py's name for it, so that the rows line up in the matrix
    family: str  # text encoder | decoder | encoder-decoder | vision
    task: str  # optimum's task
    config: Callable[[], transformers.PretrainedConfig]
    export_shapes: dict = field(default_factory=dict)  # main_export's dummy-input shapes (**kwargs_shapes)
    encoder_length: int | None = None  # encoder-decoders whose encoder output has one length (Whisper)
    dynamic_image: bool = False  # the model takes other image sizes than the config's


T = transformers
V = 512  # vocabulary of the text models
H = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)  # BERT-style
# Seq2seq sizes: hidden 64, 2 + 2 layers of 4 heads
BART = dict(vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=128)


def bert_like(cls, **fields):
    return lambda: cls(**{**H, "vocab_size": V, "max_position_embeddings": 128, **fields})


def llama_like(cls, **fields):
    """hidden 64, 4 heads of 16 on 2 key/value heads, 2 layers (make_corpus.py's decoder size)."""
    return lambda: cls(**{**H, "vocab_size": V, "num_key_value_heads": 2, "max_position_embeddings": 128,
                          "tie_word_embeddings": False, **fields})


TEXT, DECODER = "feature-extraction", "text-generation-with-past"
SEQ2SEQ, SPEECH = "text2text-generation-with-past", "automatic-speech-recognition-with-past"

ARCHS: list[Arch] = [
    # ------------------------------------------------------------------ text encoders
    Arch("bert", "text encoder", TEXT, bert_like(T.BertConfig)),
    Arch("roberta", "text encoder", TEXT, bert_like(T.RobertaConfig, pad_token_id=1)),
    Arch("distilbert", "text encoder", TEXT,
         lambda: T.DistilBertConfig(vocab_size=V, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                    max_position_embeddings=128)),
    Arch("xlm_roberta", "text encoder", TEXT, bert_like(T.XLMRobertaConfig, pad_token_id=1)),
    Arch("deberta_v2", "text encoder", TEXT,
         bert_like(T.DebertaV2Config, relative_attention=True, position_buckets=16, max_relative_positions=32,
                   pos_att_type=["p2c", "c2p"], type_vocab_size=0)),
    Arch("electra", "text encoder", TEXT, bert_like(T.ElectraConfig, embedding_size=32)),
    # ------------------------------------------------------------------ decoders
    Arch("gpt2", "decoder", DECODER, lambda: T.GPT2Config(vocab_size=V, n_positions=128, n_embd=64, n_layer=2,
                                                          n_head=4)),
    Arch("llama", "decoder", DECODER, llama_like(T.LlamaConfig)),
    Arch("mistral", "decoder", DECODER, llama_like(T.MistralConfig, sliding_window=None)),
    Arch("qwen2", "decoder", DECODER, llama_like(T.Qwen2Config, use_sliding_window=False)),
    Arch("phi3", "decoder", DECODER, llama_like(T.Phi3Config, original_max_position_embeddings=128, pad_token_id=0)),
    Arch("gemma", "decoder", DECODER,
         llama_like(T.GemmaConfig, head_dim=16, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)),
    Arch("opt", "decoder", DECODER,
         lambda: T.OPTConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
                             max_position_embeddings=128, word_embed_proj_dim=64)),
    Arch("bloom", "decoder", DECODER, lambda: T.BloomConfig(vocab_size=V, hidden_size=64, n_layer=2, n_head=4)),
    Arch("gpt_neox", "decoder", DECODER,
         lambda: T.GPTNeoXConfig(**H, vocab_size=V, max_position_embeddings=128, rotary_pct=0.5)),
    # Falcon-7B's layout (multi-query, parallel attention). make_corpus.py's Falcon-40B layout
    # (new_decoder_architecture, num_kv_heads=2) does not export: transformers 4.57 caches its keys broadcast to
    # every query head, optimum's dummy past has num_kv_heads ("Sizes of tensors must match except in dimension
    # 2. Expected size 2 but got size 4").
    Arch("falcon", "decoder", DECODER,
         lambda: T.FalconConfig(vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                multi_query=True, new_decoder_architecture=False, parallel_attn=True, alibi=False)),
    # ------------------------------------------------------------------ encoder-decoders
    Arch("t5", "encoder-decoder", SEQ2SEQ,
         lambda: T.T5Config(vocab_size=V, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                            num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=20,
                            decoder_start_token_id=0)),
    Arch("bart", "encoder-decoder", SEQ2SEQ, lambda: T.BartConfig(**BART)),
    Arch("marian", "encoder-decoder", SEQ2SEQ,
         lambda: T.MarianConfig(**BART, decoder_vocab_size=V, pad_token_id=V - 1, decoder_start_token_id=V - 1)),
    Arch("whisper", "encoder-decoder", SPEECH,
         lambda: T.WhisperConfig(**{k: v for k, v in BART.items() if k != "max_position_embeddings"},
                                 num_mel_bins=16, max_source_positions=16, max_target_positions=64,
                                 decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                 suppress_tokens=None, begin_suppress_tokens=None),
         # 16 mel bins x 32 frames (2 * max_source_positions, the only length Whisper takes); the encoder's
         # output, and so every encoder length of the decoders, is max_source_positions long.
         export_shapes={"nb_max_frames": 32}, encoder_length=16),
    # ------------------------------------------------------------------ vision
    Arch("vit", "vision", "image-classification", lambda: T.ViTConfig(**H, image_size=32, patch_size=8)),
    Arch("resnet", "vision", "image-classification",
         lambda: T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="bottleneck"),
         dynamic_image=True),
    Arch("convnext", "vision", "image-classification",
         lambda: T.ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2), dynamic_image=True),
    Arch("clip", "vision", "zero-shot-image-classification",
         lambda: T.CLIPConfig(text_config=dict(**H, vocab_size=V, max_position_embeddings=64),
                              vision_config=dict(**H, image_size=32, patch_size=8), projection_dim=32)),
]
ARCH_BY_NAME = {a.name: a for a in ARCHS}
assert len(ARCH_BY_NAME) == len(ARCHS)


def arch_flavours(arch: Arch) -> list[str]:
    if arch.family == "decoder":
        return ["optimum", "optimum_decoder", "optimum_merged"]
    if arch.family == "encoder-decoder":
        return ["optimum_encoder", "optimum_decoder", "optimum_with_past", "optimum_merged"]
    return ["optimum"]


# ================================================================================================ dims
# Two shapes per file: "dims" (for a file with a past: a decoding step, the cache branch) and "dims_alt"
# (the first step, past 0). Names are the graph's (batch_size -> batch), values per flavour and family.

SHAPES = {  # (file flavour, family) -> (dims, dims_alt); family None: any
    ("optimum", "text encoder"): ({"batch": 2, "sequence_length": 7}, {"batch": 3, "sequence_length": 13}),
    ("optimum", "decoder"): ({"batch": 2, "sequence_length": 1, "past_sequence_length": 5},
                             {"batch": 3, "sequence_length": 4, "past_sequence_length": 0}),
    ("optimum_merged", "decoder"): ({"batch": 2, "sequence_length": 1, "past_sequence_length": 5, "use_cache": 1},
                                    {"batch": 3, "sequence_length": 4, "past_sequence_length": 0, "use_cache": 0}),
    ("optimum_decoder", "decoder"): ({"batch": 2, "sequence_length": 7}, {"batch": 3, "sequence_length": 4}),
    ("optimum_encoder", None): ({"batch": 2, "encoder_sequence_length": 7},
                                {"batch": 3, "encoder_sequence_length": 5}),
    ("optimum_decoder", "encoder-decoder"): (
        {"batch": 2, "decoder_sequence_length": 4, "encoder_sequence_length": 7},
        {"batch": 3, "decoder_sequence_length": 1, "encoder_sequence_length": 5}),
    ("optimum_with_past", None): (  # one new token (the export traces it so: its logits are [batch, 1, vocab])
        {"batch": 2, "decoder_sequence_length": 1, "past_decoder_sequence_length": 5, "encoder_sequence_length": 7},
        {"batch": 3, "decoder_sequence_length": 1, "past_decoder_sequence_length": 6,
         "encoder_sequence_length": 5}),
    ("optimum_merged", "encoder-decoder"): (
        {"batch": 2, "decoder_sequence_length": 1, "past_decoder_sequence_length": 5, "encoder_sequence_length": 7,
         "past_encoder_sequence_length": 7, "use_cache": 1},
        {"batch": 3, "decoder_sequence_length": 3, "past_decoder_sequence_length": 0, "encoder_sequence_length": 5,
         "past_encoder_sequence_length": 0, "use_cache": 0}),
}
IMAGE = 32


def shapes_for(arch: Arch, flavour: str) -> tuple[dict, dict]:
    if arch.family == "vision":
        size_alt = 2 * IMAGE if arch.dynamic_image else IMAGE
        dims = {"batch": 2, "num_channels": 3, "height": IMAGE, "width": IMAGE}
        alt = {"batch": 3, "num_channels": 3, "height": size_alt, "width": size_alt}
        if arch.task == "zero-shot-image-classification":  # texts and images: two batches
            dims.update(text_batch=3, sequence_length=8)
            alt.update(text_batch=2, sequence_length=5)
        return dims, alt
    dims, alt = SHAPES.get((flavour, arch.family)) or SHAPES[(flavour, None)]
    dims, alt = {**dims}, {**alt}
    if arch.encoder_length:
        for d in (dims, alt):
            if "encoder_sequence_length" in d:
                d["encoder_sequence_length"] = arch.encoder_length
            if d.get("past_encoder_sequence_length"):  # the cache branch's cross-attention past
                d["past_encoder_sequence_length"] = arch.encoder_length
    return dims, alt


# ======================================================================================= inputs.json

DIM_NAMES = {"batch_size": "batch", "text_batch_size": "text_batch", "image_batch_size": "batch"}


def graph_dims(value: onnx.ValueInfoProto) -> list:
    """The declared shape: ints for static dims, dim_param names (optimum's, spaces removed) for the others."""
    dims = []
    for d in value.type.tensor_type.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif d.dim_param:
            name = d.dim_param.replace(" ", "")
            dims.append(DIM_NAMES.get(name, name))
        else:
            raise FileFailed(f"input {value.name}: a dynamic dim without a name")
    return dims


def input_entry(value: onnx.ValueInfoProto, arch: Arch, flavour: str, vocab: int, type_vocab: int) -> dict:
    """build_inputs' entry for one graph input, from its name and declared shape."""
    name = value.name
    dtype = onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name
    shape = graph_dims(value)
    entry = {"name": name, "dtype": dtype, "shape": shape}
    if name in ("input_ids", "decoder_input_ids"):
        return {**entry, "kind": "token_ids", "range": [0, vocab]}
    if name == "token_type_ids":
        return {**entry, "kind": "token_type_ids", "range": [0, max(1, type_vocab)]}
    if name == "attention_mask" and arch.family == "decoder" and flavour != "optimum_decoder":
        # a decoder's mask covers past + new tokens (the merged graph calls that length "sequence_length")
        return {**entry, "shape": [shape[0], "past_sequence_length+sequence_length"], "kind": "attention_mask"}
    if name in ("attention_mask", "encoder_attention_mask", "decoder_attention_mask"):
        return {**entry, "kind": "attention_mask"}
    if name == "position_ids":
        return {**entry, "kind": "position_ids"}
    if name == "use_cache_branch":
        return {**entry, "kind": "bool", "value": "use_cache"}
    if name.startswith("past_key_values.") and ".encoder." in name and flavour == "optimum_merged":
        # the cross-attention past: the encoder's length in the cache branch, 0 on the first step
        return {**entry, "shape": [*shape[:2], "past_encoder_sequence_length", *shape[3:]], "kind": "float"}
    if dtype in ("float32", "float16"):
        return {**entry, "kind": "float"}
    raise FileFailed(f"graph input {name} ({dtype}): no input kind for it")


def make_spec(path: Path, arch: Arch, flavour: str, config) -> dict:
    model = onnx.load(str(path), load_external_data=False)
    text = getattr(config, "text_config", None) or config
    vocab = getattr(text, "vocab_size", None) or V
    type_vocab = getattr(text, "type_vocab_size", 0) or 0
    entries = [input_entry(i, arch, flavour, vocab, type_vocab) for i in model.graph.input]
    dims, alt = shapes_for(arch, flavour)
    used = set()
    for e in entries:
        used.update(p.strip() for d in e["shape"] if isinstance(d, str) for p in d.split("+"))
        if isinstance(e.get("value"), str):
            used.add(e["value"])
    missing = sorted(used - set(dims))
    if missing:
        raise FileFailed(f"no value for the dims {missing}")
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return {"model": arch.name, "opset": opset, "dims": {k: v for k, v in dims.items() if k in used},
            "dims_alt": {k: v for k, v in alt.items() if k in used}, "inputs": entries,
            "outputs": [o.name for o in model.graph.output], "arch": arch.name, "family": arch.family,
            "flavour": flavour}


# ==================================================================================== model building


def save_model(arch: Arch, folder: Path):
    """The architecture's model for its task, from its config, seeded and rescaled, saved into folder.
    The class is the one optimum loads for the task, so every saved weight is used."""
    from optimum.exporters.tasks import TasksManager

    torch.manual_seed(SEED)
    config = arch.config()
    cls = TasksManager.get_model_class_for_task(arch.task.removesuffix("-with-past"), framework="pt",
                                                model_type=config.model_type, library="transformers")
    model = cls.from_config(config)
    randomize(model, torch.Generator().manual_seed(SEED))
    model.eval().save_pretrained(str(folder))
    return config


# ========================================================================================== exporting


@contextlib.contextmanager
def legacy_decoder_split():
    """Makes main_export export a decoder-only model as optimum < 1.14 did (the decoder-only
    decoder_model_merged.onnx files on the Hub come from that export): decoder_model (use_past_in_inputs
    False) and decoder_with_past_model (True), which TextDecoderOnnxConfig.post_process_exported_models then
    merges into decoder_model_merged.onnx.
    Optimum 2.1 still merges such a pair; only its choice of submodels changed (get_decoder_models_for_export
    returns the single "model")."""
    import optimum.exporters.utils as exporter_utils

    def split(model, config):
        common = dict(task=config.task, int_dtype=config.int_dtype, float_dtype=config.float_dtype)
        return {"decoder_model": (model, config.__class__(model.config, use_past=config.use_past,
                                                          use_past_in_inputs=False, **common)),
                "decoder_with_past_model": (model, config.__class__(model.config, use_past=True,
                                                                    use_past_in_inputs=True, **common))}

    original = exporter_utils.get_decoder_models_for_export
    exporter_utils.get_decoder_models_for_export = split
    try:
        yield
    finally:
        exporter_utils.get_decoder_models_for_export = original


class WarningRecorder(logging.Handler):
    """Keeps optimum's export warnings: a validation that found differences logs one and goes on."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def optimum_export(arch: Arch, source: Path, output: Path) -> str:
    """main_export from the local folder; returns what optimum's own validation said."""
    from optimum.exporters.onnx import main_export

    recorder = WarningRecorder()
    logger = logging.getLogger("optimum.exporters.onnx.convert")
    logger.addHandler(recorder)
    try:
        main_export(model_name_or_path=str(source), output=str(output), task=arch.task, opset=OPSET, device="cpu",
                    no_post_process=False, do_validation=True, library_name="transformers",
                    **arch.export_shapes)
    except RuntimeError as error:  # validation raised, "but the model was saved nonetheless"
        if "during validation" not in str(error) or not any(output.glob("*.onnx")):
            raise
        return f"raised: {last_line(error.__cause__ or error)}"
    finally:
        logger.removeHandler(recorder)
    warned = [m for m in recorder.messages if "succeeded with the warning" in m]
    if warned:
        return "differences: " + " ".join(warned[0].split("warning:", 1)[-1].split())[:300]
    return "passed"


# Which of optimum's files each flavour is, and from which export ("main": main_export as it is,
# "legacy": under legacy_decoder_split).
SOURCES = {
    ("optimum", "text encoder"): ("main", "model.onnx"),
    ("optimum", "vision"): ("main", "model.onnx"),
    ("optimum", "decoder"): ("main", "model.onnx"),
    ("optimum_decoder", "decoder"): ("legacy", "decoder_model.onnx"),
    ("optimum_merged", "decoder"): ("legacy", "decoder_model_merged.onnx"),
    ("optimum_encoder", "encoder-decoder"): ("main", "encoder_model.onnx"),
    ("optimum_decoder", "encoder-decoder"): ("main", "decoder_model.onnx"),
    ("optimum_with_past", "encoder-decoder"): ("main", "decoder_with_past_model.onnx"),
    ("optimum_merged", "encoder-decoder"): ("main", "decoder_model_merged.onnx"),
}
# The unmerged file each branch of a merged file is compared with: the cache branch (dims) with the decoder
# with past, the other (dims_alt) with the first-step decoder.
MERGED_PARTS = [("dims", "decoder_with_past_model.onnx"), ("dims_alt", "decoder_model.onnx")]


# ========================================================================================== validation


def session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def feeds_for(spec: dict, which: str) -> dict:
    return build_inputs(spec["inputs"], spec[which], np.random.default_rng(SEED + 1))


def run_both(path: Path, spec: dict) -> dict[str, dict[str, np.ndarray]]:
    """Runs the file at dims and dims_alt; fails on an error or a non-finite output."""
    sess = session(path)
    results = {}
    for which in ("dims", "dims_alt"):
        try:
            got = sess.run(spec["outputs"], feeds_for(spec, which))
        except Exception as error:  # noqa: BLE001
            raise FileFailed(f"onnxruntime at {json.dumps(spec[which])}: {last_line(error)}") from None
        for name, value in zip(spec["outputs"], got):
            if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
                raise FileFailed(f"onnxruntime at {json.dumps(spec[which])}: output {name} is not finite")
        results[which] = dict(zip(spec["outputs"], got))
    return results


def compare_branches(spec: dict, merged: dict, export_dir: Path) -> dict:
    """Each branch of a merged file against the unmerged file it came from, on the same inputs."""
    report = {}
    for which, part in MERGED_PARTS:
        sess = session(export_dir / part)
        names = [i.name for i in sess.get_inputs()]
        feeds = feeds_for(spec, which)
        outputs = [o.name for o in sess.get_outputs() if o.name in merged[which]]
        got = sess.run(outputs, {n: feeds[n] for n in names})
        worst = 0.0
        for name, value in zip(outputs, got):
            ref = merged[which][name]
            if ref.shape != value.shape:
                worst = float("inf")
                break
            if value.size:
                scale = max(1.0, float(np.max(np.abs(value))))
                worst = max(worst, float(np.max(np.abs(ref.astype(np.float64) - value))) / scale)
        branch = "cache branch" if spec[which].get("use_cache") else "no-cache branch"
        report[f"{branch} vs {part}"] = float(f"{worst:.3g}")
    return report


# =========================================================================================== one arch


def last_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    text = lines[-1] if lines else ""
    return (text if isinstance(error, FileFailed) else f"{type(error).__name__}: {text}")[:400]


def is_ok(folder: Path) -> bool:
    return (folder / "model.onnx").exists() and (folder / "inputs.json").exists()


def place_file(arch: Arch, flavour: str, export_dir: Path, file_name: str, folder: Path, config,
               optimum_check: str, versions_: dict) -> int:
    """Copies one of optimum's files to <arch>/<flavour>/model.onnx, validates it, writes inputs.json."""
    source = export_dir / file_name
    if not source.exists():
        raise FileFailed(f"optimum wrote no {file_name} (it wrote: "
                         f"{', '.join(sorted(p.name for p in export_dir.glob('*.onnx'))) or 'no .onnx file'})")
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    path = folder / "model.onnx"
    shutil.copy(source, path)
    external = {t.external_data[0].value for t in onnx.load(str(source), load_external_data=False).graph.initializer
                if t.data_location == onnx.TensorProto.EXTERNAL}
    for name in external:  # tiny models should have none
        shutil.copy(export_dir / name, folder / name)
    spec = make_spec(path, arch, flavour, config)
    outputs = run_both(path, spec)
    validation = {"onnxruntime_runs": ["dims", "dims_alt"], "optimum_validation": optimum_check}
    if flavour == "optimum_merged":
        validation["max_rel_diff_vs_unmerged"] = compare_branches(spec, outputs, export_dir)
    how = "legacy_decoder_split() (decoder_model + decoder_with_past_model, merged by optimum)" \
        if SOURCES[(flavour, arch.family)][0] == "legacy" else "main_export"
    spec.update(about=f"optimum {versions_.get('optimum')} / optimum-onnx {versions_.get('optimum-onnx')} "
                      f"{how}, task {arch.task}, opset {OPSET}: {file_name}",
                generated_by=GENERATOR, validation=validation, versions=versions_)
    (folder / "inputs.json").write_text(json.dumps(spec, indent=2) + "\n")
    return path.stat().st_size


def run_arch(arch: Arch, out: Path, force: bool, verbose: bool, versions_: dict) -> list[dict]:
    """Makes the architecture's missing (or, with force, all) files; returns a manifest entry per file tried."""
    todo = [f for f in arch_flavours(arch) if force or not is_ok(out / arch.name / f)]
    kept = [f for f in arch_flavours(arch) if f not in todo]
    if kept:
        print(f"{arch.name:14s} kept: {', '.join(kept)}", flush=True)
    entries = []

    def record(flavour, error=None, size=0, seconds=0.0):
        entry = {"arch": arch.name, "family": arch.family, "flavour": flavour,
                 "path": f"{arch.name}/{flavour}/model.onnx", "status": "ok" if error is None else "export_failed",
                 "bytes": size}
        if error is not None:
            entry["error"] = error
            shutil.rmtree(out / arch.name / flavour, ignore_errors=True)
            print(f"{arch.name:14s} {flavour:18s} FAILED {error}", flush=True)
        else:
            print(f"{arch.name:14s} {flavour:18s} ok     {size / 1024:8.0f} KiB  {seconds:5.1f} s", flush=True)
        entries.append(entry)

    if not todo:
        return entries
    with tempfile.TemporaryDirectory(prefix="make_optimum_") as tmp:
        source = Path(tmp) / "model"
        try:
            config = save_model(arch, source)
        except Exception as error:  # noqa: BLE001
            if verbose:
                traceback.print_exc()
            for flavour in todo:
                record(flavour, f"building the model: {last_line(error)}")
            return entries
        for kind in ("main", "legacy"):
            flavours = [f for f in todo if SOURCES[(f, arch.family)][0] == kind]
            if not flavours:
                continue
            export_dir = Path(tmp) / kind
            start = time.monotonic()
            try:
                with legacy_decoder_split() if kind == "legacy" else contextlib.nullcontext():
                    check = optimum_export(arch, source, export_dir)
            except Exception as error:  # noqa: BLE001
                if verbose:
                    traceback.print_exc()
                for flavour in flavours:
                    record(flavour, f"optimum export: {last_line(error)}")
                continue
            seconds = time.monotonic() - start
            for flavour in flavours:
                try:
                    size = place_file(arch, flavour, export_dir, SOURCES[(flavour, arch.family)][1],
                                      out / arch.name / flavour, config, check, versions_)
                    record(flavour, size=size, seconds=seconds)
                except Exception as error:  # noqa: BLE001
                    if verbose and not isinstance(error, FileFailed):
                        traceback.print_exc()
                    record(flavour, last_line(error))
    return entries


# ============================================================================================ manifest


def versions() -> dict:
    found = {"optimum": importlib.metadata.version("optimum"),
             "optimum-onnx": importlib.metadata.version("optimum-onnx"),
             "optimum python": platform.python_version()}
    for package in VERSIONED:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[f"optimum {package}"] = importlib.metadata.version(package)
    return found


def update_manifest(out: Path, entries: list[dict], versions_: dict) -> dict:
    """Adds or replaces this run's entries, keeps every other one; written through a temporary file."""
    path = out / "manifest.json"
    manifest = json.loads(path.read_text()) if path.exists() else {"generator": GENERATOR, "versions": {},
                                                                     "files": []}
    # A kept file of an earlier run stays listed as ok (its entry is refreshed from the disk).
    tried = {(e["arch"], e["flavour"]) for e in entries}
    files = {(f["arch"], f["flavour"]): f for f in manifest.get("files", []) if (f["arch"], f["flavour"]) not in tried}
    for e in entries:
        files[(e["arch"], e["flavour"])] = e
    manifest["files"] = [files[k] for k in sorted(files)]
    manifest.setdefault("versions", {}).update(versions_)
    temporary = path.with_suffix(".json.tmp")
    temporary.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(temporary, path)
    return manifest


def kept_entries(arch: Arch, out: Path) -> list[dict]:
    """Manifest entries of the arch's files that exist and were not remade."""
    entries = []
    for flavour in arch_flavours(arch):
        folder = out / arch.name / flavour
        if is_ok(folder):
            entries.append({"arch": arch.name, "family": arch.family, "flavour": flavour,
                            "path": f"{arch.name}/{flavour}/model.onnx", "status": "ok",
                            "bytes": (folder / "model.onnx").stat().st_size})
    return entries


# ================================================================================================ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="corpus folder (default: .cache/coverage)")
    parser.add_argument("--only", help="comma-separated architecture names (default: all)")
    parser.add_argument("--force", action="store_true", help="remake files that exist")
    parser.add_argument("--verbose", action="store_true", help="print tracebacks of failures")
    args = parser.parse_args()

    archs = [ARCH_BY_NAME[n] for n in selected(parser, args.only, list(ARCH_BY_NAME), "architectures")]
    # optimum's own log (tied-weight notes, validation steps) only with --verbose; its warnings about the
    # validation are recorded in inputs.json either way (WarningRecorder).
    from optimum.utils import logging as optimum_logging

    optimum_logging.set_verbosity(logging.INFO if args.verbose else logging.ERROR)
    logging.getLogger("optimum.exporters.onnx.convert").setLevel(logging.INFO if args.verbose else logging.WARNING)

    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    versions_ = versions()
    start = time.monotonic()
    entries = []
    for arch in archs:
        made = run_arch(arch, out, args.force, args.verbose, versions_)
        remade = {e["flavour"] for e in made}
        entries += made + [e for e in kept_entries(arch, out) if e["flavour"] not in remade]
    update_manifest(out, entries, versions_)
    summarize(entries, FLAVOURS, time.monotonic() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
