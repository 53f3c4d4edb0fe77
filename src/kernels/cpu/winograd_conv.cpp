// Compiled once per SIMD target (Highway's foreach_target re-includes this
// file) for the input and output transforms; the products run on the GEMM.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/winograd_conv.cpp"
#include <hwy/foreach_target.h>  // must come before highway.h

#include <hwy/highway.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/conv_activation-inl.h"
#include "kernels/cpu/partial_vectors-inl.h"

#ifndef TRANSMUTER_WINOGRAD_ARGS_ONCE
#define TRANSMUTER_WINOGRAD_ARGS_ONCE
namespace transmuter::kernels {

// One call's pointers and geometry (outside the per-target namespaces).
struct WinogradArgs {
  const float* x;         // [N, in_h, in_w, C]
  const float* u;         // [16, panels, C, panel_width]
  const float* bias;      // [M] or null
  const float* residual;  // [N, out_h, out_w, M] or null
  float* y;               // [N, out_h, out_w, M]
  int64_t batch, channels, out_channels, in_h, in_w, out_h, out_w, pad_top, pad_left;
  int64_t panels, panel_width;
  int activation;  // a ConvActivation
  float clip_min, clip_max;

  int64_t tiles_h() const { return (out_h + 1) / 2; }
  int64_t tiles_w() const { return (out_w + 1) / 2; }
  int64_t tiles() const { return batch * tiles_h() * tiles_w(); }
};

// Where tile t lies: image n, first output row oy and column ox (even).
struct TilePosition {
  int64_t n, oy, ox;
};

inline TilePosition tile_position(const WinogradArgs& a, int64_t t) {
  const int64_t per_image = a.tiles_h() * a.tiles_w(), r = t % per_image;
  return {t / per_image, 2 * (r / a.tiles_w()), 2 * (r % a.tiles_w())};
}

}  // namespace transmuter::kernels
#endif

HWY_BEFORE_NAMESPACE();
namespace transmuter::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;

HWY_INLINE V Activate(const WinogradArgs& a, V v) {
  return ApplyConvActivation(D(), v, static_cast<ConvActivation>(a.activation), a.clip_min, a.clip_max);
}

// B^T x B for a 4x4 block x (row-major, in place): rows, then columns.
HWY_INLINE void InputTransform4x4(V* x) {
  for (int j = 0; j < 4; ++j) {
    const V d0 = x[j], d1 = x[4 + j], d2 = x[8 + j], d3 = x[12 + j];
    x[j] = hn::Sub(d0, d2);
    x[4 + j] = hn::Add(d1, d2);
    x[8 + j] = hn::Sub(d2, d1);
    x[12 + j] = hn::Sub(d1, d3);
  }
  for (int i = 0; i < 16; i += 4) {
    const V d0 = x[i], d1 = x[i + 1], d2 = x[i + 2], d3 = x[i + 3];
    x[i] = hn::Sub(d0, d2);
    x[i + 1] = hn::Add(d1, d2);
    x[i + 2] = hn::Sub(d2, d1);
    x[i + 3] = hn::Sub(d1, d3);
  }
}

// Tiles [tile0, tile0 + count) transformed: v[e][t][c] at v + (e * count + t) * C, for the 16
// positions e of the transformed block. Input outside the image (the padding) reads as zeros.
void InputTiles(const WinogradArgs& a, int64_t tile0, int64_t count, float* v) {
  const D d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d)), C = a.channels;
  for (int64_t t = 0; t < count; ++t) {
    const TilePosition p = tile_position(a, tile0 + t);
    const int64_t iy0 = p.oy - a.pad_top, ix0 = p.ox - a.pad_left;
    const float* rows[4];
    for (int i = 0; i < 4; ++i) {
      const int64_t iy = iy0 + i;
      rows[i] = iy >= 0 && iy < a.in_h ? a.x + ((p.n * a.in_h + iy) * a.in_w) * C : nullptr;
    }
    bool column_inside[4];
    for (int j = 0; j < 4; ++j) column_inside[j] = ix0 + j >= 0 && ix0 + j < a.in_w;
    float* out = v + t * C;
    for (int64_t c = 0; c < C; c += lanes) {
      const size_t valid = static_cast<size_t>(std::min(lanes, C - c));
      V x[16];
      for (int i = 0; i < 4; ++i) {
        for (int j = 0; j < 4; ++j) {
          x[4 * i + j] = rows[i] != nullptr && column_inside[j]
                             ? LoadFirst(d, rows[i] + (ix0 + j) * C + c, valid)
                             : hn::Zero(d);
        }
      }
      InputTransform4x4(x);
      for (int e = 0; e < 16; ++e) StoreFirst(x[e], d, out + e * count * C + c, valid);
    }
  }
}

// Tiles [tile0, tile0 + count), output channels [col0, col0 + cols): from the products
// m[e][t][j] at m + (e * count + t) * ldm + j, y = act(A^T m A + bias + residual) for the
// outputs that lie inside the image (a tile may hang over its last row or column).
void OutputTiles(const WinogradArgs& a, int64_t tile0, int64_t count, int64_t col0, int64_t cols,
                 const float* m, int64_t ldm) {
  const D d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d)), M = a.out_channels;
  for (int64_t t = 0; t < count; ++t) {
    const TilePosition p = tile_position(a, tile0 + t);
    const int64_t rows_inside = std::min<int64_t>(2, a.out_h - p.oy),
                  cols_inside = std::min<int64_t>(2, a.out_w - p.ox);
    const float* in = m + t * ldm;
    for (int64_t j = 0; j < cols; j += lanes) {
      const size_t valid = static_cast<size_t>(std::min(lanes, cols - j));
      V s[8];  // A^T m: 2 rows x 4
      for (int k = 0; k < 4; ++k) {
        const V m0 = LoadFirst(d, in + (0 * 4 + k) * count * ldm + j, valid);
        const V m1 = LoadFirst(d, in + (1 * 4 + k) * count * ldm + j, valid);
        const V m2 = LoadFirst(d, in + (2 * 4 + k) * count * ldm + j, valid);
        const V m3 = LoadFirst(d, in + (3 * 4 + k) * count * ldm + j, valid);
        s[k] = hn::Add(hn::Add(m0, m1), m2);
        s[4 + k] = hn::Sub(hn::Sub(m1, m2), m3);
      }
      const V bias = a.bias != nullptr ? LoadFirst(d, a.bias + col0 + j, valid) : hn::Zero(d);
      for (int r = 0; r < rows_inside; ++r) {
        const V* sr = s + 4 * r;
        const V out[2] = {hn::Add(hn::Add(hn::Add(sr[0], sr[1]), sr[2]), bias),
                          hn::Add(hn::Sub(hn::Sub(sr[1], sr[2]), sr[3]), bias)};
        for (int q = 0; q < cols_inside; ++q) {
          const int64_t at = ((p.n * a.out_h + p.oy + r) * a.out_w + p.ox + q) * M + col0 + j;
          V y = out[q];
          if (a.residual != nullptr) y = hn::Add(y, LoadFirst(d, a.residual + at, valid));
          StoreFirst(Activate(a, y), d, a.y + at, valid);
        }
      }
    }
  }
}

}  // namespace transmuter::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/conv_nhwc.h"
#include "kernels/cpu/conv_nhwc_args.h"
#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/winograd_conv.h"
#include "mlx_bridge/buffers.h"

namespace transmuter::kernels {

HWY_EXPORT(InputTiles);
HWY_EXPORT(OutputTiles);


namespace {

constexpr int kPositions = 16;    // of a transformed 4x4 block

// The transformed tiles of one task, and its 16 products, each at most this size (at least one
// register tile of rows): in the core's L2 beside the weights. ResNet-50's 3x3 convs, kernel time at
// 96 / 384 KiB: 14x14x256 b1 0.80-0.83 / 0.91-0.93 ms, 28x28x128 0.73-0.74 / 0.82; b8 equal within
// noise.
constexpr int64_t kTaskBufferBytes = int64_t{96} << 10;
// Up to this many tiles in all (a small image deep in a network) go in one block of tiles, however many
// channels: each block reads every transformed weight of its panels, and ResNet-50's last stage at
// batch 1 (16 tiles x 512 channels) had read its 16.8 MB of weights in three blocks of 6 tiles (kernel
// time 856-882 -> 608-646 us, alternating processes; with every block at least 18 tiles stages 2 and 3
// were slower, 325 -> 353 and 450 -> 463 us, so only the few-tile case).
constexpr int64_t kFewTiles = 3 * kGemmTileRows;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Each task transforms a block of tiles (all input channels), multiplies them by the transformed
// weights of a block of output-channel panels (16 products) and transforms the products back into
// the output. Few tiles with wide weights (a small image deep in a network) split the panels between
// the tasks instead; each of those transforms the tiles again, 32 x C additions per tile against the
// 16 x C x (panel block's columns) multiply-adds of its products.
void run_winograd(const WinogradArgs& a) {
  const int64_t C = a.channels, P = a.panel_width, float_bytes = sizeof(float);
  const int64_t buffer_tiles =
      kTaskBufferBytes / (kPositions * C * float_bytes) / kGemmTileRows * kGemmTileRows;
  const int64_t max_tiles =
      std::max({kGemmTileRows, buffer_tiles, a.tiles() <= kFewTiles ? kFewTiles : int64_t{0}});
  const int64_t max_panels =
      std::max<int64_t>(1, kTaskBufferBytes / (kPositions * max_tiles * P * float_bytes));
  const BlockSplit split(a.tiles(), a.panels, max_tiles, kGemmTileRows, max_panels);
  parallel_for(split.tasks(), 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> transformed, products;
    for (int64_t task = begin; task < end; ++task) {
      int64_t tile0, tiles, panel0, panels;
      split.task(task, tile0, tiles, panel0, panels);
      transformed.resize(static_cast<size_t>(kPositions * tiles * C));
      HWY_DYNAMIC_DISPATCH(InputTiles)(a, tile0, tiles, transformed.data());
      const int64_t col0 = panel0 * P, cols = std::min(panels * P, a.out_channels - col0), ldm = panels * P;
      products.resize(static_cast<size_t>(kPositions * tiles * ldm));
      for (int e = 0; e < kPositions; ++e) {
        GemmArgs g;
        g.a = transformed.data() + e * tiles * C;
        g.lda = C;
        g.packed = a.u + (e * a.panels + panel0) * C * P;
        g.y = products.data() + e * tiles * ldm;
        g.ldy = ldm;
        g.m = tiles;
        g.k = C;
        g.n = cols;
        run_gemm_on_this_thread(g);
      }
      HWY_DYNAMIC_DISPATCH(OutputTiles)(a, tile0, tiles, col0, cols, products.data(), ldm);
    }
  });
}

class WinogradConvKernel : public CpuKernel {
 public:
  WinogradConvKernel(mx::Stream stream, Reference reference, NhwcConvOptions options, bool has_bias,
                     bool has_residual)
      : CpuKernel(stream, std::move(reference)),
        options_(options),
        has_bias_(has_bias),
        has_residual_(has_residual) {}
  const char* name() const override { return "transmuter::WinogradConvNhwc"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const WinogradConvKernel*>(&other);
    return o != nullptr && o->options_ == options_ && o->has_bias_ == has_bias_ &&
           o->has_residual_ == has_residual_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    const mx::array &x = in[0], &u = in[1], &y = out[0];
    WinogradArgs a{};
    a.x = x.data<float>();
    a.u = u.data<float>();
    a.bias = has_bias_ ? in[2].data<float>() : nullptr;
    a.residual = has_residual_ ? in.back().data<float>() : nullptr;
    a.y = out[0].data<float>();
    a.batch = x.shape(0), a.in_h = x.shape(1), a.in_w = x.shape(2), a.channels = x.shape(3);
    a.out_h = y.shape(1), a.out_w = y.shape(2), a.out_channels = y.shape(3);
    a.pad_top = options_.pads_begin[0], a.pad_left = options_.pads_begin[1];
    a.panels = u.shape(1), a.panel_width = u.shape(3);
    a.activation = static_cast<int>(options_.activation);
    a.clip_min = options_.clip_min, a.clip_max = options_.clip_max;
    return [a] { run_winograd(a); };
  }
  // The output takes the residual's buffer when nothing else holds it: each output element is
  // written only after its tile has read the residual under it (as ConvNhwc's GEMM epilogue).
  int donor_of(size_t) const override { return has_residual_ ? (has_bias_ ? 3 : 2) : -1; }

 private:
  NhwcConvOptions options_;
  bool has_bias_, has_residual_;
};

// g = L U L^T with L = [[1,0,0,0],[0,1,-1,0],[0,0,0,1]], per filter: L's rows as (position, sign) terms.
struct Term {
  int position;
  float sign;
};
const std::vector<Term> kRecover[3] = {{{0, 1.0f}}, {{1, 1.0f}, {2, -1.0f}}, {{3, 1.0f}}};

}  // namespace

bool winograd_conv_fits(const NhwcConvOptions& o) {
  return o.kernel == std::array<int, 2>{3, 3} && o.strides == std::array<int, 2>{1, 1} &&
         o.dilations == std::array<int, 2>{1, 1} && !o.channels_first_input;
}

namespace {

// U = G g G^T for input channel c of panel p (all its `width` filters at once: the loops over j
// vectorize), tap(ky, kx) giving the row of that tap's `width` values; into u [16, panels, C, width].
template <typename Tap>
void transform_panel_channel(const Tap& tap, int64_t p, int64_t c, int64_t panels, int64_t C, int64_t width,
                             float* gg /* [4][3][width] */, float* u) {
  for (int kx = 0; kx < 3; ++kx) {
    const float *g0 = tap(0, kx), *g1 = tap(1, kx), *g2 = tap(2, kx);
    float* col = gg + kx * width;
    for (int64_t j = 0; j < width; ++j) {
      col[j] = g0[j];
      col[3 * width + j] = 0.5f * (g0[j] + g1[j] + g2[j]);
      col[6 * width + j] = 0.5f * (g0[j] - g1[j] + g2[j]);
      col[9 * width + j] = g2[j];
    }
  }
  for (int xi = 0; xi < 4; ++xi) {
    const float* r = gg + xi * 3 * width;  // row xi of G g: 3 taps
    float* out[4];
    for (int nu = 0; nu < 4; ++nu) out[nu] = u + (((xi * 4 + nu) * panels + p) * C + c) * width;
    for (int64_t j = 0; j < width; ++j) {
      const float r0 = r[j], r1 = r[width + j], r2 = r[2 * width + j];
      out[0][j] = r0;
      out[1][j] = 0.5f * (r0 + r1 + r2);
      out[2][j] = 0.5f * (r0 - r1 + r2);
      out[3][j] = r2;
    }
  }
}

MlxBuffer transformed_weight_buffer(int64_t panels, int64_t C, int64_t width) {
  return MlxBuffer(static_cast<size_t>(kPositions * panels * C * width) * sizeof(float),
                   BufferLifetime::kPacked);
}

mx::array into_transformed(MlxBuffer&& buffer, int64_t panels, int64_t C, int64_t width) {
  return std::move(buffer).into_array(
      {kPositions, static_cast<int>(panels), static_cast<int>(C), static_cast<int>(width)}, mx::float32);
}

}  // namespace

mx::array winograd_weight_from_packed(const mx::array& packed, int64_t channels) {
  const int64_t width = gemm_panel_width();
  if (packed.dtype() != mx::float32 || packed.ndim() != 3 || channels <= 0 ||
      packed.shape(1) != 9 * channels || packed.shape(2) != width) {
    throw std::invalid_argument("winograd_weight_from_packed: expected a packed 3x3 weight [panels, " +
                                std::to_string(9 * channels) + ", " + std::to_string(width) + "]");
  }
  mx::array source = packed;
  source.eval();
  const float* g = source.data<float>();
  const int64_t panels = packed.shape(0), C = channels;
  MlxBuffer buffer = transformed_weight_buffer(panels, C, width);
  float* u = buffer.as<float>();
  parallel_for(panels, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> gg(static_cast<size_t>(12 * width));
    for (int64_t p = begin; p < end; ++p) {
      for (int64_t c = 0; c < C; ++c) {
        // tap (ky, kx) of input channel c: row (ky * 3 + kx) * C + c of the panel
        auto tap = [&](int ky, int kx) { return g + (p * 9 * C + (ky * 3 + kx) * C + c) * width; };
        transform_panel_channel(tap, p, c, panels, C, width, gg.data(), u);
      }
    }
  });
  return into_transformed(std::move(buffer), panels, C, width);
}

mx::array winograd_weight_from_filters(const mx::array& w) {
  if (w.ndim() != 4 || w.shape(2) != 3 || w.shape(3) != 3 || w.size() == 0 ||
      !mx::issubdtype(w.dtype(), mx::floating)) {
    throw std::invalid_argument("winograd_weight_from_filters: expected a float 3x3 weight [M, C, 3, 3]");
  }
  mx::array keep = w;
  const uint8_t* filters = host_bytes(w, /*as_float32=*/true, keep).data();
  const int64_t m = w.shape(0), C = w.shape(1), width = gemm_panel_width(), panels = ceil_div(m, width);
  MlxBuffer buffer = transformed_weight_buffer(panels, C, width);
  float* u = buffer.as<float>();
  // Each panel's filters transposed as packing transposes them (rows in the filters' (c, tap) order),
  // then transformed as winograd_weight_from_packed transforms the packed panel: the same floats.
  parallel_for(panels, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> by_channel(static_cast<size_t>(9 * C * width)), gg(static_cast<size_t>(12 * width));
    for (int64_t p = begin; p < end; ++p) {
      filter_panel_by_channel(filters, m, 9 * C, p, by_channel.data());
      for (int64_t c = 0; c < C; ++c) {
        auto tap = [&](int ky, int kx) { return by_channel.data() + (c * 9 + ky * 3 + kx) * width; };
        transform_panel_channel(tap, p, c, panels, C, width, gg.data(), u);
      }
    }
  });
  return into_transformed(std::move(buffer), panels, C, width);
}

mx::array winograd_weight_to_hwcm(const mx::array& u, int64_t m, mx::StreamOrDevice s) {
  std::vector<mx::array> positions;  // U_e as [C, m]
  for (int e = 0; e < kPositions; ++e) {
    mx::array ue =
        mx::squeeze(mx::slice(u, {e, 0, 0, 0}, {e + 1, u.shape(1), u.shape(2), u.shape(3)}, s), 0, s);
    positions.push_back(unpack_gemm_rhs(ue, m, s));
  }
  std::vector<mx::array> taps;
  for (int ky = 0; ky < 3; ++ky) {
    for (int kx = 0; kx < 3; ++kx) {
      std::optional<mx::array> sum;
      for (const Term& row : kRecover[ky]) {
        for (const Term& col : kRecover[kx]) {
          mx::array term = positions[row.position * 4 + col.position];
          if (row.sign * col.sign < 0) term = mx::negative(term, s);
          sum = sum ? mx::add(*sum, term, s) : term;
        }
      }
      taps.push_back(*sum);
    }
  }
  mx::array stacked = mx::stack(taps, 0, s);  // [9, C, m]
  return mx::reshape(stacked, {3, 3, stacked.shape(1), stacked.shape(2)}, s);
}

mx::array winograd_conv_nhwc(const mx::array& x, const mx::array& u, const std::optional<mx::array>& bias,
                             int64_t m, const NhwcConvOptions& o, mx::StreamOrDevice s,
                             const std::optional<mx::array>& residual) {
  if (!winograd_conv_fits(o)) {
    throw std::invalid_argument(
        "a Winograd convolution needs a 3x3 kernel, stride 1, dilation 1 and NHWC input");
  }
  check_conv_options(o);
  check_conv_bias(bias, m);
  if (x.dtype() != mx::float32 || x.ndim() != 4)
    throw std::invalid_argument("convolution input must be float32 [N, H, W, C]");
  const int64_t channels = x.shape(3), width = gemm_panel_width();
  if (u.dtype() != mx::float32 || u.ndim() != 4 || u.shape(0) != kPositions || m <= 0 ||
      u.shape(1) != ceil_div(m, width) || u.shape(2) != channels || u.shape(3) != width) {
    throw std::invalid_argument("Winograd weight does not match " + std::to_string(m) +
                                " output channels over " + std::to_string(channels) + " input channels");
  }
  const mx::Stream stream = mx::to_stream(s);
  const mx::Shape shape = nhwc_conv_output_shape(x, m, o);
  const bool has_bias = bias.has_value();
  const bool fused_residual = residual && residual->shape() == shape && residual->dtype() == mx::float32;
  Reference reference = [o, m, has_bias, fused_residual, stream](const std::vector<mx::array>& in) {
    mx::array w =
        mx::transpose(winograd_weight_to_hwcm(in[1], m, stream), {3, 0, 1, 2}, stream);  // [m, 3, 3, C]
    return std::vector<mx::array>{reference_conv_nhwc(in, w, 1, has_bias, fused_residual, o, stream)};
  };
  if (residual && !fused_residual) {
    NhwcConvOptions linear = o;
    linear.activation = ConvActivation::kNone;
    mx::array y = winograd_conv_nhwc(x, u, bias, m, linear, s);
    return apply_conv_activation(mx::add(y, *residual, stream), o.activation, o.clip_min, o.clip_max, stream);
  }
  std::vector<mx::array> inputs = {x, u};
  if (bias) inputs.push_back(*bias);
  if (fused_residual) inputs.push_back(*residual);
  if (!is_cpu_stream(stream) || x.size() == 0) return reference(inputs)[0];
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<WinogradConvKernel>(kernel_stream, reference, o, has_bias, fused_residual);
      },
      reference, std::move(inputs), {shape}, {mx::float32}, stream)[0];
}

}  // namespace transmuter::kernels
#endif  // HWY_ONCE
