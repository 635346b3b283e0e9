// tost_server: serves every model of a repository over gRPC.
#include <signal.h>

#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "service/server.h"

ABSL_FLAG(std::string, model_repository, "models", "Directory with one sub-directory per model");
ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on");
ABSL_FLAG(int, port, 8500, "gRPC port; 0 picks a free port (printed on stdout)");
ABSL_FLAG(int, max_message_bytes, 64 << 20, "Largest gRPC message received or sent, in bytes");
ABSL_FLAG(int, keepalive_time_ms, 30000, "Interval of server keepalive pings on idle connections");
ABSL_FLAG(int, keepalive_timeout_ms, 10000, "Time to wait for a keepalive ack before closing");
ABSL_FLAG(int, intra_op_threads, 0, "LibTorch intra-op threads; 0 = one per core");
ABSL_FLAG(int, shutdown_grace_ms, 5000, "On SIGTERM/SIGINT, time in-flight calls get to finish");
ABSL_FLAG(int64_t, max_batch_size, 64, "Most images in one Classify request");
ABSL_FLAG(int64_t, max_tensor_elements, 64LL << 20, "Most float32 values in one Classify tensor");
ABSL_FLAG(int64_t, max_prompt_bytes, 1 << 20, "Most bytes (or token ids) in one Generate prompt");
ABSL_FLAG(int, max_new_tokens, 4096, "Largest max_new_tokens a Generate request may ask for");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Serves ToST models over gRPC. Example: tost_server --model_repository=models --port=8500");
  absl::ParseCommandLine(argc, argv);

  // Block the stop signals in every thread (gRPC's and LibTorch's inherit the mask); main waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  tost::service::ServerOptions options;
  options.model_repository = absl::GetFlag(FLAGS_model_repository);
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.keepalive_time_ms = absl::GetFlag(FLAGS_keepalive_time_ms);
  options.keepalive_timeout_ms = absl::GetFlag(FLAGS_keepalive_timeout_ms);
  options.intra_op_threads = absl::GetFlag(FLAGS_intra_op_threads);
  options.limits.max_batch_size = absl::GetFlag(FLAGS_max_batch_size);
  options.limits.max_tensor_elements = absl::GetFlag(FLAGS_max_tensor_elements);
  options.limits.max_prompt_bytes = absl::GetFlag(FLAGS_max_prompt_bytes);
  options.limits.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);

  auto server = tost::service::Server::Start(options);
  if (!server.ok()) {
    std::cerr << "tost_server: " << server.status().message() << "\n";
    return 1;
  }
  // Tests and scripts read the bound port from this line.
  std::printf("tost_server listening on %s:%d\n", options.host.c_str(), (*server)->port());
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::cerr << "tost_server: signal " << signal_number << ", shutting down\n";
  (*server)->Shutdown(absl::GetFlag(FLAGS_shutdown_grace_ms));
  return 0;
}
