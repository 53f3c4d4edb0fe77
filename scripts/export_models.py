#!/usr/bin/env python3
"""Export tiny, randomly initialized Hugging Face models to ONNX test fixtures.

Run by hand (needs torch + transformers, which CI does not have):
    /opt/export-venv/bin/python scripts/export_models.py [--only NAME ...]

For each model this writes tests/models/<name>/:
    model.onnx   fp32, TorchScript exporter (dynamo=False), weights inline, < 2 MB
    inputs.json  input spec tests use to build valid inputs (see write_spec)
    ops.txt      the op types the graph uses, with counts

The configs are tiny but keep each architecture's structure: BERT (post-LN
encoder, pooler), GPT-2 and Llama decoders with past key values flattened the
way optimum's decoder_with_past export names them (past_key_values.N.key/value
in, present.N.key/value out), Llama with RoPE, RMSNorm and grouped-query
attention, ViT and ResNet image encoders. Every export is checked against
PyTorch in onnxruntime at shapes other than the traced ones, with padding in
the attention mask, so a shape baked in by tracing fails here and not later.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import transformers
from transformers.cache_utils import DynamicCache

REPO_ROOT = Path(__file__).resolve().parents[1]
MODELS_DIR = REPO_ROOT / "tests" / "models"
sys.path.insert(0, str(MODELS_DIR))
from model_inputs import build_inputs  # noqa: E402
MAX_MODEL_BYTES = 2 * 1024 * 1024
# fp32 PyTorch vs onnxruntime on the same graph: differences come only from
# kernel summation order, so 1e-4 is loose for these small hidden sizes.
EXPORT_TOLERANCE = 1e-4
SEED = 0


@dataclass
class InputSpec:
    """One graph input; `kind` tells tests how to fill it (see tests/models)."""

    name: str
    dtype: str
    shape: list  # ints or dim names; "a+b" sums two dims
    kind: str  # token_ids | token_type_ids | attention_mask | position_ids | float
    value_range: list | None = None  # [low, high) for integer kinds

    def to_json(self) -> dict:
        entry = {"name": self.name, "dtype": self.dtype, "shape": self.shape, "kind": self.kind}
        if self.value_range is not None:
            entry["range"] = self.value_range
        return entry


@dataclass
class ExportPlan:
    name: str
    module: torch.nn.Module
    inputs: list[InputSpec]
    outputs: list[str]
    dynamic_axes: dict
    opset: int
    trace_dims: dict  # dim values used for tracing
    check_dims: list[dict]  # other dim values the export must also handle
    default_dims: dict  # dim values tests use
    notes: dict = field(default_factory=dict)


def make_inputs(specs: list[InputSpec], dims: dict, rng: np.random.Generator) -> dict:
    # The tests' own input builder, so the export is checked on what tests feed.
    return build_inputs([spec.to_json() for spec in specs], dims, rng)


# ----------------------------------------------------------------------------
# Wrappers: give each model a flat tensor-in / tensor-out signature.


class EncoderWrapper(torch.nn.Module):
    def __init__(self, model: torch.nn.Module, input_names: list[str]):
        super().__init__()
        self.model = model
        self.input_names = input_names

    def forward(self, *args):
        out = self.model(**dict(zip(self.input_names, args)))
        return out.last_hidden_state, out.pooler_output


class DecoderWithPastWrapper(torch.nn.Module):
    """Takes past key/values as flat tensors and returns logits + presents."""

    def __init__(self, model: torch.nn.Module, num_layers: int, with_position_ids: bool):
        super().__init__()
        self.model = model
        self.num_layers = num_layers
        self.with_position_ids = with_position_ids

    def forward(self, input_ids, attention_mask, *rest):
        position_ids = rest[0] if self.with_position_ids else None
        flat_past = rest[1:] if self.with_position_ids else rest
        pairs = [(flat_past[2 * i], flat_past[2 * i + 1]) for i in range(self.num_layers)]
        cache = DynamicCache(ddp_cache_data=pairs)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        presents = []
        for layer in out.past_key_values.layers:
            presents.extend([layer.keys, layer.values])
        return (out.logits, *presents)


def eager(config):
    # Plain matmul/softmax attention: the op mix most exported HF models carry.
    config._attn_implementation = "eager"
    return config


# ----------------------------------------------------------------------------
# The models.


def text_dims(batch, seq):
    return {"batch": batch, "sequence_length": seq}


def plan_bert() -> ExportPlan:
    vocab = 1000
    config = eager(
        transformers.BertConfig(
            vocab_size=vocab,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=128,
            type_vocab_size=2,
        )
    )
    names = ["input_ids", "attention_mask", "token_type_ids"]
    model = transformers.BertModel(config)
    seq_shape = ["batch", "sequence_length"]
    inputs = [
        InputSpec("input_ids", "int64", seq_shape, "token_ids", [0, vocab]),
        InputSpec("attention_mask", "int64", seq_shape, "attention_mask"),
        InputSpec("token_type_ids", "int64", seq_shape, "token_type_ids", [0, 2]),
    ]
    return ExportPlan(
        name="bert",
        module=EncoderWrapper(model, names),
        inputs=inputs,
        outputs=["last_hidden_state", "pooler_output"],
        dynamic_axes={
            **{n: {0: "batch", 1: "sequence_length"} for n in names},
            "last_hidden_state": {0: "batch", 1: "sequence_length"},
            "pooler_output": {0: "batch"},
        },
        opset=17,
        trace_dims=text_dims(2, 8),
        check_dims=[text_dims(3, 5), text_dims(1, 13)],
        default_dims=text_dims(2, 7),
    )


def past_specs(num_layers: int, kv_heads: int, head_dim: int) -> list[InputSpec]:
    shape = ["batch", kv_heads, "past_sequence_length", head_dim]
    specs = []
    for i in range(num_layers):
        for part in ("key", "value"):
            specs.append(InputSpec(f"past_key_values.{i}.{part}", "float32", shape, "float"))
    return specs


def decoder_plan(name, model, num_layers, kv_heads, head_dim, vocab, opset, with_position_ids):
    total = "past_sequence_length+sequence_length"
    inputs = [
        InputSpec("input_ids", "int64", ["batch", "sequence_length"], "token_ids", [0, vocab]),
        InputSpec("attention_mask", "int64", ["batch", total], "attention_mask"),
    ]
    if with_position_ids:
        inputs.append(InputSpec("position_ids", "int64", ["batch", "sequence_length"], "position_ids"))
    inputs += past_specs(num_layers, kv_heads, head_dim)
    present_names = [f"present.{i}.{part}" for i in range(num_layers) for part in ("key", "value")]
    axes = {
        "input_ids": {0: "batch", 1: "sequence_length"},
        "attention_mask": {0: "batch", 1: "total_sequence_length"},
        "logits": {0: "batch", 1: "sequence_length"},
    }
    if with_position_ids:
        axes["position_ids"] = {0: "batch", 1: "sequence_length"}
    for spec in inputs[len(inputs) - 2 * num_layers :]:
        axes[spec.name] = {0: "batch", 2: "past_sequence_length"}
    for present in present_names:
        axes[present] = {0: "batch", 2: "total_sequence_length"}

    def dims(batch, seq, past):
        return {"batch": batch, "sequence_length": seq, "past_sequence_length": past}

    return ExportPlan(
        name=name,
        module=DecoderWithPastWrapper(model, num_layers, with_position_ids),
        inputs=inputs,
        outputs=["logits", *present_names],
        dynamic_axes=axes,
        opset=opset,
        trace_dims=dims(2, 4, 3),
        # Decode step (seq 1) and a longer prefill with a longer past.
        check_dims=[dims(3, 1, 6), dims(1, 9, 2), dims(2, 5, 11)],
        default_dims=dims(2, 3, 5),
    )


def plan_gpt2_past() -> ExportPlan:
    vocab, layers, heads, hidden = 1000, 2, 4, 64
    config = eager(
        transformers.GPT2Config(
            vocab_size=vocab,
            n_positions=128,
            n_embd=hidden,
            n_layer=layers,
            n_head=heads,
            bos_token_id=vocab - 1,
            eos_token_id=vocab - 1,
        )
    )
    model = transformers.GPT2LMHeadModel(config)
    return decoder_plan("gpt2_past", model, layers, heads, hidden // heads, vocab, 17, True)


def plan_llama() -> ExportPlan:
    vocab, layers, heads, kv_heads, hidden = 1000, 2, 4, 2, 64
    config = eager(
        transformers.LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=128,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            max_position_embeddings=128,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
        )
    )
    model = transformers.LlamaForCausalLM(config)
    return decoder_plan("llama", model, layers, kv_heads, hidden // heads, vocab, 18, True)


def image_plan(name, model, channels, size, opset):
    dims = lambda batch: {"batch": batch}  # noqa: E731
    return ExportPlan(
        name=name,
        module=EncoderWrapper(model, ["pixel_values"]),
        inputs=[InputSpec("pixel_values", "float32", ["batch", channels, size, size], "float")],
        outputs=["last_hidden_state", "pooler_output"],
        dynamic_axes={
            "pixel_values": {0: "batch"},
            "last_hidden_state": {0: "batch"},
            "pooler_output": {0: "batch"},
        },
        opset=opset,
        trace_dims=dims(2),
        check_dims=[dims(1), dims(3)],
        default_dims=dims(2),
    )


def plan_vit() -> ExportPlan:
    config = eager(
        transformers.ViTConfig(
            image_size=32,
            patch_size=8,
            num_channels=3,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
        )
    )
    return image_plan("vit", transformers.ViTModel(config), 3, 32, 18)


def plan_resnet() -> ExportPlan:
    config = transformers.ResNetConfig(
        num_channels=3,
        embedding_size=16,
        hidden_sizes=[16, 32, 48],
        depths=[1, 1, 1],
        layer_type="bottleneck",
    )
    return image_plan("resnet", transformers.ResNetModel(config), 3, 32, 17)


PLANS = {
    "bert": plan_bert,
    "gpt2_past": plan_gpt2_past,
    "llama": plan_llama,
    "vit": plan_vit,
    "resnet": plan_resnet,
}


# ----------------------------------------------------------------------------
# Export and checks.


def randomize_norms(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Fresh norms are weight 1 / bias 0 (and BatchNorm stats 0/1), which would
    hide a scale or bias applied to the wrong axis; perturb them."""
    with torch.no_grad():
        for sub in module.modules():
            for pname in ("weight", "bias", "running_mean"):
                tensor = getattr(sub, pname, None)
                is_norm = "Norm" in type(sub).__name__
                if is_norm and isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                    tensor.add_(0.1 * torch.randn(tensor.shape, generator=generator))
            running_var = getattr(sub, "running_var", None)
            if isinstance(running_var, torch.Tensor):
                running_var.mul_(torch.rand(running_var.shape, generator=generator) + 0.5)


def torch_inputs(values: dict, specs: list[InputSpec]) -> tuple:
    return tuple(torch.from_numpy(values[spec.name]) for spec in specs)


def export(plan: ExportPlan, path: Path) -> None:
    rng = np.random.default_rng(SEED)
    example = torch_inputs(make_inputs(plan.inputs, plan.trace_dims, rng), plan.inputs)
    torch.onnx.export(
        plan.module,
        example,
        str(path),
        input_names=[spec.name for spec in plan.inputs],
        output_names=plan.outputs,
        dynamic_axes=plan.dynamic_axes,
        opset_version=plan.opset,
        do_constant_folding=True,
        dynamo=False,
    )
    # The exporter restores the module's previous training flag afterwards.
    plan.module.eval()


def check_against_torch(plan: ExportPlan, path: Path) -> float:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(SEED + 1)
    worst = 0.0
    for dims in [plan.trace_dims, *plan.check_dims]:
        values = make_inputs(plan.inputs, dims, rng)
        got = session.run(plan.outputs, values)
        with torch.no_grad():
            expected = plan.module(*torch_inputs(values, plan.inputs))
        for out_name, g, e in zip(plan.outputs, got, expected, strict=True):
            e = e.numpy()
            if g.shape != e.shape:
                raise SystemExit(f"{plan.name}/{out_name} at {dims}: shape {g.shape} != {e.shape}")
            diff = float(np.max(np.abs(g - e))) if g.size else 0.0
            if not diff <= EXPORT_TOLERANCE:
                raise SystemExit(f"{plan.name}/{out_name} at {dims}: max diff {diff}")
            worst = max(worst, diff)
    return worst


def write_spec(plan: ExportPlan, directory: Path) -> None:
    spec = {
        "model": plan.name,
        "opset": plan.opset,
        "dims": plan.default_dims,
        "inputs": [spec.to_json() for spec in plan.inputs],
        "outputs": plan.outputs,
        "generated_by": "scripts/export_models.py",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    (directory / "inputs.json").write_text(json.dumps(spec, indent=2) + "\n")


def write_ops(model: onnx.ModelProto, directory: Path) -> list[str]:
    counts = collections.Counter(node.op_type for node in model.graph.node)
    lines = [f"{op} {count}" for op, count in sorted(counts.items())]
    (directory / "ops.txt").write_text("\n".join(lines) + "\n")
    return sorted(counts)


def run_plan(name: str) -> None:
    torch.manual_seed(SEED)
    plan = PLANS[name]()
    randomize_norms(plan.module, torch.Generator().manual_seed(SEED))
    plan.module.eval()
    directory = MODELS_DIR / name
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "model.onnx"
    export(plan, path)
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    size = path.stat().st_size
    if size > MAX_MODEL_BYTES:
        raise SystemExit(f"{name}: {size} bytes exceeds {MAX_MODEL_BYTES}")
    worst = check_against_torch(plan, path)
    write_spec(plan, directory)
    ops = write_ops(model, directory)
    print(f"{name}: {size} bytes, opset {plan.opset}, worst ORT-vs-torch diff {worst:.2e}")
    print(f"  ops: {' '.join(ops)}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(PLANS), default=sorted(PLANS))
    args = parser.parse_args()
    for name in args.only:
        run_plan(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
