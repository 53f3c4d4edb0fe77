"""Builds a tiny single-stage object detector with onnx.helper: Resize and NonMaxSuppression.

The shape of the post-processing that published detector exports (YOLO,
SSD-style, OCR text detectors) carry, on a toy backbone with fixed-seed random
weights:

    image [B, 3, 32, 32]
      -> Conv s2 + Relu -> c1 [B, 8, 16, 16] -> Conv s2 + Relu -> c2 [B, 8, 8, 8]
      -> Resize(c2, nearest, scales x2) + c1 -> p1 [B, 8, 16, 16]     (FPN top-down path)
      -> Resize(p1, linear half_pixel, sizes 24x24) -> p0 [B, 8, 24, 24] -> head
      -> box deltas [B, 4, 24, 24] + anchor grid -> boxes [B, 576, 4] (y1, x1, y2, x2)
      -> objectness Sigmoid -> scores [B, 1, 576]
      -> NonMaxSuppression(boxes, scores, max 20 per class, IoU 0.5, score 0.82)
      -> selected [K, 3] -> GatherND -> detections [K, 4]

Outputs: scores, boxes, selected_indices, detections. The NMS count depends on
the data, so under compile the model runs as segments around it.

Writes tests/models/detector/{model.onnx, inputs.json, ops.txt}, which
tests/models/test_models.py compares against ONNX Runtime (optimizations off).

Usage: .venv/bin/python scripts/make_detector_model.py [--out tests/models]
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

REPO_ROOT = Path(__file__).resolve().parents[1]
OPSET = 19
SIZE = 32
CHANNELS = 8
GRID = 24  # the detection grid after the linear Resize


def weight(rng: np.random.Generator, name: str, shape: tuple[int, ...], std: float) -> TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * std).astype(np.float32), name)


def anchor_grid() -> np.ndarray:
    """Anchor boxes [1, GRID*GRID, 4] (y1, x1, y2, x2), one 4x4-pixel box per cell, in pixels."""
    centers = (np.arange(GRID, dtype=np.float32) + 0.5) * (SIZE / GRID)
    cy, cx = np.meshgrid(centers, centers, indexing="ij")
    half = np.float32(2.0)
    boxes = np.stack([cy - half, cx - half, cy + half, cx + half], axis=-1)
    return boxes.reshape(1, GRID * GRID, 4).astype(np.float32)


def build() -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(20261130)
    inits = [
        weight(rng, "conv1_w", (CHANNELS, 3, 3, 3), 0.4), weight(rng, "conv1_b", (CHANNELS,), 0.1),
        weight(rng, "conv2_w", (CHANNELS, CHANNELS, 3, 3), 0.2), weight(rng, "conv2_b", (CHANNELS,), 0.1),
        weight(rng, "box_w", (4, CHANNELS, 1, 1), 0.3), weight(rng, "box_b", (4,), 0.1),
        weight(rng, "obj_w", (1, CHANNELS, 1, 1), 0.15), weight(rng, "obj_b", (1,), 0.1),
        numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "up_scales"),
        numpy_helper.from_array(anchor_grid(), "anchors"),
        numpy_helper.from_array(np.array([0, -1, GRID * GRID], np.int64), "flat_shape"),
        numpy_helper.from_array(np.array([20], np.int64), "max_per_class"),
        numpy_helper.from_array(np.array([0.5], np.float32), "iou_threshold"),
        numpy_helper.from_array(np.array([0.82], np.float32), "score_threshold"),
        numpy_helper.from_array(np.array([0, 2], np.int64), "batch_and_box"),
        numpy_helper.from_array(np.array([2.0], np.float32), "delta_scale"),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "conv1_w", "conv1_b"], ["c1_pre"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1_pre"], ["c1"]),
        helper.make_node("Conv", ["c1", "conv2_w", "conv2_b"], ["c2_pre"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2_pre"], ["c2"]),
        # Top-down path: nearest x2 (scales), then a linear resize to the detection grid (sizes).
        helper.make_node("Resize", ["c2", "", "up_scales"], ["c2_up"], mode="nearest",
                         coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        helper.make_node("Add", ["c2_up", "c1"], ["p1"]),
        helper.make_node("Shape", ["p1"], ["batch_channels"], start=0, end=2),
        helper.make_node("Constant", [], ["grid_hw"], value=numpy_helper.from_array(np.array([GRID, GRID], np.int64))),
        helper.make_node("Concat", ["batch_channels", "grid_hw"], ["p0_sizes"], axis=0),
        helper.make_node("Resize", ["p1", "", "", "p0_sizes"], ["p0"], mode="linear",
                         coordinate_transformation_mode="half_pixel"),
        # Head: box deltas (in pixels, tanh-bounded) and objectness per cell.
        helper.make_node("Conv", ["p0", "box_w", "box_b"], ["deltas_raw"]),
        helper.make_node("Tanh", ["deltas_raw"], ["deltas_unit"]),
        helper.make_node("Mul", ["deltas_unit", "delta_scale"], ["deltas"]),
        helper.make_node("Reshape", ["deltas", "flat_shape"], ["deltas_flat"]),  # [B, 4, 576]
        helper.make_node("Transpose", ["deltas_flat"], ["deltas_t"], perm=[0, 2, 1]),  # [B, 576, 4]
        helper.make_node("Add", ["anchors", "deltas_t"], ["boxes"]),
        helper.make_node("Conv", ["p0", "obj_w", "obj_b"], ["obj"]),
        helper.make_node("Sigmoid", ["obj"], ["obj_prob"]),
        helper.make_node("Reshape", ["obj_prob", "flat_shape"], ["scores"]),  # [B, 1, 576]
        helper.make_node("NonMaxSuppression",
                         ["boxes", "scores", "max_per_class", "iou_threshold", "score_threshold"],
                         ["selected_indices"], center_point_box=0),
        # detections[k] = boxes[batch_k, box_k]
        helper.make_node("Gather", ["selected_indices", "batch_and_box"], ["batch_box"], axis=1),
        helper.make_node("GatherND", ["boxes", "batch_box"], ["detections"]),
    ]
    graph = helper.make_graph(
        nodes, "detector",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", 1, GRID * GRID]),
         helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["batch", GRID * GRID, 4]),
         helper.make_tensor_value_info("selected_indices", TensorProto.INT64, ["selected", 3]),
         helper.make_tensor_value_info("detections", TensorProto.FLOAT, ["selected", 4])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=9,
                              producer_name="transmuter scripts/make_detector_model.py")
    onnx.checker.check_model(model, full_check=True)
    spec = {
        "model": "detector",
        "opset": OPSET,
        "dims": {"batch": 2},
        "inputs": [{"name": "image", "dtype": "float32", "shape": ["batch", 3, SIZE, SIZE], "kind": "float"}],
        "outputs": ["scores", "boxes", "selected_indices", "detections"],
        "generated_by": "scripts/make_detector_model.py",
    }
    return model, spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "tests" / "models")
    args = parser.parse_args()
    model, spec = build()
    directory = args.out / "detector"
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(model, directory / "model.onnx")
    (directory / "inputs.json").write_text(json.dumps(spec, indent=2) + "\n")
    counts = collections.Counter(n.op_type for n in model.graph.node)
    (directory / "ops.txt").write_text("".join(f"{op} {n}\n" for op, n in sorted(counts.items())))
    print(f"wrote {directory}")


if __name__ == "__main__":
    main()
