"""Valid random inputs for a model, built from its inputs.json spec.

Used by tests/models/test_models.py and by scripts/export_models.py (which
checks each export with the same kind of inputs the tests feed). numpy only.

inputs.json:
    {"dims": {"batch": 2, "sequence_length": 7, ...},      # values tests use
     "inputs": [{"name", "dtype", "shape", "kind", "range"?}, ...],
     "outputs": [...]}
A shape entry is an int, a dim name, or "a+b" (the sum of two dims).
Kinds:
    token_ids, token_type_ids  integers uniform in range [low, high)
    attention_mask             ones; with batch > 1 the last row ends in 2 zeros
    position_ids               derived from the mask like generate() does
    float                      standard normal, in the entry's dtype (float32 or float16: drawn as
                               float32, then rounded)
    bool                       every element equal to the entry's "value" (true/false, or the
                               name of a dim whose value, 0 or not, gives it per shape),
                               e.g. optimum's use_cache_branch
    int                        every element equal to the entry's "value" in its dtype
                               (a sample rate, a fixed count)
"""

from __future__ import annotations

import numpy as np

PADDED_TAIL = 2


def resolve_dim(dim, dims: dict) -> int:
    if isinstance(dim, int):
        return dim
    return sum(dims[part.strip()] for part in dim.split("+"))


def resolve_shape(entry: dict, dims: dict) -> list[int]:
    return [resolve_dim(d, dims) for d in entry["shape"]]


def attention_mask(shape: list[int]) -> np.ndarray:
    mask = np.ones(shape, dtype=np.int64)
    # Right padding on the last row exercises the masking path; the row keeps
    # real tokens so no softmax row is fully masked.
    if shape[0] > 1 and shape[1] > PADDED_TAIL:
        mask[-1, -PADDED_TAIL:] = 0
    return mask


def position_ids(mask: np.ndarray, length: int) -> np.ndarray:
    positions = np.cumsum(mask, axis=1) - 1
    positions[mask == 0] = 1
    return positions[:, -length:].astype(np.int64)


def build_inputs(entries: list[dict], dims: dict, rng: np.random.Generator) -> dict:
    """Returns {input name: numpy array} for every entry, in entry order."""
    masks = {
        e["name"]: attention_mask(resolve_shape(e, dims))
        for e in entries
        if e["kind"] == "attention_mask"
    }
    values = {}
    for entry in entries:
        shape = resolve_shape(entry, dims)
        kind = entry["kind"]
        if kind == "attention_mask":
            value = masks[entry["name"]]
        elif kind in ("token_ids", "token_type_ids"):
            low, high = entry["range"]
            value = rng.integers(low, high, size=shape, dtype=np.int64)
        elif kind == "position_ids":
            if len(masks) != 1:
                raise ValueError("position_ids need exactly one attention_mask input")
            value = position_ids(next(iter(masks.values())), shape[1])
        elif kind == "float":  # float16 entries (fp16 models): drawn as float32, then rounded
            value = rng.standard_normal(shape).astype(np.float32).astype(entry["dtype"])
        elif kind == "bool":
            flag = entry["value"]
            value = np.full(shape, bool(dims[flag]) if isinstance(flag, str) else bool(flag), dtype=np.bool_)
        elif kind == "int":
            value = np.full(shape, int(entry["value"]), dtype=np.dtype(entry["dtype"]))
        else:
            raise ValueError(f"input {entry['name']}: unknown kind {kind!r}")
        if value.dtype != np.dtype(entry["dtype"]):
            raise ValueError(f"input {entry['name']}: built {value.dtype}, spec says {entry['dtype']}")
        values[entry["name"]] = value
    return values
