// The one place where LibTorch exceptions become absl::Status. Every public model entry point runs
// its tensor code through GuardTorch, so nothing above model/ ever sees a c10::Error.
#pragma once

#include <exception>
#include <string>
#include <type_traits>
#include <utility>

#include <c10/util/Exception.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/error_detail.h"
#include "model/device/device_failure.h"

namespace tost::model {

template <typename T>
struct StatusOrValue {
  using type = T;
};
template <typename T>
struct StatusOrValue<absl::StatusOr<T>> {
  using type = T;
};

// Runs `fn` (returning T or StatusOr<T>); a c10::Error from argument checks in our ops becomes
// INVALID_ARGUMENT (OUT_OF_RANGE for index errors), running out of memory (a device's or the
// host's) RESOURCE_EXHAUSTED (that request fails, the server goes on: LibTorch's caching allocator
// has already freed its cache and retried before it throws), a CUDA error that lost the device
// UNAVAILABLE (see device_failure.h), anything else INTERNAL; all name the model and the
// operation. LibTorch's own text (its source files and lines, tensor shapes, CUDA's words) is the
// status's server detail (base/error_detail.h): the server's log has it, a client never does.
template <typename Fn>
auto GuardTorch(const std::string& model, const char* operation, Fn&& fn)
    -> absl::StatusOr<typename StatusOrValue<std::decay_t<decltype(fn())>>::type> {
  const auto failed = [&](absl::StatusCode code, absl::string_view what, absl::string_view torch) {
    return WithServerDetail(
        absl::Status(code, absl::StrCat("model ", model, ": ", operation, what)),
        absl::StrCat("LibTorch: ", torch));
  };
  try {
    return fn();
  } catch (const c10::ValueError& e) {
    return failed(absl::StatusCode::kInvalidArgument, ": an argument check refused the input",
                  e.what_without_backtrace());
  } catch (const c10::OutOfMemoryError& e) {
    return failed(absl::StatusCode::kResourceExhausted,
                  ": out of memory; retry later or with fewer images or tokens per request",
                  e.what_without_backtrace());
  } catch (const c10::AcceleratorError& e) {
    // A CUDA error. A sticky one has lost the device for this whole process: the caller should
    // retry on another replica, and this one reports NOT_SERVING and exits (device_failure.h).
    const std::string what = e.what_without_backtrace();
    if (ReportCudaError(e.get_error_code(), what)) {
      return failed(absl::StatusCode::kUnavailable,
                    ": the CUDA device failed and this replica is shutting down; retry on "
                    "another replica",
                    what);
    }
    return failed(absl::StatusCode::kInternal, " failed on the CUDA device", what);
  } catch (const c10::IndexError& e) {
    return failed(absl::StatusCode::kOutOfRange, ": an index was out of range",
                  e.what_without_backtrace());
  } catch (const c10::Error& e) {
    return failed(absl::StatusCode::kInternal, " failed", e.what_without_backtrace());
  } catch (const std::exception& e) {
    return failed(absl::StatusCode::kInternal, " failed", e.what());
  }
}

}  // namespace tost::model
