// libFuzzer target: config.json (model/config/config.h, ParseModelConfig). A config that parses is
// one the server builds a model from: its invariants must hold and the sizes derived from it must
// be computable. Its strings and any error's message reach proto3 strings (ListModels, load
// errors), so both must be valid UTF-8 whatever bytes the file holds.
#include <cstdint>
#include <string>

#include "base/utf8.h"
#include "model/config/config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using tost::model::Architecture;
  const std::string text(tost::fuzz::Bytes(data, size));
  const absl::StatusOr<tost::model::ModelConfig> cfg =
      tost::model::ParseModelConfig(text, "config.json");
  if (!cfg.ok()) {
    TOST_FUZZ_CHECK(
        !tost::model::FirstInvalidUtf8(std::string(cfg.status().message())).has_value());
    return 0;
  }
  TOST_FUZZ_CHECK(!tost::model::FirstInvalidUtf8(text).has_value());
  TOST_FUZZ_CHECK(!cfg->name.empty());
  TOST_FUZZ_CHECK(!tost::model::FirstInvalidUtf8(cfg->name).has_value());
  TOST_FUZZ_CHECK(!tost::model::FirstInvalidUtf8(cfg->version).has_value());
  TOST_FUZZ_CHECK(!tost::model::FirstInvalidUtf8(cfg->provenance_json).has_value());
  if (cfg->architecture == Architecture::kVision) {
    const tost::model::VisionConfig& v = cfg->vision;
    TOST_FUZZ_CHECK(v.embed_dim > 0 && v.depth > 0 && v.num_heads > 0 && v.num_classes > 0);
    TOST_FUZZ_CHECK(v.in_chans > 0 && v.image_height > 0 && v.image_width > 0);
    TOST_FUZZ_CHECK(v.embed_dim % v.num_heads == 0);
    TOST_FUZZ_CHECK(static_cast<int64_t>(v.labels.size()) == v.num_classes);
    for (const std::string& label : v.labels)
      TOST_FUZZ_CHECK(!tost::model::FirstInvalidUtf8(label).has_value());
    TOST_FUZZ_CHECK(static_cast<int64_t>(v.mean.size()) == v.in_chans);
    TOST_FUZZ_CHECK(static_cast<int64_t>(v.std.size()) == v.in_chans);
    for (const float s : v.std) TOST_FUZZ_CHECK(s > 0);
    TOST_FUZZ_CHECK(v.stem_stages() >= 1);
    TOST_FUZZ_CHECK(v.tokens() >= 1);  // what the vision model sizes its token grid with
  } else {
    const tost::model::LanguageConfig& l = cfg->language;
    TOST_FUZZ_CHECK(l.n_layer > 0 && l.n_head > 0 && l.n_embd > 0 && l.vocab_size > 0);
    TOST_FUZZ_CHECK(l.context_length > 0);
    TOST_FUZZ_CHECK(l.n_embd % l.n_head == 0);
    TOST_FUZZ_CHECK(l.eos_token_id < l.vocab_size);
    TOST_FUZZ_CHECK(l.state_floats_per_layer() > 0);  // what session state is sized with
  }
  return 0;
}
