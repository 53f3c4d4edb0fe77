#!/usr/bin/env python3
"""Train four small tokenizers and record what Python `tokenizers` makes of a test corpus.

Writes tests/text/fixtures/<kind>/{tokenizer.json, tokenizer_config.json, expected.txt} for
kind in wordpiece (BERT-style), bytelevel_bpe (GPT-2 style), unigram (SentencePiece Unigram) and
sentencepiece_bpe. tests/text/tokenizer_test.cpp compares the C++ API against expected.txt, which
it only reads; run this script (with the venv's pinned tokenizers, scripts/requirements.txt) only
to change the fixtures:
    .venv/bin/python scripts/make_tokenizer_fixtures.py
Training is not byte-for-byte reproducible (the trainers break ties in hash-map order), so a rerun
may write other vocabularies; the references always match the tokenizer.json written with them.

expected.txt is line based so that C++ reads it without a JSON parser: a record starts with
"case NAME" and holds "key value..." lines. Strings are written as "x" + the hex of their UTF-8
bytes ("x" alone is the empty string); lists are space separated. Offsets are byte offsets into
the text a token came from: Python's encode gives character offsets, converted here.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import SentencePieceBPETokenizer, SentencePieceUnigramTokenizer, Tokenizer, decoders
from tokenizers import models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import ByteLevelBPETokenizer

OUT = Path(__file__).resolve().parents[1] / "tests" / "text" / "fixtures"

# Training text: English, accented Latin, CJK, emoji, code-ish text. Small and deterministic.
TRAINING = [
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs!",
    "How vexingly quick daft zebras jump; sphinx of black quartz, judge my vow.",
    "Transmuter runs ONNX models on MLX, with no per-architecture code.",
    "A tokenizer splits text into tokens, and tokens into ids.",
    "Le cœur déçu mais l'âme plutôt naïve, Louÿs rêva de crapaüter en canoë.",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    "El pingüino Wenceslao hizo kilómetros bajo exhaustiva lluvia y frío.",
    "我能吞下玻璃而不伤身体。今天天气很好，我们去公园散步吧。",
    "私はガラスを食べられます。それは私を傷つけません。東京は大きな都市です。",
    "나는 유리를 먹을 수 있어요. 그래도 아프지 않아요.",
    "Emoji: 😀 😂 👍🏽 ❤️ 👩‍💻 🇫🇷 — and more 🎉🎉.",
    "def encode(text):\n\treturn [ord(c) for c in text]\n",
    "Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 and 2024-01-01.",
    "Hello world! Hello again, world. Goodbye, cruel world?",
]


def training_corpus() -> list[str]:
    # Repeats with small variations give the trainers enough pairs to merge.
    lines = []
    for i in range(40):
        for j, line in enumerate(TRAINING):
            lines.append(line if (i + j) % 3 else line.lower())
    return lines


# The recorded corpus: what the tests encode.
CORPUS = {
    "ascii": "Hello world! The quick brown fox.",
    "empty": "",
    "accents": "Café naïve déjà vu, Zwölf Boxkämpfer über Sylt.",
    "combining": "Cafe\u0301 nai\u0308ve — decomposed e\u0301 and o\u0308",
    "emoji": "I ❤️ tokens 😀👍🏽 and 👩‍💻 at 🇫🇷!",
    "zwj_family": "👨‍👩‍👧‍👦👩🏽‍🚀",
    "cjk": "我能吞下玻璃而不伤身体。東京は大きな都市です。나는 유리를",
    "whitespace": "  leading   and   trailing   runs  ",
    "tabs_newlines": "line one\n\tline two\r\n\n  line\tthree\n",
    "added": "before <|extra|> middle [NEW]after zzyzx end",
    "unknown": "Ωmega ∑ ∫ ⊕ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "long": "A tokenizer splits text into tokens, and tokens into ids; " * 3,
}
PAIRS = [("ascii", "accents"), ("emoji", "cjk"), ("empty", "added"), ("long", "whitespace")]


def hexs(s: str) -> str:
    return "x" + s.encode("utf-8").hex()


def nums(values) -> str:
    return " ".join(str(int(v)) for v in values)


def byte_offsets(text: str, pair: str | None, encoding) -> list[int]:
    """Character offsets -> UTF-8 byte offsets into the sequence each token came from."""
    out = []
    for (b, e), seq in zip(encoding.offsets, encoding.sequence_ids):
        source = pair if seq == 1 else text
        if seq is None:
            out += [0, 0] if (b, e) == (0, 0) else [b, e]
            continue
        out += [len(source[:b].encode("utf-8")), len(source[:e].encode("utf-8"))]
    return out


def encoding_lines(suffix: str, text: str, pair: str | None, enc) -> list[str]:
    return [
        f"ids{suffix} {nums(enc.ids)}",
        f"type_ids{suffix} {nums(enc.type_ids)}",
        f"attention_mask{suffix} {nums(enc.attention_mask)}",
        f"special_tokens_mask{suffix} {nums(enc.special_tokens_mask)}",
        f"sequence_ids{suffix} {nums(-1 if s is None else s for s in enc.sequence_ids)}",
        f"offsets{suffix} {nums(byte_offsets(text, pair, enc))}",
        f"tokens{suffix} {' '.join(hexs(t) for t in enc.tokens)}",
    ]


def record(tok: Tokenizer, pad_token: str) -> list[str]:
    tok.no_truncation()
    tok.no_padding()
    lines = []
    for name, text in CORPUS.items():
        for add_special in (True, False):
            enc = tok.encode(text, add_special_tokens=add_special)
            lines += [f"case encode.{name}.{int(add_special)}", "api single", f"add_special {int(add_special)}",
                      f"text {hexs(text)}", *encoding_lines("", text, None, enc),
                      f"decode {hexs(tok.decode(enc.ids, skip_special_tokens=False))}",
                      f"decode_skip {hexs(tok.decode(enc.ids, skip_special_tokens=True))}"]
        enc = tok.encode(text)
        stream = decoders.DecodeStream(skip_special_tokens=False)
        chunks = [stream.step(tok, i) for i in enc.ids]
        lines += [f"case stream.{name}", f"ids {nums(enc.ids)}",
                  f"chunks {' '.join('-' if c is None else hexs(c) for c in chunks)}"]
    for a, b in PAIRS:
        text, pair = CORPUS[a], CORPUS[b]
        enc = tok.encode(text, pair)
        lines += [f"case pair.{a}.{b}", "api pair", "add_special 1", f"text {hexs(text)}", f"pair {hexs(pair)}",
                  *encoding_lines("", text, pair, enc)]
    pad_id = tok.token_to_id(pad_token)
    batches = [
        # name, texts, pairs, truncation (max_length, strategy, side) or None, padding (length or 0, side, multiple) or None
        ("longest_right", ["ascii", "empty", "emoji", "cjk"], None, None, (0, "right", 0)),
        ("longest_left", ["ascii", "accents", "added"], None, None, (0, "left", 0)),
        ("truncate_right", ["long", "cjk", "ascii"], None, (12, "longest_first", "right"), (0, "right", 0)),
        ("truncate_left_fixed", ["long", "ascii"], None, (10, "longest_first", "left"), (16, "right", 0)),
        ("multiple_of", ["ascii", "emoji"], None, None, (0, "right", 8)),
        ("pairs_truncated", ["long", "emoji"], ["whitespace", "long"], (14, "longest_first", "right"), (0, "right", 0)),
        ("pairs_only_second", ["ascii"], ["long"], (40, "only_second", "right"), None),
    ]
    strategies = {"longest_first": 0, "only_first": 1, "only_second": 2}
    for name, texts, pairs, trunc, pad in batches:
        tok.no_truncation()
        tok.no_padding()
        lines += [f"case batch.{name}", "api batch", "add_special 1", f"count {len(texts)}"]
        if trunc:
            tok.enable_truncation(max_length=trunc[0], strategy=trunc[1], direction=trunc[2])
            lines += [f"max_length {trunc[0]}", f"strategy {strategies[trunc[1]]}",
                      f"truncation_side {int(trunc[2] == 'left')}"]
        if pad:
            tok.enable_padding(direction=pad[1], pad_id=pad_id, pad_token=pad_token,
                               length=pad[0] or None, pad_to_multiple_of=pad[2] or None)
            lines += [f"pad_length {pad[0]}", f"padding_side {int(pad[1] == 'left')}", f"pad_to_multiple_of {pad[2]}"]
        inputs = [CORPUS[t] for t in texts]
        pair_texts = [CORPUS[p] for p in pairs] if pairs else [None] * len(texts)
        encs = tok.encode_batch([(t, p) if p is not None else t for t, p in zip(inputs, pair_texts)])
        for i, (t, p, enc) in enumerate(zip(inputs, pair_texts, encs)):
            lines.append(f"text.{i} {hexs(t)}")
            if p is not None:
                lines.append(f"pair.{i} {hexs(p)}")
            lines += encoding_lines(f".{i}", t, p, enc)
    tok.no_truncation()
    tok.no_padding()
    vocab_lines = ["case vocab", f"vocab_size {tok.get_vocab_size(with_added_tokens=False)}",
                   f"vocab_size_added {tok.get_vocab_size(with_added_tokens=True)}"]
    added = sorted(tok.get_added_tokens_decoder().items())
    vocab_lines += [f"added_ids {nums(i for i, _ in added)}",
                    f"added_contents {' '.join(hexs(t.content) for _, t in added)}",
                    f"added_special {nums(t.special for _, t in added)}"]
    for probe in ("world", "Hello", "<|extra|>", "[NEW]", "not-in-vocab-xyz"):
        tid = tok.token_to_id(probe)
        vocab_lines.append(f"token_to_id {hexs(probe)} {-1 if tid is None else tid}")
    for tid in (0, 1, 5, 100, tok.get_vocab_size() - 1, tok.get_vocab_size() + 1000):
        token = tok.id_to_token(tid)
        vocab_lines.append(f"id_to_token {tid} {'-' if token is None else hexs(token)}")
    return vocab_lines + lines


def add_tokens(tok: Tokenizer) -> None:
    # Non-special added tokens (matched before the model runs, kept by skip_special_tokens) and a
    # special one (dropped by skip_special_tokens).
    tok.add_tokens(["[NEW]", "zzyzx"])
    tok.add_special_tokens(["<|extra|>"])


def wordpiece() -> tuple[Tokenizer, dict]:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=800, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.train_from_iterator(training_corpus(), trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    add_tokens(tok)
    config = {"tokenizer_class": "BertTokenizer", "model_max_length": 32, "padding_side": "right",
              "truncation_side": "right", "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]",
              "unk_token": "[UNK]", "mask_token": "[MASK]", "do_lower_case": True,
              "clean_up_tokenization_spaces": False}
    return tok, config


def bytelevel_bpe() -> tuple[Tokenizer, dict]:
    impl = ByteLevelBPETokenizer(add_prefix_space=False, trim_offsets=True)
    impl.train_from_iterator(training_corpus(), vocab_size=900, special_tokens=["<|endoftext|>"])
    tok = impl._tokenizer
    add_tokens(tok)
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": 1000000000000000019884624838656,
              "padding_side": "left", "pad_token": "<|endoftext|>", "bos_token": "<|endoftext|>",
              "eos_token": "<|endoftext|>", "add_bos_token": False, "clean_up_tokenization_spaces": False}
    return tok, config


def unigram() -> tuple[Tokenizer, dict]:
    impl = SentencePieceUnigramTokenizer()
    impl.train_from_iterator(training_corpus(), vocab_size=700, special_tokens=["<pad>", "</s>", "<unk>"],
                             unk_token="<unk>")
    tok = impl._tokenizer
    eos = tok.token_to_id("</s>")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                       special_tokens=[("</s>", eos)])
    add_tokens(tok)
    config = {"tokenizer_class": "T5Tokenizer", "model_max_length": 24, "pad_token": {"content": "<pad>",
              "lstrip": False, "rstrip": False, "normalized": False, "single_word": False, "special": True},
              "eos_token": "</s>", "unk_token": "<unk>", "truncation_side": "left",
              "clean_up_tokenization_spaces": False}
    return tok, config


def sentencepiece_bpe() -> tuple[Tokenizer, dict]:
    impl = SentencePieceBPETokenizer(unk_token="<unk>")
    impl.train_from_iterator(training_corpus(), vocab_size=900, special_tokens=["<unk>", "<s>", "</s>"])
    tok = impl._tokenizer
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s>:1 $B:1",
                                                       special_tokens=[("<s>", bos)])
    add_tokens(tok)
    config = {"tokenizer_class": "LlamaTokenizer", "model_max_length": 48, "pad_token": None,
              "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
              "add_eos_token": False, "padding_side": "left", "clean_up_tokenization_spaces": False}
    return tok, config


def main() -> None:
    kinds = {"wordpiece": (wordpiece, "[PAD]"), "bytelevel_bpe": (bytelevel_bpe, "<|endoftext|>"),
             "unigram": (unigram, "<pad>"), "sentencepiece_bpe": (sentencepiece_bpe, "</s>")}
    for kind, (make, pad_token) in kinds.items():
        tok, config = make()
        folder = OUT / kind
        folder.mkdir(parents=True, exist_ok=True)
        tok.save(str(folder / "tokenizer.json"), pretty=False)
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
        # Re-read what was saved, so that the references are those of the committed file.
        saved = Tokenizer.from_file(str(folder / "tokenizer.json"))
        lines = [f"# {kind}: recorded with tokenizers (Python) by scripts/make_tokenizer_fixtures.py",
                 f"# pad token for the batch cases: {pad_token}"] + record(saved, pad_token)
        (folder / "expected.txt").write_text("\n".join(lines) + "\n")
        print(f"{folder}: vocab {saved.get_vocab_size()}, {sum(l.startswith('case ') for l in lines)} cases")


if __name__ == "__main__":
    main()
