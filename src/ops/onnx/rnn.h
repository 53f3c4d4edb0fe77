// The LSTM layer of src/ops/onnx/rnn.cpp, for com.microsoft's
// DynamicQuantizeLSTM (src/ops/microsoft/qlinear_matmul.cpp).
#pragma once

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/registry.h"

namespace transmuter {

/** What the recurrence weights multiply at each step, from the state Ht-1
 * [D', B, H] (D': the directions run together). */
using RecurrentInput = mx::array (*)(const mx::array& h, mx::StreamOrDevice s);

/** ONNX LSTM of the node in `ctx` with the given values instead of inputs 0,
 * 1 and 2: x [T, B, I] (layout 0) or [B, T, I] (layout 1), w [D, 4H, I],
 * r [D, 4H, H], all of one float dtype (gates i o f c). The other inputs (B,
 * sequence_lens, initial_h, initial_c, P) and attributes are read from the
 * node at their LSTM positions. `recurrent_input` (null: Ht-1 itself) maps
 * the state before it multiplies R (DynamicQuantizeLSTM rounds it to uint8).
 * Outputs Y, Y_h, Y_c. */
OpOutputs lstm_with_weights(NodeContext& ctx, const mx::array& x, const mx::array& w, const mx::array& r,
                            RecurrentInput recurrent_input = nullptr);

}  // namespace transmuter
