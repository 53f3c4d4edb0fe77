#!/usr/bin/env python3
"""Record how transformers' generate() chooses tokens, as references for tests/pipelines/generation_test.cpp.

Run with the export venv (torch 2.15, transformers 5.23.0):
    /opt/export-venv/bin/python scripts/make_generation_references.py
It writes tests/pipelines/fixtures/generation/*.json (committed; the C++ tests only read them):

- processors.json: transformers' own LogitsProcessor classes, one at a time (RepetitionPenalty,
  NoRepeatNGram, MinLength, MinNewTokensLength, Temperature, TopK, TopP, MinP), on seeded random logits
  (ties, large values, entries already at -inf) and histories (repeats, ids past the vocabulary).
- chains.json: the processor list GenerationMixin._get_logits_processor builds for a GenerationConfig
  (encoder-decoder checkpoints' forced_bos/forced_eos_token_id, suppress_tokens, begin_suppress_tokens too)
  (after generate's own preparation: global defaults, min_new_tokens -> min_length, eos tensor), applied to
  one row, and torch.argmax of the result (greedy's choice).
- stop_strings.json: StopStringCriteria with real tokenizers (tests/text/fixtures/*/tokenizer.json loaded by
  PreTrainedTokenizerFast) on every prefix of token sequences: True when generation would stop there.
  byte_fallback/tokenizer.json (written here too) is the sentencepiece_bpe fixture made Llama-like: <0xNN>
  byte tokens, BPE byte_fallback and Llama's decoder (Replace, ByteFallback, Fuse, Strip), so that the
  byte-fallback matching mode is covered.
- generate.json: whole greedy generate() runs (batch of one) of a stand-in language model whose logits are a
  hash of the history (integers / 64: exact in float32, with many ties), so that C++ computes the same
  logits: the output sequences, ended by max_new_tokens, max_length, eos or a stop string.
- configs.json: GenerationConfig.from_pretrained of generation_config.json files, the config.json fallback
  (what transformers loads when generation_config.json is missing), and the max_length generate derives
  from max_new_tokens / max_length / the default.

Floats are written as the shortest decimal that parses back (double, then float32) to the float32 value;
-inf is the string "-inf" (JSON has no infinities). Deterministic: seeded numpy, CPU torch, fixed order.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import transformers
from transformers import GenerationConfig, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerFast
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.generation import logits_process as lp
from transformers.generation.stopping_criteria import StopStringCriteria
from transformers.generation.utils import GenerationMixin

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "pipelines" / "fixtures" / "generation"
TOKENIZERS = ROOT / "tests" / "text" / "fixtures"

assert transformers.__version__ == "5.23.0", transformers.__version__
warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()


# ---------------------------------------------------------------------------------------------- writing


def f32(x) -> float | str:
    """A float32 as a JSON number that parses back to it exactly; -inf as "-inf"."""
    x = np.float32(x)
    if np.isneginf(x):
        return "-inf"
    assert np.isfinite(x), x
    short = float(str(x))
    return short if np.float32(short) == x else float(x)


def row(t: torch.Tensor) -> list:
    return [f32(v) for v in t.reshape(-1).tolist()]


def write(name: str, document: dict) -> None:
    """One JSON object; each list of cases one case per line (readable diffs, small files)."""
    parts = []
    for key, value in document.items():
        if isinstance(value, list):
            lines = ",\n".join("  " + json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in value)
            parts.append(f"{json.dumps(key)}: [\n{lines}\n]")
        else:
            parts.append(f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}")
    (OUT / name).write_text("{\n" + ",\n".join(parts) + "\n}\n", encoding="utf-8")


# ---------------------------------------------------------------------------------------------- inputs


def random_logits(rng: np.random.Generator, vocab: int, minus_inf: int = 0) -> np.ndarray:
    """Normal logits with groups of ties (one at the maximum), a few large values, optionally -inf entries."""
    x = rng.normal(0.0, 3.0, vocab).astype(np.float32)
    for _ in range(3):  # groups of equal values
        idx = rng.choice(vocab, size=int(rng.integers(2, 5)), replace=False)
        x[idx] = x[idx[0]]
    top = rng.choice(vocab, size=2, replace=False)  # a tie at the maximum
    x[top] = x.max() + np.float32(0.5)
    big = rng.choice(vocab, size=3, replace=False)
    x[big[0]], x[big[1]] = np.float32(-1000.0), np.float32(-30.5)
    if rng.random() < 0.3:  # a large maximum: most of the mass on one token
        x[big[2]] = np.float32(40.0)
    if minus_inf:
        x[rng.choice(vocab, size=minus_inf, replace=False)] = -np.inf
    return x


def random_history(rng: np.random.Generator, vocab: int, length: int, past_vocab: bool = True) -> list[int]:
    """Ids with repeats (small alphabet stretches make n-grams recur), sometimes one past the vocabulary."""
    alphabet = rng.choice(vocab, size=max(3, length // 3), replace=False)
    ids = [int(v) for v in rng.choice(alphabet, size=length)]
    if past_vocab and length and rng.random() < 0.4:
        ids[int(rng.integers(0, length))] = vocab + int(rng.integers(0, 5))
    return ids


def ids_tensor(history: list[int]) -> torch.Tensor:
    return torch.tensor([history], dtype=torch.long).reshape(1, len(history))


# ---------------------------------------------------------------------------------------------- processors


def processor_cases(rng: np.random.Generator) -> list[dict]:
    cases = []

    def add(name: str, processor, params: dict, vocab: int, history: list[int], minus_inf: int = 0):
        logits = random_logits(rng, vocab, minus_inf)
        scores = torch.from_numpy(logits.copy()).reshape(1, vocab)
        out = processor(ids_tensor(history), scores.clone())
        cases.append({"name": name, **params, "history": history, "logits": row(scores), "expected": row(out)})

    for i, (penalty, vocab, length) in enumerate(
        [(1.3, 50, 12), (0.7, 64, 20), (2.0, 97, 0), (1.05, 128, 30), (1.5, 300, 25)]
    ):
        add(f"repetition_penalty_{i}", lp.RepetitionPenaltyLogitsProcessor(penalty), {"penalty": penalty},
            vocab, random_history(rng, vocab, length), minus_inf=2 * (i % 2))
    for i, (n, vocab, length) in enumerate([(1, 50, 10), (2, 64, 24), (3, 60, 40), (2, 97, 1), (4, 50, 30)]):
        add(f"no_repeat_ngram_{i}", lp.NoRepeatNGramLogitsProcessor(n), {"ngram_size": n},
            vocab, random_history(rng, vocab, length))
    for i, (min_length, vocab, length) in enumerate([(10, 50, 9), (10, 50, 10)]):
        eos = [3, vocab - 1, vocab + 7]  # one eos id past the vocabulary: ignored
        add(f"min_length_{i}", lp.MinLengthLogitsProcessor(min_length, eos), {"min_length": min_length, "eos": eos},
            vocab, random_history(rng, vocab, length, past_vocab=False))
    for i, (min_new, prompt, length) in enumerate([(4, 5, 8), (4, 5, 9), (1, 3, 3)]):
        vocab, eos = 60, [0, 17]
        add(f"min_new_tokens_{i}", lp.MinNewTokensLengthLogitsProcessor(prompt, min_new, eos),
            {"min_new_tokens": min_new, "prompt_length": prompt, "eos": eos},
            vocab, random_history(rng, vocab, length, past_vocab=False))
    for i, (t, vocab) in enumerate([(0.7, 50), (1.5, 97), (0.05, 64), (3.0, 128)]):
        add(f"temperature_{i}", lp.TemperatureLogitsWarper(t), {"temperature": t}, vocab, [], minus_inf=i % 2)
    for i, (k, vocab) in enumerate([(1, 50), (5, 64), (20, 97), (50, 300), (200, 128), (3, 50)]):
        add(f"top_k_{i}", lp.TopKLogitsWarper(k), {"top_k": k}, vocab, [], minus_inf=3 * (i % 2))
    for i, (p, vocab) in enumerate([(0.9, 50), (0.5, 64), (0.95, 300), (0.1, 97), (0.0, 50), (0.999, 128), (0.7, 60)]):
        add(f"top_p_{i}", lp.TopPLogitsWarper(p), {"top_p": p}, vocab, [], minus_inf=2 * (i % 2))
    for i, (m, vocab) in enumerate([(0.1, 50), (0.05, 97), (0.5, 64), (1.0, 50), (0.0, 60), (0.2, 300)]):
        add(f"min_p_{i}", lp.MinPLogitsWarper(m), {"min_p": m}, vocab, [], minus_inf=i % 2)

    # Ties exactly at the top-p boundary: which tied token goes depends on the order of torch's sort.
    for i, p in enumerate([0.5, 0.75, 0.3]):
        vocab = 40
        logits = np.zeros(vocab, dtype=np.float32)
        logits[: vocab // 2] = np.float32(1.0)
        logits = logits[rng.permutation(vocab)]
        scores = torch.from_numpy(logits.copy()).reshape(1, vocab)
        out = lp.TopPLogitsWarper(p)(ids_tensor([]), scores.clone())
        cases.append({"name": f"top_p_boundary_ties_{i}", "top_p": p, "history": [], "logits": row(scores),
                      "expected": row(out)})
    return cases


# ---------------------------------------------------------------------------------------------- chains


class DecoderOnly:
    """What _get_logits_processor and the length preparation read of a model."""

    def __init__(self, max_position_embeddings=None):
        self.config = SimpleNamespace(is_encoder_decoder=False, max_position_embeddings=max_position_embeddings)
        self.device = torch.device("cpu")

    _merge_criteria_processor_list = GenerationMixin._merge_criteria_processor_list


def prepared_config(fields: dict, prompt_length: int, model: DecoderOnly) -> GenerationConfig:
    """The GenerationConfig generate() works with: the model's config, global defaults, derived lengths."""
    config = GenerationConfig(**fields)
    has_default_max_length = config.max_length is None
    has_default_min_length = config.min_length is None
    config.update(**GenerationConfig._get_default_generation_params(), defaults_only=True)
    inputs = torch.zeros((1, prompt_length), dtype=torch.long)
    GenerationMixin._prepare_generated_length(model, config, has_default_max_length, has_default_min_length,
                                              "input_ids", prompt_length, inputs)
    GenerationMixin._validate_generated_length(model, config, prompt_length, has_default_max_length)
    GenerationMixin._prepare_special_tokens(model, config, kwargs_has_attention_mask=True, device="cpu")
    return config


def chain_for(fields: dict, prompt_length: int):
    """The processors and the max_length generate() derives (where forced_eos_token_id acts)."""
    model = DecoderOnly()
    config = prepared_config(fields, prompt_length, model)
    processors = GenerationMixin._get_logits_processor(model, config, input_ids_seq_length=prompt_length,
                                                       encoder_input_ids=None, logits_processor=None,
                                                       device="cpu", model_kwargs={})
    return processors, config.max_length


CHAIN_CONFIGS = [
    {"name": "greedy_defaults", "config": {}},
    {"name": "greedy_penalties", "config": {"repetition_penalty": 1.3, "no_repeat_ngram_size": 2,
                                            "min_new_tokens": 3, "eos_token_id": [5, 2]}},
    {"name": "greedy_penalty_below_one", "config": {"repetition_penalty": 0.8, "eos_token_id": 1}},
    {"name": "greedy_ignores_warpers", "config": {"do_sample": False, "temperature": 0.5, "top_k": 3,
                                                  "top_p": 0.5, "min_p": 0.2}},
    {"name": "sample_defaults", "config": {"do_sample": True}},
    {"name": "sample_temperature_top_k_top_p", "config": {"do_sample": True, "temperature": 0.7, "top_k": 20,
                                                          "top_p": 0.9}},
    {"name": "sample_all", "config": {"do_sample": True, "temperature": 1.5, "top_k": 0, "top_p": 0.8,
                                      "min_p": 0.05, "repetition_penalty": 1.1, "no_repeat_ngram_size": 3,
                                      "min_new_tokens": 2, "eos_token_id": 0}},
    {"name": "sample_min_p_only", "config": {"do_sample": True, "top_k": 0, "min_p": 0.1}},
    {"name": "sample_min_length", "config": {"do_sample": True, "min_length": 12, "eos_token_id": [4, 9],
                                             "top_k": 10, "temperature": 0.9}},
    {"name": "sample_sharp", "config": {"do_sample": True, "temperature": 0.3, "top_k": 5, "top_p": 0.95}},
]
# The processors of encoder-decoder checkpoints (BART's forced bos/eos, Whisper's suppressed tokens), on
# one-token prompts (the decoder start token) and longer ones, at the steps where they act and after.
FORCING_CONFIGS = [
    {"name": "forced_bos_eos", "config": {"forced_bos_token_id": 7, "forced_eos_token_id": 2, "max_new_tokens": 3}},
    {"name": "forced_eos_list", "config": {"forced_eos_token_id": [2, 11], "max_new_tokens": 2,
                                           "repetition_penalty": 1.2}},
    {"name": "suppress", "config": {"suppress_tokens": [1, 4, 9, 200], "begin_suppress_tokens": [3, 5]}},
    {"name": "suppress_after_forced_bos", "config": {"forced_bos_token_id": 6, "begin_suppress_tokens": [3, 8],
                                                     "eos_token_id": 3, "min_new_tokens": 2}},
    {"name": "sample_forced", "config": {"do_sample": True, "top_k": 4, "forced_bos_token_id": 5,
                                         "forced_eos_token_id": 1, "max_new_tokens": 2}},
]
FORCING_SHAPES = [(50, 1, 0), (64, 1, 1), (97, 1, 2), (80, 4, 0), (60, 4, 1)]


def chain_cases(rng: np.random.Generator) -> list[dict]:
    cases = []
    shapes = [(50, 6, 1), (97, 4, 3), (128, 9, 6)]
    for spec in [*CHAIN_CONFIGS, *FORCING_CONFIGS]:
        for j, (vocab, prompt_length, generated) in enumerate(FORCING_SHAPES if spec in FORCING_CONFIGS else shapes):
            history = random_history(rng, vocab, prompt_length + generated, past_vocab=False)
            processors, max_length = chain_for(spec["config"], prompt_length)
            logits = random_logits(rng, vocab)
            scores = torch.from_numpy(logits.copy()).reshape(1, vocab)
            out = processors(ids_tensor(history), scores.clone())
            cases.append({
                "name": f"{spec['name']}_{j}",
                "config": spec["config"],
                "transformers_chain": [type(p).__name__ for p in processors],
                "prompt_length": prompt_length,
                "max_length": max_length,
                "history": history,
                "logits": row(scores),
                "expected": row(out),
                "argmax": int(torch.argmax(out, dim=-1)),
            })
    return cases


# ---------------------------------------------------------------------------------------------- stop strings

TEXTS = [
    "Hello world! Hello again, world. Goodbye, cruel world?",
    "The quick brown fox jumps over the lazy dog.\n\nStop here.",
    "Emoji: 😀 😂 👍🏽 and more 🎉🎉. Le cœur déçu, naïve.",
    "def encode(text):\n\treturn [ord(c) for c in text]\n",
    "Unseen: 🚀 Ω≈ √∑ → done 🚀.",  # characters the tokenizers were not trained on: bytes, or unknown
]
STOP_STRINGS = {
    "bytelevel_bpe": [["world"], ["o w", "\n\n"], ["😀"], ["🎉."], ["é"], ["ld!", "bye, c"], ["return ["], ["🚀"],
                      ["≈ √", "→ d"]],
    "wordpiece": [["world"], ["o w", "quick"], ["bye, c"], ["ncode"], ["ld!"], ["!"]],
    "sentencepiece_bpe": [["world"], ["o w", "quick"], ["😀"], ["é"], ["bye, c"], ["ld!"]],
    "unigram": [["world"], ["o w", "quick"], ["bye, c"], ["é"], ["ld!"]],
    "byte_fallback": [["world"], ["😀"], ["👍🏽"], ["🎉."], ["é"], ["bye, c"], ["ld!", "\n\t"], ["🚀"], ["≈ √", "→ d"],
                      ["🚀."]],
}
RANDOM_STOP_STRINGS = [["e"], ["in", "th"], ["o", "er "], ["an"]]


def write_byte_fallback_tokenizer() -> Path:
    """The sentencepiece_bpe fixture with byte fallback, as Llama 2 / Mistral tokenizers have it."""
    spec = json.loads((TOKENIZERS / "sentencepiece_bpe" / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    added = {t["id"] for t in spec["added_tokens"]}
    next_id = max(list(vocab.values()) + list(added)) + 1
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = next_id + b
    spec["model"]["byte_fallback"] = True
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    path = OUT / "byte_fallback" / "tokenizer.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    return path


def tokenizer_path(kind: str) -> Path:
    return OUT / kind / "tokenizer.json" if kind == "byte_fallback" else TOKENIZERS / kind / "tokenizer.json"


def stop_string_cases(rng: np.random.Generator) -> list[dict]:
    cases = []
    write_byte_fallback_tokenizer()
    for kind, stop_lists in STOP_STRINGS.items():
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_path(kind)))
        vocab = len(tokenizer.get_vocab())
        sequences = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in TEXTS]
        added = [t.content for t in tokenizer.added_tokens_decoder.values()]
        special = tokenizer.convert_tokens_to_ids(added[-1])
        sequences.append(sequences[0][:5] + [special] + sequences[0][5:9])
        randoms = [[int(v) for v in rng.integers(0, vocab, size=24)] for _ in range(3)]

        def add(stop_strings, ids, origin):
            criteria = StopStringCriteria(tokenizer, stop_strings)
            expected = [bool(criteria(ids_tensor(ids[:k]), None)[0]) for k in range(1, len(ids) + 1)]
            cases.append({"tokenizer": kind, "mode": criteria._stop_string_matching_mode, "origin": origin,
                          "stop_strings": stop_strings, "ids": ids, "expected": expected})

        for stop_strings in stop_lists:
            for i, ids in enumerate(sequences):
                add(stop_strings, ids, f"text_{i}")
        for stop_strings in RANDOM_STOP_STRINGS:
            for i, ids in enumerate(randoms):
                add(stop_strings, ids, f"random_{i}")
    return cases


# ---------------------------------------------------------------------------------------------- generate

MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """A 64-bit finalizer (as in splitmix64); tests/pipelines/generation_test.cpp has the same one."""
    x &= MASK64
    x ^= x >> 31
    x = (x * 0x7FB5D329728EA185) & MASK64
    x ^= x >> 27
    x = (x * 0x81DADEF4BC2DD44D) & MASK64
    return x ^ (x >> 33)


def hash_logits(history: list[int], vocab: int) -> list[float]:
    """The stand-in model: logits from the last two tokens and the length, k / 64 for k in [-1000, 1000]."""
    last = history[-1] if history else 0
    before = history[-2] if len(history) > 1 else 0
    base = mix64(last * 0x9E3779B97F4A7C15 + before * 0xC2B2AE3D27D4EB4F + len(history))
    return [((mix64(base + v) % 2001) - 1000) / 64.0 for v in range(vocab)]


class HashConfig(PretrainedConfig):
    model_type = "transmuter_hash_lm"

    def __init__(self, vocab_size: int = 64, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size


class HashLM(PreTrainedModel, GenerationMixin):
    """A causal LM for generate(): no weights, no cache, the last position's logits from hash_logits."""

    config_class = HashConfig

    def __init__(self, config: HashConfig):
        super().__init__(config)
        self.unused = torch.nn.Parameter(torch.zeros(1))
        self.post_init()

    def forward(self, input_ids, attention_mask=None, **kwargs):
        logits = torch.zeros(*input_ids.shape, self.config.vocab_size)
        for i, ids in enumerate(input_ids.tolist()):
            logits[i, -1] = torch.tensor(hash_logits(ids, self.config.vocab_size))
        return CausalLMOutputWithPast(logits=logits)

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids}


def generate(vocab: int, prompt: list[int], fields: dict, tokenizer=None) -> list[int]:
    model = HashLM(HashConfig(vocab_size=vocab))
    model.generation_config = GenerationConfig()
    out = model.generate(torch.tensor([prompt]), generation_config=GenerationConfig(**fields), use_cache=False,
                         tokenizer=tokenizer)
    return out[0].tolist()


def generate_cases() -> list[dict]:
    cases = []

    def add(name, vocab, prompt, fields, tokenizer_kind=None, tokenizer=None):
        sequence = generate(vocab, prompt, fields, tokenizer)
        cases.append({"name": name, "vocab": vocab, "prompt": prompt, "config": fields, "tokenizer": tokenizer_kind,
                      "sequence": sequence})
        return sequence

    add("max_new_tokens", 64, [5, 6, 7], {"max_new_tokens": 12})
    add("default_length", 64, [1, 2], {})
    add("max_length", 50, [9, 8, 7, 6], {"max_length": 10})
    add("penalties", 64, [5, 6, 7, 5, 6], {"max_new_tokens": 25, "repetition_penalty": 1.3, "no_repeat_ngram_size": 2})
    add("penalty_below_one", 64, [3, 4], {"max_new_tokens": 15, "repetition_penalty": 0.7})
    # eos chosen from a run without it, so that it does end the run early; min_new_tokens holds it back.
    free = generate(80, [11, 12, 13], {"max_new_tokens": 20})
    eos = free[3 + 5]
    add("eos", 80, [11, 12, 13], {"max_new_tokens": 20, "eos_token_id": [eos, 79]})
    add("eos_after_min_new_tokens", 80, [11, 12, 13], {"max_new_tokens": 20, "eos_token_id": eos, "min_new_tokens": 8})
    add("eos_after_min_length", 80, [11, 12, 13], {"max_new_tokens": 20, "eos_token_id": eos, "min_length": 12})
    # A stop string cut from the text of a run without it, spanning a token boundary.
    for kind in ["bytelevel_bpe", "wordpiece"]:
        tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_path(kind)))
        vocab, prompt = len(tokenizer.get_vocab()), tokenizer("Hello", add_special_tokens=False)["input_ids"]
        free = generate(vocab, prompt, {"max_new_tokens": 30}, tokenizer)
        texts = [tokenizer.decode(free[: k + 1]) for k in range(len(free))]
        for k in range(len(prompt) + 6, len(free)):
            boundary = len(texts[k - 1])
            stop = texts[k][boundary - 2 : boundary + 2]
            if len(stop) < 4 or "\ufffd" in stop:
                continue
            fields = {"max_new_tokens": 30, "stop_strings": [stop]}
            if len(add(f"stop_string_{kind}", vocab, prompt, fields, kind, tokenizer)) < len(free):
                break
            cases.pop()
        else:
            raise AssertionError(f"no stop string ends the {kind} run early")
    return cases


# ---------------------------------------------------------------------------------------------- configs

FIELDS = ["max_new_tokens", "max_length", "min_length", "min_new_tokens", "do_sample", "temperature", "top_k",
          "top_p", "min_p", "repetition_penalty", "no_repeat_ngram_size", "eos_token_id", "pad_token_id",
          "bos_token_id", "decoder_start_token_id", "stop_strings"]


def loaded_fields(config: GenerationConfig) -> dict:
    """The fields as generate() sees them (global defaults filled in), max_length as the file gives it."""
    max_length = config.max_length
    config.update(**GenerationConfig._get_default_generation_params(), defaults_only=True)
    fields = {name: getattr(config, name) for name in FIELDS}
    fields["max_length"] = max_length
    eos = fields.pop("eos_token_id")
    fields["eos_token_ids"] = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    stops = fields["stop_strings"]
    fields["stop_strings"] = [] if stops is None else ([stops] if isinstance(stops, str) else list(stops))
    # The pad id generate() fills finished rows with (pad_token_id, else the first eos id).
    GenerationMixin._prepare_special_tokens(DecoderOnly(), config, kwargs_has_attention_mask=True, device="cpu")
    pad = config._pad_token_tensor
    fields["generation_pad_token_id"] = None if pad is None else int(pad)
    return fields


GENERATION_CONFIG_FILES = [
    {"name": "empty", "json": {}},
    {"name": "llama_style", "json": {"bos_token_id": 1, "eos_token_id": [2, 32000], "pad_token_id": 0,
                                     "do_sample": True, "temperature": 0.6, "top_p": 0.9,
                                     "transformers_version": "4.44.0"}},
    {"name": "gpt2_style", "json": {"_from_model_config": True, "bos_token_id": 50256, "eos_token_id": 50256,
                                    "transformers_version": "4.27.0.dev0"}},
    {"name": "bart_style", "json": {"bos_token_id": 0, "decoder_start_token_id": 2, "eos_token_id": 2,
                                    "forced_bos_token_id": 0, "forced_eos_token_id": 2, "max_length": 142,
                                    "min_length": 56, "no_repeat_ngram_size": 3, "num_beams": 4,
                                    "pad_token_id": 1, "length_penalty": 2.0, "early_stopping": True}},
    {"name": "lengths_and_sampling", "json": {"max_new_tokens": 64, "min_new_tokens": 2, "do_sample": True,
                                              "top_k": 0, "min_p": 0.05, "repetition_penalty": 1.1,
                                              "stop_strings": "<|im_end|>",
                                              "eos_token_id": [7, 8]}},
    {"name": "nulls_and_lists", "json": {"temperature": None, "top_k": None, "eos_token_id": None,
                                         "stop_strings": ["\n\n", "User:"], "pad_token_id": None}},
    {"name": "integer_floats", "json": {"temperature": 2, "top_p": 1, "repetition_penalty": 1}},
]

MODEL_CONFIG_FILES = [
    {"name": "gpt2", "json": {"model_type": "gpt2", "bos_token_id": 50256, "eos_token_id": 50256, "n_embd": 768,
                              "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}}}},
    {"name": "old_style_generation_fields", "json": {"model_type": "bart", "bos_token_id": 0, "eos_token_id": 2,
                                                     "pad_token_id": 1, "decoder_start_token_id": 2,
                                                     "max_length": 142, "min_length": 56, "num_beams": 4,
                                                     "no_repeat_ngram_size": 3, "do_sample": False}},
    {"name": "composite_text_config", "json": {"model_type": "llava", "bos_token_id": None,
                                               "text_config": {"bos_token_id": 1, "eos_token_id": [2, 7],
                                                               "pad_token_id": 0, "max_length": 33}}},
    {"name": "decoder_subconfig", "json": {"model_type": "encoder-decoder", "eos_token_id": 3,
                                           "decoder": {"eos_token_id": 9, "bos_token_id": 8, "pad_token_id": 0},
                                           "text_config": {"bos_token_id": 99}}},
    {"name": "no_special_tokens", "json": {"model_type": "bert", "hidden_size": 16}},
]

LENGTH_CASES = [
    # (generation config fields, prompt length, model's max_position_embeddings)
    ({}, 7, None),
    ({}, 7, 16),
    ({}, 30, 16),
    ({"max_new_tokens": 5}, 7, None),
    ({"max_new_tokens": 5, "max_length": 9}, 7, None),
    ({"max_length": 9}, 7, None),
    ({"max_length": 9}, 9, None),
    ({"max_length": 100}, 7, 16),
    ({"max_new_tokens": 50}, 7, 16),
]


def from_pretrained_fields(folder: Path, **kwargs) -> dict:
    return loaded_fields(GenerationConfig.from_pretrained(folder, **kwargs))


def config_cases() -> dict:
    from_file, fallback, lengths = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for spec in GENERATION_CONFIG_FILES:
            (folder / "generation_config.json").write_text(json.dumps(spec["json"]))
            from_file.append({**spec, "expected": from_pretrained_fields(folder)})
        (folder / "generation_config.json").unlink()
        for spec in MODEL_CONFIG_FILES:
            # What adjust_generation_fn loads when a model folder has no generation_config.json.
            (folder / "config.json").write_text(json.dumps(spec["json"]))
            expected = from_pretrained_fields(folder, config_file_name="config.json", _from_model_config=True)
            fallback.append({**spec, "expected": expected})
    for fields, prompt_length, max_positions in LENGTH_CASES:
        case = {"config": fields, "prompt_length": prompt_length, "max_position_embeddings": max_positions}
        try:
            config = prepared_config(fields, prompt_length, DecoderOnly(max_positions))
            case["max_length"] = config.max_length
        except ValueError as error:
            case["error"] = str(error).split(".")[0]
        lengths.append(case)
    return {"from_file": from_file, "from_model_config": fallback, "lengths": lengths}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    header = {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]}
    write("processors.json", {**header, "cases": processor_cases(np.random.default_rng(20240601))})
    write("chains.json", {**header, "cases": chain_cases(np.random.default_rng(20240602))})
    write("stop_strings.json", {**header, "cases": stop_string_cases(np.random.default_rng(20240603))})
    write("generate.json", {**header, "cases": generate_cases()})
    write("configs.json", {**header, **config_cases()})
    total = sum(p.stat().st_size for p in OUT.rglob("*.json"))
    print(f"wrote {OUT.relative_to(ROOT)}: {total / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
