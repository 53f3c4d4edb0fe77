#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/expect_near.h"
#include "support/op_test_support.h"
#include "transmuter/error.h"

namespace transmuter {
namespace {

using testing::error_of;
using testing::int_attr;
using testing::run_op;
using testing::to_doubles;

// float32 FFTs of small integers: a few ulps of the largest magnitude.
constexpr double kTol = 1e-5;

void expect_near(const std::vector<double>& actual, const std::vector<double>& expected, double tol = kTol) {
  testing::expect_all_near(actual, expected, tol);
}

mx::array scalar64(int64_t v) { return mx::array(v); }

TEST(Dft, RealSignalByHand) {
  // fft([1, 2, 3, 4]) = [10, -2+2i, -2, -2-2i]; batch 1, signal along axis 1, real.
  mx::array x = mx::array({1.f, 2.f, 3.f, 4.f}, {1, 4, 1});
  auto full = run_op("DFT", 17, {x});
  EXPECT_EQ(full[0].tensor().shape(), (mx::Shape{1, 4, 2}));
  expect_near(to_doubles(full[0].tensor()), {10, 0, -2, 2, -2, 0, -2, -2});
  auto half = run_op("DFT", 17, {x}, {int_attr("onesided", 1)});
  expect_near(to_doubles(half[0].tensor()), {10, 0, -2, 2, -2, 0});
}

TEST(Dft, LengthPadsWithZeros) {
  // fft([1, 1, 0, 0]) = [2, 1-i, 0, 1+i].
  auto out = run_op("DFT", 20, {mx::array({1.f, 1.f}, {1, 2, 1}), scalar64(4)});
  expect_near(to_doubles(out[0].tensor()), {2, 0, 1, -1, 0, 0, 1, 1});
}

TEST(Dft, InverseUndoesForwardForComplexSignals) {
  mx::array x = mx::array({1.f, -1.f, 2.f, 0.5f, -3.f, 2.f}, {3, 2});  // 3 complex values, no batch
  auto forward = run_op("DFT", 20, {x, Value(), scalar64(0)});
  auto back = run_op("DFT", 20, {forward[0].tensor(), Value(), scalar64(0)}, {int_attr("inverse", 1)});
  expect_near(to_doubles(back[0].tensor()), to_doubles(x));
}

TEST(Dft, OnesidedInverseIsIrfft) {
  // rfft of a real signal of even length 6, then the one-sided inverse: the signal again, [..., 1].
  mx::array x = mx::array({1.f, 4.f, -2.f, 0.f, 3.f, 5.f}, {1, 6, 1});
  auto half = run_op("DFT", 20, {x}, {int_attr("onesided", 1)});
  EXPECT_EQ(half[0].tensor().shape(), (mx::Shape{1, 4, 2}));
  auto back = run_op("DFT", 20, {half[0].tensor()}, {int_attr("onesided", 1), int_attr("inverse", 1)});
  EXPECT_EQ(back[0].tensor().shape(), (mx::Shape{1, 6, 1}));
  expect_near(to_doubles(back[0].tensor()), to_doubles(x));
}

TEST(Stft, FramesAreWindowedDfts) {
  // Signal 0..7, frame 4, step 2: 3 frames; with a window of ones, frame f is
  // fft([2f, 2f+1, 2f+2, 2f+3]) = [8f + 6, -2+2i, -2, ...] (one-sided: 3 bins).
  mx::array signal = mx::reshape(testing::iota({8}), {1, 8, 1});
  auto out = run_op("STFT", 17, {signal, scalar64(2), mx::ones({4})});
  EXPECT_EQ(out[0].tensor().shape(), (mx::Shape{1, 3, 3, 2}));
  expect_near(to_doubles(out[0].tensor()), {6, 0, -2, 2, -2, 0, 14, 0, -2, 2, -2, 0, 22, 0, -2, 2, -2, 0});
  // The frame length alone (rectangular window) gives the same frames.
  auto no_window = run_op("STFT", 17, {signal, scalar64(2), Value(), scalar64(4)});
  expect_near(to_doubles(no_window[0].tensor()), to_doubles(out[0].tensor()));
}

TEST(Windows, HannHammingBlackmanByHand) {
  auto hann = run_op("HannWindow", 17, {scalar64(4)});
  expect_near(to_doubles(hann[0].tensor()), {0, 0.5, 1, 0.5}, 1e-7);
  auto symmetric = run_op("HannWindow", 17, {scalar64(5)}, {int_attr("periodic", 0)});
  expect_near(to_doubles(symmetric[0].tensor()), {0, 0.5, 1, 0.5, 0}, 1e-7);
  const double a = 25.0 / 46.0;
  auto hamming = run_op("HammingWindow", 17, {scalar64(2)});
  expect_near(to_doubles(hamming[0].tensor()), {a - (1 - a), a + (1 - a)}, 1e-7);
  auto blackman = run_op("BlackmanWindow", 17, {scalar64(2)}, {int_attr("output_datatype", 11)});
  EXPECT_EQ(blackman[0].tensor().dtype(), mx::float64);
  expect_near(to_doubles(blackman[0].tensor()), {0.42 - 0.5 + 0.08, 0.42 + 0.5 + 0.08}, 1e-12);
}

TEST(MelWeightMatrix, TrianglesPeakAtOne) {
  auto out = run_op("MelWeightMatrix", 17,
                    {scalar64(4), scalar64(32), scalar64(16000), mx::array(100.0f), mx::array(6000.0f)});
  mx::array w = out[0].tensor();
  EXPECT_EQ(w.shape(), (mx::Shape{17, 4}));
  std::vector<double> v = to_doubles(w);
  for (int m = 0; m < 4; ++m) {
    double peak = 0;
    for (int bin = 0; bin < 17; ++bin) {
      EXPECT_GE(v[bin * 4 + m], 0.0);
      peak = std::max(peak, v[bin * 4 + m]);
    }
    EXPECT_DOUBLE_EQ(peak, 1.0) << "mel bin " << m;
  }
}

TEST(Signal, BadInputsAreOpErrors) {
  auto message = [](const std::string& op, int opset, std::vector<Value> inputs,
                    std::vector<Attribute> attrs = {}) {
    return error_of<OpError>([&] { run_op(op, opset, inputs, attrs); });
  };
  mx::array x = mx::zeros({1, 4, 1});
  EXPECT_NE(message("DFT", 20, {x, Value(), scalar64(-1)}).find("axis 2 is out of range"), std::string::npos);
  EXPECT_NE(
      message("DFT", 17, {mx::zeros({1, 4, 3})}).find("last dim must be 1 (real) or 2 (complex), got 3"),
      std::string::npos);
  EXPECT_NE(message("DFT", 17, {x, scalar64(0)}).find("dft_length must be positive"), std::string::npos);
  EXPECT_NE(message("DFT", 17, {mx::zeros({1, 4, 1}, mx::int32)}).find("must be a float tensor"),
            std::string::npos);
  EXPECT_NE(message("STFT", 17, {x, scalar64(1), Value(), scalar64(5)}).find("frame_length 5"),
            std::string::npos);
  EXPECT_NE(message("STFT", 17, {x, scalar64(0)}).find("frame_step must be positive"), std::string::npos);
  EXPECT_NE(message("STFT", 17, {x, scalar64(1), mx::ones({3}), scalar64(2)}).find("window has 3 elements"),
            std::string::npos);
  EXPECT_NE(message("HannWindow", 17, {scalar64(-1)}).find("size must be non-negative"), std::string::npos);
  EXPECT_NE(
      message("HannWindow", 17, {scalar64(4)}, {int_attr("output_datatype", 8)}).find("output_datatype"),
      std::string::npos);
  EXPECT_NE(message("MelWeightMatrix", 17,
                    {scalar64(4), scalar64(32), scalar64(16000), mx::array(500.0f), mx::array(100.0f)})
                .find("lower_edge_hertz < upper_edge_hertz"),
            std::string::npos);
  EXPECT_NE(message("DFT", 17, {mx::zeros({1, 4, 3})}).find("[DFT v17]"), std::string::npos);
}

}  // namespace
}  // namespace transmuter
