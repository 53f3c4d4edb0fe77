#!/usr/bin/env python3
"""Fetches real chat templates of published models into .cache/chat_templates/ (gitignored).

The templates are not retyped: they are the files llama.cpp keeps in models/templates/ (copied
from the models' tokenizer_config.json / chat_template.jinja on the Hub), as the PyPI source
distribution of llama-cpp-python (pinned below, sha256-checked) vendors them. The archive is
fetched with pip, each template is checked against its recorded sha256, and nothing is done when
the files are already there. Used by tests/text/chat_template_test.cpp and
scripts/make_chat_template_references.py.

    .venv/bin/python scripts/fetch_chat_templates.py
"""

import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".cache" / "chat_templates"

PACKAGE = "llama-cpp-python==0.3.36"
ARCHIVE = "llama_cpp_python-0.3.36.tar.gz"
ARCHIVE_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
PREFIX = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/"

# file in models/templates/ -> sha256 of its bytes
TEMPLATES = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",
    "meta-llama-Llama-3.2-3B-Instruct.jinja": "5816fce10444e03c2e9ee1ef8a4a1ea61ae7e69e438613f3b17b69d0426223a4",
    "Qwen-Qwen2.5-7B-Instruct.jinja": "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f",
    "Qwen-Qwen3-0.6B.jinja": "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "e4676cb56dffea7782fd3e2b577cfaf1e123537e6ef49b3ec7caa6c095c62272",
    "google-gemma-2-2b-it.jinja": "ecd6ae513fe103f0eb62e8ab5bfa8d0fe45c1074fa398b089c93a7e70c15cfd6",
    "microsoft-Phi-3.5-mini-instruct.jinja": "78d976a442bcde2f0be15aafbb8e3050e1104f86732266f68403251b89982a90",
    "HuggingFaceTB-SmolLM3-3B.jinja": "19eacf64569032f07644ea92c8e2a87af06ee7008147557302c31e474912ca97",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "bbe594884b44d740667ee65a70bc8d333a565eab3d63ea59f291ea73ada84ba6",
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "3c71df5f659987462c882bf9e295b597dc19902467a7312ea382c5896681bc02",
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": "bf9e9ee8c0f2297c6ff60af5fab357d7b34bc4375884ed16ab6aa90597d7eb7d",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "7ce09d55d3690e06c70b5c07228cc7e8c99c43a23cdc027762be4011efcdea6c",
}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def up_to_date() -> bool:
    return all((OUT / name).is_file() and sha256((OUT / name).read_bytes()) == digest
               for name, digest in TEMPLATES.items())


def main() -> int:
    if up_to_date():
        print(f"{OUT}: up to date ({len(TEMPLATES)} templates)")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        "-d", tmp, PACKAGE],
                       check=False, stdout=subprocess.DEVNULL)
        archive = Path(tmp) / ARCHIVE
        if not archive.is_file():
            print(f"pip did not fetch {ARCHIVE}", file=sys.stderr)
            return 1
        got = sha256(archive.read_bytes())
        if got != ARCHIVE_SHA256:
            print(f"{ARCHIVE}: sha256 {got}, expected {ARCHIVE_SHA256}", file=sys.stderr)
            return 1
        OUT.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            for name, digest in TEMPLATES.items():
                data = tar.extractfile(PREFIX + name).read()
                if sha256(data) != digest:
                    print(f"{name}: sha256 {sha256(data)}, expected {digest}", file=sys.stderr)
                    return 1
                (OUT / name).write_bytes(data)
    print(f"{OUT}: {len(TEMPLATES)} templates from {PACKAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
