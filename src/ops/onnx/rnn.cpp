// Recurrent layers: RNN, GRU, LSTM, every version.
// https://onnx.ai/onnx/operators/onnx__LSTM.html (and onnx__GRU, onnx__RNN)
//
// The recurrence is sequential, so the time loop is unrolled into MLX ops,
// one step per time index; the input projection X * W^T (+ the biases that
// can be folded) of all steps is one matmul up front. Variable sequence
// lengths (sequence_lens) become masks instead of host reads, so the lengths
// stay traced under compile: a batch entry whose sequence has ended keeps its
// state (Y_h and Y_c are the state at its last step) and outputs zeros. A
// reverse direction starts at the last step, where every entry past its
// length is still masked, so each entry starts from the initial state at its
// own last step. The two directions of a bidirectional layer advance together
// as one batched step (the reverse one reading time backwards) when their
// activations agree: on the CPU the cost is per MLX op (roughly a millisecond
// per step here), not per element.
#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <vector>

#include <mlx/mlx.h>

#include "ops/node_context.h"
#include "ops/onnx/rnn.h"
#include "ops/registry.h"

namespace transmuter {
namespace {

enum class CellKind { kRnn, kGru, kLstm };

/** Gates per cell: RNN one, GRU z r h, LSTM i o f c (the spec's order in W, R, B). */
int gate_count(CellKind kind) { return kind == CellKind::kRnn ? 1 : kind == CellKind::kGru ? 3 : 4; }

/** Activation functions per direction: RNN f; GRU f g; LSTM f g h. */
int activations_per_direction(CellKind kind) {
  return kind == CellKind::kRnn ? 1 : kind == CellKind::kGru ? 2 : 3;
}

struct Activation {
  std::string name;  // lower case
  float alpha = 0;
  float beta = 0;
};

// The activation functions the spec lists. The spec gives no defaults for
// alpha and beta once activation_alpha/activation_beta run out; these are
// ONNX Runtime's (those of the standalone ops LeakyRelu, HardSigmoid and Elu,
// 0 for the rest).
bool uses_alpha(const std::string& name) {
  return name == "affine" || name == "leakyrelu" || name == "thresholdedrelu" || name == "scaledtanh" ||
         name == "hardsigmoid" || name == "elu";
}
bool uses_beta(const std::string& name) {
  return name == "affine" || name == "scaledtanh" || name == "hardsigmoid";
}
float default_alpha(const std::string& name) {
  if (name == "leakyrelu") return 0.01f;
  if (name == "hardsigmoid") return 0.2f;
  if (name == "elu") return 1.0f;
  return 0.0f;
}
float default_beta(const std::string& name) { return name == "hardsigmoid" ? 0.5f : 0.0f; }

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// The activations of every direction, forward first. activation_alpha and
// activation_beta are consumed in order by the functions that take them.
std::vector<Activation> parse_activations(const NodeContext& ctx, CellKind kind, int num_directions) {
  const int per_direction = activations_per_direction(kind);
  std::vector<std::string> names = ctx.attr_strings("activations");
  if (names.empty()) {
    std::vector<std::string> defaults = kind == CellKind::kRnn ? std::vector<std::string>{"Tanh"}
                                        : kind == CellKind::kGru
                                            ? std::vector<std::string>{"Sigmoid", "Tanh"}
                                            : std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
    for (int d = 0; d < num_directions; ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  } else if (static_cast<int>(names.size()) == per_direction && num_directions == 2) {
    // One direction's list for a bidirectional layer: both use it (as ONNX Runtime does).
    names.insert(names.end(), names.begin(), names.end());
  }
  if (static_cast<int>(names.size()) != per_direction * num_directions) {
    throw ctx.error("activations has ", names.size(), " entries, expected ", per_direction * num_directions,
                    " (", per_direction, " per direction)");
  }
  std::vector<float> alphas = ctx.attr_floats("activation_alpha");
  std::vector<float> betas = ctx.attr_floats("activation_beta");
  size_t next_alpha = 0, next_beta = 0;
  std::vector<Activation> out;
  for (const std::string& spelled : names) {
    Activation a;
    a.name = lower(spelled);
    static const char* known[] = {
        "relu",       "tanh",        "sigmoid", "affine",   "leakyrelu", "thresholdedrelu",
        "scaledtanh", "hardsigmoid", "elu",     "softsign", "softplus"};
    if (std::find(std::begin(known), std::end(known), a.name) == std::end(known)) {
      throw ctx.error("unknown activation '", spelled, "'");
    }
    a.alpha = default_alpha(a.name);
    a.beta = default_beta(a.name);
    if (uses_alpha(a.name) && next_alpha < alphas.size()) a.alpha = alphas[next_alpha++];
    if (uses_beta(a.name) && next_beta < betas.size()) a.beta = betas[next_beta++];
    out.push_back(a);
  }
  return out;
}

mx::array scalar_like(const mx::array& like, double v) { return mx::array(v, like.dtype()); }

mx::array activate(const Activation& a, const mx::array& x, mx::StreamOrDevice s) {
  auto alpha = scalar_like(x, a.alpha);
  auto beta = scalar_like(x, a.beta);
  auto zero = scalar_like(x, 0);
  const std::string& n = a.name;
  if (n == "sigmoid") return mx::sigmoid(x, s);
  if (n == "tanh") return mx::tanh(x, s);
  if (n == "relu") return mx::maximum(x, zero, s);
  if (n == "affine") return mx::add(mx::multiply(alpha, x, s), beta, s);
  if (n == "leakyrelu") return mx::where(mx::less(x, zero, s), mx::multiply(alpha, x, s), x, s);
  if (n == "thresholdedrelu") return mx::where(mx::greater(x, alpha, s), x, zero, s);
  if (n == "scaledtanh") return mx::multiply(alpha, mx::tanh(mx::multiply(beta, x, s), s), s);
  if (n == "hardsigmoid") {
    return mx::clip(mx::add(mx::multiply(alpha, x, s), beta, s), zero, scalar_like(x, 1), s);
  }
  if (n == "elu") return mx::where(mx::less(x, zero, s), mx::multiply(alpha, mx::expm1(x, s), s), x, s);
  if (n == "softsign") return mx::divide(x, mx::add(scalar_like(x, 1), mx::abs(x, s), s), s);
  return mx::logaddexp(x, zero, s);  // softplus
}

/** Attributes and weights of one layer, already checked. */
struct Layer {
  CellKind kind = CellKind::kRnn;
  int hidden = 0;
  int num_directions = 1;
  bool reverse_only = false;
  bool batch_major = false;  // layout 1: X [B, T, I], Y [B, T, D, H], states [B, D, H]
  std::optional<float> clip;
  bool input_forget = false;         // LSTM: couple the input and forget gates
  bool linear_before_reset = false;  // GRU
  std::vector<Activation> activations;
  RecurrentInput recurrent_input = nullptr;  // LSTM: what multiplies R (null: Ht-1)
};

// Everything the directions run together need at each step, stacked along
// a leading axis D' (both directions of a bidirectional layer whose
// activations agree, else one): one batched op per step serves them all.
// Time is aligned: step k of a reverse direction reads time T - 1 - k.
struct Directions {
  mx::array projected;                   // [D', T, B, G*H]: X W^T + the foldable biases
  mx::array recurrence;                  // [D', H, G*H]: R^T
  std::optional<mx::array> hidden_bias;  // GRU: Rbh [D', 1, H], added next to the recurrence
  std::vector<mx::array> peepholes;      // LSTM: P split into i, o, f, each [D', 1, H]
  std::optional<mx::array> mask;         // [D', T, B, 1]: step k is inside the sequence
  mx::array h;                           // [D', B, H]
  mx::array c;                           // [D', B, H] (LSTM)
  const Activation* activations;         // the shared f (g, h)
};

mx::array clipped(const Layer& layer, const mx::array& x, mx::StreamOrDevice s) {
  if (!layer.clip) return x;
  return mx::clip(x, scalar_like(x, -*layer.clip), scalar_like(x, *layer.clip), s);
}

// Ht = f(Xt Wi^T + Ht-1 Ri^T + Wbi + Rbi)
void rnn_step(const Layer& layer, Directions& d, const mx::array& x_t, mx::StreamOrDevice s) {
  mx::array pre = mx::add(x_t, mx::matmul(d.h, d.recurrence, s), s);
  d.h = activate(d.activations[0], clipped(layer, pre, s), s);
}

// zt = f(Xt Wz^T + Ht-1 Rz^T + Wbz + Rbz), rt likewise;
// ht = g(Xt Wh^T + (rt . Ht-1) Rh^T + Rbh + Wbh)      (linear_before_reset 0)
// ht = g(Xt Wh^T + rt . (Ht-1 Rh^T + Rbh) + Wbh)      (linear_before_reset 1)
// Ht = (1 - zt) . ht + zt . Ht-1
void gru_step(const Layer& layer, Directions& d, const mx::array& x_t, mx::StreamOrDevice s) {
  const int H = layer.hidden;
  std::vector<mx::array> x = mx::split(x_t, 3, -1, s);  // z, r, h
  std::vector<mx::array> r_zr_h = mx::split(d.recurrence, mx::Shape{2 * H}, -1, s);
  std::vector<mx::array> h_zr = mx::split(mx::matmul(d.h, r_zr_h[0], s), 2, -1, s);
  mx::array z = activate(d.activations[0], clipped(layer, mx::add(x[0], h_zr[0], s), s), s);
  mx::array r = activate(d.activations[0], clipped(layer, mx::add(x[1], h_zr[1], s), s), s);
  mx::array recurrent_h = [&] {
    if (layer.linear_before_reset) {
      mx::array linear = mx::matmul(d.h, r_zr_h[1], s);
      if (d.hidden_bias) linear = mx::add(linear, *d.hidden_bias, s);
      return mx::multiply(r, linear, s);
    }
    mx::array linear = mx::matmul(mx::multiply(r, d.h, s), r_zr_h[1], s);
    return d.hidden_bias ? mx::add(linear, *d.hidden_bias, s) : linear;
  }();
  mx::array candidate = activate(d.activations[1], clipped(layer, mx::add(x[2], recurrent_h, s), s), s);
  mx::array one = scalar_like(z, 1);
  d.h = mx::add(mx::multiply(mx::subtract(one, z, s), candidate, s), mx::multiply(z, d.h, s), s);
}

// it = f(Xt Wi^T + Ht-1 Ri^T + Pi . Ct-1 + Wbi + Rbi)
// ft = f(Xt Wf^T + Ht-1 Rf^T + Pf . Ct-1 + Wbf + Rbf)   (1 - it with input_forget)
// ct = g(Xt Wc^T + Ht-1 Rc^T + Wbc + Rbc)
// Ct = ft . Ct-1 + it . ct
// ot = f(Xt Wo^T + Ht-1 Ro^T + Po . Ct + Wbo + Rbo)
// Ht = ot . h(Ct)
void lstm_step(const Layer& layer, Directions& d, const mx::array& x_t, mx::StreamOrDevice s) {
  const mx::array h = layer.recurrent_input ? layer.recurrent_input(d.h, s) : d.h;
  std::vector<mx::array> gates = mx::split(mx::add(x_t, mx::matmul(h, d.recurrence, s), s), 4, -1, s);
  auto with_peephole = [&](const mx::array& g, int index, const mx::array& c) {
    if (d.peepholes.empty()) return clipped(layer, g, s);
    return clipped(layer, mx::add(g, mx::multiply(d.peepholes[index], c, s), s), s);
  };
  const Activation& f = d.activations[0];
  mx::array i = activate(f, with_peephole(gates[0], 0, d.c), s);
  mx::array forget = layer.input_forget ? mx::subtract(scalar_like(i, 1), i, s)
                                        : activate(f, with_peephole(gates[2], 2, d.c), s);
  mx::array cell = activate(d.activations[1], clipped(layer, gates[3], s), s);
  d.c = mx::add(mx::multiply(forget, d.c, s), mx::multiply(i, cell, s), s);
  mx::array o = activate(f, with_peephole(gates[1], 1, d.c), s);
  d.h = mx::multiply(o, activate(d.activations[2], d.c, s), s);
}

struct DirectionsResult {
  mx::array y;  // [D', T, B, H], time aligned as the inputs
  mx::array h;  // [D', B, H]
  mx::array c;  // [D', B, H]
};

// Runs the stacked directions over all time steps. The mask (none when every
// sequence is full length) freezes the state of ended sequences.
DirectionsResult run_directions(const Layer& layer, Directions d, mx::StreamOrDevice s) {
  const int steps = d.projected.shape(1);
  std::vector<mx::array> y;
  for (int k = 0; k < steps; ++k) {
    mx::array x_k = mx::take(d.projected, k, 1, s);
    const mx::array h_before = d.h;
    const mx::array c_before = d.c;
    switch (layer.kind) {
      case CellKind::kRnn:
        rnn_step(layer, d, x_k, s);
        break;
      case CellKind::kGru:
        gru_step(layer, d, x_k, s);
        break;
      case CellKind::kLstm:
        lstm_step(layer, d, x_k, s);
        break;
    }
    if (d.mask) {
      mx::array m = mx::take(*d.mask, k, 1, s);
      y.push_back(mx::where(m, d.h, scalar_like(d.h, 0), s));
      d.h = mx::where(m, d.h, h_before, s);
      if (layer.kind == CellKind::kLstm) d.c = mx::where(m, d.c, c_before, s);
    } else {
      y.push_back(d.h);
    }
  }
  mx::Shape empty = d.h.shape();
  empty.insert(empty.begin() + 1, 0);
  return {steps == 0 ? mx::zeros(empty, d.h.dtype(), s) : mx::stack(y, 1, s), d.h, d.c};
}

bool same_activations(const Activation* a, const Activation* b, int count) {
  for (int i = 0; i < count; ++i) {
    if (a[i].name != b[i].name || a[i].alpha != b[i].alpha || a[i].beta != b[i].beta) return false;
  }
  return true;
}

/** Checks that `a` has `shape`; names the input in the error. */
void expect_shape(const NodeContext& ctx, const mx::array& a, const mx::Shape& shape, const char* name) {
  if (a.shape() != shape) {
    std::string want, got;
    for (int d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
    for (int d : a.shape()) got += (got.empty() ? "" : ", ") + std::to_string(d);
    throw ctx.error(name, " must have shape [", want, "], got [", got, "]");
  }
}

Layer parse_layer(const NodeContext& ctx, CellKind kind, int num_directions_from_w) {
  Layer layer;
  layer.kind = kind;
  const std::string direction = ctx.attr_string("direction", "forward");
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional") {
    throw ctx.error("direction must be forward, reverse or bidirectional, got '", direction, "'");
  }
  layer.num_directions = direction == "bidirectional" ? 2 : 1;
  layer.reverse_only = direction == "reverse";
  if (num_directions_from_w != layer.num_directions) {
    throw ctx.error("W has ", num_directions_from_w, " directions but direction is '", direction, "'");
  }
  const int64_t layout = ctx.attr_int("layout", 0);
  if (layout != 0 && layout != 1) throw ctx.error("layout must be 0 or 1, got ", layout);
  layer.batch_major = layout == 1;
  if (ctx.has_attr("clip")) {
    float clip = ctx.attr_float("clip", 0);
    if (!(clip > 0)) throw ctx.error("clip must be positive, got ", clip);
    layer.clip = clip;
  }
  layer.input_forget = ctx.attr_int("input_forget", 0) != 0;
  layer.linear_before_reset = ctx.attr_int("linear_before_reset", 0) != 0;
  layer.activations = parse_activations(ctx, kind, layer.num_directions);
  return layer;
}

// Inputs: X, W, R, B, sequence_lens, initial_h (, initial_c, P for LSTM).
// Outputs: Y, Y_h (, Y_c for LSTM).
// X, W and R come from the caller: inputs 0, 1 and 2, or DynamicQuantizeLSTM's
// dequantized values.
OpOutputs recurrent_layer(NodeContext& ctx, CellKind kind, const mx::array& x_in, const mx::array& w,
                          const mx::array& r, RecurrentInput recurrent_input = nullptr) {
  auto s = ctx.stream();
  if (!mx::issubdtype(x_in.dtype(), mx::floating))
    throw ctx.error("X must be a float tensor, got ", x_in.dtype());
  if (x_in.ndim() != 3) throw ctx.error("X must have rank 3, got ", x_in.ndim());
  if (w.ndim() != 3 || r.ndim() != 3)
    throw ctx.error("W and R must have rank 3, got ", w.ndim(), " and ", r.ndim());
  if (w.dtype() != x_in.dtype() || r.dtype() != x_in.dtype()) throw ctx.error("W and R must have X's dtype");

  Layer layer = parse_layer(ctx, kind, w.shape(0));
  layer.recurrent_input = recurrent_input;
  const int G = gate_count(kind);
  const int D = layer.num_directions;
  const int H = r.shape(2);
  layer.hidden = H;
  if (ctx.has_attr("hidden_size") && ctx.attr_int("hidden_size", 0) != H) {
    throw ctx.error("hidden_size ", ctx.attr_int("hidden_size", 0), " does not match R's last dim ", H);
  }
  // [T, B, I] whatever the layout.
  mx::array x = layer.batch_major ? mx::transpose(x_in, {1, 0, 2}, s) : x_in;
  const int T = x.shape(0), B = x.shape(1), I = x.shape(2);
  expect_shape(ctx, w, {D, G * H, I}, "W");
  expect_shape(ctx, r, {D, G * H, H}, "R");

  std::optional<mx::array> bias = ctx.optional_input(3);
  if (bias) expect_shape(ctx, *bias, {D, 2 * G * H}, "B");

  std::optional<mx::array> mask;  // [T, B, 1]
  if (auto lens = ctx.optional_input(4)) {
    if (!mx::issubdtype(lens->dtype(), mx::integer))
      throw ctx.error("sequence_lens must be an integer tensor");
    expect_shape(ctx, *lens, {B}, "sequence_lens");
    // Known lengths are checked; traced ones (under compile) are used as
    // masks, where a length beyond T acts as T and one below 1 keeps the
    // initial state.
    if (!lens->is_tracer()) {
      for (int64_t length : ctx.host_ints(4)) {
        if (length < 0 || length > T) throw ctx.error("sequence length ", length, " outside [0, ", T, "]");
      }
    }
    mx::array steps = mx::reshape(mx::arange(T, mx::int32, s), {T, 1, 1}, s);
    mask = mx::less(steps, mx::reshape(mx::astype(*lens, mx::int32, s), {1, B, 1}, s), s);
  }
  // Initial states as [D, B, H].
  auto initial_state = [&](size_t index, const char* name) -> mx::array {
    std::optional<mx::array> given = ctx.optional_input(index);
    if (!given) return mx::zeros({D, B, H}, x.dtype(), s);
    expect_shape(ctx, *given, layer.batch_major ? mx::Shape{B, D, H} : mx::Shape{D, B, H}, name);
    return layer.batch_major ? mx::transpose(*given, {1, 0, 2}, s) : *given;
  };
  mx::array h0 = initial_state(5, "initial_h");
  mx::array c0 = kind == CellKind::kLstm ? initial_state(6, "initial_c") : h0;
  std::optional<mx::array> peepholes = kind == CellKind::kLstm ? ctx.optional_input(7) : std::nullopt;
  if (peepholes) expect_shape(ctx, *peepholes, {D, 3 * H}, "P");

  // Direction dir's inputs, time aligned and with a leading axis of 1.
  mx::array reversed_time = mx::subtract(mx::array(T - 1), mx::arange(T, mx::int32, s), s);
  auto is_reverse = [&](int dir) { return layer.reverse_only || dir == 1; };
  auto align = [&](const mx::array& a, int dir, int time_axis) {
    return is_reverse(dir) && T > 1 ? mx::take(a, reversed_time, time_axis, s) : a;
  };
  auto one_direction = [&](int dir) {
    auto row = [&](const mx::array& a) {
      return mx::slice(a, {dir, 0, 0}, {dir + 1, a.shape(1), a.shape(2)}, s);
    };
    Directions d{mx::matmul(align(x, dir, 0), mx::transpose(row(w), {0, 2, 1}, s), s),  // [1, T, B, G*H]
                 mx::transpose(row(r), {0, 2, 1}, s),
                 std::nullopt,
                 {},
                 std::nullopt,
                 row(h0),
                 row(c0),
                 &layer.activations[dir * activations_per_direction(kind)]};
    d.projected = mx::expand_dims(d.projected, 0, s);
    if (bias) {
      mx::array b_d = mx::reshape(mx::slice(*bias, {dir, 0}, {dir + 1, 2 * G * H}, s), {2 * G * H}, s);
      mx::array wb = mx::slice(b_d, {0}, {G * H}, s);
      mx::array rb = mx::slice(b_d, {G * H}, {2 * G * H}, s);
      if (kind == CellKind::kGru) {
        // Rbh sits next to the recurrence (inside the reset gate's product
        // with linear_before_reset), so only Rbz and Rbr fold into the input.
        d.hidden_bias = mx::reshape(mx::slice(rb, {2 * H}, {3 * H}, s), {1, 1, H}, s);
        rb = mx::concatenate({mx::slice(rb, {0}, {2 * H}, s), mx::zeros({H}, rb.dtype(), s)}, 0, s);
      }
      d.projected = mx::add(d.projected, mx::add(wb, rb, s), s);
    }
    if (peepholes) {
      mx::array p_d = mx::reshape(mx::slice(*peepholes, {dir, 0}, {dir + 1, 3 * H}, s), {1, 1, 3 * H}, s);
      d.peepholes = mx::split(p_d, 3, -1, s);
    }
    if (mask) d.mask = mx::expand_dims(align(*mask, dir, 0), 0, s);
    return d;
  };
  // Stacks directions along axis 0.
  auto stack = [&](std::vector<Directions> parts) {
    if (parts.size() == 1) return parts[0];
    Directions d = parts[0];
    auto join = [&](auto member) {
      std::vector<mx::array> all;
      for (const Directions& p : parts) all.push_back(member(p));
      return mx::concatenate(all, 0, s);
    };
    d.projected = join([](const Directions& p) { return p.projected; });
    d.recurrence = join([](const Directions& p) { return p.recurrence; });
    if (d.hidden_bias) d.hidden_bias = join([](const Directions& p) { return *p.hidden_bias; });
    for (size_t i = 0; i < d.peepholes.size(); ++i) {
      d.peepholes[i] = join([&](const Directions& p) { return p.peepholes[i]; });
    }
    if (d.mask) d.mask = join([](const Directions& p) { return *p.mask; });
    d.h = join([](const Directions& p) { return p.h; });
    d.c = join([](const Directions& p) { return p.c; });
    return d;
  };

  std::vector<mx::array> ys, hs, cs;  // per direction: [1, T, B, H], [1, B, H], [1, B, H]
  auto collect = [&](const DirectionsResult& result, int first_dir) {
    for (int i = 0; i < result.y.shape(0); ++i) {
      const int dir = first_dir + i;
      auto row = [&](const mx::array& a) {
        mx::Shape start(a.ndim(), 0), stop = a.shape();
        start[0] = i;
        stop[0] = i + 1;
        return mx::slice(a, start, stop, s);
      };
      ys.push_back(align(row(result.y), dir, 1));
      hs.push_back(row(result.h));
      cs.push_back(row(result.c));
    }
  };
  const int per_direction = activations_per_direction(kind);
  if (D == 2 && same_activations(&layer.activations[0], &layer.activations[per_direction], per_direction)) {
    collect(run_directions(layer, stack({one_direction(0), one_direction(1)}), s), 0);
  } else {
    for (int dir = 0; dir < D; ++dir) collect(run_directions(layer, one_direction(dir), s), dir);
  }

  // Y [T, D, B, H] (layout 1: [B, T, D, H]); Y_h, Y_c [D, B, H] (layout 1: [B, D, H]).
  mx::array y = mx::transpose(mx::concatenate(ys, 0, s), {1, 0, 2, 3}, s);
  mx::array y_h = mx::concatenate(hs, 0, s);
  mx::array y_c = mx::concatenate(cs, 0, s);
  if (layer.batch_major) {
    y = mx::transpose(y, {2, 0, 1, 3}, s);
    y_h = mx::transpose(y_h, {1, 0, 2}, s);
    y_c = mx::transpose(y_c, {1, 0, 2}, s);
  }
  if (kind == CellKind::kLstm) return {y, y_h, y_c};
  return {y, y_h};
}

OpOutputs rnn(NodeContext& ctx) {
  return recurrent_layer(ctx, CellKind::kRnn, ctx.input(0), ctx.input(1), ctx.input(2));
}
OpOutputs gru(NodeContext& ctx) {
  return recurrent_layer(ctx, CellKind::kGru, ctx.input(0), ctx.input(1), ctx.input(2));
}
OpOutputs lstm(NodeContext& ctx) {
  return recurrent_layer(ctx, CellKind::kLstm, ctx.input(0), ctx.input(1), ctx.input(2));
}

}  // namespace

OpOutputs lstm_with_weights(NodeContext& ctx, const mx::array& x, const mx::array& w, const mx::array& r,
                            RecurrentInput recurrent_input) {
  return recurrent_layer(ctx, CellKind::kLstm, x, w, r, recurrent_input);
}

void register_rnn(OpRegistry& r) {
  // One implementation reads each attribute with the spec's default, so a
  // version that lacks an attribute gets that default. v1 has output_sequence
  // (Y is computed whenever it is requested, which is what that flag
  // selects); GRU v3 adds linear_before_reset; v7 drops output_sequence; v14
  // adds layout; v22 adds bfloat16.
  r.add({
      {"RNN", kOnnx, 1, 6, rnn},
      {"RNN", kOnnx, 7, 13, rnn},
      {"RNN", kOnnx, 14, 21, rnn},
      {"RNN", kOnnx, 22, kOpen, rnn},
      {"GRU", kOnnx, 1, 2, gru},
      {"GRU", kOnnx, 3, 6, gru},
      {"GRU", kOnnx, 7, 13, gru},
      {"GRU", kOnnx, 14, 21, gru},
      {"GRU", kOnnx, 22, kOpen, gru},
      {"LSTM", kOnnx, 1, 6, lstm},
      {"LSTM", kOnnx, 7, 13, lstm},
      {"LSTM", kOnnx, 14, 21, lstm},
      {"LSTM", kOnnx, 22, kOpen, lstm},
  });
}

}  // namespace transmuter
