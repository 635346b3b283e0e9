// Small file helpers returning absl::Status with the path in every message.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tost::model {

absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace tost::model
