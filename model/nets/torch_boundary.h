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
// operation.
template <typename Fn>
auto GuardTorch(const std::string& model, const char* operation, Fn&& fn)
    -> absl::StatusOr<typename StatusOrValue<std::decay_t<decltype(fn())>>::type> {
  try {
    return fn();
  } catch (const c10::ValueError& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("model ", model, ": ", operation, ": ", e.what_without_backtrace()));
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("model ", model, ": ", operation,
                     ": out of memory; retry later or with fewer images or tokens per request (",
                     e.what_without_backtrace(), ")"));
  } catch (const c10::AcceleratorError& e) {
    // A CUDA error. A sticky one has lost the device for this whole process: the caller should
    // retry on another replica, and this one reports NOT_SERVING and exits (device_failure.h).
    const std::string what = e.what_without_backtrace();
    if (ReportCudaError(e.get_error_code(), what)) {
      return absl::UnavailableError(
          absl::StrCat("model ", model, ": ", operation,
                       ": the CUDA device failed and this replica is shutting "
                       "down; retry on another replica (",
                       what, ")"));
    }
    return absl::InternalError(
        absl::StrCat("model ", model, ": ", operation, " failed on the CUDA device: ", what));
  } catch (const c10::IndexError& e) {
    return absl::OutOfRangeError(
        absl::StrCat("model ", model, ": ", operation, ": ", e.what_without_backtrace()));
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("model ", model, ": ", operation, " failed: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("model ", model, ": ", operation, " failed: ", e.what()));
  }
}

}  // namespace tost::model
