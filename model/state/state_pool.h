// Rows of per-sequence TSSA statistics kept where a language model computes. The generation
// scheduler gives every active sequence one row for as long as it prefills and decodes: a decode
// step reads and updates the rows in place (on a GPU, device memory: no per-step copy of the
// statistics through the host), and a row is copied to or from host bytes only when a call starts,
// takes a snapshot or ends. Positions are not kept here: the caller owns them (they are host
// integers, uploaded with the step's token ids).
//
// Torch-free: the engine sees only this interface. LanguageModel::NewStatePool makes the device
// pool; HostStatePool is the plain-memory one (the test models use it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace tost::model {

class StatePool {
 public:
  virtual ~StatePool() = default;

  virtual int64_t rows() const = 0;
  virtual int64_t floats_per_row() const = 0;  // n_layer × (2·n_embd + n_head)
  // Bytes the pool occupies where it lives (device memory for a GPU pool).
  int64_t bytes() const { return rows() * floats_per_row() * static_cast<int64_t>(sizeof(float)); }

  // Copies a sequence's statistics into `row`.
  virtual absl::Status Store(int64_t row, absl::Span<const float> stats) = 0;
  // Copies `row` out into `stats`.
  virtual absl::Status Load(int64_t row, absl::Span<float> stats) const = 0;

  // How decode steps run on these rows ("eager", "cuda graphs", or "eager: " and why graphs were
  // turned off), for operators.
  virtual std::string decode_mode() const { return "eager"; }

 protected:
  // INVALID_ARGUMENT / OUT_OF_RANGE unless `row` exists and `floats` is one row's width.
  absl::Status CheckRow(int64_t row, size_t floats) const;
};

// A pool in host memory.
class HostStatePool final : public StatePool {
 public:
  HostStatePool(int64_t rows, int64_t floats_per_row);

  int64_t rows() const override { return rows_; }
  int64_t floats_per_row() const override { return width_; }
  absl::Status Store(int64_t row, absl::Span<const float> stats) override;
  absl::Status Load(int64_t row, absl::Span<float> stats) const override;

  // The row in place, for a model computing on host memory.
  absl::Span<float> row(int64_t r) {
    return absl::MakeSpan(data_.data() + r * width_, static_cast<size_t>(width_));
  }

 private:
  int64_t rows_, width_;
  std::vector<float> data_;
};

}  // namespace tost::model
