#include "service/http/internal/tls.h"

#include <openssl/x509v3.h>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"

namespace tost::http::internal {

namespace net = boost::asio;

namespace {

// Identity the way gRPC reports a TLS peer: its first DNS subject alternative name, else its
// common name.
std::string CertificateIdentity(X509* cert) {
  auto* names =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  std::string identity;
  if (names != nullptr) {
    for (int i = 0; i < sk_GENERAL_NAME_num(names) && identity.empty(); ++i) {
      const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
      if (name->type == GEN_DNS) {
        const unsigned char* data = ASN1_STRING_get0_data(name->d.dNSName);
        identity.assign(reinterpret_cast<const char*>(data),
                        static_cast<size_t>(ASN1_STRING_length(name->d.dNSName)));
      }
    }
    GENERAL_NAMES_free(names);
  }
  if (!identity.empty()) return identity;
  char cn[256] = {0};
  const int n =
      X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn));
  return n > 0 ? std::string(cn, static_cast<size_t>(n)) : std::string();
}

}  // namespace

absl::Status ConfigureTls(const HttpServerOptions& o, net::ssl::context& ctx) {
  auto cert = model::ReadFileToString(o.tls_cert_file);
  if (!cert.ok()) return cert.status();
  auto key = model::ReadFileToString(o.tls_key_file);
  if (!key.ok()) return key.status();
  ctx.set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                  net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 |
                  net::ssl::context::no_tlsv1_1 | net::ssl::context::single_dh_use);
  boost::system::error_code ec;
  ctx.use_certificate_chain(net::buffer(*cert), ec);
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat(
        o.name, " server: tls_cert_file ", o.tls_cert_file,
        ": expected a PEM certificate chain, got one OpenSSL refuses: ", ec.message()));
  }
  ctx.use_private_key(net::buffer(*key), net::ssl::context::pem, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat(o.name, " server: tls_key_file ", o.tls_key_file,
                     ": expected the PEM private key of tls_cert_file, got one OpenSSL refuses: ",
                     ec.message()));
  }
  if (!o.tls_client_ca_file.empty()) {
    auto ca = model::ReadFileToString(o.tls_client_ca_file);
    if (!ca.ok()) return ca.status();
    ctx.add_certificate_authority(net::buffer(*ca), ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat(o.name, " server: tls_client_ca_file ", o.tls_client_ca_file,
                       ": expected a PEM CA certificate, got one OpenSSL refuses: ", ec.message()));
    }
    ctx.set_verify_mode(net::ssl::verify_peer | net::ssl::verify_fail_if_no_peer_cert);
  }
  return absl::OkStatus();
}

TlsPeer ReadTlsPeer(SSL* ssl) {
  TlsPeer peer;
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (cert == nullptr) return peer;
  char line[512] = {0};
  X509_NAME_oneline(X509_get_subject_name(cert), line, sizeof(line));
  peer.subject = line;
  peer.identity = CertificateIdentity(cert);
  X509_free(cert);
  return peer;
}

}  // namespace tost::http::internal
