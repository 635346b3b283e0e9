#include "service/openai_http/responses_routes.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "service/engine/client_text.h"
#include "service/generation/generation_call.h"
#include "service/http/http_errors.h"
#include "service/http/http_query.h"
#include "service/openai/chat_template.h"
#include "service/openai/conversation_record.h"
#include "service/openai/error.h"
#include "service/openai/responses_body.h"
#include "service/openai/responses_request.h"
#include "service/openai_http/route_support.h"

namespace tost::service {
namespace {

using http::HttpExchange;
using nlohmann::json;
using openai::ResponsesRequest;
using openai::StoredConversation;
using openai::StoredResponse;

// The ids this server hands out: a response's, a conversation's. A record read under the other
// kind's prefix would be read as the wrong kind; such an id is simply unknown.
constexpr char kResponsePrefix[] = "resp_";
constexpr char kConversationPrefix[] = "conv_";

// Ids are unguessable, and an unknown, expired, deleted or someone else's id gets the same answer.
absl::Status NotFound(const char* kind, const std::string& id, const std::string& param) {
  absl::Status s = absl::NotFoundError(
      absl::StrCat(kind, " ", QuoteClientText(id),
                   " not found (unknown, expired, deleted, or created with another API key)"));
  return param.empty() ? s : openai::WithParam(std::move(s), param);
}

// A store's answer for record `id`: NOT_FOUND in the words above; UNAVAILABLE (503, with the
// store's retry hint) and the rest as they are.
absl::Status StoreRefusal(absl::Status status, const char* kind, const std::string& id,
                          const std::string& param) {
  if (status.code() == absl::StatusCode::kNotFound) return NotFound(kind, id, param);
  return status;
}

void RespondJson(HttpExchange& exchange, const json& body) {
  exchange.Respond(
      http::MakeResponse(200, body.dump(-1, ' ', false, json::error_handler_t::replace)));
}

// Runs `work` on an admission thread of the store pool (store calls may wait on a network; a
// connection's strand must not, nor a call that needs no store), answering 429 when every thread
// is busy and the queue full.
void OnPool(HandlerPool& pool, const std::shared_ptr<HttpExchange>& exchange,
            std::function<void()> work) {
  if (!pool.Schedule(std::move(work))) {
    RespondError(*exchange, pool.Refusal(exchange->request().path));
  }
}

// The id in the route's path, refused (404, as an unknown id) when it cannot be one of ours.
absl::StatusOr<std::string> PathId(const HttpExchange& exchange, std::string_view name,
                                   const char* kind, const char* prefix) {
  std::string id(exchange.request().PathParam(name));
  if (id.size() > openai::kMaxIdBytes || !absl::StartsWith(id, prefix)) {
    return NotFound(kind, id, "");
  }
  return id;
}

// A list's query: limit in [1, 100] (default 20), order "asc" or "desc" (default desc), after.
struct ListQuery {
  int64_t limit = 20;
  std::string order = "desc";
  std::string after;
};
absl::StatusOr<ListQuery> ParseListQuery(const http::HttpRequest& request) {
  auto pairs = http::ParseQuery(request.query);
  if (!pairs.ok()) return openai::WithParam(pairs.status(), "query");
  ListQuery q;
  if (auto limit = http::QueryValue(*pairs, "limit")) {
    if (!absl::SimpleAtoi(*limit, &q.limit) || q.limit < 1 || q.limit > 100) {
      return openai::FieldError(
          "limit", absl::StrCat("expected an integer in [1, 100], got ", QuoteClientText(*limit)));
    }
  }
  if (auto order = http::QueryValue(*pairs, "order")) {
    if (*order != "asc" && *order != "desc") {
      return openai::FieldError(
          "order", absl::StrCat("expected \"asc\" or \"desc\", got ", QuoteClientText(*order)));
    }
    q.order = *order;
  }
  if (auto after = http::QueryValue(*pairs, "after")) q.after = *after;
  return q;
}

struct RoutesContext {
  ServingEngine engine;
  const ServiceLimits& limits;
  AdmissionPools admission;
  RecordStore& store;
  ResponsesObserver* observer;
};

// The Responses event stream or the JSON of one POST /v1/responses: a CallSink of its
// GenerationCall, owned by it. Admission runs on admission threads, the store's reads and its
// writes on the store pool's; the tokens arrive on the engine's delivery thread.
class ResponsesSink final : public CallSink {
 public:
  ResponsesSink(Engine& engine, const RoutesContext& context,
                std::shared_ptr<HttpExchange> exchange)
      : engine_(engine), context_(context), exchange_(std::move(exchange)) {}

  // On a stateless admission thread. A response that continues a stored one or a conversation
  // moves to the store pool before it reads the store.
  void Start(GenerationCall& call) {
    StartCall(*exchange_, call, [&]() -> absl::Status {
      TOST_RETURN_IF_ERROR(Parse());
      if (!ReadsStore()) return Admit(call);
      return AdmitOnStorePool(context_.admission.store, exchange_, call,
                              [this, &call] { return Admit(call); });
    });
  }

  absl::Status Refine(AdmissionStep step, absl::Status status) override {
    switch (step) {
      case AdmissionStep::kResolve:
        // A model this server serves, refusing the state: the state's field is at fault.
        if (continued_ && engine_.Find(request_.model).ok()) {
          return ContinuationRefusal(std::move(status));
        }
        return ModelRefusal(engine_, request_.model, std::move(status));
      case AdmissionStep::kCompileConstraint:
        return ConstraintRefusal(request_.constraint_field, std::move(status));
      case AdmissionStep::kContinueConstraint:
        return ContinuationRefusal(std::move(status));
      case AdmissionStep::kInput:
      case AdmissionStep::kSubmit:
        // The engine says how long the context is and how far past it the input went.
        if (status.code() == absl::StatusCode::kOutOfRange) {
          status = absl::InvalidArgumentError(status.message());
        }
        if (status.code() == absl::StatusCode::kInvalidArgument) {
          // The engine's checks name the field they refuse by this request's names
          // (GenerationFieldNames) without attaching it: the limits on the new tokens, or else
          // the input's (its size, the context it would pass).
          const char* field = absl::StartsWith(status.message(), "max_output_tokens")
                                  ? "max_output_tokens"
                                  : "input";
          return openai::WithParam(std::move(status), field);  // keeps a param already named
        }
        return status;
      default:
        return status;
    }
  }
  absl::StatusOr<GenerationInput> Input(const AdmittedCall& call) override {
    const model::ModelConfig& config = call.generator->config();
    // Instructions first (a system message), then the conversation's items not yet answered, then
    // the input: the state holds everything before.
    std::vector<openai::ChatMessage> messages;
    std::vector<std::string> fields;
    if (request_.instructions.has_value()) {
      messages.push_back({openai::ChatRole::kSystem, *request_.instructions});
      fields.push_back("instructions");
    }
    for (const openai::InputMessage& m : pending_) {
      messages.push_back(m.message);
      fields.push_back("conversation");
    }
    for (size_t i = 0; i < request_.input.size(); ++i) {
      messages.push_back(request_.input[i].message);
      fields.push_back(absl::StrCat("input[", i, "]"));
    }
    auto rendered = openai::RenderChat(config, messages);
    if (!rendered.ok()) return RenameMessageParam(rendered.status(), fields);
    prompt_ = *std::move(rendered);
    GenerationInput in;
    in.prompt_text = prompt_;
    in.stop.emplace();
    // Under a constraint the constraint ends the reply; the template's stop strings (a closing
    // quote) would cut a JSON output at its first quote.
    if (!request_.constraint.has_value()) {
      in.stop->strings = openai::ChatStopStrings(*config.chat_template, {});
    }
    // Each response samples with its own parameters (OpenAI's defaults when unset), whatever the
    // state it continues was sampled with.
    model::SamplingParams s;
    s.temperature = request_.temperature.value_or(1.f);
    s.top_p = request_.top_p.value_or(1.f);
    s.seed = request_.seed.value_or(RandomSeed());
    in.sampling = s;
    in.max_new_tokens = request_.max_output_tokens.value_or(0);
    return in;
  }
  void Started(const AdmittedCall& call) override {
    response_ = openai::NewResponseJson(request_, response_id_, call.model,
                                        absl::ToUnixSeconds(absl::Now()));
    model_ = call.model;
    if (request_.stream) {
      events_.emplace(message_id_);
      exchange_->StartStream();
      exchange_->Write(events_->Begin(response_));
    }
  }
  bool HasRoom() override { return !request_.stream || exchange_->HasRoom(); }
  bool NotifyWhenRoom(absl::AnyInvocable<void()> wake) override {
    exchange_->OnWritable(
        [wake = std::make_shared<absl::AnyInvocable<void()>>(std::move(wake))] { (*wake)(); });
    return true;
  }
  absl::Status Token(size_t, const TokenEvent& token) override {
    text_ += token.text;
    if (request_.stream) {
      if (std::string delta = events_->Delta(token.text); !delta.empty()) {
        exchange_->Write(std::move(delta));
      }
    }
    return absl::OkStatus();
  }
  absl::Status Snapshot(size_t, std::string, int64_t) override { return absl::OkStatus(); }
  absl::Status Final(size_t, const GenerationEvent& event, std::string blob) override {
    text_ += event.final_text;
    truncated_ = event.finish_reason == FinishReason::kLength;
    // Tokens the state holds after this response: the next turn's history. Its input is all of
    // them but the output; what this turn prefilled is its prompt less the prefix-cache hit.
    const GenerationState& state = event.snapshot;
    context_tokens_ = state.sequence.position + (state.pending_token >= 0 ? 1 : 0);
    usage_.output_tokens = event.generated_tokens;
    usage_.input_tokens = context_tokens_ - usage_.output_tokens;
    const int64_t prefilled = event.prompt_tokens - event.cached_tokens;
    usage_.cached_tokens = std::max<int64_t>(0, usage_.input_tokens - prefilled);
    blob_ = std::move(blob);
    return absl::OkStatus();
  }
  void End(const absl::Status& status, bool client_gone) override {
    if (client_gone) {
      if (request_.stream) exchange_->Finish();
      return;  // nobody to answer, and a response nobody received is not kept
    }
    if (!status.ok()) return Fail(status);
    openai::CompleteResponseJson(response_, message_id_, text_, truncated_, usage_,
                                 absl::ToUnixSeconds(absl::Now()));
    // A continuation is a response that took a stored state (of a previous response or a
    // conversation), stored itself or not.
    if (continued_ && !request_.state.has_value() && context_.observer != nullptr) {
      context_.observer->OnContinuation();
    }
    // Nothing to keep (a conversation's response is stored): the state, if asked for, goes back
    // in the answer alone.
    if (!request_.store) return Answer();
    // The store may wait on a network: not on the engine's thread, which delivers every stream's
    // tokens; with the store pool full the response is refused rather than kept from there.
    auto self = self_.lock();
    if (!context_.admission.store.Schedule([self] { self->PersistAndAnswer(); })) {
      Fail(context_.admission.store.Refusal(exchange_->request().path));
    }
  }
  void Abort() override { exchange_->Abort(); }

  void set_self(std::weak_ptr<ResponsesSink> self) { self_ = std::move(self); }

 private:
  absl::Status Parse() {
    const http::HttpRequest& http_request = exchange_->request();
    TOST_ASSIGN_OR_RETURN(request_, openai::ParseResponsesRequest(http_request.body));
    for (auto& [key, value] : openai::AccessLogFields(request_.identifiers)) {
      exchange_->AddLogField(std::move(key), std::move(value));
    }
    owner_ = CallerOf(http_request);
    response_id_ = openai::NewItemId(kResponsePrefix);
    message_id_ = openai::NewItemId("msg_");
    return absl::OkStatus();
  }
  // Whether admitting the parsed request reads the store (LoadContinuation): a state blob brings
  // its own state.
  bool ReadsStore() const {
    return !request_.state.has_value() &&
           (!request_.previous_response_id.empty() || !request_.conversation_id.empty());
  }
  absl::Status Admit(GenerationCall& call) {
    GenerationCallRequest r;
    r.owner = owner_;
    r.model = request_.model;
    TOST_RETURN_IF_ERROR(LoadContinuation(r));
    r.choices = 1;
    r.constraint = request_.constraint;
    r.return_state = request_.store || request_.return_state;
    r.priority = request_.priority;
    r.prompt_cache_key = request_.identifiers.prompt_cache_key;
    r.names.model = "model";
    r.names.max_new_tokens = "max_output_tokens";
    r.names.prompt_text = "input";
    r.names.prompt_tokens = "input";
    r.names.stop = "input";
    r.names.stop_token_ids = "input";
    return call.Admit(std::move(r));
  }

  // The state this response continues: a stored response's, a conversation's, or a blob's.
  absl::Status LoadContinuation(GenerationCallRequest& r) {
    if (request_.state.has_value()) {
      r.state_blob = request_.state;
      continued_ = true;
      return absl::OkStatus();
    }
    if (!request_.previous_response_id.empty()) {
      const std::string& id = request_.previous_response_id;
      absl::StatusOr<StoredRecord> record = absl::StartsWith(id, kResponsePrefix)
                                                ? context_.store.Get(id, owner_)
                                                : absl::StatusOr<StoredRecord>(RecordNotFound(id));
      if (context_.observer != nullptr && (record.ok() || absl::IsNotFound(record.status()))) {
        context_.observer->OnPreviousResponseLookup(record.ok());
      }
      if (!record.ok())
        return StoreRefusal(record.status(), "response", id, "previous_response_id");
      TOST_ASSIGN_OR_RETURN(StoredResponse previous,
                            openai::DecodeStoredResponse(record->data, id));
      TOST_RETURN_IF_ERROR(SameModel(previous.response["model"].get<std::string>(), "response", id,
                                     "previous_response_id"));
      r.state_blob = std::move(previous.state_blob);
      continued_ = true;
      return absl::OkStatus();
    }
    if (!request_.conversation_id.empty()) {
      const std::string& id = request_.conversation_id;
      absl::StatusOr<StoredRecord> record = absl::StartsWith(id, kConversationPrefix)
                                                ? context_.store.Get(id, owner_)
                                                : absl::StatusOr<StoredRecord>(RecordNotFound(id));
      if (!record.ok()) return StoreRefusal(record.status(), "conversation", id, "conversation");
      TOST_ASSIGN_OR_RETURN(StoredConversation c,
                            openai::DecodeStoredConversation(record->data, id));
      if (!c.model.empty()) {
        TOST_RETURN_IF_ERROR(SameModel(c.model, "conversation", id, "conversation"));
      }
      pending_ = openai::PendingMessages(c);
      if (!c.state_blob.empty()) {
        r.state_blob = c.state_blob;
        continued_ = true;
      }
      conversation_version_ = record->version;
      conversation_ = std::move(c);
    }
    return absl::OkStatus();
  }

  // A state continues on the model that made it only.
  absl::Status SameModel(const std::string& model, const char* kind, const std::string& id,
                         const std::string& param) const {
    if (model == request_.model) return absl::OkStatus();
    return openai::FieldError(param, absl::StrCat(kind, " ", QuoteClientText(id),
                                                  " was made by model ", QuoteClientText(model),
                                                  ", and its state continues on that model "
                                                  "only; got model ",
                                                  QuoteClientText(request_.model)));
  }

  // A continued state the engine refused (another model's blob, an expired or foreign one),
  // named by the field that brought it.
  absl::Status ContinuationRefusal(absl::Status status) const {
    const char* param = request_.state.has_value()          ? "state"
                        : !request_.conversation_id.empty() ? "conversation"
                                                            : "previous_response_id";
    return openai::WithParam(std::move(status), param);
  }

  // RenderChat names "messages[i]"; this request named them otherwise.
  static absl::Status RenameMessageParam(const absl::Status& status,
                                         const std::vector<std::string>& fields) {
    const std::string param = openai::ErrorParam(status);
    size_t i = 0;
    if (absl::StartsWith(param, "messages[")) {
      const size_t close = param.find(']');
      if (close != std::string::npos && absl::SimpleAtoi(param.substr(9, close - 9), &i) &&
          i < fields.size()) {
        const std::string renamed = fields[i] + param.substr(close + 1);
        absl::string_view message = status.message();
        absl::ConsumePrefix(&message, param + ": ");
        return openai::WithParam(absl::Status(status.code(), absl::StrCat(renamed, ": ", message)),
                                 renamed);
      }
    }
    return status;
  }

  // On a store admission thread: keep the response and advance its conversation, then answer.
  void PersistAndAnswer() {
    if (absl::Status kept = Persist(); !kept.ok()) return Fail(kept);
    Answer();
  }

  absl::Status Persist() {
    // One id per input item, whether a stored response or its conversation lists it.
    const json input_items = openai::InputItemsJson(request_.input);
    if (request_.store) {
      StoredResponse stored;
      stored.response = response_;
      stored.input_items = input_items;
      stored.context_tokens = context_tokens_;
      stored.state_blob = blob_;
      std::string record = openai::EncodeStoredResponse(stored);
      const auto bytes = static_cast<int64_t>(record.size());
      TOST_RETURN_IF_ERROR(context_.store.Create(response_id_, owner_, std::move(record)));
      if (context_.observer != nullptr) {
        context_.observer->OnResponseStored(bytes);
      }
    }
    if (conversation_.has_value()) {
      StoredConversation& c = *conversation_;
      c.model = model_;
      c.state_blob = blob_;
      c.context_tokens = context_tokens_;
      json turn_items = input_items;
      turn_items.push_back(response_["output"][0]);
      openai::RecordTurn(c, turn_items);
      absl::StatusOr<int64_t> replaced =
          context_.store.Replace(request_.conversation_id, owner_, conversation_version_,
                                 openai::EncodeStoredConversation(c));
      if (absl::IsAborted(replaced.status())) {
        return openai::WithParam(
            absl::AbortedError(absl::StrCat(
                "conversation ", QuoteClientText(request_.conversation_id),
                " was advanced by another request while this one ran, and keeps that one's "
                "state; this response is stored as ",
                request_.store ? response_id_ : "nothing",
                ": send the turn again, or continue this branch with previous_response_id")),
            "conversation");
      }
      if (!replaced.ok()) {
        return StoreRefusal(replaced.status(), "conversation", request_.conversation_id,
                            "conversation");
      }
    }
    return absl::OkStatus();
  }

  void Answer() {
    if (request_.return_state && !blob_.empty()) response_["state"] = absl::Base64Escape(blob_);
    if (!request_.stream) return RespondJson(*exchange_, response_);
    exchange_->Write(events_->Complete(response_));
    exchange_->Finish();
  }

  void Fail(const absl::Status& failure) {
    if (!request_.stream || !events_.has_value()) return RespondError(*exchange_, failure);
    const absl::Status status = ClientStatus(*exchange_, failure);
    openai::FailResponseJson(response_, status);
    exchange_->Write(events_->Failed(response_));
    exchange_->Write(events_->Error(status));
    exchange_->Finish();
  }

  Engine& engine_;
  const RoutesContext& context_;
  const std::shared_ptr<HttpExchange> exchange_;
  std::weak_ptr<ResponsesSink> self_;
  // Set by Parse() and Admit(), then read-only.
  ResponsesRequest request_;
  std::string owner_;
  std::string response_id_;
  std::string message_id_;
  bool continued_ = false;
  std::vector<openai::InputMessage> pending_;  // the conversation's items not yet answered
  std::optional<StoredConversation> conversation_;
  int64_t conversation_version_ = 0;
  std::string prompt_;
  // Filled as the call runs (one thread at a time: the pump, then End's).
  std::string model_;
  json response_;
  std::optional<openai::ResponseEventStream> events_;  // a stream's, from Started()
  std::string text_;
  bool truncated_ = false;
  openai::ResponseUsage usage_;
  int64_t context_tokens_ = 0;
  std::string blob_;
};

void CreateResponse(Engine& engine, const RoutesContext& context,
                    std::shared_ptr<HttpExchange> exchange) {
  auto sink = std::make_shared<ResponsesSink>(engine, context, exchange);
  sink->set_self(sink);
  std::shared_ptr<GenerationCall> call = GenerationCall::Create(engine, context.limits, sink);
  if (!context.admission.stateless.Schedule([sink, call] { sink->Start(*call); })) {
    RespondError(*exchange, context.admission.stateless.Refusal(exchange->request().path));
  }
}

// GET /v1/responses/{response_id} and DELETE, and GET .../input_items.
void StoredResponseRoute(const RoutesContext& context, std::shared_ptr<HttpExchange> exchange,
                         bool input_items) {
  OnPool(context.admission.store, exchange, [&context, exchange, input_items] {
    absl::StatusOr<json> body = [&]() -> absl::StatusOr<json> {
      TOST_ASSIGN_OR_RETURN(std::string id,
                            PathId(*exchange, "response_id", "response", kResponsePrefix));
      const std::string owner = CallerOf(exchange->request());
      if (exchange->request().method == "DELETE") {
        if (absl::Status s = context.store.Delete(id, owner); !s.ok()) {
          return StoreRefusal(s, "response", id, "");
        }
        return json{{"id", id}, {"object", "response.deleted"}, {"deleted", true}};
      }
      ListQuery query;
      if (input_items) {
        TOST_ASSIGN_OR_RETURN(query, ParseListQuery(exchange->request()));
      }
      absl::StatusOr<StoredRecord> record = context.store.Get(id, owner);
      if (!record.ok()) return StoreRefusal(record.status(), "response", id, "");
      TOST_ASSIGN_OR_RETURN(StoredResponse stored, openai::DecodeStoredResponse(record->data, id));
      if (!input_items) return std::move(stored.response);
      return openai::ListPage(stored.input_items, query.order, query.after, query.limit);
    }();
    if (!body.ok()) return RespondError(*exchange, body.status());
    RespondJson(*exchange, *body);
  });
}

// Reads conversation `id`, lets `change` edit it, and writes it back if it changed, retrying a
// few times when another request wrote it in between. `change` returns the answer's body.
using ConversationChange = std::function<absl::StatusOr<json>(StoredConversation&, bool& changed)>;
absl::StatusOr<json> EditConversation(const RoutesContext& context, const std::string& id,
                                      const std::string& owner, const ConversationChange& change) {
  constexpr int kAttempts = 4;
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<StoredRecord> record = context.store.Get(id, owner);
    if (!record.ok()) return StoreRefusal(record.status(), "conversation", id, "");
    TOST_ASSIGN_OR_RETURN(StoredConversation c, openai::DecodeStoredConversation(record->data, id));
    bool changed = false;
    TOST_ASSIGN_OR_RETURN(json body, change(c, changed));
    if (!changed) return body;
    absl::StatusOr<int64_t> replaced =
        context.store.Replace(id, owner, record->version, openai::EncodeStoredConversation(c));
    if (replaced.ok()) return body;
    if (!absl::IsAborted(replaced.status()) || attempt == kAttempts) {
      return StoreRefusal(replaced.status(), "conversation", id, "");
    }
  }
}

void ConversationRoute(const RoutesContext& context, std::shared_ptr<HttpExchange> exchange) {
  OnPool(context.admission.store, exchange, [&context, exchange] {
    absl::StatusOr<json> body = [&]() -> absl::StatusOr<json> {
      const http::HttpRequest& request = exchange->request();
      const std::string owner = CallerOf(request);
      if (request.method == "POST" && request.PathParam("conversation_id").empty()) {
        TOST_ASSIGN_OR_RETURN(
            openai::ConversationRequest parsed,
            openai::ParseConversationRequest(openai::ConversationBody::kCreate, request.body));
        StoredConversation c;
        c.created_at = absl::ToUnixSeconds(absl::Now());
        if (parsed.metadata.has_value()) c.metadata = *parsed.metadata;
        TOST_RETURN_IF_ERROR(openai::AddPendingItems(c, parsed.items, "items").status());
        const std::string id = openai::NewItemId(kConversationPrefix);
        TOST_RETURN_IF_ERROR(context.store.Create(id, owner, openai::EncodeStoredConversation(c)));
        return openai::ConversationJson(id, c);
      }
      TOST_ASSIGN_OR_RETURN(std::string id, PathId(*exchange, "conversation_id", "conversation",
                                                   kConversationPrefix));
      if (request.method == "DELETE") {
        if (absl::Status s = context.store.Delete(id, owner); !s.ok()) {
          return StoreRefusal(s, "conversation", id, "");
        }
        return json{{"id", id}, {"object", "conversation.deleted"}, {"deleted", true}};
      }
      std::optional<json> metadata;
      if (request.method == "POST") {
        TOST_ASSIGN_OR_RETURN(
            openai::ConversationRequest parsed,
            openai::ParseConversationRequest(openai::ConversationBody::kUpdate, request.body));
        metadata = std::move(parsed.metadata);
      }
      return EditConversation(context, id, owner,
                              [&](StoredConversation& c, bool& changed) -> absl::StatusOr<json> {
                                if (metadata.has_value()) {
                                  c.metadata = *metadata;
                                  changed = true;
                                }
                                return openai::ConversationJson(id, c);
                              });
    }();
    if (!body.ok()) return RespondError(*exchange, body.status());
    RespondJson(*exchange, *body);
  });
}

void ConversationItemsRoute(const RoutesContext& context, std::shared_ptr<HttpExchange> exchange) {
  OnPool(context.admission.store, exchange, [&context, exchange] {
    absl::StatusOr<json> body = [&]() -> absl::StatusOr<json> {
      const http::HttpRequest& request = exchange->request();
      const std::string owner = CallerOf(request);
      TOST_ASSIGN_OR_RETURN(std::string id, PathId(*exchange, "conversation_id", "conversation",
                                                   kConversationPrefix));
      const std::string item_id(request.PathParam("item_id"));
      if (request.method == "POST") {
        TOST_ASSIGN_OR_RETURN(
            openai::ConversationRequest parsed,
            openai::ParseConversationRequest(openai::ConversationBody::kAddItems, request.body));
        return EditConversation(
            context, id, owner, [&](StoredConversation& c, bool& changed) -> absl::StatusOr<json> {
              TOST_ASSIGN_OR_RETURN(json added, openai::AddPendingItems(c, parsed.items, "items"));
              changed = true;
              return json{{"object", "list"},
                          {"data", added},
                          {"first_id", added.front()["id"]},
                          {"last_id", added.back()["id"]},
                          {"has_more", false}};
            });
      }
      ListQuery query;
      if (item_id.empty()) {
        TOST_ASSIGN_OR_RETURN(query, ParseListQuery(request));
      }
      const bool remove = request.method == "DELETE";
      return EditConversation(
          context, id, owner, [&](StoredConversation& c, bool& changed) -> absl::StatusOr<json> {
            if (item_id.empty())
              return openai::ListPage(c.items, query.order, query.after, query.limit);
            for (size_t i = 0; i < c.items.size(); ++i) {
              if (c.items[i]["id"] != item_id) continue;
              if (!remove) return c.items[i];
              const size_t first_pending = c.items.size() - static_cast<size_t>(c.pending);
              if (i < first_pending) {
                return openai::FieldError(
                    "item_id",
                    absl::StrCat("item ", QuoteClientText(item_id),
                                 " was answered already: the conversation's state holds it, and "
                                 "a state cannot forget one item. Continue from an earlier "
                                 "response (previous_response_id) to branch without it"));
              }
              c.items.erase(c.items.begin() + static_cast<std::ptrdiff_t>(i));
              --c.pending;
              changed = true;
              return openai::ConversationJson(id, c);
            }
            return NotFound("item", item_id, "item_id");
          });
    }();
    if (!body.ok()) return RespondError(*exchange, body.status());
    RespondJson(*exchange, *body);
  });
}

}  // namespace

void AddResponsesRoutes(ServingEngine engine, const ServiceLimits& limits, AdmissionPools admission,
                        RecordStore& store, ResponsesObserver* observer, http::HttpRouter& router) {
  // Shared by every route's handler, for the router's (the server's) lifetime.
  auto context = std::make_shared<RoutesContext>(
      RoutesContext{std::move(engine), limits, admission, store, observer});
  router.Handle("POST", "/v1/responses", [context](std::shared_ptr<HttpExchange> exchange) {
    if (Engine* e = EngineOrLoading(context->engine, *exchange))
      CreateResponse(*e, *context, std::move(exchange));
  });
  for (const char* method : {"GET", "DELETE"}) {
    router.Handle(method, "/v1/responses/{response_id}",
                  [context](std::shared_ptr<HttpExchange> exchange) {
                    StoredResponseRoute(*context, std::move(exchange), false);
                  });
  }
  router.Handle("GET", "/v1/responses/{response_id}/input_items",
                [context](std::shared_ptr<HttpExchange> exchange) {
                  StoredResponseRoute(*context, std::move(exchange), true);
                });
  auto conversation = [context](std::shared_ptr<HttpExchange> exchange) {
    ConversationRoute(*context, std::move(exchange));
  };
  router.Handle("POST", "/v1/conversations", conversation);
  for (const char* method : {"GET", "POST", "DELETE"}) {
    router.Handle(method, "/v1/conversations/{conversation_id}", conversation);
  }
  auto items = [context](std::shared_ptr<HttpExchange> exchange) {
    ConversationItemsRoute(*context, std::move(exchange));
  };
  for (const char* method : {"GET", "POST"}) {
    router.Handle(method, "/v1/conversations/{conversation_id}/items", items);
  }
  for (const char* method : {"GET", "DELETE"}) {
    router.Handle(method, "/v1/conversations/{conversation_id}/items/{item_id}", items);
  }
}

}  // namespace tost::service
