#include "service/engine/tenants.h"

#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"
#include "base/status_macros.h"
#include "service/engine/client_text.h"

namespace tost::service {
namespace {

// The largest quota a field takes: far beyond any real server, small enough that sums of token
// counts never overflow.
constexpr int64_t kMaxQuota = int64_t{1} << 50;

std::string Quoted(absl::string_view text) {
  return QuoteClientText(std::string_view(text.data(), text.size()));
}

absl::Status ParseQuota(absl::string_view where, absl::string_view field, absl::string_view value,
                        std::optional<int64_t>& out) {
  int64_t n = 0;
  const bool parsed = absl::SimpleAtoi(value, &n);
  if (parsed && n == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": field ", field,
                     " is 0: a quota of zero would refuse every call; leave the field out for no "
                     "quota"));
  }
  if (!parsed || n < 1 || n > kMaxQuota) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": field ", field,
                                                   " must be an integer in [1, ", kMaxQuota,
                                                   "], got ", Quoted(value)));
  }
  if (out.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": field ", field, " is set twice"));
  }
  out = n;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TenantTable> TenantTable::Parse(std::string_view text, std::string_view source,
                                               TenantLineForm form) {
  TenantTable table;
  int line_no = 0;
  const absl::string_view all(text.data(), text.size());
  const std::string file(source);
  for (absl::string_view line : absl::StrSplit(all, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    const std::string where = absl::StrCat(file, ":", line_no);
    std::vector<absl::string_view> parts =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    size_t first_field = 1;
    if (form == TenantLineForm::kApiKeysFile) {
      if (parts.size() < 2) continue;  // Authenticator refuses the line, naming it
      first_field = 2;
    }
    TenantSpec spec;
    spec.name = std::string(parts[0]);
    if (spec.name.find('=') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": expected a tenant name before its fields, got ", QuoteClientText(spec.name)));
    }
    bool weight_set = false;
    bool priority_set = false;
    for (size_t i = first_field; i < parts.size(); ++i) {
      const size_t eq = parts[i].find('=');
      if (eq == absl::string_view::npos || eq == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": expected field=value, got ", Quoted(parts[i])));
      }
      const absl::string_view field = parts[i].substr(0, eq);
      const absl::string_view value = parts[i].substr(eq + 1);
      if (field == "weight") {
        double w = 0;
        if (!absl::SimpleAtod(value, &w) || !std::isfinite(w) || w <= 0 || w > kMaxTenantWeight) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": field weight must be a number in (0, ", kMaxTenantWeight,
                           "], got ", Quoted(value)));
        }
        if (weight_set) {
          return absl::InvalidArgumentError(absl::StrCat(where, ": field weight is set twice"));
        }
        weight_set = true;
        spec.weight = w;
      } else if (field == "max_concurrent") {
        TOST_RETURN_IF_ERROR(ParseQuota(where, field, value, spec.quotas.max_concurrent));
      } else if (field == "tokens_per_minute") {
        TOST_RETURN_IF_ERROR(ParseQuota(where, field, value, spec.quotas.tokens_per_minute));
      } else if (field == "max_sessions") {
        TOST_RETURN_IF_ERROR(ParseQuota(where, field, value, spec.quotas.max_sessions));
      } else if (field == "max_session_bytes") {
        TOST_RETURN_IF_ERROR(ParseQuota(where, field, value, spec.quotas.max_session_bytes));
      } else if (field == "highest_priority") {
        int32_t p = 0;
        if (!absl::SimpleAtoi(value, &p) || p < -kMaxPriorityLimit || p > kMaxPriorityLimit) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": field highest_priority must be an integer in [",
                           -kMaxPriorityLimit, ", ", kMaxPriorityLimit,
                           "] (the lowest priority its calls may ask for), got ", Quoted(value)));
        }
        if (priority_set) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": field highest_priority is set twice"));
        }
        priority_set = true;
        spec.highest_priority = p;
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unknown field ", Quoted(field),
                         "; expected weight, max_concurrent, tokens_per_minute, max_sessions, "
                         "max_session_bytes or highest_priority"));
      }
    }
    if (auto it = table.where_.find(spec.name); it != table.where_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": duplicate tenant ",
                                                     QuoteClientText(spec.name),
                                                     " (first named at ", it->second, ")"));
    }
    table.where_.emplace(spec.name, where);
    table.by_name_.emplace(spec.name, table.tenants_.size());
    table.tenants_.push_back(std::move(spec));
  }
  return table;
}

absl::StatusOr<TenantTable> TenantTable::FromFile(const std::string& path, TenantLineForm form) {
  TOST_ASSIGN_OR_RETURN(std::string text, model::ReadFileToString(path));
  return Parse(text, path, form);
}

absl::StatusOr<TenantTable> TenantTable::Merge(const TenantTable& a, const TenantTable& b) {
  TenantTable out = a;
  for (const TenantSpec& spec : b.tenants_) {
    if (auto it = out.where_.find(spec.name); it != out.where_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(b.where_.at(spec.name), ": duplicate tenant ",
                                                     QuoteClientText(spec.name),
                                                     " (first named at ", it->second, ")"));
    }
    out.where_.emplace(spec.name, b.where_.at(spec.name));
    out.by_name_.emplace(spec.name, out.tenants_.size());
    out.tenants_.push_back(spec);
  }
  return out;
}

const TenantSpec* TenantTable::Find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tenants_[it->second];
}

std::string TenantTable::Where(std::string_view name) const {
  auto it = where_.find(name);
  return it == where_.end() ? std::string() : it->second;
}

double TenantTable::Weight(std::string_view name) const {
  const TenantSpec* spec = Find(name);
  return spec == nullptr ? 1.0 : spec->weight;
}

}  // namespace tost::service
