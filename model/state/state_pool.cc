#include "model/state/state_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace tost::model {

absl::Status StatePool::CheckRow(int64_t row, size_t floats) const {
  if (row < 0 || row >= rows()) {
    return absl::OutOfRangeError(absl::StrCat(
        "state pool row ", row, " does not exist: the pool has rows [0, ", rows(), ")"));
  }
  if (static_cast<int64_t>(floats) != floats_per_row()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state pool rows hold ", floats_per_row(), " floats, got ", floats));
  }
  return absl::OkStatus();
}

HostStatePool::HostStatePool(int64_t rows, int64_t floats_per_row)
    : rows_(std::max<int64_t>(rows, 0)),
      width_(std::max<int64_t>(floats_per_row, 0)),
      data_(static_cast<size_t>(rows_ * width_), 0.f) {}

absl::Status HostStatePool::Store(int64_t r, absl::Span<const float> stats) {
  if (absl::Status s = CheckRow(r, stats.size()); !s.ok()) return s;
  std::copy(stats.begin(), stats.end(), row(r).begin());
  return absl::OkStatus();
}

absl::Status HostStatePool::Load(int64_t r, absl::Span<float> stats) const {
  if (absl::Status s = CheckRow(r, stats.size()); !s.ok()) return s;
  const float* src = data_.data() + r * width_;
  std::copy(src, src + width_, stats.begin());
  return absl::OkStatus();
}

}  // namespace tost::model
