// The lean decode step's kernels (kernels/cpu/decode_kernels.h) on every instruction set this
// CPU runs, against plain float64 loops: the packed product in each stored precision (shapes with
// partial panels and every row remainder), layer norm, GELU and the scaled residual; and the raw
// TSSA step row against tost::tssa_step.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/decode_kernels.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/tssa_cpu.h"
#include "kernels/tssa_ops.h"

namespace tost::kernels::cpu {
namespace {

std::string IsaParamName(const ::testing::TestParamInfo<CpuIsa>& info) {
  return std::string(CpuIsaName(info.param));
}

class DecodeKernelsTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  const DecodeKernels& k() const { return DecodeKernelsFor(GetParam()); }
};

// W [out, in] float32 → the packed layout of decode_kernels.h in `type` (int8 with absmax/127
// scales), returning the storage and filling `m`; `dequantised` gets the values the packed matrix
// holds, as float32 [out, in].
at::Tensor PackForTest(const at::Tensor& w, const at::Tensor& bias, PackedType type,
                       PackedMatrix& m, at::Tensor& scale, at::Tensor& padded_bias,
                       at::Tensor& dequantised) {
  const int64_t out = w.size(0), in = w.size(1);
  m = PackedMatrix{};
  m.type = type;
  m.in = in;
  m.out = out;
  const int64_t padded = m.panels() * kPanelWidth;
  at::Tensor wp = at::constant_pad_nd(w, {0, 0, 0, padded - out});
  at::ScalarType stored = at::kFloat;
  if (type == PackedType::kBFloat16) stored = at::kBFloat16;
  if (type == PackedType::kFloat16) stored = at::kHalf;
  if (type == PackedType::kInt8) {
    stored = at::kChar;
    scale = wp.abs().amax({1}).div_(127).clamp_min_(1e-30).contiguous();
    wp = wp.div(scale.unsqueeze(1)).round_().clamp_(-127, 127);
    m.scale = scale.data_ptr<float>();
    dequantised = (wp * scale.unsqueeze(1)).narrow(0, 0, out).contiguous();
  } else {
    dequantised = wp.to(stored).to(at::kFloat).narrow(0, 0, out).contiguous();
  }
  if (bias.defined()) {
    padded_bias = at::constant_pad_nd(bias, {0, padded - out}).contiguous();
    m.bias = padded_bias.data_ptr<float>();
  }
  at::Tensor packed =
      wp.view({m.panels(), kPanelWidth, in}).permute({0, 2, 1}).contiguous().to(stored);
  m.data = packed.data_ptr();
  return packed;
}

TEST_P(DecodeKernelsTest, PackedProductMatchesFloat64InEveryPrecision) {
  at::manual_seed(3);
  for (PackedType type :
       {PackedType::kFloat32, PackedType::kBFloat16, PackedType::kFloat16, PackedType::kInt8}) {
    for (auto [out, in] : {std::pair<int64_t, int64_t>{257, 13}, {64, 384}, {130, 7}, {1, 1}}) {
      for (bool with_bias : {false, true}) {
        const at::Tensor w = at::randn({out, in});
        const at::Tensor bias = with_bias ? at::randn({out}) : at::Tensor();
        PackedMatrix m;
        at::Tensor scale, padded_bias, deq;
        const at::Tensor packed = PackForTest(w, bias, type, m, scale, padded_bias, deq);
        for (int64_t rows : {1, 2, 3, 4, 5, 7, 9}) {
          const at::Tensor x = at::randn({rows, in});
          // y's rows are wider than `out`: the kernel must leave the columns past `out` alone.
          const int64_t ldy = out + 3;
          std::vector<float> y(rows * ldy, -7.f);
          k().matmul(m, x.data_ptr<float>(), rows, in, 0, m.panels(), y.data(), ldy);
          // The same panels in two ranges give the same values.
          std::vector<float> y_split(rows * ldy, -7.f);
          const int64_t half = m.panels() / 2;
          k().matmul(m, x.data_ptr<float>(), rows, in, 0, half, y_split.data(), ldy);
          k().matmul(m, x.data_ptr<float>(), rows, in, half, m.panels(), y_split.data(), ldy);
          EXPECT_EQ(y, y_split);
          at::Tensor want = at::matmul(x.to(at::kDouble), deq.to(at::kDouble).t());
          if (with_bias) want = want + bias.to(at::kDouble);
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t o = 0; o < out; ++o) {
              const double expect = want[r][o].item<double>();
              EXPECT_NEAR(y[r * ldy + o], expect, 1e-5 * (1 + std::abs(expect)) * std::sqrt(in))
                  << "type " << static_cast<int>(type) << " " << out << "x" << in << " rows "
                  << rows << " at " << r << "," << o;
            }
            for (int64_t o = out; o < ldy; ++o) EXPECT_EQ(y[r * ldy + o], -7.f);
          }
          // A row's values do not depend on the rows beside it.
          std::vector<float> alone(ldy, -7.f);
          k().matmul(m, x.data_ptr<float>() + (rows - 1) * in, 1, in, 0, m.panels(), alone.data(),
                     ldy);
          EXPECT_EQ(0, std::memcmp(alone.data(), y.data() + (rows - 1) * ldy, out * sizeof(float)))
              << "row " << rows - 1 << " of " << rows;
        }
      }
    }
  }
}

TEST_P(DecodeKernelsTest, LayerNormGeluAndResidualMatchLibTorch) {
  at::manual_seed(5);
  for (int64_t n : {1, 7, 16, 128, 385}) {
    const at::Tensor x = at::randn({n}) * 3 + 1;
    const at::Tensor weight = at::randn({n}), bias = at::randn({n});
    for (bool with_bias : {false, true}) {
      at::Tensor y = at::empty({n});
      k().layer_norm(x.data_ptr<float>(), n, weight.data_ptr<float>(),
                     with_bias ? bias.data_ptr<float>() : nullptr, 1e-5f, y.data_ptr<float>());
      const at::Tensor want = at::layer_norm(x.to(at::kDouble), {n}, weight.to(at::kDouble),
                                             with_bias ? bias.to(at::kDouble) : at::Tensor(), 1e-5);
      EXPECT_LT((y.to(at::kDouble) - want).abs().max().item<double>(), 1e-5) << n;
    }
    at::Tensor g = x.clone();
    k().gelu(g.data_ptr<float>(), n);
    EXPECT_LT((g.to(at::kDouble) - at::gelu(x.to(at::kDouble))).abs().max().item<double>(), 1e-6)
        << n;
    at::Tensor acc = x.clone();
    k().add_scaled(acc.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(), n);
    EXPECT_LT((acc - (x + weight * bias)).abs().max().item<double>(), 1e-5) << n;
  }
}

TEST_P(DecodeKernelsTest, TssaStepRowIsTssaStepBitForBit) {
  at::manual_seed(11);
  const int64_t D = 96, K = 4, tmax = 32;
  const HeadShape shape{D, K, D / K};
  const at::Tensor temp = at::rand({K}) + 0.5, denom_bias = at::randn({K, tmax});
  at::Tensor state = at::rand({1, 2 * D + K});
  at::Tensor raw_state = state.clone();
  std::vector<float> scratch(TssaStepRowScratch(shape));
  for (int64_t pos = 0; pos < 5; ++pos) {
    const at::Tensor w = at::randn({1, D});
    const at::Tensor y = tssa_step(w, temp, denom_bias, at::full({1}, pos, at::kLong), state);
    std::vector<float> raw_y(D);
    TssaStepRow(KernelsFor<float>(ActiveCpuIsa()), shape, w.data_ptr<float>(),
                temp.data_ptr<float>(), denom_bias.data_ptr<float>(), tmax, pos,
                raw_state.data_ptr<float>(), raw_y.data(), scratch.data());
    EXPECT_TRUE(at::equal(y[0], at::from_blob(raw_y.data(), {D}))) << "position " << pos;
    EXPECT_TRUE(at::equal(state, raw_state)) << "position " << pos;
  }
}

INSTANTIATE_TEST_SUITE_P(Isas, DecodeKernelsTest, ::testing::ValuesIn(AvailableCpuIsas()),
                         IsaParamName);

}  // namespace
}  // namespace tost::kernels::cpu
