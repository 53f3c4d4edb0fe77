"""What bench/coverage/make_corpus.py and make_optimum.py share. They run in two venvs (transformers 5 and, for
Optimum, transformers 4.57), so this module needs torch alone."""
from __future__ import annotations

import argparse

import torch


def selected(parser: argparse.ArgumentParser, text: str | None, known: list[str], what: str) -> list[str]:
    """The comma-separated names of `text` (all of `known` when it is None), each one of `known`: a name that is
    not stops the script through parser.error."""
    if not text:
        return list(known)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown {what}: {', '.join(unknown)} (known: {', '.join(known)})")
    return names


def randomize(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Linear and convolution weights ~ N(0, 1/fan_in), their biases ~ N(0, 0.1^2), and norms perturbed.

    The models' own initializations (std 0.02) leave activations, attention scores and logits near zero
    in these tiny configs, where a wrong mask, bias or axis can hide under a 1e-4 tolerance. Fresh norms
    are weight 1 / bias 0 (and BatchNorm statistics 0/1), which would hide a scale or bias applied to the
    wrong axis: they get noise too (scripts/export_models.py does the same)."""
    with torch.no_grad():
        for module in model.modules():
            if torch.nn.utils.parametrize.is_parametrized(module):  # weight-normed convolutions
                continue
            weight = getattr(module, "weight", None)
            gpt2_conv1d = type(module).__name__ == "Conv1D"  # GPT-2's linear layer, weight [in, out]
            linear = gpt2_conv1d or isinstance(module, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d))
            if gpt2_conv1d and isinstance(weight, torch.Tensor):
                weight.copy_(torch.randn(weight.shape, generator=generator) / weight.shape[0] ** 0.5)
            elif linear and isinstance(weight, torch.Tensor):
                weight.copy_(torch.randn(weight.shape, generator=generator) / weight[0].numel() ** 0.5)
            bias = getattr(module, "bias", None)
            if linear and isinstance(bias, torch.Tensor):
                bias.copy_(0.1 * torch.randn(bias.shape, generator=generator))
            if "Norm" in type(module).__name__:
                for name in ("weight", "bias", "running_mean"):
                    tensor = getattr(module, name, None)
                    if isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                        tensor.add_(0.1 * torch.randn(tensor.shape, generator=generator))
                running_var = getattr(module, "running_var", None)
                if isinstance(running_var, torch.Tensor):
                    running_var.mul_(torch.rand(running_var.shape, generator=generator) + 0.5)


def summarize(files: list[dict], flavours: list[str], seconds: float) -> None:
    """Totals of manifest entries: architectures, files ok and failed per flavour (a part's flavour, such as
    fp32_encoder, counts under the flavour it starts with), and every failure."""
    ok = [f for f in files if f["status"] == "ok"]
    print(f"\n{len({f['arch'] for f in ok})} architectures with at least one ok file; "
          f"{len(ok)} files ok, {len(files) - len(ok)} failed; {sum(f['bytes'] for f in ok) / 2**20:.1f} MiB; "
          f"{seconds:.0f} s")
    by_flavour: dict[str, list[int]] = {}
    for f in files:
        base = max((fl for fl in flavours if f["flavour"].startswith(fl)), key=len, default=f["flavour"])
        counts = by_flavour.setdefault(base, [0, 0])
        counts[f["status"] != "ok"] += 1
    for flavour in flavours:
        if flavour in by_flavour:
            ok_count, failed = by_flavour[flavour]
            print(f"  {flavour:18s} {ok_count:4d} ok {failed:4d} failed")
    failed = [f for f in files if f["status"] != "ok"]
    if failed:
        print("failed:")
        for f in failed:
            print(f"  {f['arch']}/{f['flavour']}: {f['error']}")
