"""`transmuter tokenize`: JSON lines equal to Python tokenizers (ids, tokens, byte offsets), text
from arguments or stdin, and clear errors for a folder without tokenizer.json or a bad file."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("TRANSMUTER_BIN", str(ROOT / "build" / "transmuter"))
FIXTURE = ROOT / "tests" / "text" / "fixtures" / "bytelevel_bpe"
TEXTS = ["Hello world!", "I ❤️ tokens 😀👍🏽 and 👩‍💻", "我能吞下玻璃 <|extra|> zzyzx", "  runs\tof   space "]


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120, input=stdin)


@pytest.fixture(scope="module", autouse=True)
def needs_text_component():
    result = cli("tokenize", str(FIXTURE), "probe")
    if "built without the text component" in result.stderr:
        pytest.skip("transmuter built with -DTRANSMUTER_TEXT=OFF")


# The published tokenizer.json of sentence-transformers/all-MiniLM-L6-v2 (BERT uncased WordPiece),
# placed beside the real model by scripts/fetch_real_model.py (scripts/test runs it).
PUBLISHED = ROOT / ".cache" / "models" / "paraphrase-MiniLM-L3-v2"
CORPUS = TEXTS + ["Héllo WÖRLD, naïve café", "東京タワー と 北京", "don't stop-believing!!", "[MASK] tokens [SEP] inside",
                  "tab\tand\nnewline", "x" * 300]


def expected(text: str, pair: str | None = None, add_special_tokens: bool = True, folder: Path = FIXTURE) -> dict:
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    # A tokenizer.json may carry padding and truncation (all-MiniLM-L6-v2's pads to 128): transformers
    # sets both per call, and so does Transmuter.
    tok.no_padding()
    tok.no_truncation()
    enc = tok.encode(text, pair, add_special_tokens=add_special_tokens)
    offsets = []
    for (b, e), seq in zip(enc.offsets, enc.sequence_ids):
        source = pair if seq == 1 else text
        # Python gives character offsets, the CLI byte offsets.
        offsets.append([0, 0] if seq is None else [len(source[:b].encode()), len(source[:e].encode())])
    return {"ids": enc.ids, "tokens": enc.tokens, "offsets": offsets}


def lines(result: subprocess.CompletedProcess) -> list[dict]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_arguments_equal_python_tokenizers():
    assert lines(cli("tokenize", str(FIXTURE), *TEXTS)) == [expected(t) for t in TEXTS]


def test_stdin_one_text_per_line_and_a_model_file_means_its_folder():
    model_file = FIXTURE / "tokenizer.json"  # any file stands for its folder, as model.onnx would
    assert lines(cli("tokenize", str(model_file), stdin="\n".join(TEXTS) + "\n")) == [expected(t) for t in TEXTS]


def test_pair_and_no_special_tokens():
    wordpiece = ROOT / "tests" / "text" / "fixtures" / "wordpiece"
    out = lines(cli("tokenize", str(wordpiece), "Hello world", "--pair", "Café!"))
    assert out[0]["tokens"][0] == "[CLS]" and out[0]["tokens"].count("[SEP]") == 2
    out = lines(cli("tokenize", str(FIXTURE), "--no-special-tokens", TEXTS[1]))
    assert out == [expected(TEXTS[1], add_special_tokens=False)]


def test_folder_without_tokenizer_json(tmp_path):
    result = cli("tokenize", str(tmp_path), "hello")
    assert result.returncode == 1
    assert f"{tmp_path / 'tokenizer.json'}: no such file" in result.stderr


def test_malformed_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": ')
    result = cli("tokenize", str(tmp_path), "hello")
    assert result.returncode == 1
    assert str(tmp_path / "tokenizer.json") in result.stderr, result.stderr


def test_missing_source():
    result = cli("tokenize", "/nonexistent/folder", "hello")
    assert result.returncode == 1 and "/nonexistent/folder: no such file or folder" in result.stderr


def test_a_published_tokenizer_equals_python_tokenizers():
    if not (PUBLISHED / "tokenizer.json").is_file():
        pytest.skip("run scripts/fetch_real_model.py first (scripts/test does)")
    texts = [t for t in CORPUS if "\n" not in t]  # one text per argument; stdin would split it
    assert lines(cli("tokenize", str(PUBLISHED), *texts)) == [expected(t, folder=PUBLISHED) for t in texts]
