"""Prints the MaxRoiPool expectations of tests/ops/onnx/image_test.cpp, computed
by ONNX Runtime with graph optimizations off (the onnx reference has no
MaxRoiPool). Run with the project venv: .venv/bin/python <this file>."""
import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

# X[i] = ((i * 37) % 101) / 8: exact in float, reproduced by the C++ test.
N, C, H, W = 2, 3, 6, 7
x = (((np.arange(N * C * H * W) * 37) % 101) / 8).astype(np.float32).reshape(N, C, H, W)
# ONNX Runtime implements MaxRoiPool v1 only, hence opset 21 (v22 added bfloat16).
# Regions: whole image, fractional corners (rounding), one past the border,
# an inverted one (width and height clamp to 1 pixel), one on batch 1, and one
# entirely outside the image (every bin empty -> 0). With spatial_scale 0.5
# the odd corners land on halves, which round away from zero.
rois = np.array([
    [0, 0, 0, 6, 5],
    [1, 1.4, 0.5, 4.6, 3.5],
    [0, 3, 2, 12, 9],
    [1, 5, 4, 2, 1],
    [1, 2, 1, 3, 4],
    [0, 20, 20, 30, 30],
], dtype=np.float32)


def run(pooled, scale):
    node = helper.make_node("MaxRoiPool", ["X", "rois"], ["Y"], pooled_shape=pooled, spatial_scale=scale)
    graph = helper.make_graph([node], "g", [
        helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x.shape)),
        helper.make_tensor_value_info("rois", TensorProto.FLOAT, list(rois.shape))],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"X": x, "rois": rois})[0]


for pooled, scale in [([2, 3], 1.0), ([3, 2], 0.5)]:
    y = run(pooled, scale)
    print(f"// pooled_shape {pooled}, spatial_scale {scale}: shape {list(y.shape)}")
    print("{" + ", ".join(f"{v:g}" for v in y.flatten()) + "}")
