"""`transmuter chat DIR --render` against transformers' apply_chat_template, as recorded in
tests/text/chat_template_references.txt (Qwen 2.5's template with tools, scripts/fetch_chat_templates.py)."""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("TRANSMUTER_BIN", str(ROOT / "build" / "transmuter")))
TEMPLATE = ROOT / ".cache" / "chat_templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"


def reference(template, set_name, agp):
    data = (ROOT / "tests" / "text" / "chat_template_references.txt").read_bytes()
    head = f"case {template} {set_name} {agp}\n".encode()
    block = data[data.index(head):]
    fields = {}
    for line in block.split(b"\n"):
        key, _, value = line.partition(b" ")
        if key == b"expected":
            start = block.index(b"\nexpected ") + len(b"\nexpected ") + len(value) + 1
            return fields, block[start:start + int(value)]
        fields[key.decode()] = value.decode()


@pytest.mark.skipif(not BIN.exists(), reason="needs the build")
@pytest.mark.parametrize("agp", [0, 1])
def test_render_matches_transformers(tmp_path, agp):
    assert TEMPLATE.exists(), f"{TEMPLATE} is missing: run scripts/fetch_chat_templates.py (scripts/test does)"
    fields, expected = reference(TEMPLATE.name, "tools", agp)
    shutil.copy(TEMPLATE, tmp_path / "chat_template.jinja")
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "chat_template": "unused: chat_template.jinja wins"}))
    (tmp_path / "tools.json").write_text(fields["tools"])
    args = [str(BIN), "chat", str(tmp_path), "--render", "--tools", str(tmp_path / "tools.json")]
    if agp:
        args.append("--add-generation-prompt")
    out = subprocess.run(args, input=fields["messages"].encode(), capture_output=True, check=True).stdout
    assert out == expected
