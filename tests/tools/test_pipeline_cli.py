"""`transmuter embed|classify|ner|fill-mask`: JSON lines equal to transformers' pipelines (the
references of tests/pipelines/fixtures/*/expected.json, recorded by scripts/make_pipeline_models.py;
scores within 1e-4, as in the C++ tests), texts from arguments or stdin, and clear errors."""

from __future__ import annotations

import json
import os
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
