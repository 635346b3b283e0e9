// TLS of the HTTP server, for its own .cc files only: which protocol versions and files its context
// takes (as the gRPC server's --tls_* flags), and how a client certificate becomes the identity
// material of HttpRequest (subject line, and identity the way gRPC reports a TLS peer).
#pragma once

#include <openssl/ssl.h>

#include <string>

#include <boost/asio/ssl/context.hpp>

#include "absl/status/status.h"
#include "service/http/http_server.h"

namespace tost::http {
namespace internal {

// Loads options.tls_cert_file and tls_key_file into `context` (TLS 1.2 and later), and with
// tls_client_ca_file requires client certificates it signed. INVALID_ARGUMENT naming the file
// OpenSSL refuses; a file that cannot be read: its read error.
absl::Status ConfigureTls(const HttpServerOptions& options, boost::asio::ssl::context& context);

struct TlsPeer {
  std::string subject;   // one line, "/CN=alice"
  std::string identity;  // the first DNS subject alternative name, else the common name
};

// The client certificate of a completed handshake on `ssl`; empty without one.
TlsPeer ReadTlsPeer(SSL* ssl);

}  // namespace internal
}  // namespace tost::http
