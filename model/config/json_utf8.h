// Where invalid UTF-8 sits in a JSON text of a model repository (config.json, tokenizer files,
// the safetensors header), for a message that names the field. A JSON parser, so with the model's
// file formats rather than in base/utf8.h, which every layer includes.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tost::model {

// INVALID_ARGUMENT when the JSON text `text` holds invalid UTF-8: the message names `source`,
// the byte offset (line and column too) and where in the document it is (the field whose value
// or key holds it, e.g. lm.tokenizer.type or labels[3]). OK for valid UTF-8; whether the JSON
// parses is left to the parser.
absl::Status CheckJsonUtf8(std::string_view text, const std::string& source);

}  // namespace tost::model
