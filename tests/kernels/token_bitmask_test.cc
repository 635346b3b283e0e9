// tost::apply_token_bitmask_ on the CPU: the registered kernel (kernels/cpu/token_bitmask_cpu.cc,
// through the dispatcher) and the ATen reference (kernels/reference.cc) against a literal
// transcription of the contract (a loop over every token's bit), on random masks, vocabularies
// that are and are not multiples of 32, whole words set and clear, spare words and bits past the
// vocabulary, row subsets in int32 and int64, and every argument error.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/token_bitmask_cpu.h"
#include "kernels/reference.h"
#include "kernels/token_bitmask_ops.h"

namespace tost::kernels {
namespace {

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// The contract, one token at a time.
at::Tensor Literal(const at::Tensor& logits, const at::Tensor& bitmask,
                   const std::optional<std::vector<int64_t>>& rows) {
  at::Tensor out = logits.clone();
  const int64_t vocab = logits.size(1);
  for (int64_t m = 0; m < bitmask.size(0); ++m) {
    const int64_t row = rows.has_value() ? (*rows)[m] : m;
    for (int64_t t = 0; t < vocab; ++t) {
      const auto word = static_cast<uint32_t>(bitmask[m][t / 32].item<int32_t>());
      if (((word >> (t % 32)) & 1u) == 0) out[row][t] = kMinusInf;
    }
  }
  return out;
}

// Exact equality, NaN equal to NaN (allowed logits keep whatever they were).
void ExpectSame(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor same = (got == want) | (got.isnan() & want.isnan());
  EXPECT_TRUE(same.all().item<bool>())
      << what << ": " << (~same).sum().item<int64_t>() << " of " << got.numel() << " differ";
}

// Random words; some whole words all clear or all set, and with `noise_past_vocab` random bits in
// the words past the vocabulary (which must be ignored).
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
  // Values the op must leave alone where allowed.
  if (logits.numel() >= 3) {
    logits.view({-1})[0] = std::numeric_limits<float>::quiet_NaN();
    logits.view({-1})[1] = std::numeric_limits<float>::infinity();
    logits.view({-1})[2] = kMinusInf;
  }
  return logits;
}

struct Case {
  int64_t rows;
  int64_t vocab;
  int64_t spare_words;  // words past ceil(vocab/32)
};

const Case kCases[] = {{1, 1, 0},   {3, 31, 0},  {3, 32, 0},   {2, 33, 1},
                       {4, 100, 0}, {5, 257, 3}, {2, 1000, 0}, {3, 4097, 2}};

TEST(TokenBitmaskCpu, EveryRowMatchesTheLiteralContract) {
  uint64_t seed = 1;
  for (const Case& c : kCases) {
    const std::string what = "rows " + std::to_string(c.rows) + " vocab " +
                             std::to_string(c.vocab) + " spare " + std::to_string(c.spare_words);
    const int64_t words = (c.vocab + 31) / 32 + c.spare_words;
    const at::Tensor logits = RandomLogits(c.rows, c.vocab, ++seed);
    const at::Tensor mask = RandomMask(c.rows, words, ++seed);
    const at::Tensor want = Literal(logits, mask, std::nullopt);

    at::Tensor got = logits.clone();
    at::Tensor& returned = apply_token_bitmask_(got, mask);
    EXPECT_TRUE(returned.is_same(got)) << what << ": in place, the same tensor returned";
    ExpectSame(got, want, what + " (dispatcher: CPU kernel)");

    at::Tensor ref = logits.clone();
    reference::apply_token_bitmask_(ref, mask);
    ExpectSame(ref, want, what + " (ATen reference)");
  }
}

TEST(TokenBitmaskCpu, RowsNameTheConstrainedRowsOnly) {
  const int64_t R = 7, V = 77, W = 3;
  const at::Tensor logits = RandomLogits(R, V, 11);
  const at::Tensor mask = RandomMask(3, W, 12);
  const std::vector<int64_t> rows = {5, 0, 3};
  const at::Tensor want = Literal(logits, mask, rows);
  for (const at::ScalarType dtype : {at::kInt, at::kLong}) {
    const at::Tensor row_ids = at::tensor(rows).to(dtype);
    at::Tensor got = logits.clone();
    apply_token_bitmask_(got, mask, row_ids);
    ExpectSame(got, want, std::string("rows ") + c10::toString(dtype));
    // The rows no bitmask row names are untouched, bit for bit.
    for (const int64_t r : {1, 2, 4, 6}) {
      EXPECT_TRUE(at::equal(got[r], logits[r])) << "row " << r;
    }
    at::Tensor ref = logits.clone();
    reference::apply_token_bitmask_(ref, mask, row_ids);
    ExpectSame(ref, want, std::string("reference, rows ") + c10::toString(dtype));
  }
}

TEST(TokenBitmaskCpu, WholeWordsAndBitsPastTheVocabulary) {
  const int64_t V = 70;  // three words, the last with 6 tokens
  const at::Tensor logits = at::zeros({3, V});
  // Row 0: nothing allowed; row 1: everything (the last word's bits past V clear: ignored);
  // row 2: only tokens 0, 31, 32, 69, with every bit past V set (ignored).
  const at::Tensor mask =
      at::tensor(std::vector<int32_t>{0, 0, 0, -1, -1, 0x3F, static_cast<int32_t>(0x80000001u), 1,
                                      static_cast<int32_t>(0xFFFFFFE0u)})
          .view({3, 3});
  at::Tensor got = logits.clone();
  apply_token_bitmask_(got, mask);
  EXPECT_TRUE(got[0].eq(kMinusInf).all().item<bool>());
  EXPECT_TRUE(got[1].eq(0).all().item<bool>());
  const at::Tensor allowed = got[2].isfinite().nonzero().view({-1});
  EXPECT_TRUE(at::equal(allowed, at::tensor(std::vector<int64_t>{0, 31, 32, 69}))) << allowed;
}

TEST(TokenBitmaskCpu, LargeBatchesSplitAcrossThreadsGiveTheSameResult) {
  // Enough rows and tokens for several intra-op tasks.
  const int64_t R = 48, V = 50000, W = (V + 31) / 32;
  const at::Tensor logits = RandomLogits(R, V, 21);
  const at::Tensor mask = RandomMask(R / 2, W, 22);
  std::vector<int64_t> rows;
  for (int64_t r = R - 1; r >= 0; r -= 2) rows.push_back(r);
  const at::Tensor row_ids = at::tensor(rows);
  at::Tensor got = logits.clone();
  apply_token_bitmask_(got, mask, row_ids);
  at::Tensor want = logits.clone();
  reference::apply_token_bitmask_(want, mask, row_ids);
  ExpectSame(got, want, "48 x 50000, every other row");
}

TEST(TokenBitmaskCpu, NothingToDo) {
  const at::Tensor logits = RandomLogits(3, 40, 31);
  at::Tensor got = logits.clone();
  apply_token_bitmask_(got, at::zeros({0, 2}, at::kInt), at::zeros({0}, at::kLong));
  ExpectSame(got, logits, "no bitmask rows");
  at::Tensor empty = at::zeros({2, 0});
  apply_token_bitmask_(empty, at::zeros({2, 0}, at::kInt));
  EXPECT_EQ(empty.sizes(), at::IntArrayRef({2, 0}));
}

// The message of the c10::Error `fn` throws ("" and a test failure when it does not throw).
template <typename Fn>
std::string ErrorOf(Fn fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(TokenBitmaskCpu, ArgumentErrorsNameTheArgumentTheExpectedAndTheReceived) {
  const at::Tensor mask = at::zeros({2, 2}, at::kInt);
  const auto call = [](at::Tensor logits, const at::Tensor& bitmask,
                       const std::optional<at::Tensor>& rows) {
    return [=]() mutable { apply_token_bitmask_(logits, bitmask, rows); };
  };
  const auto expect = [](const std::string& message, const std::string& part) {
    EXPECT_NE(message.find(part), std::string::npos)
        << "\"" << message << "\" lacks \"" << part << "\"";
  };
  expect(ErrorOf(call(at::zeros({2, 40, 1}), mask, std::nullopt)),
         "apply_token_bitmask_: logits must be 2-D [rows, vocab], got shape [2, 40, 1]");
  expect(ErrorOf(call(at::zeros({2, 40}, at::kHalf), mask, std::nullopt)),
         "logits must be float32, got Half");
  expect(ErrorOf(call(at::zeros({40, 2}).t(), mask, std::nullopt)),
         "logits must be contiguous (they are updated in place), got strides [1, 2]");
  expect(ErrorOf(call(at::zeros({2, 65}), mask, std::nullopt)),
         "bitmask must be [masked_rows, words>=3] (32 ids per word, vocab=65), got shape [2, 2]");
  expect(ErrorOf(call(at::zeros({2, 40}), at::zeros({2, 2}, at::kLong), std::nullopt)),
         "bitmask must be int32, got Long");
  expect(ErrorOf(call(at::zeros({3, 40}), mask, std::nullopt)),
         "without rows, bitmask must have one row per logits row: expected [3, words], got shape "
         "[2, 2]");
  expect(ErrorOf(call(at::zeros({3, 40}), mask, at::zeros({3}, at::kLong))),
         "rows must be [masked_rows=2] (one per bitmask row), got shape [3]");
  expect(ErrorOf(call(at::zeros({3, 40}), mask, at::zeros({2}, at::kShort))),
         "rows must be int32 or int64, got Short");
  expect(ErrorOf(call(at::zeros({3, 40}), mask, at::tensor(std::vector<int64_t>{0, 3}))),
         "rows names row 3, outside the logits' rows [0, 3)");
  expect(ErrorOf(call(at::zeros({3, 40}), mask, at::tensor(std::vector<int32_t>{-1, 0}))),
         "rows names row -1, outside the logits' rows [0, 3)");
  expect(ErrorOf(call(at::zeros({3, 40}), mask, at::tensor(std::vector<int32_t>{2, 2}))),
         "rows names row 2 twice; each logits row takes at most one bitmask row");
  // The reference refuses the same inputs with the same messages.
  at::Tensor three = at::zeros({3, 40});
  expect(ErrorOf([&] {
           reference::apply_token_bitmask_(three, mask, at::tensor(std::vector<int32_t>{2, 2}));
         }),
         "rows names row 2 twice");
}

}  // namespace
}  // namespace tost::kernels
