// UTF-8 validation for text that enters from model repository files. What the server reports
// (model names, load errors, labels) travels in proto3 strings, which must be valid UTF-8: one
// invalid byte there makes the whole response fail to serialise, for every client.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tost::model {

// Expected length of a UTF-8 sequence from its lead byte; 0 for a byte that cannot lead.
int Utf8SequenceLength(unsigned char lead);
bool IsUtf8Continuation(unsigned char c);
// Whether `second` may follow `lead`: refuses overlong encodings, surrogates and code points
// above U+10FFFF (RFC 3629's table).
bool IsValidUtf8SecondByte(unsigned char lead, unsigned char second);

// The offset of the first byte of `text` that is not part of a valid UTF-8 sequence (a truncated
// sequence at the end counts); nullopt when all of it is valid.
std::optional<size_t> FirstInvalidUtf8(std::string_view text);

// The longest prefix of `text` of at most `max_bytes` that does not end inside a UTF-8 sequence:
// for quoting the start of a string in a message without cutting a character in two.
std::string Utf8Prefix(std::string_view text, size_t max_bytes);

// `text` with every byte that is not part of a valid UTF-8 sequence written as \xNN: valid UTF-8,
// and still shows what the bytes were. nlohmann's parse errors need it even for valid input:
// their "last read" quotes bytes raw, and may stop inside a multi-byte character.
std::string EscapeInvalidUtf8(std::string_view text);

// `status` with its message passed through EscapeInvalidUtf8 (the same status when it is valid).
absl::Status WithUtf8Message(const absl::Status& status);

}  // namespace tost::model
