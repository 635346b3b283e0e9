// A gRPC service whose methods receive their requests as bytes and parse them with ParseRequest
// (service/api/raw_request.h), so that a request protobuf refuses (invalid UTF-8 in a string
// field, a malformed encoding) is answered INVALID_ARGUMENT naming the field instead of gRPC's
// INTERNAL with an empty message. Responses are serialised as gRPC's generated handlers do; auth,
// deadlines and interceptors (metrics, logs) see the call as before.
//
// Why not the generated service with its WithRaw... templates: the generated constructor installs
// typed handlers for every method (and typed SerializationTraits cannot be specialised past the
// generic MessageLite ones it instantiates), and the templates only offer raw methods on the async
// completion-queue API or the callback API. Both kinds of method here are raw callback methods,
// as the generated WithRawCallbackMethod_ templates register them. The callback API runs handlers
// on gRPC's few callback threads (two on a two-core machine), where a Classify waiting for its
// batch would hold one and throttle every stream, so unary handlers run on this service's
// HandlerPool, which gives each call a thread as gRPC's synchronous server did. They do not run on
// the synchronous server itself: with Debian's gRPC 1.51 it held every unary call about 100 ms
// once every 1.1 s, at any load, which alone broke the classification p99.
//
// Method names come from the protobuf service descriptor, and each registration checks the
// request and response types against it, so a handler cannot serve the wrong method.
#pragma once

#include <grpcpp/impl/codegen/server_callback_handlers.h>
#include <grpcpp/impl/rpc_service_method.h>
#include <grpcpp/impl/service_type.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include <cstdint>
#include <deque>
#include <string>

#include "google/protobuf/descriptor.h"
#include "service/api/before_handler.h"
#include "service/api/grpc_status.h"
#include "service/api/handler_pool.h"
#include "service/api/raw_request.h"

namespace tost::service {

class RawService : public grpc::Service {
 public:
  // Unary calls running at once per service before more wait for a thread (the synchronous server
  // this replaces had no limit; this one is far above what the queues admit).
  static constexpr int kMaxHandlerThreads = 1024;
  // Unary calls waiting for a thread once all of them run; more are answered RESOURCE_EXHAUSTED
  // at once instead of each holding its call (and its request) in memory.
  static constexpr int kMaxQueuedHandlerCalls = 4096;

 protected:
  // `service_full_name`: the proto service, e.g. "tost.v1.Tost" (its messages must be linked in);
  // `max_request_bytes`: the most a compressed request may inflate to (ParseRequest).
  RawService(const std::string& service_full_name, int64_t max_request_bytes);

  // Serves unary `method` with `handler`, a member of the derived service `Self`, on gRPC's
  // callback API with the handler itself run on this service's HandlerPool (it may block), or on
  // `pool` (not owned; it outlives the service) for a handler that should not share it: the
  // request is parsed (INVALID_ARGUMENT naming the field when it cannot be) and the response
  // serialised there.
  template <class Self, class Request, class Response>
  void AddUnary(const std::string& method,
                grpc::Status (Self::*handler)(grpc::ServerContextBase*, const Request*, Response*),
                HandlerPool* pool = nullptr) {
    const char* path =
        Register(method, *Request::descriptor(), *Response::descriptor(), /*streaming=*/false);
    Self* self = static_cast<Self*>(this);
    const bool own_pool = pool == nullptr;
    if (own_pool) pool = &handlers_;
    const int64_t max_request_bytes = max_request_bytes_;
    // The answers of calls that end before their handler (before_handler.h), made once: a flood
    // of reset streams gets them by the ten thousand a second.
    const grpc::Status no_request(
        grpc::StatusCode::INVALID_ARGUMENT,
        std::string(Request::descriptor()->name()).append(kNoRequestMessageEnd));
    const grpc::Status cancelled(grpc::StatusCode::CANCELLED,
                                 std::string(path).append(kCancelledBeforeHandlerMessageEnd));
    AddMethod(new grpc::internal::RpcServiceMethod(path, grpc::internal::RpcMethod::NORMAL_RPC,
                                                   /*handler=*/nullptr));
    MarkMethodRawCallback(
        methods_added_,
        new grpc::internal::CallbackUnaryHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
            [self, handler, pool, own_pool, max_request_bytes, path, no_request, cancelled](
                grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw,
                grpc::ByteBuffer* out) {
              grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
              // A call reset before its handler starts costs no task and no thread: a client that
              // opens and resets streams as fast as it can (HTTP/2 "rapid reset") would otherwise
              // start a thread per stream. gRPC hands such a call over without its request (the
              // reset cut it), mostly before it reports the cancellation.
              // It is mostly handed over as a call without a request message, since the reset
              // cut it, and only then reported cancelled.
              if (context->IsCancelled()) {
                reactor->Finish(cancelled);
                return reactor;
              }
              if (!raw->Valid()) {
                reactor->Finish(no_request);
                return reactor;
              }
              // The request and response buffers live until Finish; Finish is the task's last act.
              const bool scheduled = pool->Schedule([self, handler, context, raw, out, reactor,
                                                     max_request_bytes, cancelled] {
                reactor->Finish(context->IsCancelled() ? cancelled
                                                       : ServeUnary(self, handler, context, *raw,
                                                                    max_request_bytes, out));
              });
              if (!scheduled) {
                reactor->Finish(own_pool ? PoolFull(path) : ToGrpcStatus(pool->Refusal(path)));
              }
              return reactor;
            }));
    ++methods_added_;
  }

  // Serves server-streaming `method` (which takes `Request` and streams `Response`) with a
  // callback reactor of bytes that `start`, a member of `Self`, creates for the raw request. The
  // reactor parses it with ParseRequest, finishing with the refusal when it cannot, and
  // serialises each response it writes with SerializeResponse.
  template <class Request, class Response, class Self>
  void AddServerStreaming(const std::string& method,
                          grpc::ServerWriteReactor<grpc::ByteBuffer>* (Self::*start)(
                              grpc::CallbackServerContext*, const grpc::ByteBuffer&)) {
    const char* path =
        Register(method, *Request::descriptor(), *Response::descriptor(), /*streaming=*/true);
    Self* self = static_cast<Self*>(this);
    AddMethod(new grpc::internal::RpcServiceMethod(
        path, grpc::internal::RpcMethod::SERVER_STREAMING, /*handler=*/nullptr));
    MarkMethodRawCallback(
        methods_added_,
        new grpc::internal::CallbackServerStreamingHandler<grpc::ByteBuffer, grpc::ByteBuffer>(
            [self, start](grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
              return (self->*start)(context, *raw);
            }));
    ++methods_added_;
  }

 private:
  template <class Self, class Request, class Response>
  static grpc::Status ServeUnary(Self* self,
                                 grpc::Status (Self::*handler)(grpc::ServerContextBase*,
                                                               const Request*, Response*),
                                 grpc::CallbackServerContext* context, const grpc::ByteBuffer& raw,
                                 int64_t max_request_bytes, grpc::ByteBuffer* out) {
    Request request;
    if (absl::Status parsed = ParseRequest(*context, raw, max_request_bytes, request);
        !parsed.ok()) {
      return ToGrpcStatus(parsed);
    }
    Response response;
    grpc::Status status = (self->*handler)(context, &request, &response);
    if (!status.ok()) return status;
    return SerializeResponse(response, out);
  }

  // The answer of a call that finds the handler pool's queue full.
  static grpc::Status PoolFull(const char* path);

  // "/<service>/<method>" for gRPC, after checking that the proto method takes `request`, returns
  // `response` and streams (or not) as its handler does; aborts if not, a programming error.
  const char* Register(const std::string& method, const google::protobuf::Descriptor& request,
                       const google::protobuf::Descriptor& response, bool streaming);

  const google::protobuf::ServiceDescriptor* service_;
  std::deque<std::string> paths_;  // gRPC keeps the method names' pointers
  int methods_added_ = 0;          // the index of the next method
  const int64_t max_request_bytes_;
  HandlerPool handlers_;
};

}  // namespace tost::service
