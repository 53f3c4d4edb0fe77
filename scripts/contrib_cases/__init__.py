"""Cases for ONNX Runtime's contrib operators (com.microsoft), checked against ORT.

Each family module here (attention.py, quantization.py, ...) defines
`cases() -> list[Case]`: one operator node (or a few) with seeded inputs,
re-creating the cases of ORT's own contrib-op tests
(onnxruntime/test/contrib_ops/*_test.cc) and the attribute combinations its
CPU kernels accept. scripts/make_contrib_cases.py runs each case through ONNX
Runtime with graph optimizations off and writes it in the ONNX backend test
layout, so `transmuter conformance` runs it eagerly and compiled.

A Case's tolerance is the one `transmuter conformance` applies:
|actual - expected| <= atol + rtol * |expected|. Each family states why its
tolerances are what they are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from onnx import TensorProto, helper, numpy_helper

MS_DOMAIN = "com.microsoft"
# ORT 1.31 reads IR version 13 at most; onnx 1.23 writes 14 by default.
IR_VERSION = 10
ONNX_OPSET = 21


@dataclass
class Case:
    """One test: a graph of `nodes` over `inputs`, outputs named `outputs`.

    inputs: (name, array) in graph-input order; an array in `constants` is an
    initializer instead (ORT pre-packs constant weights, so cases with
    MatMulNBits weights and the like must give them as initializers).
    """

    name: str
    nodes: list
    inputs: list[tuple[str, np.ndarray]]
    outputs: list[str]
    constants: list[tuple[str, np.ndarray]] = field(default_factory=list)
    rtol: float = 1e-4
    atol: float = 1e-5
    ms_opset: int = 1
    onnx_opset: int = ONNX_OPSET
    # For operators that ONNX Runtime implements only on CUDA (BiasAdd,
    # BiasSplitGelu, BiasSoftmax): the outputs computed by NumPy from the
    # operator's definition in ContribOperators.md, instead of ORT's.
    expected: list[np.ndarray] | None = None
    # For outputs with parts the spec leaves unspecified (ORT leaves them uninitialized): a function of
    # ORT's outputs giving them with those parts as Transmuter writes them (stated per family).
    settle: Callable[[list[np.ndarray]], list[np.ndarray]] | None = None

    def model(self):
        def info(name, array):
            return helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(array.dtype), list(array.shape)
            )

        graph = helper.make_graph(
            self.nodes,
            self.name,
            [info(n, a) for n, a in self.inputs],
            [helper.make_empty_tensor_value_info(n) for n in self.outputs],
            initializer=[numpy_helper.from_array(a, n) for n, a in self.constants],
        )
        return helper.make_model(
            graph,
            opset_imports=[
                helper.make_opsetid("", self.onnx_opset),
                helper.make_opsetid(MS_DOMAIN, self.ms_opset),
            ],
            ir_version=IR_VERSION,
            producer_name="transmuter contrib cases",
        )


def op_case(name: str, op: str, inputs, outputs, attrs=None, *, domain: str = MS_DOMAIN, **kwargs) -> Case:
    """A case of one com.microsoft node.

    inputs: list of (name, array) or None for an optional input left out ("");
    a name starting with "const:" makes that input an initializer.
    outputs: output names; "" leaves an optional output out.
    domain: the node's domain; ORT keeps a few contrib ops in the default
    domain ("": SimplifiedLayerNormalization, LayerNormalization before opset 17).
    """
    node_inputs, graph_inputs, constants = [], [], []
    for entry in inputs:
        if entry is None:
            node_inputs.append("")
            continue
        input_name, array = entry
        if input_name.startswith("const:"):
            input_name = input_name[len("const:"):]
            constants.append((input_name, array))
        else:
            graph_inputs.append((input_name, array))
        node_inputs.append(input_name)
    while node_inputs and node_inputs[-1] == "":
        node_inputs.pop()
    node = helper.make_node(op, node_inputs, list(outputs), domain=domain, **(attrs or {}))
    return Case(
        name=name,
        nodes=[node],
        inputs=graph_inputs,
        outputs=[o for o in outputs if o],
        constants=constants,
        **kwargs,
    )


def rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def normal(generator: np.random.Generator, shape, scale: float = 1.0, dtype=np.float32) -> np.ndarray:
    return (generator.standard_normal(shape) * scale).astype(dtype)


__all__ = ["Case", "MS_DOMAIN", "TensorProto", "normal", "op_case", "rng"]


@dataclass
class ModelProtoCase(Case):
    """A case whose model is a whole onnx.ModelProto (`proto`), e.g. one made by
    onnxruntime.quantization; `nodes` is unused. inputs/outputs name the
    model's graph inputs (in order) and the outputs to check."""

    proto: object = None

    def model(self):
        import onnx

        model = onnx.ModelProto()
        model.CopyFrom(self.proto)
        return model
