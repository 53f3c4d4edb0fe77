"""`transmuter embed|classify|ner|fill-mask`: JSON lines equal to transformers' pipelines (the
references of tests/pipelines/fixtures/*/expected.json, recorded by scripts/make_pipeline_models.py;
scores within 1e-4, as in the C++ tests), texts from arguments or stdin, and clear errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("TRANSMUTER_BIN", str(ROOT / "build" / "transmuter"))
FIXTURES = ROOT / "tests" / "pipelines" / "fixtures"
TOLERANCE = 1e-4


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300, input=stdin)


def lines(result: subprocess.CompletedProcess) -> list:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def expected(name: str) -> dict:
    return json.loads((FIXTURES / name / "expected.json").read_text())


@pytest.fixture(scope="module", autouse=True)
def needs_text_component():
    result = cli("embed", str(FIXTURES / "bert_embedding"), "probe")
    if "built without the text component" in result.stderr:
        pytest.skip("transmuter built with -DTRANSMUTER_TEXT=OFF")


def char_offset(text: str, byte: int) -> int:
    return len(text.encode()[:byte].decode())


def test_embed_from_stdin_equals_sentence_transformers():
    want = expected("bert_embedding")
    sentences = want["sentences"]
    got = lines(cli("embed", str(FIXTURES / "bert_embedding"), stdin="\n".join(sentences) + "\n"))
    assert len(got) == len(sentences)
    for row, reference in zip(got, want["poolings"]["mean_normalize"]):
        assert list(row) == ["embedding"]
        assert max(abs(a - b) for a, b in zip(row["embedding"], reference)) < TOLERANCE


def test_embed_pooling_option_and_compiled_mode():
    want = expected("bert_embedding")
    text = want["sentences"][0]
    got = lines(cli("embed", str(FIXTURES / "bert_embedding"), text, "--pooling", "cls", "--no-normalize",
                    "--mode", "compiled"))
    assert max(abs(a - b) for a, b in zip(got[0]["embedding"], want["poolings"]["cls"][0])) < TOLERANCE


def test_classify_all_labels_and_pairs():
    want = expected("bert_sentiment")
    got = lines(cli("classify", str(FIXTURES / "bert_sentiment"), *want["sentences"], "--top-k", "0"))
    for row, reference in zip(got, want["all"]):
        assert [r["label"] for r in row] == [r["label"] for r in reference]
        assert all(abs(r["score"] - s["score"]) < TOLERANCE for r, s in zip(row, reference))
    text, pair = want["pairs"][0]
    got = lines(cli("classify", str(FIXTURES / "bert_sentiment"), text, "--pair", pair, "--top-k", "0"))
    assert [r["label"] for r in got[0]] == [r["label"] for r in want["pairs_all"][0]]
    assert all(abs(r["score"] - s["score"]) < TOLERANCE for r, s in zip(got[0], want["pairs_all"][0]))


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
def test_ner_aggregations(strategy):
    want = expected("bert_ner")
    sentences = want["sentences"][:3]
    got = lines(cli("ner", str(FIXTURES / "bert_ner"), *sentences, "--aggregation", strategy))
    for text, row, reference in zip(sentences, got, want["strategies"][strategy]):
        assert len(row) == len(reference)
        for entity, ref in zip(row, reference):
            key = "entity" if strategy == "none" else "entity_group"
            assert entity[key] == ref[key] and entity["word"] == ref["word"]
            assert abs(entity["score"] - ref["score"]) < TOLERANCE
            # The CLI gives byte offsets, transformers character offsets.
            assert (char_offset(text, entity["start"]), char_offset(text, entity["end"])) == (ref["start"], ref["end"])


def test_fill_mask_one_and_two_masks():
    want = expected("bert_fill_mask")
    got = lines(cli("fill-mask", str(FIXTURES / "bert_fill_mask"), want["single"][0]))
    assert [f["token_str"] for f in got[0]] == [f["token_str"] for f in want["top5"][0]]
    assert [f["sequence"] for f in got[0]] == [f["sequence"] for f in want["top5"][0]]
    got = lines(cli("fill-mask", str(FIXTURES / "bert_fill_mask"), want["double"][0], "--top-k", "2"))
    assert [[f["token"] for f in mask] for mask in got[0]] == [[f["token"] for f in mask] for mask in want["double_top2"][0]]
    targets = [a for t in want["targets"] for a in ("--target", t)]
    got = lines(cli("fill-mask", str(FIXTURES / "bert_fill_mask"), want["single"][0], "--top-k", "3", *targets))
    assert [f["token"] for f in got[0]] == [f["token"] for f in want["targets_top3"][0]]


def test_clear_errors(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(FIXTURES / "bert_sentiment", folder)
    (folder / "tokenizer.json").unlink()
    result = cli("classify", str(folder), "text")
    assert result.returncode == 1 and "has no tokenizer.json" in result.stderr

    result = cli("fill-mask", str(FIXTURES / "bert_fill_mask"), "no mask at all")
    assert result.returncode == 1 and "text 0 has no mask token [MASK]" in result.stderr

    long_text = expected("bert_embedding")["sentences"][-1]
    result = cli("embed", str(FIXTURES / "bert_embedding"), long_text, "--reject-long")
    assert result.returncode == 1 and "more than the model's limit of 32" in result.stderr

    result = cli("ner", str(FIXTURES / "bert_ner"), "x", "--aggregation", "bogus")
    assert result.returncode == 1 and "--aggregation takes average|first|max|none|simple" in result.stderr

    result = cli("embed", str(tmp_path / "missing"), "x")
    assert result.returncode == 1 and "no such folder or file" in result.stderr


SUMMARY = r"^\[\d+ prompt tokens, \d+ generated; first token after [\d.]+ ms, then [\d.]+ tokens/s; [\d.]+ s in all(; \d+ compiled plans)?\]$"


def test_generate_streams_transformers_greedy_text():
    import re

    want = expected("llama_decoder")
    case = next(c for c in want["cases"] if c["name"] == "single")
    result = cli("generate", str(FIXTURES / "llama_decoder"), case["prompts"][0], "--max-new-tokens",
                 str(case["generate"]["max_new_tokens"]))
    assert result.returncode == 0, result.stderr
    assert result.stdout == case["texts"][0] + "\n"
    assert re.match(SUMMARY, result.stderr.strip()), result.stderr
    assert "24 generated" in result.stderr


def test_generate_min_new_tokens_bans_eos_until_then():
    import json

    case = next(c for c in expected("llama_decoder")["cases"] if c["name"] == "stops_on_eos")
    want = case["new_token_ids"][0]  # transformers' greedy tokens, ending at eos
    args = ["generate", str(FIXTURES / "llama_decoder"), case["prompts"][0], "--max-new-tokens", "24", "--jsonl"]
    free = json.loads(cli(*args).stdout)
    assert free["tokens"] == want and free["stop_reason"] == "eos_token"
    held = json.loads(cli(*args, "--min-new-tokens", "24").stdout)
    assert held["stop_reason"] == "max_length" and len(held["tokens"]) == 24
    assert held["tokens"][:len(want) - 1] == want[:-1] and held["tokens"][len(want) - 1] != want[-1]


def test_generate_errors():
    result = cli("generate", str(FIXTURES / "gpt2_decoder"), "", stdin=None)
    assert result.returncode == 1 and "the prompt is empty" in result.stderr
    result = cli("generate", str(FIXTURES / "gpt2_decoder"), "x " * 80)
    assert result.returncode == 1 and "the model's context of 64" in result.stderr
    result = cli("generate", str(FIXTURES / "gpt2_decoder"), "hi", "--do-sample", "--temperature", "0")
    assert result.returncode == 1 and "temperature must be strictly positive" in result.stderr
    result = cli("generate", str(FIXTURES / "gpt2_decoder"), "hi", "--cache", "sometimes")
    assert result.returncode == 1 and "--cache takes auto|dynamic|none|static" in result.stderr


def test_generate_runs_encoder_decoders():
    """An encoder_model.onnx in the folder: the prompt is the encoder's input (T5 with decoder_model +
    decoder_with_past_model, BART with decoder_model_merged), tokens equal transformers' generate()."""
    import json

    for family in ("t5", "bart"):
        case = next(c for c in expected(f"{family}_seq2seq")["cases"] if c["name"] == "stops_on_eos")
        for mode in ("eager", "compiled"):
            result = cli("generate", str(FIXTURES / f"{family}_seq2seq"), case["texts"][0], "--max-new-tokens",
                         str(case["generate"]["max_new_tokens"]), "--jsonl", "--mode", mode)
            assert result.returncode == 0, result.stderr
            out = json.loads(result.stdout.splitlines()[0])
            assert out["tokens"] == case["new_token_ids"][0], (family, mode)
            assert out["text"] == case["decoded"][0] and out["stop_reason"] == "eos_token"
            assert re.match(SUMMARY, result.stderr.strip()), result.stderr
    result = cli("generate", str(FIXTURES / "bart_seq2seq"), "hi", "--cache", "static")
    assert result.returncode == 1 and "cannot run with a static cache" in result.stderr


def test_generate_feeds_an_encoder_that_takes_no_text(tmp_path):
    """--input NAME=FILE.npy and --decoder-prompt for a Whisper-style encoder (input_features): one JSON line
    per row, tokens equal transformers' generate() (tests/pipelines/fixtures/whisper_seq2seq)."""
    import json
    import numpy as np

    want = expected("whisper_seq2seq")
    case = next(c for c in want["cases"] if c["name"] == "batch")
    features = tmp_path / "features.npy"
    np.save(features, np.array(case["input_features"], np.float32))
    prompt = ",".join(str(t) for t in want["decoder_prompt"])
    args = ["generate", str(FIXTURES / "whisper_seq2seq"), "--input", f"input_features={features}",
            "--decoder-prompt", prompt, "--max-new-tokens", "16", "--jsonl"]
    result = cli(*args)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["tokens"] for r in rows] == case["new_token_ids"]
    result = cli(*args[:-4], "--decoder-prompt", "805,x")
    assert result.returncode == 1 and "--decoder-prompt expects token ids" in result.stderr
    result = cli("generate", str(FIXTURES / "whisper_seq2seq"), "some text")
    assert result.returncode == 1 and "the encoder takes no input_ids" in result.stderr
    result = cli("generate", str(FIXTURES / "llama_decoder"), "--input", f"input_features={features}")
    assert result.returncode == 1 and "are for encoder-decoder models" in result.stderr


# Short, as the fixture's context is 64 byte-level tokens.
CHAT_TEMPLATE = "{% for m in messages %}{{ m.role[0] }}:{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}a:{% endif %}"


def chat_model(tmp_path: Path) -> Path:
    """The Llama decoder fixture with CHAT_TEMPLATE in its tokenizer_config.json."""
    folder = tmp_path / "chat_model"
    shutil.copytree(FIXTURES / "llama_decoder", folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def test_chat_keeps_the_conversation(tmp_path):
    folder = chat_model(tmp_path)
    options = ["--max-new-tokens", "6"]
    result = cli("chat", str(folder), *options, stdin="Hi\nOk\n")
    assert result.returncode == 0, result.stderr
    replies = result.stdout.split("\n")[:2]
    assert len(result.stderr.strip().splitlines()) == 2  # one summary per reply
    # The second reply is the continuation of the whole conversation, as the template renders it.
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": replies[0]},
                {"role": "user", "content": "Ok"}]
    rendered = cli("chat", str(folder), "--render", "--add-generation-prompt", stdin=json.dumps(messages))
    assert rendered.returncode == 0, rendered.stderr
    alone = cli("generate", str(folder), rendered.stdout, *options)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout == replies[1] + "\n"


def test_chat_without_a_template():
    result = cli("chat", str(FIXTURES / "gpt2_decoder"), stdin="hello\n")
    assert result.returncode == 1 and "no chat template" in result.stderr


def test_chat_reports_a_turn_that_does_not_fit_and_goes_on(tmp_path):
    folder = chat_model(tmp_path)
    too_long = "x" * 80  # 80 byte-level tokens: more than the fixture's context of 64
    result = cli("chat", str(folder), "--max-new-tokens", "4", stdin=f"{too_long}\nHi\n")
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "context of 64" in errors[0], result.stderr
    assert re.search(r"4 generated", result.stderr)  # the turn after it was answered
