#!/usr/bin/env python3
"""Tiny random Hugging Face models with their tokenizers, exported to ONNX, and the outputs of
transformers' pipelines (and sentence-transformers) on them: the fixtures of tests/pipelines/.

Run by hand (needs torch, transformers 5.23 and sentence-transformers, which CI does not have):
    /opt/export-venv/bin/python scripts/make_pipeline_models.py

For each model this writes tests/pipelines/fixtures/<name>/ as a Hugging Face model folder:
    model.onnx            fp32, TorchScript exporter (dynamo=False), opset 17, dynamic batch/sequence
    tokenizer.json        one of tests/text/fixtures/ (trained by scripts/make_tokenizer_fixtures.py)
    tokenizer_config.json
    config.json           the model's config (id2label, problem_type, ...)
    modules.json, 1_Pooling/config.json   (the embedding model: a sentence-transformers folder)
    expected.json         the pipelines' outputs per case, as transformers returns them

Offsets in expected.json are transformers' character offsets; the C++ tests compare them with
byte offsets converted to characters. Weights are seeded, so re-running gives the same files
(up to the exporter's version).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import tokenizers
import torch
import transformers
from sentence_transformers import SentenceTransformer
from sentence_transformers import models as st_models

REPO_ROOT = Path(__file__).resolve().parents[1]
TOKENIZERS = REPO_ROOT / "tests" / "text" / "fixtures"
OUT = REPO_ROOT / "tests" / "pipelines" / "fixtures"
SEED = 0
# PyTorch vs onnxruntime on the exported graph: summation order only.
EXPORT_TOLERANCE = 1e-4

SENTENCES = [
    "John Smith lives in New York.",
    "The quick brown fox jumps over the lazy dog",
    "Héllo wörld, ça va? 東京 is big 🙂",
    "zzyzx [NEW] tokens   and   spaces",
    "a",
    "Paris and Berlin are cities where Marie Curie and Albert Einstein worked.",
]
# Longer than the wordpiece tokenizer's model_max_length (32): truncation cases.
LONG_SENTENCE = " ".join(["the cat sat on the mat and looked at the dog"] * 6)
PAIRS = [
    ("I loved this movie", "It was great"),
    ("What is the capital of France?", "Paris is the capital of France."),
]
NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]


def small_bert_config(vocab_size: int, **extra) -> transformers.BertConfig:
    config = transformers.BertConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        type_vocab_size=2,
        # Wider than BERT's 0.02, so that outputs differ clearly from sentence to sentence.
        initializer_range=0.2,
        **extra,
    )
    config._attn_implementation = "eager"
    return config


def load_tokenizer(kind: str) -> transformers.PreTrainedTokenizerFast:
    config = json.loads((TOKENIZERS / kind / "tokenizer_config.json").read_text())
    special = {k: v for k, v in config.items() if k.endswith("_token")}
    kwargs = {k: config[k] for k in ("model_max_length", "padding_side", "truncation_side") if k in config}
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(TOKENIZERS / kind / "tokenizer.json"),
        clean_up_tokenization_spaces=config.get("clean_up_tokenization_spaces", False),
        # As BertTokenizer declares them: pairs carry token_type_ids 1 into the model.
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
        **special,
        **kwargs,
    )
    # transformers 5 rebuilds the post-processor of a tokenizer given bos/eos tokens (a template
    # without ByteLevel's offset trimming); the model folder's tokenizer.json is what a user ships,
    # so the references tokenize exactly as that file says, as the `tokenizers` package does.
    from_file = tokenizers.Tokenizer.from_file(str(TOKENIZERS / kind / "tokenizer.json"))
    tokenizer.backend_tokenizer.post_processor = from_file.post_processor
    for text in SENTENCES + [LONG_SENTENCE]:
        want = from_file.encode(text)
        got = tokenizer(text, return_offsets_mapping=True)
        assert got["input_ids"] == want.ids and [tuple(o) for o in got["offset_mapping"]] == want.offsets, text
    return tokenizer


class Logits(torch.nn.Module):
    """A flat tensor-in / tensor-out signature over a model with `logits`."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args):
        return self.model(**dict(zip(self.names, args))).logits


class LastHiddenState(Logits):
    def forward(self, *args):
        return self.model(**dict(zip(self.names, args))).last_hidden_state


def export(module: torch.nn.Module, tokenizer, output: str, path: Path) -> None:
    names = ["input_ids", "attention_mask", "token_type_ids"]
    example = tokenizer(SENTENCES[:2], padding=True, return_tensors="pt")
    args = tuple(example[n] for n in names)
    axes = {n: {0: "batch", 1: "sequence_length"} for n in names + [output]}
    torch.onnx.export(module, args, str(path), input_names=names, output_names=[output],
                      dynamic_axes=axes, opset_version=17, do_constant_folding=True, dynamo=False)
    module.eval()
    check = tokenizer(SENTENCES[2:5], padding=True, return_tensors="pt")
    with torch.no_grad():
        want = module(*(check[n] for n in names)).numpy()
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {n: check[n].numpy() for n in names})[0]
    worst = float(np.abs(got - want).max())
    if worst > EXPORT_TOLERANCE:
        raise SystemExit(f"{path}: onnxruntime differs from PyTorch by {worst}")


def write_folder(name: str, kind: str, model, module, output: str) -> Path:
    folder = OUT / name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    shutil.copy(TOKENIZERS / kind / "tokenizer.json", folder / "tokenizer.json")
    shutil.copy(TOKENIZERS / kind / "tokenizer_config.json", folder / "tokenizer_config.json")
    model.config.to_json_file(str(folder / "config.json"))
    export(module, load_tokenizer(kind), output, folder / "model.onnx")
    return folder


def seeded(cls, config):
    torch.manual_seed(SEED)
    model = cls(config).eval()
    return model


def spread_classifier(model, std: float) -> None:
    """Random init gives near-equal logits; wider classifier weights make the predicted labels
    vary from token to token, so grouping and aggregation have something to do."""
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, std)
        model.classifier.bias.normal_(0.0, std / 4)


def as_json(value):
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_json(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def dump(folder: Path, expected: dict) -> None:
    (folder / "expected.json").write_text(json.dumps(as_json(expected), indent=1, ensure_ascii=False) + "\n")


# --- the models ------------------------------------------------------------------------------


def embedding_model() -> None:
    tokenizer = load_tokenizer("wordpiece")
    model = seeded(transformers.BertModel, small_bert_config(len(tokenizer)))
    folder = write_folder("bert_embedding", "wordpiece", model, LastHiddenState(model, ["input_ids", "attention_mask", "token_type_ids"]), "last_hidden_state")
    # A sentence-transformers folder: Transformer -> Pooling(mean) -> Normalize.
    (folder / "1_Pooling").mkdir()
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (folder / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 32, "do_lower_case": False}) + "\n")

    hf_dir = folder / "_hf"
    model.save_pretrained(hf_dir)
    tokenizer.save_pretrained(hf_dir)
    expected = {"sentences": SENTENCES + [LONG_SENTENCE], "poolings": {}}
    for mode in ("mean", "cls", "max", "lasttoken"):
        for normalize in (False, True):
            transformer = st_models.Transformer(str(hf_dir), max_seq_length=32)
            pooling = st_models.Pooling(transformer.get_word_embedding_dimension(), pooling_mode=mode)
            modules = [transformer, pooling] + ([st_models.Normalize()] if normalize else [])
            st = SentenceTransformer(modules=modules, device="cpu")
            vectors = st.encode(expected["sentences"], batch_size=1, convert_to_numpy=True)
            expected["poolings"][f"{mode}{'_normalize' if normalize else ''}"] = vectors.tolist()
    # The folder's own pooling, in the format of published sentence-transformers models (one flag
    # per mode; newer releases also read a single "pooling_mode").
    flags = {f"pooling_mode_{m}": m == "mean_tokens" for m in
             ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")}
    pooling_config = {"word_embedding_dimension": 32, **flags, "include_prompt": True}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config, indent=2) + "\n")
    shutil.rmtree(hf_dir)
    dump(folder, expected)


def classification_model(name: str, problem_type: str | None, labels: list[str]) -> None:
    tokenizer = load_tokenizer("wordpiece")
    config = small_bert_config(len(tokenizer), num_labels=len(labels),
                               id2label=dict(enumerate(labels)), label2id={l: i for i, l in enumerate(labels)})
    if problem_type is not None:
        config.problem_type = problem_type
    model = seeded(transformers.BertForSequenceClassification, config)
    spread_classifier(model, 0.5)
    folder = write_folder(name, "wordpiece", model, Logits(model, ["input_ids", "attention_mask", "token_type_ids"]), "logits")
    pipe = transformers.pipeline("text-classification", model=model, tokenizer=tokenizer, device="cpu")
    # truncation=True: transformers' text-classification does not truncate unless asked; Transmuter
    # truncates to model_max_length by default (one sentence here is longer than its 32).
    run = lambda text, **kw: pipe(text, truncation=True, **kw)  # noqa: E731
    expected = {"sentences": SENTENCES, "top1": [run(s) for s in SENTENCES],
                "all": [run(s, top_k=None) for s in SENTENCES],
                "top2": [run(s, top_k=2) for s in SENTENCES],
                "pairs": [[a, b] for a, b in PAIRS],
                "pairs_all": [run({"text": a, "text_pair": b}, top_k=None) for a, b in PAIRS],
                "none_all": [run(s, top_k=None, function_to_apply="none") for s in SENTENCES]}
    dump(folder, expected)


def token_classification_model(name: str, kind: str) -> None:
    tokenizer = load_tokenizer(kind)
    config = small_bert_config(len(tokenizer), num_labels=len(NER_LABELS),
                               id2label=dict(enumerate(NER_LABELS)), label2id={l: i for i, l in enumerate(NER_LABELS)})
    model = seeded(transformers.BertForTokenClassification, config)
    spread_classifier(model, 2.0)
    folder = write_folder(name, kind, model, Logits(model, ["input_ids", "attention_mask", "token_type_ids"]), "logits")
    pipe = transformers.pipeline("token-classification", model=model, tokenizer=tokenizer, device="cpu")
    sentences = SENTENCES + ([LONG_SENTENCE] if kind == "wordpiece" else [])
    expected = {"sentences": sentences, "strategies": {}}
    for strategy in ("none", "simple", "first", "average", "max"):
        expected["strategies"][strategy] = [pipe(s, aggregation_strategy=strategy) for s in sentences]
    expected["none_no_ignore"] = [pipe(s, aggregation_strategy="none", ignore_labels=[]) for s in sentences]
    dump(folder, expected)


def fill_mask_model() -> None:
    tokenizer = load_tokenizer("wordpiece")
    model = seeded(transformers.BertForMaskedLM, small_bert_config(len(tokenizer)))
    folder = write_folder("bert_fill_mask", "wordpiece", model, Logits(model, ["input_ids", "attention_mask", "token_type_ids"]), "logits")
    pipe = transformers.pipeline("fill-mask", model=model, tokenizer=tokenizer, device="cpu")
    single = ["The quick brown [MASK] jumps over the lazy dog", "[MASK] Smith lives in New York.",
              "Héllo wörld, ça [MASK]? 東京 is big"]
    double = ["The [MASK] brown fox jumps over the [MASK] dog"]
    targets = ["fox", "dog", "cat", "zzyzx", "foxes"]
    expected = {"single": single, "top5": [pipe(s) for s in single], "top3": [pipe(s, top_k=3) for s in single],
                "targets": targets, "targets_top3": [pipe(s, targets=targets, top_k=3) for s in single],
                "double": double, "double_top2": [pipe(s, top_k=2) for s in double]}
    dump(folder, expected)


def main() -> int:
    transformers.logging.set_verbosity_error()
    OUT.mkdir(parents=True, exist_ok=True)
    embedding_model()
    classification_model("bert_sentiment", "single_label_classification", ["negative", "neutral", "positive"])
    classification_model("bert_multilabel", "multi_label_classification", ["sports", "politics", "science", "art"])
    token_classification_model("bert_ner", "wordpiece")
    token_classification_model("bpe_ner", "bytelevel_bpe")
    fill_mask_model()
    for folder in sorted(OUT.iterdir()):
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        print(f"{folder.relative_to(REPO_ROOT)}: {size / 1024:.0f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
