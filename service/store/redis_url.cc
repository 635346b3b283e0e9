#include "service/store/redis_url.h"

#include <arpa/inet.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tost::store {
namespace {

constexpr absl::string_view kForm = "redis://[[user]:password@]host[:port][/db]";
constexpr size_t kMaxShown = 200;  // of the received value, in messages

bool IsUnreserved(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_' ||
         c == '~';
}

bool AllDigits(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// The received value as an error message may show it: whatever precedes the last '@' (the
// credentials) becomes ***; without an '@', a non-numeric "port" does too, since redis://:secret
// (the host forgotten) would otherwise print a password.
std::string RedactRaw(absl::string_view url) {
  absl::string_view scheme;
  absl::string_view rest = url;
  if (size_t sep = url.find("://"); sep != absl::string_view::npos) {
    scheme = url.substr(0, sep + 3);
    rest = url.substr(sep + 3);
  }
  std::string shown;
  if (size_t at = rest.rfind('@'); at != absl::string_view::npos) {
    shown = absl::StrCat(scheme, "***", rest.substr(at));
  } else {
    absl::string_view authority = rest.substr(0, rest.find('/'));
    size_t colon = authority.rfind(':');
    size_t bracket = authority.rfind(']');
    if (colon != absl::string_view::npos &&
        (bracket == absl::string_view::npos || colon > bracket) &&
        !AllDigits(authority.substr(colon + 1)) && colon + 1 < authority.size()) {
      shown = absl::StrCat(scheme, authority.substr(0, colon + 1), "***",
                           rest.substr(authority.size()));
    } else {
      shown = absl::StrCat(scheme, rest);
    }
  }
  if (shown.size() > kMaxShown) shown = absl::StrCat(shown.substr(0, kMaxShown), "...");
  return shown;
}

absl::Status Refuse(absl::string_view url, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat(kSessionStoreFlag, ": expected ", kForm, ", got '", RedactRaw(url), "': ", why));
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Decodes %XX escapes (RFC 3986); false on a malformed one. '+' stays '+' (not a form encoding).
bool PercentDecode(absl::string_view in, std::string& out) {
  out.clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return false;
    int hi = HexValue(in[i + 1]);
    int lo = HexValue(in[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

std::string PercentEncode(absl::string_view in) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (char c : in) {
    if (IsUnreserved(c)) {
      out.push_back(c);
    } else {
      auto b = static_cast<unsigned char>(c);
      out.push_back('%');
      out.push_back(kHex[b >> 4]);
      out.push_back(kHex[b & 15]);
    }
  }
  return out;
}

bool IsHostName(absl::string_view host) {
  for (char c : host) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') {
      return false;
    }
  }
  return true;
}

absl::Status ParseCredentials(absl::string_view url, absl::string_view userinfo, RedisEndpoint& e) {
  size_t colon = userinfo.find(':');
  if (colon == absl::string_view::npos) {
    return Refuse(url,
                  "the credentials before '@' need a ':' before the password "
                  "(redis://user:password@host, or redis://:password@host for the default user)");
  }
  if (!PercentDecode(userinfo.substr(0, colon), e.user)) {
    return Refuse(url,
                  "the user name has a malformed percent-escape (expected %XX, two hex digits)");
  }
  if (!PercentDecode(userinfo.substr(colon + 1), e.password)) {
    return Refuse(url,
                  "the password has a malformed percent-escape (expected %XX, two hex digits)");
  }
  if (e.password.empty()) {
    return Refuse(url,
                  "the password after ':' is empty (leave the credentials out for a store "
                  "without a password)");
  }
  return absl::OkStatus();
}

absl::Status ParsePort(absl::string_view url, absl::string_view text, RedisEndpoint& e) {
  if (text.empty()) return Refuse(url, "nothing after ':' (expected a port, 1..65535)");
  if (!AllDigits(text)) return Refuse(url, "the port is not a number (expected 1..65535)");
  int port = 0;
  if (text.size() > 5 || !absl::SimpleAtoi(text, &port) || port < 1 || port > 65535) {
    return Refuse(url, absl::StrCat("port ", text.substr(0, 12), " is out of range 1..65535"));
  }
  e.port = port;
  return absl::OkStatus();
}

absl::Status ParseHostPort(absl::string_view url, absl::string_view authority, RedisEndpoint& e) {
  absl::string_view port_text;
  bool has_port = false;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == absl::string_view::npos) {
      return Refuse(url, "the IPv6 address has no closing ']' (expected redis://[::1]:6379)");
    }
    e.host = std::string(authority.substr(1, close - 1));
    in6_addr unused;
    if (inet_pton(AF_INET6, e.host.c_str(), &unused) != 1) {
      return Refuse(url,
                    absl::StrCat("'", e.host.substr(0, 64),
                                 "' in brackets is not an IPv6 address (expected e.g. [::1])"));
    }
    absl::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return Refuse(url, "expected ':port' or '/db' after ']'");
      has_port = true;
      port_text = after.substr(1);
    }
  } else {
    size_t colon = authority.find(':');
    if (colon != absl::string_view::npos &&
        authority.find(':', colon + 1) != absl::string_view::npos) {
      return Refuse(url, "an IPv6 address must be written in brackets (redis://[::1]:6379)");
    }
    e.host = std::string(authority.substr(0, colon));
    if (colon != absl::string_view::npos) {
      has_port = true;
      port_text = authority.substr(colon + 1);
    }
    if (e.host.empty()) return Refuse(url, "no host (expected e.g. redis://127.0.0.1:6379)");
    if (!IsHostName(e.host)) {
      return Refuse(url,
                    "the host has characters a host name cannot have (expected letters, "
                    "digits, '.', '-' and '_', or an IPv6 address in brackets)");
    }
  }
  if (has_port) return ParsePort(url, port_text, e);
  return absl::OkStatus();
}

absl::Status ParseDb(absl::string_view url, absl::string_view path, RedisEndpoint& e) {
  if (path.empty() || path == "/") return absl::OkStatus();  // db 0
  absl::string_view text = path.substr(1);
  int db = 0;
  if (!AllDigits(text) || text.size() > 9 || !absl::SimpleAtoi(text, &db)) {
    return Refuse(url,
                  absl::StrCat("the database '", text.substr(0, 32),
                               "' after '/' is not a non-negative integer (expected e.g. /0)"));
  }
  e.db = db;
  return absl::OkStatus();
}

}  // namespace

std::string RedisEndpoint::Redacted() const {
  std::string out = "redis://";
  if (!user.empty() || !password.empty()) {
    absl::StrAppend(&out, PercentEncode(user), password.empty() ? "" : ":***", "@");
  }
  return absl::StrCat(out, Address().substr(sizeof("redis://") - 1));
}

std::string RedisEndpoint::Address() const {
  std::string out = "redis://";
  if (host.find(':') != std::string::npos) {
    absl::StrAppend(&out, "[", host, "]");
  } else {
    absl::StrAppend(&out, host);
  }
  absl::StrAppend(&out, ":", port, "/", db);
  return out;
}

absl::StatusOr<RedisEndpoint> ParseRedisUrl(std::string_view url_text) {
  const absl::string_view url(url_text.data(), url_text.size());
  if (url.empty()) return Refuse(url, "an empty value");
  size_t sep = url.find("://");
  if (sep == absl::string_view::npos) {
    return Refuse(url, "no scheme (the value must start with redis://)");
  }
  std::string scheme = absl::AsciiStrToLower(url.substr(0, sep));
  if (scheme == "rediss") {
    return Refuse(url,
                  "TLS to the session store (rediss://) is not supported: Debian 12's hiredis "
                  "0.14 has no TLS. Reach a TLS-only store through a TLS sidecar (e.g. stunnel "
                  "listening on loopback, then redis://127.0.0.1:PORT), or keep the store on a "
                  "private network and use redis://");
  }
  if (scheme != "redis") {
    return Refuse(url, absl::StrCat("the scheme '", scheme.substr(0, 16),
                                    "' is not supported (only redis://, TCP without TLS)"));
  }
  absl::string_view rest = url.substr(sep + 3);
  RedisEndpoint e;
  absl::string_view location = rest;
  if (size_t at = rest.rfind('@'); at != absl::string_view::npos) {
    if (absl::Status s = ParseCredentials(url, rest.substr(0, at), e); !s.ok()) return s;
    location = rest.substr(at + 1);
  }
  if (location.find_first_of("?#") != absl::string_view::npos) {
    return Refuse(url, "query parameters and fragments ('?', '#') are not supported");
  }
  size_t slash = location.find('/');
  absl::string_view authority = location.substr(0, slash);
  absl::string_view path = slash == absl::string_view::npos ? "" : location.substr(slash);
  if (absl::Status s = ParseHostPort(url, authority, e); !s.ok()) return s;
  if (absl::Status s = ParseDb(url, path, e); !s.ok()) return s;
  return e;
}

}  // namespace tost::store
