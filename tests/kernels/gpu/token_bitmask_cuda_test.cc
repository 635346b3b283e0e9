// The CUDA token-bitmask kernel (kernels/cuda/token_bitmask_kernels.cu) against the ATen reference
// on the CPU (kernels/reference.cc): the same logits and words go to both, and the results must be
// equal bit for bit (the only value the op writes is -infinity). Reached through kernel_device.h:
// the `tost::` operator on a GPU, or the emulator's test operator running the same kernel source on
// the CPU (tests/kernels/emulator), at smaller vocabularies there.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/reference.h"
#include "tests/kernels/gpu/kernel_device.h"

namespace tost::kernels {
namespace {

using testing::ApplyTokenBitmask;
using testing::DeviceAvailable;
using testing::OnDevice;

#define TOST_REQUIRE_DEVICE()                                                            \
  do {                                                                                   \
    if (!DeviceAvailable()) GTEST_SKIP() << "no " << testing::DeviceName() << " device"; \
  } while (0)

#ifdef TOST_KERNEL_TESTS_EMULATED
constexpr bool kEmulated = true;
#else
constexpr bool kEmulated = false;
#endif

at::Tensor Cuda(const at::Tensor& t) { return testing::ToDevice(t); }

// Words drawn so that whole words all clear and all set are common, and the bits past the
// vocabulary are random (the kernel must ignore them).
at::Tensor RandomMask(int64_t masked_rows, int64_t words, uint64_t seed) {
  std::mt19937_64 rng(seed);
  at::Tensor mask = at::empty({masked_rows, words}, at::kInt);
  int32_t* w = mask.mutable_data_ptr<int32_t>();
  for (int64_t i = 0; i < masked_rows * words; ++i) {
    const uint64_t pick = rng() % 8;
    w[i] = pick == 0 ? 0 : pick == 1 ? -1 : static_cast<int32_t>(static_cast<uint32_t>(rng()));
  }
  return mask;
}

at::Tensor RandomLogits(int64_t rows, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor logits = at::randn({rows, vocab}, gen);
  if (logits.numel() >= 2) {  // an allowed NaN stays NaN
    logits.view({-1})[0] = std::numeric_limits<float>::quiet_NaN();
    logits.view({-1})[1] = std::numeric_limits<float>::infinity();
  }
  return logits;
}

// Bit for bit, NaN equal to NaN.
void ExpectSame(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor g = got.to(at::kCPU);
  const at::Tensor same = (g == want) | (g.isnan() & want.isnan());
  EXPECT_TRUE(same.all().item<bool>())
      << what << ": " << (~same).sum().item<int64_t>() << " of " << g.numel() << " differ";
}

// The device op on a device copy of `logits`, checked to be in place.
at::Tensor OnTheDevice(const at::Tensor& logits, const at::Tensor& mask,
                       const std::optional<at::Tensor>& rows) {
  at::Tensor d = Cuda(logits);
  at::Tensor& returned = ApplyTokenBitmask(d, Cuda(mask), rows);
  EXPECT_TRUE(returned.is_same(d)) << "the op updates its logits in place and returns them";
  EXPECT_TRUE(OnDevice(d));
  return d;
}

at::Tensor OnTheHost(const at::Tensor& logits, const at::Tensor& mask,
                     const std::optional<at::Tensor>& rows) {
  at::Tensor h = logits.clone();
  reference::apply_token_bitmask_(h, mask, rows.has_value() ? rows->to(at::kCPU) : rows);
  return h;
}

struct MaskShape {
  int64_t rows;
  int64_t vocab;
  int64_t spare_words;  // past ceil(vocab/32)
};

std::string Name(const MaskShape& s) {
  std::ostringstream os;
  os << "R" << s.rows << "_V" << s.vocab << "_spare" << s.spare_words;
  return os.str();
}

void PrintTo(const MaskShape& s, std::ostream* os) { *os << Name(s); }

class TokenBitmaskCudaTest : public ::testing::TestWithParam<MaskShape> {};

TEST_P(TokenBitmaskCudaTest, MatchesReference) {
  TOST_REQUIRE_DEVICE();
  const MaskShape s = GetParam();
  const int64_t words = (s.vocab + 31) / 32 + s.spare_words;
  const at::Tensor logits = RandomLogits(s.rows, s.vocab, 100 + s.vocab);
  const at::Tensor mask = RandomMask(s.rows, words, 200 + s.vocab);
  ExpectSame(OnTheDevice(logits, mask, std::nullopt), OnTheHost(logits, mask, std::nullopt),
             Name(s));
}

// Vocabularies below one block, at a word boundary or one past it, across several blocks; on a GPU
// also real model vocabularies (GPT-2's 50257, a 152064 one at 64 rows: 39 MB of logits).
std::vector<MaskShape> Shapes() {
  std::vector<MaskShape> shapes = {{1, 1, 0},   {3, 31, 0},  {2, 32, 0},  {2, 33, 2},
                                   {3, 255, 0}, {2, 256, 1}, {2, 257, 0}, {4, 1000, 3}};
  if (!kEmulated) {
    shapes.push_back({8, 50257, 0});
    shapes.push_back({64, 152064, 0});
  }
  return shapes;
}

INSTANTIATE_TEST_SUITE_P(Shapes, TokenBitmaskCudaTest, ::testing::ValuesIn(Shapes()),
                         [](const ::testing::TestParamInfo<MaskShape>& info) {
                           return Name(info.param);
                         });

TEST(TokenBitmaskCuda, RowsSubsetOnTheHostAndOnTheDevice) {
  TOST_REQUIRE_DEVICE();
  const int64_t R = 9, V = kEmulated ? 300 : 32000;
  const at::Tensor logits = RandomLogits(R, V, 7);
  const at::Tensor mask = RandomMask(4, (V + 31) / 32, 8);
  const std::vector<int64_t> rows = {8, 0, 5, 2};
  for (const at::ScalarType dtype : {at::kInt, at::kLong}) {
    const at::Tensor host_rows = at::tensor(rows).to(dtype);
    for (const bool on_device : {false, true}) {
      const at::Tensor row_ids = on_device ? Cuda(host_rows) : host_rows;
      const std::string what = std::string(c10::toString(dtype)) +
                               (on_device ? " rows on the device" : " rows on the host");
      const at::Tensor got = OnTheDevice(logits, mask, row_ids);
      ExpectSame(got, OnTheHost(logits, mask, host_rows), what);
      for (const int64_t r : {1, 3, 4, 6, 7}) {  // rows no bitmask row names: untouched
        EXPECT_TRUE(at::equal(got[r].to(at::kCPU), logits[r])) << what << ", row " << r;
      }
    }
  }
}

TEST(TokenBitmaskCuda, AllClearAndAllSetWords) {
  TOST_REQUIRE_DEVICE();
  const int64_t V = 100;  // four words, the last with 4 tokens
  const at::Tensor logits = at::randn({3, V}) + 1;
  // Row 0: nothing allowed; row 1: everything, bits past V clear; row 2: only 0, 31, 32 and 99,
  // bits past V set.
  const at::Tensor mask = at::tensor(std::vector<int32_t>{0, 0, 0, 0, -1, -1, -1, 0xF,
                                                          static_cast<int32_t>(0x80000001u), 1, 0,
                                                          static_cast<int32_t>(0xFFFFFFF8u)})
                              .view({3, 4});
  const at::Tensor got = OnTheDevice(logits, mask, std::nullopt).to(at::kCPU);
  ExpectSame(got, OnTheHost(logits, mask, std::nullopt), "whole words");
  EXPECT_TRUE(got[0].eq(-std::numeric_limits<float>::infinity()).all().item<bool>());
  EXPECT_TRUE(at::equal(got[1], logits[1]));
  EXPECT_TRUE(at::equal(got[2].isfinite().nonzero().view({-1}),
                        at::tensor(std::vector<int64_t>{0, 31, 32, 99})));
}

TEST(TokenBitmaskCuda, NoBitmaskRowsLaunchNothing) {
  TOST_REQUIRE_DEVICE();
  const at::Tensor logits = at::randn({2, 50});
  at::Tensor d = Cuda(logits);
  ApplyTokenBitmask(d, Cuda(at::zeros({0, 2}, at::kInt)), at::zeros({0}, at::kLong));
  EXPECT_TRUE(at::equal(d.to(at::kCPU), logits));
}

TEST(TokenBitmaskCuda, RejectsBadArgumentsLikeTheReference) {
  TOST_REQUIRE_DEVICE();
  const at::Tensor mask = Cuda(at::zeros({2, 2}, at::kInt));
  const auto message = [](auto fn) -> std::string {
    try {
      fn();
    } catch (const c10::Error& e) {
      return e.what_without_backtrace();
    }
    return "(no error)";
  };
  const auto expect = [](const std::string& got, const std::string& part) {
    EXPECT_NE(got.find(part), std::string::npos) << "\"" << got << "\" lacks \"" << part << "\"";
  };
  at::Tensor short_vocab = Cuda(at::zeros({2, 65}));
  expect(message([&] { ApplyTokenBitmask(short_vocab, mask); }),
         "bitmask must be [masked_rows, words>=3] (32 ids per word, vocab=65), got shape [2, 2]");
  at::Tensor half = Cuda(at::zeros({2, 40}, at::kHalf));
  expect(message([&] { ApplyTokenBitmask(half, mask); }), "logits must be float32, got Half");
  at::Tensor strided = Cuda(at::zeros({40, 2})).t();
  expect(message([&] { ApplyTokenBitmask(strided, mask); }), "logits must be contiguous");
  at::Tensor three = Cuda(at::zeros({3, 40}));
  expect(message([&] {
           ApplyTokenBitmask(three, Cuda(at::zeros({2, 2}, at::kLong)));
         }),
         "bitmask must be int32, got Long");
  expect(message([&] { ApplyTokenBitmask(three, mask); }),
         "without rows, bitmask must have one row per logits row");
  // Host rows are checked on the host, wherever the logits are.
  expect(message([&] {
           ApplyTokenBitmask(three, mask, at::tensor(std::vector<int64_t>{0, 3}));
         }),
         "rows names row 3, outside the logits' rows [0, 3)");
  expect(message([&] {
           ApplyTokenBitmask(three, mask, at::tensor(std::vector<int32_t>{1, 1}));
         }),
         "rows names row 1 twice");
  if (!OnDevice(at::zeros({1}))) {  // a real device: a host bitmask is refused, not copied
    expect(message([&] {
             ApplyTokenBitmask(three, at::zeros({3, 2}, at::kInt));
           }),
           "bitmask is on cpu but logits are on cuda");
    // Rows already on the device are not read back (that would synchronise every call): a row
    // outside the logits is skipped and the others are masked (compute-sanitizer memcheck runs
    // this case: nothing outside the logits is written).
    const at::Tensor logits = at::randn({3, 40});
    at::Tensor d = Cuda(logits);
    const at::Tensor words = at::zeros({2, 2}, at::kInt);
    ApplyTokenBitmask(d, Cuda(words), Cuda(at::tensor(std::vector<int32_t>{1, 3})));
    const at::Tensor got = d.to(at::kCPU);
    EXPECT_TRUE(got[1].eq(-std::numeric_limits<float>::infinity()).all().item<bool>());
    EXPECT_TRUE(at::equal(got[0], logits[0]));
    EXPECT_TRUE(at::equal(got[2], logits[2]));
  }
}

}  // namespace
}  // namespace tost::kernels
