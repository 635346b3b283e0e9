// Small file helpers returning absl::Status with the path in every message.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tost::model {

// The most a model repository's text files may hold. They are read whole into memory, so a
// repository must not be able to make the server read without end (a link to /dev/zero) or far
// more than any real file needs.
//   config.json: real ones are kilobytes; a vision model's "labels" for thousands of classes stay
//   well under a MiB.
inline constexpr uint64_t kMaxConfigFileBytes = uint64_t{4} << 20;
//   Tokenizer files (tokenizer.json, encoder.json, vocab.bpe, tiktoken ranks): GPT-2's are about
//   1 MiB, large tiktoken vocabularies a few; a config's vocab_size is at most 2^20 ids.
inline constexpr uint64_t kMaxTokenizerFileBytes = uint64_t{64} << 20;

// Weights (model.safetensors) are bounded by their own size, and by this: the host's physical
// memory, since the file is read into memory whole.
uint64_t MaxWeightsFileBytes();

// Reads the regular file at `path` (a symbolic link is followed; its target must be a regular
// file) holding at most `max_bytes`; `what` names the file's role in messages ("config file").
// Anything else is refused without reading: a FIFO (which would block), a device (/dev/zero would
// never end), a directory or socket; a file over `max_bytes`; a file whose size changes while it
// is read. It is opened non-blocking and checked again on the opened descriptor, so a file
// swapped between the check and the open is refused too. Errors name the path and the reason:
// NOT_FOUND (missing), PERMISSION_DENIED, FAILED_PRECONDITION (not a regular file, a symbolic
// link loop, a name too long), RESOURCE_EXHAUSTED (over `max_bytes`), DATA_LOSS (read errors, a
// size that changed).
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, uint64_t max_bytes,
                                            const std::string& what);

// Reads a file an operator named on the command line (keys, certificates) whole, whatever it is:
// a pipe such as bash's <(...) must work. Model repository files go through ReadRegularFile.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace tost::model
