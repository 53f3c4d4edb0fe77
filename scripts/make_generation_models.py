#!/usr/bin/env python3
"""Tiny random decoder models with their tokenizer, exported to ONNX with a KV cache, and transformers'
greedy generate() outputs on them: the fixtures against which the C++ decode loop is tested.

Run by hand (needs torch and transformers 5.23, which CI does not have):
    /opt/export-venv/bin/python scripts/make_generation_models.py [--only FAMILY ...]

For each family (gpt2, llama, qwen2, phi3) this writes tests/pipelines/fixtures/<family>_decoder/:
    model.onnx               fp32, TorchScript exporter (dynamo=False), weights inline, the optimum
                             decoder-with-past signature of scripts/export_models.py: input_ids,
                             attention_mask [batch, past+seq], position_ids, past_key_values.N.key/value
                             [batch, kv_heads, past, head_dim] in; logits, present.N.key/value out.
                             Past length 0 is the first step.
    tokenizer.json           tests/text/fixtures/bytelevel_bpe/ (its <|endoftext|> is bos, eos and pad)
    tokenizer_config.json
    config.json              model.config.to_json_file
    generation_config.json   greedy (do_sample False), eos and pad = <|endoftext|>
    expected.json            the model's shape facts and greedy generate()'s outputs on the cases below:
                             prompt texts, prompt ids (per row and as the padded batch), the new
                             token ids per row and their texts (skip_special_tokens=True)

The cases: single (one prompt, 24 new tokens), single_no_cache (the same with use_cache=False, which
must give the same tokens), batch_left_padded (three prompts of different lengths, left padded, 16
new tokens), repetition_penalty_no_repeat_ngram (repetition_penalty 1.3, no_repeat_ngram_size 3, 20
new tokens) and stops_on_eos (a prompt whose output ends on eos before max_new_tokens).

Random weights over 842 tokens seldom choose eos, so each family's eos row of the output projection
is multiplied by the smallest factor (1.0 when none is needed) that gives the stops_on_eos case; the
factor is recorded in expected.json and is part of model.onnx. Where one of the candidate prompts for
a case stops on eos too early, the next is used (see pick_eos_scale, pick_penalty_prompt).

Each export is checked in onnxruntime against PyTorch: the prompt with an empty past, then one token
at a time with the presents fed back, with and without left padding, against the wrapper on the same
inputs and against a single no-cache forward over the whole sequence.

The models are seeded and deterministic: re-running gives the same expected.json and the same ONNX
files (up to the exporter's version).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import tokenizers
import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from export_models import decoder_plan, randomize_norms  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = REPO_ROOT / "tests" / "text" / "fixtures" / "bytelevel_bpe"
OUT = REPO_ROOT / "tests" / "pipelines" / "fixtures"
SEED = 0
MAX_MODEL_BYTES = 1536 * 1024
MAX_TOTAL_BYTES = 6 * 1024 * 1024
# fp32 PyTorch vs onnxruntime on the same graph: kernel summation order only.
EXPORT_TOLERANCE = 1e-4
EOS = "<|endoftext|>"

assert transformers.__version__ == "5.23.0", transformers.__version__
warnings.filterwarnings("ignore")
transformers.logging.set_verbosity_error()
# The machine is shared with a C++ build; one thread also keeps results independent of core count.
torch.set_num_threads(1)

# The first that runs to max_new_tokens without eos is recorded (see pick_eos_scale).
SINGLE_PROMPTS = ["The quick brown fox", "The weather today is", "We went to the market and bought"]
SINGLE_MAX_NEW_TOKENS = 24
BATCH_PROMPTS = ["Hello", "Paris is the capital of France and", "The cat sat on"]
PENALTY = {"max_new_tokens": 20, "repetition_penalty": 1.3, "no_repeat_ngram_size": 3}
# The first that runs to max_new_tokens without eos and whose output the penalties change is recorded.
PENALTY_PROMPTS = [
    "the cat sat on the mat and looked at the dog",
    "one two three one two three",
    "I loved this movie, I loved it",
]
EOS_CASE_MAX_NEW_TOKENS = 24
# Tried in order for the eos case; the first whose greedy output ends on eos after EOS_STEPS new
# tokens is recorded.
EOS_PROMPTS = [
    "John Smith lives in",
    "a",
    "What is the capital of",
    "Héllo wörld",
    "zzyzx tokens and spaces",
    "Once upon a time",
    "I loved this movie",
    "Berlin",
    "It was great",
    "The dog",
    "Marie Curie and Albert Einstein worked",
    "one two three",
    "Hello world",
    "spaces   and",
    "東京 is big",
    "the mat",
]
EOS_STEPS = range(6, 20)
# Each family's eos row of the output projection is scaled by the first of these factors with which
# an EOS_PROMPTS prompt stops on eos as wanted while a SINGLE_PROMPTS prompt does not stop (see
# pick_eos_scale); 1.0 leaves the model as initialized.
EOS_SCALES = [round(1.0 + 0.1 * i, 1) for i in range(21)]


# ---------------------------------------------------------------------------------------------- models


@dataclass
class Family:
    name: str
    model: transformers.PreTrainedModel
    opset: int

    @property
    def num_layers(self) -> int:
        return self.model.config.num_hidden_layers

    @property
    def num_heads(self) -> int:
        return self.model.config.num_attention_heads

    @property
    def kv_heads(self) -> int:
        return getattr(self.model.config, "num_key_value_heads", None) or self.num_heads

    @property
    def head_dim(self) -> int:
        return getattr(self.model.config, "head_dim", None) or self.model.config.hidden_size // self.num_heads

    @property
    def max_position_embeddings(self) -> int:
        return self.model.config.max_position_embeddings


def special_ids(vocab: int, eos: int) -> dict:
    assert eos < vocab
    return {"vocab_size": vocab, "bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}


def eager(config):
    config._attn_implementation = "eager"
    return config


def gpt2(vocab: int, eos: int) -> Family:
    config = eager(
        transformers.GPT2Config(
            n_positions=64, n_embd=64, n_layer=2, n_head=4, initializer_range=0.3, **special_ids(vocab, eos)
        )
    )
    return Family("gpt2", transformers.GPT2LMHeadModel(config), 17)


def llama(vocab: int, eos: int) -> Family:
    # Grouped-query attention: 4 query heads share 2 key/value heads.
    config = eager(
        transformers.LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            initializer_range=0.3,
            **special_ids(vocab, eos),
        )
    )
    return Family("llama", transformers.LlamaForCausalLM(config), 18)


def qwen2(vocab: int, eos: int) -> Family:
    # Qwen2: biases on q/k/v, 6 query heads of width 8 on 2 key/value heads, tied embeddings off.
    config = eager(
        transformers.Qwen2Config(
            hidden_size=48,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            max_position_embeddings=64,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            use_sliding_window=False,
            initializer_range=0.3,
            **special_ids(vocab, eos),
        )
    )
    model = transformers.Qwen2ForCausalLM(config)
    with torch.no_grad():
        # Fresh biases are zero; random ones make a bias added on the wrong axis visible.
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.3)
    return Family("qwen2", model, 17)


def phi3(vocab: int, eos: int) -> Family:
    # Phi-3: fused qkv_proj and gate_up_proj; rotary on half of each head (partial_rotary_factor, as
    # Phi-4-mini uses with this architecture), so the pass-through half is covered too.
    config = eager(
        transformers.Phi3Config(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            original_max_position_embeddings=64,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            tie_word_embeddings=False,
            initializer_range=0.3,
            **special_ids(vocab, eos),
        )
    )
    return Family("phi3", transformers.Phi3ForCausalLM(config), 18)


FAMILIES = {"gpt2": gpt2, "llama": llama, "qwen2": qwen2, "phi3": phi3}


def build(name: str, vocab: int, eos: int) -> Family:
    torch.manual_seed(SEED)
    family = FAMILIES[name](vocab, eos)
    randomize_norms(family.model, torch.Generator().manual_seed(SEED))
    family.model.eval()
    family.model.generation_config = transformers.GenerationConfig(
        bos_token_id=eos, eos_token_id=eos, pad_token_id=eos, do_sample=False
    )
    return family


# ---------------------------------------------------------------------------------------------- tokenizer


def load_tokenizer() -> transformers.PreTrainedTokenizerFast:
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(TOKENIZER_DIR / "tokenizer.json"),
        clean_up_tokenization_spaces=config["clean_up_tokenization_spaces"],
        model_input_names=["input_ids", "attention_mask"],
        padding_side=config["padding_side"],
        **{k: v for k, v in config.items() if k.endswith("_token")},
    )
    # transformers 5 rebuilds the post-processor when given bos/eos; tokenize exactly as the shipped
    # tokenizer.json says (as the `tokenizers` package and the C++ side do).
    from_file = tokenizers.Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    tokenizer.backend_tokenizer.post_processor = from_file.post_processor
    for text in [*SINGLE_PROMPTS, *BATCH_PROMPTS, *PENALTY_PROMPTS, *EOS_PROMPTS]:
        assert tokenizer(text)["input_ids"] == from_file.encode(text).ids, text
    assert tokenizer.eos_token == EOS and tokenizer.pad_token == EOS and tokenizer.bos_token == EOS
    return tokenizer


# ---------------------------------------------------------------------------------------------- generate


def generate(model, tokenizer, prompts: list[str], padding_side: str | None = None, **kwargs):
    """Greedy generate on `prompts`; returns the prompt encoding and the new tokens per row."""
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    encoded = tokenizer(prompts, padding=len(prompts) > 1, return_tensors="pt")
    with torch.no_grad():
        sequences = model.generate(
            input_ids=encoded["input_ids"],
            attention_mask=encoded["attention_mask"],
            do_sample=False,
            **kwargs,
        )
    new = sequences[:, encoded["input_ids"].shape[1] :]
    return encoded, new.tolist()


def record(tokenizer, name, prompts, encoded, new_rows, settings, max_positions: int) -> dict:
    ids = encoded["input_ids"].tolist()
    mask = encoded["attention_mask"].tolist()
    longest = len(ids[0]) + max(len(r) for r in new_rows)
    assert longest <= max_positions, f"{name}: {longest} positions, over {max_positions}"
    return {
        "name": name,
        "prompts": prompts,
        # Keyword arguments of generate() besides input_ids and attention_mask (greedy: do_sample False).
        "generate": {"do_sample": False, **{k: v for k, v in settings.items() if k != "padding_side"}},
        "padding_side": settings.get("padding_side"),
        # Per row, without padding; the padded batch generate() was given follows.
        "prompt_token_ids": [[t for t, m in zip(r, k) if m] for r, k in zip(ids, mask)],
        "input_ids": ids,
        "attention_mask": mask,
        # Only the new tokens, as generate() returns them: a row that ended on eos before the others
        # is filled with pad_token_id up to the longest row.
        "new_token_ids": new_rows,
        "texts": tokenizer.batch_decode(new_rows, skip_special_tokens=True),
    }


def run_cases(family: Family, tokenizer, eos_id: int, single: str, eos_prompt: str | None) -> list[dict]:
    model = family.model
    limit = family.max_position_embeddings
    cases = []

    settings = {"max_new_tokens": SINGLE_MAX_NEW_TOKENS, "use_cache": True}
    encoded, cached = generate(model, tokenizer, [single], **settings)
    cases.append(record(tokenizer, "single", [single], encoded, cached, settings, limit))

    settings = {"max_new_tokens": SINGLE_MAX_NEW_TOKENS, "use_cache": False}
    encoded, uncached = generate(model, tokenizer, [single], **settings)
    if uncached != cached:
        raise SystemExit(f"{family.name}: use_cache=False gives {uncached}, use_cache=True {cached}")
    cases.append(record(tokenizer, "single_no_cache", [single], encoded, uncached, settings, limit))

    settings = {"max_new_tokens": 16, "use_cache": True, "padding_side": "left"}
    encoded, rows = generate(model, tokenizer, BATCH_PROMPTS, **settings)
    batch = record(tokenizer, "batch_left_padded", BATCH_PROMPTS, encoded, rows, settings, limit)
    assert len({len(r) for r in batch["prompt_token_ids"]}) == len(BATCH_PROMPTS), "prompt lengths must differ"
    cases.append(batch)

    settings = {**PENALTY, "use_cache": True}
    prompt = pick_penalty_prompt(family, tokenizer, eos_id)
    encoded, rows = generate(model, tokenizer, [prompt], **settings)
    cases.append(record(tokenizer, "repetition_penalty_no_repeat_ngram", [prompt], encoded, rows, settings, limit))

    if eos_prompt is not None:
        settings = {"max_new_tokens": EOS_CASE_MAX_NEW_TOKENS, "use_cache": True}
        encoded, rows = generate(model, tokenizer, [eos_prompt], **settings)
        assert rows[0][-1] == eos_id and len(rows[0]) < EOS_CASE_MAX_NEW_TOKENS
        cases.append(record(tokenizer, "stops_on_eos", [eos_prompt], encoded, rows, settings, limit))
    return cases


def output_embedding_row(family: Family, eos_id: int) -> torch.Tensor:
    return family.model.get_output_embeddings().weight[eos_id]


def eos_step(family: Family, tokenizer, prompt: str, eos_id: int, max_new_tokens: int) -> int | None:
    """How many new tokens greedy generate makes up to and including eos, or None."""
    _, rows = generate(family.model, tokenizer, [prompt], max_new_tokens=max_new_tokens)
    return rows[0].index(eos_id) + 1 if eos_id in rows[0] else None


def pick_eos_scale(family: Family, tokenizer, eos_id: int) -> tuple[float, str, str | None]:
    """Random weights over 842 tokens seldom choose eos. Scaling eos's row of the output projection
    (its logit is that row dotted with the final hidden state) makes eos win in some contexts and not
    others; take the smallest scale with which a prompt stops on eos after EOS_STEPS tokens while a
    single-case prompt still runs to max_new_tokens. Returns the scale, the single-case prompt and
    the eos-case prompt (None if no scale works; the model is then left as initialized). The scaled
    row is part of the exported model; with tied embeddings (gpt2) it is eos's input embedding too,
    which only pad positions (masked) and rows that already ended read."""
    with torch.no_grad():
        row = output_embedding_row(family, eos_id)
        original = row.clone()
        for scale in EOS_SCALES:
            row.copy_(original * scale)
            single = runs_to_the_end(family, tokenizer, eos_id)
            steps = (eos_step(family, tokenizer, p, eos_id, EOS_CASE_MAX_NEW_TOKENS) for p in EOS_PROMPTS)
            eos_prompt = next((p for p, step in zip(EOS_PROMPTS, steps) if step in EOS_STEPS), None)
            if single is not None and eos_prompt is not None:
                return scale, single, eos_prompt
        row.copy_(original)
    single = runs_to_the_end(family, tokenizer, eos_id)
    if single is None:
        raise SystemExit(f"{family.name}: every single-case prompt stops on eos")
    return 1.0, single, None


def runs_to_the_end(family: Family, tokenizer, eos_id: int) -> str | None:
    """The first of SINGLE_PROMPTS whose greedy output has no eos within SINGLE_MAX_NEW_TOKENS."""
    steps = (eos_step(family, tokenizer, p, eos_id, SINGLE_MAX_NEW_TOKENS) for p in SINGLE_PROMPTS)
    return next((p for p, step in zip(SINGLE_PROMPTS, steps) if step is None), None)


def pick_penalty_prompt(family: Family, tokenizer, eos_id: int) -> str:
    """The first of PENALTY_PROMPTS that runs to max_new_tokens under the penalties and whose output
    they change (compared with plain greedy), so that the case shows they are applied."""
    for prompt in PENALTY_PROMPTS:
        _, plain = generate(family.model, tokenizer, [prompt], max_new_tokens=PENALTY["max_new_tokens"])
        _, penalized = generate(family.model, tokenizer, [prompt], **PENALTY)
        if eos_id not in penalized[0] and penalized != plain:
            return prompt
    raise SystemExit(f"{family.name}: every penalty prompt stops on eos or is unchanged by the penalties")


# ---------------------------------------------------------------------------------------------- export


def export(family: Family, vocab: int, path: Path):
    plan = decoder_plan(
        family.name, family.model, family.num_layers, family.kv_heads, family.head_dim, vocab, family.opset, True
    )
    rng = np.random.default_rng(SEED)
    batch, seq, past = 2, 4, 3
    total = past + seq
    mask = np.ones((batch, total), dtype=np.int64)
    mask[1, :2] = 0  # left padding in the traced mask, so no all-ones shortcut is traced
    example = [
        torch.from_numpy(rng.integers(1, vocab, size=(batch, seq), dtype=np.int64)),
        torch.from_numpy(mask),
        torch.from_numpy(position_ids(mask)[:, past:]),
    ]
    for _ in range(2 * family.num_layers):
        shape = (batch, family.kv_heads, past, family.head_dim)
        example.append(torch.from_numpy(rng.standard_normal(shape).astype(np.float32)))
    torch.onnx.export(
        plan.module,
        tuple(example),
        str(path),
        input_names=[spec.name for spec in plan.inputs],
        output_names=plan.outputs,
        dynamic_axes=plan.dynamic_axes,
        opset_version=family.opset,
        do_constant_folding=True,
        dynamo=False,
    )
    plan.module.eval()
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    return plan


def position_ids(mask: np.ndarray, fill: int = 0) -> np.ndarray:
    """cumsum(mask) - 1 with masked positions set to `fill` (transformers 5.23's
    _prepare_position_ids_for_generation uses 0; older releases used 1)."""
    ids = np.cumsum(mask, axis=1) - 1
    return np.where(mask == 0, fill, ids).astype(np.int64)


def ort_session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def check_incremental(family: Family, plan, path: Path, rows: list[list[int]], steps: int, fill: int) -> dict:
    """Run left-padded `rows` as a prompt with an empty past, then `steps` tokens one at a time with the
    presents fed back, in onnxruntime and in the PyTorch wrapper; also one no-cache PyTorch forward over
    the whole sequence. Returns the largest logit differences."""
    session = ort_session(path)
    width = max(len(r) for r in rows)
    ids = np.array([[0] * (width - len(r)) + r for r in rows], dtype=np.int64)
    mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in rows], dtype=np.int64)
    batch = len(rows)
    past = [np.zeros((batch, family.kv_heads, 0, family.head_dim), np.float32)] * (2 * family.num_layers)
    rng = np.random.default_rng(SEED + 2)
    step_ids, all_ids, all_mask = ids, ids, mask
    worst = {"ort_vs_wrapper": 0.0, "ort_vs_full_forward": 0.0}
    ort_logits = []
    for step in range(steps + 1):
        positions = position_ids(all_mask, fill)[:, -step_ids.shape[1] :]
        feeds = {"input_ids": step_ids, "attention_mask": all_mask, "position_ids": positions}
        feeds.update({f"past_key_values.{i // 2}.{('key', 'value')[i % 2]}": p for i, p in enumerate(past)})
        got = session.run(plan.outputs, feeds)
        with torch.no_grad():
            want = plan.module(*(torch.from_numpy(feeds[s.name]) for s in plan.inputs))
        for name, g, w in zip(plan.outputs, got, want, strict=True):
            w = w.numpy()
            if g.shape != w.shape:
                raise SystemExit(f"{family.name}/{name} at step {step}: shape {g.shape} != {w.shape}")
            worst["ort_vs_wrapper"] = max(worst["ort_vs_wrapper"], float(np.abs(g - w).max()))
        ort_logits.append(got[0])
        past = got[1:]
        step_ids = rng.integers(1, got[0].shape[-1], size=(batch, 1), dtype=np.int64)
        if step < steps:
            all_ids = np.concatenate([all_ids, step_ids], axis=1)
            all_mask = np.concatenate([all_mask, np.ones((batch, 1), np.int64)], axis=1)
    # The same sequence in one forward without a cache: the cached logits at every real position.
    with torch.no_grad():
        full = family.model(
            input_ids=torch.from_numpy(all_ids),
            attention_mask=torch.from_numpy(all_mask),
            position_ids=torch.from_numpy(position_ids(all_mask, fill)),
            use_cache=False,
        ).logits.numpy()
    cached = np.concatenate(ort_logits, axis=1)
    real = all_mask.astype(bool)
    worst["ort_vs_full_forward"] = float(np.abs(cached - full)[real].max())
    for key, value in worst.items():
        if not value <= EXPORT_TOLERANCE:
            raise SystemExit(f"{family.name}: {key} max diff {value} (fill {fill}, rows {rows})")
    return worst


def check_export(family: Family, plan, path: Path, tokenizer) -> dict:
    prompts = [tokenizer(p)["input_ids"] for p in BATCH_PROMPTS]
    worst = {}
    for label, rows, fill in [
        ("one row, no padding", prompts[1:2], 0),
        ("three rows, left padded, masked positions 0", prompts, 0),
        ("three rows, left padded, masked positions 1", prompts, 1),
    ]:
        diffs = check_incremental(family, plan, path, rows, steps=6, fill=fill)
        worst[label] = diffs
    return worst


def penalize(scores: np.ndarray, history: np.ndarray, penalty: float, ngram: int) -> np.ndarray:
    """transformers' RepetitionPenaltyLogitsProcessor then NoRepeatNGramLogitsProcessor on one row."""
    scores = scores.copy()
    if penalty != 1.0:
        seen = np.unique(history)
        scores[seen] = np.where(scores[seen] < 0, scores[seen] * penalty, scores[seen] / penalty)
    if ngram and len(history) + 1 >= ngram:
        prefix = tuple(history[len(history) - ngram + 1 :])
        for start in range(len(history) - ngram + 1):
            if tuple(history[start : start + ngram - 1]) == prefix:
                scores[history[start + ngram - 1]] = -np.inf
    return scores


def replay_in_onnxruntime(session: ort.InferenceSession, family: Family, case: dict, eos_id: int) -> float:
    """Greedy decoding of `case` on model.onnx with the KV cache, as a decode loop outside PyTorch
    does it: the prompt with an empty past, then one token per step; rows that ended on eos get pad.
    Checks that it makes generate()'s tokens and returns the smallest gap between the chosen token's
    score and the runner-up's over all steps (how far the choice is from a tie)."""
    settings = case["generate"]
    penalty = settings.get("repetition_penalty", 1.0)
    ngram = settings.get("no_repeat_ngram_size", 0)
    ids = np.array(case["input_ids"], dtype=np.int64)
    mask = np.array(case["attention_mask"], dtype=np.int64)
    batch = len(ids)
    past = [np.zeros((batch, family.kv_heads, 0, family.head_dim), np.float32)] * (2 * family.num_layers)
    history, step_ids, done = ids, ids, np.zeros(batch, bool)
    new, margin = [], np.inf
    for _ in range(settings["max_new_tokens"]):
        feeds = {
            "input_ids": step_ids,
            "attention_mask": mask,
            "position_ids": position_ids(mask)[:, -step_ids.shape[1] :],
        }
        feeds.update({f"past_key_values.{i // 2}.{('key', 'value')[i % 2]}": p for i, p in enumerate(past)})
        logits, *past = session.run(None, feeds)
        chosen = np.full(batch, eos_id, dtype=np.int64)  # pad_token_id == eos_token_id
        for row in range(batch):
            if done[row]:
                continue
            scores = penalize(logits[row, -1], history[row], penalty, ngram)
            top2 = np.sort(scores)[-2:]
            margin = min(margin, float(top2[1] - top2[0]))
            chosen[row] = int(np.argmax(scores))
        new.append(chosen)
        done |= chosen == eos_id
        history = np.concatenate([history, chosen[:, None]], axis=1)
        step_ids = chosen[:, None]
        mask = np.concatenate([mask, np.ones((batch, 1), np.int64)], axis=1)
        if done.all():
            break
    got = np.stack(new, axis=1).tolist()
    if got != case["new_token_ids"]:
        raise SystemExit(f"{family.name}/{case['name']}: onnxruntime decodes {got}, generate() {case['new_token_ids']}")
    return margin


# ---------------------------------------------------------------------------------------------- folders


def write_family(name: str, tokenizer) -> int:
    vocab = len(tokenizer)
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    family = build(name, vocab, eos_id)
    scale, single, eos_prompt = pick_eos_scale(family, tokenizer, eos_id)

    folder = OUT / f"{name}_decoder"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    shutil.copy(TOKENIZER_DIR / "tokenizer.json", folder / "tokenizer.json")
    shutil.copy(TOKENIZER_DIR / "tokenizer_config.json", folder / "tokenizer_config.json")
    family.model.config.to_json_file(str(folder / "config.json"))
    family.model.generation_config.save_pretrained(str(folder))

    plan = export(family, vocab, folder / "model.onnx")
    size = (folder / "model.onnx").stat().st_size
    if size > MAX_MODEL_BYTES:
        raise SystemExit(f"{name}: model.onnx is {size} bytes, over {MAX_MODEL_BYTES}")
    diffs = check_export(family, plan, folder / "model.onnx", tokenizer)

    cases = run_cases(family, tokenizer, eos_id, single, eos_prompt)
    session = ort_session(folder / "model.onnx")
    for case in cases:
        # How close greedy's choices came to a tie (on onnxruntime's logits, after the penalties): a
        # decode loop whose logits differ by less than this picks the same tokens.
        case["min_top2_margin"] = round(replay_in_onnxruntime(session, family, case, eos_id), 6)
    expected = {
        "generated_by": "scripts/make_generation_models.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "model_type": family.model.config.model_type,
        "opset": family.opset,
        "vocab_size": vocab,
        "num_layers": family.num_layers,
        "num_attention_heads": family.num_heads,
        "kv_heads": family.kv_heads,
        "head_dim": family.head_dim,
        "eos_token_id": eos_id,
        "pad_token_id": eos_id,
        "bos_token_id": eos_id,
        "max_position_embeddings": family.max_position_embeddings,
        "position_ids_input": "position_ids" in [spec.name for spec in plan.inputs],
        "inputs": [spec.name for spec in plan.inputs],
        "outputs": plan.outputs,
        # generate() computes position_ids = cumsum(attention_mask) - 1 with masked positions 0; the
        # logits at real positions do not depend on what padded positions get.
        "position_ids_rule": "cumsum(attention_mask, -1) - 1, masked positions 0",
        # The eos row of the output projection was multiplied by this (1.0: untouched), so that the
        # stops_on_eos case exists; see pick_eos_scale. It is part of model.onnx and the cases.
        "eos_logit_row_scale": scale,
        "cases": cases,
    }
    (folder / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")

    total = sum(f.stat().st_size for f in folder.iterdir())
    print(f"{folder.name}: {total} bytes (model.onnx {size}), opset {family.opset}")
    for label, d in diffs.items():
        print(f"  ORT max diff, {label}: vs wrapper {d['ort_vs_wrapper']:.2e}, "
              f"vs no-cache forward {d['ort_vs_full_forward']:.2e}")
    tied = " (tied: the input embedding of eos too)" if family.model.config.tie_word_embeddings else ""
    print(f"  eos row scale {scale}{tied}")
    for case in cases:
        for prompt, ids, text in zip(case["prompts"], case["new_token_ids"], case["texts"]):
            print(f"  {case['name']}: {prompt!r} -> {ids} {text!r}")
        print(f"    onnxruntime replay matches; smallest top-2 margin {case['min_top2_margin']}")
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(FAMILIES), default=list(FAMILIES))
    args = parser.parse_args()
    tokenizer = load_tokenizer()
    total = sum(write_family(name, tokenizer) for name in args.only)
    print(f"total: {total} bytes")
    if len(args.only) == len(FAMILIES) and total > MAX_TOTAL_BYTES:
        raise SystemExit(f"fixtures total {total} bytes, over {MAX_TOTAL_BYTES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
