// The lean decode step's kernels (kernels/cpu/decode_kernels.h) on every instruction set this
// CPU runs, against plain float64 loops: the packed product in each stored precision (shapes with
// partial panels and every row remainder), layer norm, GELU and the scaled residual; and the raw
// TSSA step row against tost::tssa_step.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/cpu/decode_kernels.h"
#include "kernels/cpu/decode_pack.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/tssa_cpu.h"
#include "kernels/tssa_ops.h"

namespace tost::kernels::cpu {
namespace {

// An instruction set, and at AVX-512 whether the dot-product table is taken.
struct KernelChoice {
  CpuIsa isa;
  bool dot_products;
};

// gtest prints a parameter's bytes otherwise, padding included.
void PrintTo(const KernelChoice& c, std::ostream* os) {
  *os << CpuIsaName(c.isa) << (c.dot_products ? " with dot products" : "");
}

std::vector<KernelChoice> AvailableChoices() {
  std::vector<KernelChoice> choices;
  for (CpuIsa isa : AvailableCpuIsas()) choices.push_back({isa, false});
  if (CpuHasDotProducts()) choices.push_back({CpuIsa::kAvx512, true});
  return choices;
}

std::string ChoiceName(const ::testing::TestParamInfo<KernelChoice>& info) {
  return std::string(CpuIsaName(info.param.isa)) + (info.param.dot_products ? "_Dot" : "");
}

class DecodeKernelsTest : public ::testing::TestWithParam<KernelChoice> {
 protected:
  const DecodeKernels& k() const {
    return DecodeKernelsFor(GetParam().isa, GetParam().dot_products);
  }
};

// The float64 product the kernel approximates: x's rows as the kernel reads them (rounded to
// bfloat16 for pairs; quantised to 8 bits with the row's absmax/127, zero point 128, for quads)
// times the values the packed matrix holds.
at::Tensor ExpectedProduct(const at::Tensor& x, const PackedWeights& p, const at::Tensor& w) {
  const PackedMatrix& m = p.matrix;
  at::Tensor rows = x.to(at::kDouble);
  if (m.group == 2) rows = x.to(at::kBFloat16).to(at::kDouble);
  if (m.group == 4) {
    const at::Tensor scale = x.abs().amax({1}, /*keepdim=*/true).div(127.f);
    const at::Tensor q =
        (x * (127.f / x.abs().amax({1}, /*keepdim=*/true))).nan_to_num(0).round().clamp(-128, 127);
    rows = q.to(at::kDouble) * scale.to(at::kDouble);
  }
  at::Tensor held;
  if (m.type == PackedType::kInt8) {
    const Int8Rows q = QuantiseInt8PerRow(w);
    held = q.values.to(at::kDouble) * q.scale.to(at::kDouble).unsqueeze(1);
  } else {
    const at::ScalarType stored = m.type == PackedType::kBFloat16  ? at::kBFloat16
                                  : m.type == PackedType::kFloat16 ? at::kHalf
                                                                   : at::kFloat;
    held = w.to(stored).to(at::kDouble);
  }
  return at::matmul(rows, held.t());
}

TEST_P(DecodeKernelsTest, PackedProductMatchesFloat64InEveryPrecision) {
  at::manual_seed(3);
  for (PackedType type :
       {PackedType::kFloat32, PackedType::kBFloat16, PackedType::kFloat16, PackedType::kInt8}) {
    const int64_t group = k().input_group[static_cast<int>(type)];
    for (auto [out, in] : {std::pair<int64_t, int64_t>{257, 13}, {64, 384}, {130, 7}, {1, 1}}) {
      for (bool with_bias : {false, true}) {
        const at::Tensor w = at::randn({out, in});
        const at::Tensor bias = with_bias ? at::randn({out}) : at::Tensor();
        const PackedWeights packed = PackWeights(w, bias, type, group);
        const PackedMatrix& m = packed.matrix;
        for (int64_t rows : {1, 2, 3, 4, 5, 7, 9}) {
          const at::Tensor x = at::randn({rows, in});
          std::vector<uint32_t> prepared(PreparedRowsBytes(m, rows) / 4 + 1);
          k().prepare(m, x.data_ptr<float>(), rows, in, prepared.data());
          // y's rows are wider than `out`: the kernel must leave the columns past `out` alone.
          const int64_t ldy = out + 3;
          std::vector<float> y(rows * ldy, -7.f);
          k().matmul(m, x.data_ptr<float>(), rows, in, prepared.data(), 0, m.panels(), y.data(),
                     ldy);
          // The same panels in two ranges give the same values.
          std::vector<float> y_split(rows * ldy, -7.f);
          const int64_t half = m.panels() / 2;
          k().matmul(m, x.data_ptr<float>(), rows, in, prepared.data(), 0, half, y_split.data(),
                     ldy);
          k().matmul(m, x.data_ptr<float>(), rows, in, prepared.data(), half, m.panels(),
                     y_split.data(), ldy);
          EXPECT_EQ(y, y_split);
          at::Tensor want = ExpectedProduct(x, packed, w);
          if (with_bias) want = want + bias.to(at::kDouble);
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t o = 0; o < out; ++o) {
              const double expect = want[r][o].item<double>();
              EXPECT_NEAR(y[r * ldy + o], expect, 1e-5 * (1 + std::abs(expect)) * std::sqrt(in))
                  << "type " << static_cast<int>(type) << " group " << group << " " << out << "x"
                  << in << " rows " << rows << " at " << r << "," << o;
            }
            for (int64_t o = out; o < ldy; ++o) EXPECT_EQ(y[r * ldy + o], -7.f);
          }
          // A row's values do not depend on the rows beside it.
          std::vector<float> alone(ldy, -7.f);
          std::vector<uint32_t> prepared_alone(PreparedRowsBytes(m, 1) / 4 + 1);
          k().prepare(m, x.data_ptr<float>() + (rows - 1) * in, 1, in, prepared_alone.data());
          k().matmul(m, x.data_ptr<float>() + (rows - 1) * in, 1, in, prepared_alone.data(), 0,
                     m.panels(), alone.data(), ldy);
          EXPECT_EQ(0, std::memcmp(alone.data(), y.data() + (rows - 1) * ldy, out * sizeof(float)))
              << "row " << rows - 1 << " of " << rows;
        }
      }
    }
  }
}

// int8 and 16-bit weights at many rows (through float32 tiles at AVX2 and AVX-512 where the dot
// products do not take them):
// against float64, and bit for bit the widening product's values at every row count, across the
// tiles' seams (128 input channels, 64-row groups) and with odd panel, input and row tails.
TEST_P(DecodeKernelsTest, ProductAtManyRowsIsTheWideningProductBitForBit) {
  const DecodeKernels& widening = WideningDecodeKernelsFor(GetParam().isa);
  at::manual_seed(11);
  for (PackedType type : {PackedType::kInt8, PackedType::kBFloat16, PackedType::kFloat16}) {
    if (k().input_group[static_cast<int>(type)] != 1) continue;  // through the dot products
    for (auto [out, in] : {std::pair<int64_t, int64_t>{200, 389}, {64, 128}, {33, 129}, {70, 5}}) {
      for (bool with_bias : {false, true}) {
        const at::Tensor w = at::randn({out, in});
        const at::Tensor bias = with_bias ? at::randn({out}) : at::Tensor();
        const PackedWeights packed = PackWeights(w, bias, type, 1);
        const PackedMatrix& m = packed.matrix;
        for (int64_t rows : {3, 4, 6, 7, 13, 64, 65, 131}) {
          // x's rows are wider than `in` (as a prefill chunk's are not, but the contract allows).
          const int64_t ldx = in + 5;
          const at::Tensor x = at::randn({rows, ldx});
          const int64_t ldy = out + 3;
          std::vector<float> y(rows * ldy, -7.f), y_widened(rows * ldy, -7.f);
          k().matmul(m, x.data_ptr<float>(), rows, ldx, nullptr, 0, m.panels(), y.data(), ldy);
          widening.matmul(m, x.data_ptr<float>(), rows, ldx, nullptr, 0, m.panels(),
                          y_widened.data(), ldy);
          EXPECT_EQ(y, y_widened) << "type " << static_cast<int>(type) << " " << out << "x" << in
                                  << " rows " << rows;
          // Panel ranges split between two calls give the same values.
          std::vector<float> y_split(rows * ldy, -7.f);
          const int64_t half = m.panels() / 2;
          k().matmul(m, x.data_ptr<float>(), rows, ldx, nullptr, 0, half, y_split.data(), ldy);
          k().matmul(m, x.data_ptr<float>(), rows, ldx, nullptr, half, m.panels(), y_split.data(),
                     ldy);
          EXPECT_EQ(y, y_split);
          at::Tensor want = ExpectedProduct(x.narrow(1, 0, in).contiguous(), packed, w);
          if (with_bias) want = want + bias.to(at::kDouble);
          const auto want_a = want.accessor<double, 2>();
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t o = 0; o < out; ++o) {
              ASSERT_NEAR(y[r * ldy + o], want_a[r][o],
                          1e-5 * (1 + std::abs(want_a[r][o])) * std::sqrt(in))
                  << out << "x" << in << " rows " << rows << " at " << r << "," << o;
            }
            for (int64_t o = out; o < ldy; ++o) ASSERT_EQ(y[r * ldy + o], -7.f);
          }
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

INSTANTIATE_TEST_SUITE_P(Isas, DecodeKernelsTest, ::testing::ValuesIn(AvailableChoices()),
                         ChoiceName);

}  // namespace
}  // namespace tost::kernels::cpu
