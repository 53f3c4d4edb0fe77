#include "kernels/cpu/depthwise_block.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/conv_nhwc_args.h"
#include "kernels/cpu/cpu_kernel.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/thread_pool.h"

namespace transmuter::kernels {

namespace {

// Output positions of one strip step: the project product of one step has
// about this many rows (whole output rows: 1 row of a 112-wide image, 5 of a
// 14-wide one), enough for its register tiles to run full.
constexpr int64_t kStepPositions = 64;

// One call's pointers and geometry.
struct BlockArgs {
  NhwcConvArgs dw;           // the depthwise stage (its x and y unused: the strips give them)
  const float* x = nullptr;  // [N, in_h, in_w, in_channels]
  int64_t in_channels = 0;
  bool has_expand = false, has_project = false;
  GemmArgs expand, project;         // weights, biases, activations; rows and pointers set per step
  const float* residual = nullptr;  // [N, out_h, out_w, out_channels] or null
  float* y = nullptr;               // [N, out_h, out_w, out_channels]
  int64_t out_channels = 0;
  int64_t step_rows = 1;  // output rows per step
};

// Rows of the expanded input a step of `rows` output rows reads, at most.
int64_t window_rows(const NhwcConvArgs& dw, int64_t rows) {
  return (rows - 1) * dw.stride_h + (dw.kernel_h - 1) * dw.dilation_h + 1;
}

// The expanded rows [first, first + count) of image n, kept between the steps
// of one strip: a step keeps the rows it shares with the previous one (moved
// to the front) and computes the others with the expand product.
class ExpandedWindow {
 public:
  ExpandedWindow(const BlockArgs& b, int64_t n, std::vector<float>& storage)
      : b_(b), n_(n), row_floats_(b.dw.in_w * b.dw.channels) {
    storage.resize(static_cast<size_t>(window_rows(b.dw, b.step_rows) * row_floats_));
    data_ = storage.data();
  }

  // Makes the window hold rows [lo, hi) (lo never below the previous lo).
  void cover(int64_t lo, int64_t hi) {
    int64_t have = lo;  // rows [lo, have) are already in the window
    if (count_ > 0 && lo >= first_ && lo < first_ + count_) {
      have = std::min(hi, first_ + count_);
      std::memmove(data_, data_ + (lo - first_) * row_floats_,
                   static_cast<size_t>((have - lo) * row_floats_) * sizeof(float));
    }
    first_ = lo;
    count_ = hi - lo;
    if (have >= hi) return;
    GemmArgs g = b_.expand;
    g.a = b_.x + ((n_ * b_.dw.in_h + have) * b_.dw.in_w) * b_.in_channels;
    g.m = (hi - have) * b_.dw.in_w;
    g.y = data_ + (have - lo) * row_floats_;
    run_gemm_on_this_thread(g);
  }

  const float* row(int64_t iy) const { return data_ + (iy - first_) * row_floats_; }

 private:
  const BlockArgs& b_;
  int64_t n_, row_floats_;
  float* data_ = nullptr;
  int64_t first_ = 0, count_ = 0;
};

// Output rows [r0, r1) of image n.
void run_strip(const BlockArgs& b, int64_t n, int64_t r0, int64_t r1) {
  const NhwcConvArgs& dw = b.dw;
  thread_local std::vector<float> window_storage, depthwise_rows;
  std::optional<ExpandedWindow> window;
  if (b.has_expand) window.emplace(b, n, window_storage);
  const int64_t out_row_floats = dw.out_w * dw.channels;
  if (b.has_project) depthwise_rows.resize(static_cast<size_t>(b.step_rows * out_row_floats));
  std::vector<const float*> taps(static_cast<size_t>(dw.kernel_h));
  for (int64_t oy = r0; oy < r1; oy += b.step_rows) {
    const int64_t rows = std::min(b.step_rows, r1 - oy);
    const int64_t lo = std::clamp<int64_t>(dw.input_row(oy), 0, dw.in_h);
    const int64_t hi =
        std::clamp<int64_t>(dw.input_row(oy + rows - 1) + (dw.kernel_h - 1) * dw.dilation_h + 1, lo, dw.in_h);
    if (window) window->cover(lo, hi);
    for (int64_t j = 0; j < rows; ++j) {
      for (int64_t ky = 0; ky < dw.kernel_h; ++ky) {
        const int64_t iy = dw.input_row(oy + j) + ky * dw.dilation_h;
        if (iy < 0 || iy >= dw.in_h) {
          taps[ky] = nullptr;
        } else {
          taps[ky] = window ? window->row(iy) : b.x + ((n * dw.in_h + iy) * dw.in_w) * dw.channels;
        }
      }
      float* out = b.has_project ? depthwise_rows.data() + j * out_row_floats
                                 : b.y + ((n * dw.out_h + oy + j) * dw.out_w) * dw.channels;
      depthwise_row_from(dw, taps.data(), out);
    }
    if (!b.has_project) continue;
    const int64_t first_position = (n * dw.out_h + oy) * dw.out_w;
    GemmArgs g = b.project;
    g.a = depthwise_rows.data();
    g.m = rows * dw.out_w;
    g.y = b.y + first_position * b.out_channels;
    g.residual = b.residual != nullptr ? b.residual + first_position * b.out_channels : nullptr;
    run_gemm_on_this_thread(g);
  }
}

// Output rows per strip step: whole rows, about kStepPositions positions.
int64_t step_rows_of(const NhwcConvArgs& dw) {
  return std::clamp<int64_t>((kStepPositions + dw.out_w - 1) / dw.out_w, 1, dw.out_h);
}

// Strips per image: about two per thread, each image's rows in contiguous strips. A strip recomputes
// the expanded rows it shares with the strip above (the depthwise kernel's halo), so strips are kept at
// least four halos tall; when that leaves fewer strips than threads (a 14x14 image at batch 1), two
// halos tall, one strip per thread.
int64_t strips_per_image(const NhwcConvArgs& dw, bool has_expand) {
  const int64_t step_rows = step_rows_of(dw);
  const int64_t halo = has_expand ? std::max<int64_t>(0, window_rows(dw, 1) - dw.stride_h) : 0;
  auto strips_at_least = [&](int64_t halos, int64_t most) {
    const int64_t min_rows = std::max<int64_t>(step_rows, (halos * halo + dw.stride_h - 1) / dw.stride_h);
    return std::clamp<int64_t>(dw.out_h / std::max<int64_t>(1, min_rows), 1, most);
  };
  const int64_t threads = kernel_threads();
  const int64_t strips = strips_at_least(4, (2 * threads + dw.batch - 1) / dw.batch);
  if (dw.batch * strips >= threads) return strips;
  return std::max(strips, strips_at_least(2, (threads + dw.batch - 1) / dw.batch));
}

void run_depthwise_block(const BlockArgs& b) {
  const NhwcConvArgs& dw = b.dw;
  const int64_t strips = strips_per_image(dw, b.has_expand);
  const int64_t strip_rows = (dw.out_h + strips - 1) / strips;
  parallel_for(dw.batch * strips, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t n = t / strips, r0 = (t % strips) * strip_rows;
      if (r0 < dw.out_h) run_strip(b, n, r0, std::min(dw.out_h, r0 + strip_rows));
    }
  });
}

GemmArgs pointwise_product(const float* packed, const float* bias, int64_t k, int64_t n,
                           const NhwcConvOptions& o) {
  GemmArgs g;
  g.lda = g.k = k;
  g.packed = packed;
  g.col_bias = bias;
  g.ldy = g.n = n;
  g.conv_activation = o.activation;
  g.clip_min = o.clip_min;
  g.clip_max = o.clip_max;
  return g;
}

// Which of the optional operands a kernel call has, in the order they follow x.
struct Layout {
  bool expand = false, expand_bias = false, depthwise_bias = false, project = false, project_bias = false,
       residual = false;
  bool operator==(const Layout&) const = default;
};

class DepthwiseBlockKernel : public CpuKernel {
 public:
  DepthwiseBlockKernel(mx::Stream stream, Reference reference, Layout layout, NhwcConvOptions expand,
                       NhwcConvOptions depthwise, NhwcConvOptions project)
      : CpuKernel(stream, std::move(reference)),
        layout_(layout),
        expand_(expand),
        depthwise_(depthwise),
        project_(project) {}
  const char* name() const override { return "transmuter::DepthwiseBlockNhwc"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const DepthwiseBlockKernel*>(&other);
    return o != nullptr && o->layout_ == layout_ && o->expand_ == expand_ && o->depthwise_ == depthwise_ &&
           o->project_ == project_;
  }

 protected:
  KernelTask make_task(const std::vector<mx::array>& in, std::vector<mx::array>& out) const override {
    size_t next = 0;
    auto take = [&](bool present) { return present ? in[next++].data<float>() : nullptr; };
    BlockArgs b;
    const mx::array& x = in[next++];
    b.x = x.data<float>();
    b.in_channels = x.shape(3);
    b.has_expand = layout_.expand;
    b.has_project = layout_.project;
    const float* expand_weight = take(layout_.expand);
    const float* expand_bias = take(layout_.expand_bias);
    const mx::array& dw_weight = in[next];
    const int64_t channels = dw_weight.shape(2);
    const float* depthwise_weight = take(true);
    const float* depthwise_bias = take(layout_.depthwise_bias);
    const float* project_weight = take(layout_.project);
    const float* project_bias = take(layout_.project_bias);
    b.residual = take(layout_.residual);
    b.y = out[0].data<float>();
    b.out_channels = out[0].shape(3);
    b.dw = nhwc_conv_geometry(depthwise_, x.shape(0), x.shape(1), x.shape(2), channels, out[0].shape(1),
                              out[0].shape(2), channels);
    b.dw.w = depthwise_weight;
    b.dw.bias = depthwise_bias;
    if (b.has_expand)
      b.expand = pointwise_product(expand_weight, expand_bias, b.in_channels, channels, expand_);
    if (b.has_project)
      b.project = pointwise_product(project_weight, project_bias, channels, b.out_channels, project_);
    b.step_rows = step_rows_of(b.dw);
    return [b] { run_depthwise_block(b); };
  }

 private:
  Layout layout_;
  NhwcConvOptions expand_, depthwise_, project_;
};

// Whether the fused kernel runs: as many strips over the images as there are threads (a 14x14 image at
// batch 1 is one strip: its block took 0.56 ms on one thread against 0.40 as separate kernels).
bool streams(const mx::array& x, const mx::array& depthwise_weight, const NhwcConvOptions& o,
             const mx::array& y, bool has_expand) {
  const int64_t channels = depthwise_weight.shape(2);
  const NhwcConvArgs dw =
      nhwc_conv_geometry(o, x.shape(0), x.shape(1), x.shape(2), channels, y.shape(1), y.shape(2), channels);
  return dw.batch * strips_per_image(dw, has_expand) >= kernel_threads();
}

void check_pointwise(const PointwiseStage& stage, const char* which) {
  NhwcConvOptions defaults;
  defaults.activation = stage.options.activation;
  defaults.clip_min = stage.options.clip_min;
  defaults.clip_max = stage.options.clip_max;
  if (!(stage.options == defaults))
    throw std::invalid_argument(std::string("depthwise block: the ") + which +
                                " stage must be a 1x1 convolution");
}

}  // namespace

mx::array depthwise_block_nhwc(const mx::array& x, const std::optional<PointwiseStage>& expand,
                               const mx::array& depthwise_weight,
                               const std::optional<mx::array>& depthwise_bias,
                               const NhwcConvOptions& depthwise_options,
                               const std::optional<PointwiseStage>& project,
                               const std::optional<mx::array>& residual, mx::StreamOrDevice s) {
  if (expand) check_pointwise(*expand, "expand");
  if (project) check_pointwise(*project, "project");
  if (residual && !project)
    throw std::invalid_argument("depthwise block: a residual needs the project stage");
  const mx::Stream stream = mx::to_stream(s);
  // The composition: the reference (gradients, other streams) and the small images' path. Each call checks
  // its stage's shapes.
  auto compose = [=](const mx::array& input) {
    mx::array v = input;
    if (expand)
      v = conv2d_nhwc(v, expand->packed, expand->bias, expand->out_channels, expand->options, stream);
    v = depthwise_conv_nhwc(v, depthwise_weight, depthwise_bias, depthwise_options, stream);
    if (project)
      v = conv2d_nhwc(v, project->packed, project->bias, project->out_channels, project->options, stream,
                      residual);
    return v;
  };
  mx::array y = compose(x);  // the shapes, checked; the graph is dropped when the fused kernel runs
  const bool fused_residual = residual && residual->shape() == y.shape() && residual->dtype() == mx::float32;
  if (!is_cpu_stream(stream) || y.size() == 0 || (residual && !fused_residual) ||
      depthwise_options.channels_first_input ||
      !streams(x, depthwise_weight, depthwise_options, y, expand.has_value()))
    return y;
  Layout layout;
  std::vector<mx::array> inputs = {x};
  auto add = [&](bool& flag, const std::optional<mx::array>& a) {
    flag = a.has_value();
    if (a) inputs.push_back(*a);
  };
  layout.expand = expand.has_value();
  if (expand) {
    inputs.push_back(expand->packed);
    add(layout.expand_bias, expand->bias);
  }
  inputs.push_back(depthwise_weight);
  add(layout.depthwise_bias, depthwise_bias);
  layout.project = project.has_value();
  if (project) {
    inputs.push_back(project->packed);
    add(layout.project_bias, project->bias);
  }
  add(layout.residual, residual);
  // The reference rebuilds the stages from the kernel's inputs, in their order.
  Reference reference = [=](const std::vector<mx::array>& in) {
    size_t next = 0;
    auto take = [&](bool present) { return present ? std::optional<mx::array>(in[next++]) : std::nullopt; };
    mx::array v = in[next++];
    if (layout.expand) {
      const mx::array packed = in[next++];
      v = conv2d_nhwc(v, packed, take(layout.expand_bias), expand->out_channels, expand->options, stream);
    }
    const mx::array dw = in[next++];
    v = depthwise_conv_nhwc(v, dw, take(layout.depthwise_bias), depthwise_options, stream);
    if (layout.project) {
      const mx::array packed = in[next++];
      std::optional<mx::array> bias = take(layout.project_bias);
      v = conv2d_nhwc(v, packed, bias, project->out_channels, project->options, stream,
                      take(layout.residual));
    }
    return std::vector<mx::array>{v};
  };
  const NhwcConvOptions expand_options = expand ? expand->options : NhwcConvOptions{};
  const NhwcConvOptions project_options = project ? project->options : NhwcConvOptions{};
  return make_cpu_kernel_outputs(
      [&](mx::Stream kernel_stream) {
        return std::make_shared<DepthwiseBlockKernel>(kernel_stream, reference, layout, expand_options,
                                                      depthwise_options, project_options);
      },
      reference, std::move(inputs), {y.shape()}, {mx::float32}, stream)[0];
}

}  // namespace transmuter::kernels
