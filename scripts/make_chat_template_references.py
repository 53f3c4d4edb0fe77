#!/usr/bin/env python3
"""Records transformers' apply_chat_template(tokenize=False) on real chat templates.

Writes tests/text/chat_template_references.txt, read by tests/text/chat_template_test.cpp: for
every template of scripts/fetch_chat_templates.py (in .cache/chat_templates/) and every message
set below, with add_generation_prompt false and true, the exact string transformers renders, or
the message of the exception the template raises.

The renderer is the real one: a PreTrainedTokenizerFast built from a fixture tokenizer
(tests/text/fixtures/bytelevel_bpe; the vocabulary does not matter with tokenize=False) with the
model's chat template and special tokens, and its apply_chat_template. The special tokens are the
bos/eos tokens of each model's tokenizer_config.json (the templates come without it).

Needs `transformers==5.23.0` and `jinja2==3.1.6` (not in scripts/requirements.txt: the tests only
read the recorded file):

    .venv/bin/pip install transformers==5.23.0 jinja2==3.1.6
    .venv/bin/python scripts/fetch_chat_templates.py
    .venv/bin/python scripts/make_chat_template_references.py

Format (all JSON on one line): per case
    case TEMPLATE_FILE SET ADD_GENERATION_PROMPT(0|1)
    special JSON_OBJECT
    messages JSON_ARRAY
    tools JSON_ARRAY|null
    extra JSON_OBJECT
    today STRFTIME_FORMAT          (only when the template calls strftime_now: the date
                                    it printed is <<TODAY>> in the expected text)
    expected|error N
    N raw bytes, then a newline
"""

import datetime
import hashlib
import json
import re
import sys
from pathlib import Path

import transformers
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / ".cache" / "chat_templates"
OUT = ROOT / "tests" / "text" / "chat_template_references.txt"

sys.path.insert(0, str(ROOT / "scripts"))
from fetch_chat_templates import TEMPLATES as TEMPLATE_SHA256  # noqa: E402

# bos/eos of each model's tokenizer_config.json (None: the model has none).
SPECIAL = {
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": (None, "<|im_end|>"),
    "Qwen-Qwen3-0.6B.jinja": (None, "<|im_end|>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("<s>", "</s>"),
    "google-gemma-2-2b-it.jinja": ("<bos>", "<eos>"),
    "microsoft-Phi-3.5-mini-instruct.jinja": ("<s>", "<|endoftext|>"),
    "HuggingFaceTB-SmolLM3-3B.jinja": (None, "<|im_end|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "ibm-granite-granite-3.3-2B-Instruct.jinja": ("<|end_of_text|>", "<|end_of_text|>"),
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("<|begin_of_text|>", "<|im_end|>"),
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Gets the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

MESSAGE_SETS = {
    "plain": ([{"role": "user", "content": "Hello, how are you?"}], None),
    "system": ([{"role": "system", "content": "You are a terse assistant."},
                {"role": "user", "content": "Name a prime number."}], None),
    "multi_turn": ([{"role": "user", "content": "What is 2 + 2?"},
                    {"role": "assistant", "content": "4."},
                    {"role": "user", "content": "And times 3?"}], None),
    "unicode": ([{"role": "user", "content": "Ünïcödé: 你好, 👩‍👩‍👧, tabs\tand \"quotes\" <b>&'</b>\n  second line "},
                 {"role": "assistant", "content": "Héllo 👋 — ça va?"},
                 {"role": "user", "content": "🇫🇷 ok"}], None),
    "tools": ([{"role": "user", "content": "What is the weather in Paris?"},
               {"role": "assistant", "content": "",
                "tool_calls": [{"id": "call12345", "type": "function",
                                "function": {"name": "get_weather",
                                             "arguments": {"city": "Paris", "unit": "celsius"}}}]},
               {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
                "content": "{\"temperature\": 22.5, \"sky\": \"clear\"}"},
               {"role": "assistant", "content": "It is 22.5 °C and clear in Paris."},
               {"role": "user", "content": "Thanks!"}], [WEATHER_TOOL]),
}

# A fixed date for templates that take one (Llama 3.x's date_string), so that references do not
# depend on the day they were made.
EXTRA = {"date_string": "26 Jul 2024"}


def one_line(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def main() -> int:
    base = Tokenizer.from_file(str(ROOT / "tests/text/fixtures/bytelevel_bpe/tokenizer.json"))
    lines = []
    for name, digest in TEMPLATE_SHA256.items():
        source_bytes = (TEMPLATES / name).read_bytes()
        assert hashlib.sha256(source_bytes).hexdigest() == digest, name
        source = source_bytes.decode("utf-8")
        bos, eos = SPECIAL[name]
        special = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=base, chat_template=source, **special)
        today_format = None
        if "strftime_now" in source:
            m = re.search(r"strftime_now\(['\"]([^'\"]+)['\"]\)", source)
            today_format = m.group(1)
        for set_name, (messages, tools) in MESSAGE_SETS.items():
            for agp in (False, True):
                header = [f"case {name} {set_name} {int(agp)}", f"special {one_line(special)}",
                          f"messages {one_line(messages)}", f"tools {one_line(tools)}", f"extra {one_line(EXTRA)}"]
                try:
                    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                         add_generation_prompt=agp, **EXTRA)
                    kind = "expected"
                    if today_format is not None:
                        today = datetime.datetime.now().strftime(today_format)
                        if today in text:
                            header.append(f"today {today_format}")
                            text = text.replace(today, "<<TODAY>>")
                except Exception as e:  # the template's raise_exception (jinja2 TemplateError)
                    kind, text = "error", str(e)
                data = text.encode("utf-8")
                lines.append("\n".join(header) + f"\n{kind} {len(data)}\n")
                lines.append(data + b"\n")
    with open(OUT, "wb") as f:
        f.write(f"# made by scripts/make_chat_template_references.py with transformers {transformers.__version__}\n"
                .encode())
        for piece in lines:
            f.write(piece if isinstance(piece, bytes) else piece.encode("utf-8"))
    print(f"{OUT}: {len(lines) // 2} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
