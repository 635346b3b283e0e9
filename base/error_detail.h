// An error has two readers: the client whose request failed, and whoever reads the server's log.
// Some of what explains an error is the server's alone: a library's own text (LibTorch's, with its
// source files and lines; XGrammar's, which quotes a whole schema back), a path of the server's
// file system, a store's host and port. That part travels with the status as its server detail, a
// payload no client is sent, and the message stays in words a client can act on.
//
// Where a status reaches a client (the gRPC interceptor, the HTTP routes' error answers), ForClient
// gives the client its share: the message bounded to kMaxClientMessageBytes, and for the codes that
// mean the server failed (INTERNAL, UNKNOWN, DATA_LOSS) a fixed message naming the request id
// instead of whatever the failing layer said. Whatever it held back (the detail, the whole message)
// that caller logs under the same request id.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tost {

// The most bytes of a message a client is sent. Messages that quote a client's text quote at most
// 64 bytes of it (service/engine/client_text.h), so only a message built wrongly comes near this.
inline constexpr size_t kMaxClientMessageBytes = 1024;
// The most bytes of a server detail kept: it is written to the log, once per failed request.
inline constexpr size_t kMaxServerDetailBytes = 4096;

// `status` with `detail` (cut at kMaxServerDetailBytes) as its server detail, after any it had.
absl::Status WithServerDetail(absl::Status status, std::string_view detail);
// The server detail of `status`; "" when it has none.
std::string ServerDetail(const absl::Status& status);
// `status`'s code and payloads (its server detail among them) with another message: what a layer
// that rewords an error returns, so that the detail below it is not lost on the way up.
absl::Status WithMessage(const absl::Status& status, std::string_view message);
// The message and, in brackets, the server detail: what a log line of the server's own says.
std::string FullErrorText(const absl::Status& status);

// True for the codes that say the server failed rather than the request: INTERNAL, UNKNOWN,
// DATA_LOSS. Their messages come from whatever layer failed, so clients get ForClient's own.
bool IsServerFailure(absl::StatusCode code);

struct ClientError {
  absl::Status status;    // what the client is sent: same code and payloads, no server detail
  bool withheld = false;  // part of the original is not in it: the caller logs the original
};
// What the client of request `request_id` ("" when unknown) is told of `status`: INTERNAL, UNKNOWN
// and DATA_LOSS as "internal error (request id ...): the server's log has the details"; a longer
// message cut (at a UTF-8 boundary) to kMaxClientMessageBytes, saying how long it was and where the
// rest is; the server detail removed. An already bounded status comes back unchanged (withheld
// false), so applying it twice logs once.
ClientError ForClient(const absl::Status& status, std::string_view request_id);

}  // namespace tost
