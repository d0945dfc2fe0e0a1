// kvo-serve: one model behind the OpenAI API (/v1/chat/completions, /v1/completions, streamed
// by server-sent events or not, /v1/models), with /health and /metrics (Prometheus text). The
// model and its cache take kvo-generate's options; requests share the cache as its slots
// (tools/serve/engine.hpp), and a prompt whose first tokens a free slot holds prefills only the
// rest.
//
// Safe by default: it listens on 127.0.0.1; --api-key makes /v1/* and /metrics ask for
// "Authorization: Bearer KEY"; bodies, prompts and max_tokens have limits, refused with 400 (413
// for a body) before any work; a client that goes away cancels its request and frees its slot;
// SIGTERM or SIGINT answers new requests 503, lets running requests end within
// --shutdown-deadline, cancels the rest, closes the listener once their responses are written,
// and exits 0.
#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kvoffload/kvoffload.hpp"
#include "model/decoder/decoder.hpp"
#include "model/text/chat_format.hpp"
#include "model/text/tokenizer.hpp"
#include "model/text/tokenizer_settings.hpp"
#include "tools/cli/cli.hpp"
#include "tools/generate/generate_options.hpp"
#include "tools/generate/generate_text.hpp"
#include "tools/serve/api.hpp"
#include "tools/serve/engine.hpp"
#include "tools/serve/serial_tokenizer.hpp"

namespace {

using kvo::serve::ApiError;
using kvo::serve::Endpoint;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kMaxTokens = 1 << 30;

struct ServeArgs {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  std::string name;  // the model's id in responses (default: the file or directory's name)
  int slots = 4;
  int max_seq = 8192;
  int queue = 16;
  std::uint64_t max_body = 8ull << 20;
  int max_prompt_tokens = 0;  // 0: max_seq - 1
  int max_tokens = 1024;
  double shutdown_deadline_s = 10;
  int http_threads = 0;      // 0: slots + queue + 4
  int prefill_piece = 4096;  // prompt tokens prefilled between two decode steps
  std::string contexts;  // a directory: the slots' rows restored at start, saved at a clean stop
};

// The file in --contexts DIR.
std::string contexts_file(const std::string& dir) {
  return dir + "/contexts.kvo";
}

std::string base_name(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const std::size_t slash = p.find_last_of('/');
  return slash == std::string::npos ? p : p.substr(slash + 1);
}

std::string metrics_text(const kvo::serve::EngineMetrics& m, std::uint64_t refused,
                         std::uint64_t rejected) {
  std::ostringstream o;
  auto line = [&](const char* name, const char* type, const char* help, double value) {
    o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n'
      << name << ' ' << value << '\n';
  };
  line("kvo_requests_started_total", "counter", "requests that got a slot",
       static_cast<double>(m.requests_started));
  line("kvo_requests_finished_total", "counter", "requests that ended (stop or length)",
       static_cast<double>(m.requests_finished));
  line("kvo_requests_cancelled_total", "counter", "requests whose client went away",
       static_cast<double>(m.requests_cancelled));
  line("kvo_requests_failed_total", "counter", "requests that failed in the engine",
       static_cast<double>(m.requests_failed));
  line("kvo_requests_refused_total", "counter", "requests answered 503 (busy or stopping)",
       static_cast<double>(refused));
  line("kvo_requests_rejected_total", "counter", "requests answered 4xx",
       static_cast<double>(rejected));
  line("kvo_prompt_tokens_total", "counter", "prompt tokens prefilled",
       static_cast<double>(m.prompt_tokens));
  line("kvo_prompt_tokens_reused_total", "counter",
       "prompt tokens found in a slot's rows, not prefilled again",
       static_cast<double>(m.reused_tokens));
  line("kvo_prefix_cache_hits_total", "counter", "requests that reused a slot's rows",
       static_cast<double>(m.prefix_hits));
  line("kvo_prefix_copies_total", "counter",
       "requests whose prefix was copied from another slot's rows",
       static_cast<double>(m.prefix_copies));
  line("kvo_completion_tokens_total", "counter", "tokens generated",
       static_cast<double>(m.completion_tokens));
  line("kvo_decode_steps_total", "counter", "decode steps", static_cast<double>(m.decode_steps));
  line("kvo_prefill_pieces_total", "counter", "prompt pieces prefilled between decode steps",
       static_cast<double>(m.prefill_pieces));
  line("kvo_prefill_seconds_total", "counter", "time spent prefilling", m.prefill_s);
  line("kvo_decode_seconds_total", "counter", "time spent in decode steps", m.decode_s);
  line("kvo_prefill_tokens_per_second", "gauge", "prompt tokens prefilled per prefill second",
       m.prefill_s > 0 ? static_cast<double>(m.prompt_tokens) / m.prefill_s : 0);
  line("kvo_decode_tokens_per_second", "gauge", "tokens decoded per decode second",
       m.decode_s > 0 ? static_cast<double>(m.completion_tokens) / m.decode_s : 0);
  line("kvo_h2d_bytes_total", "counter", "bytes moved host to device by the cache",
       static_cast<double>(m.h2d_bytes));
  line("kvo_slots", "gauge", "slots of the cache", m.slots);
  line("kvo_slots_in_use", "gauge", "slots running a request", m.slots_in_use);
  line("kvo_queue_length", "gauge", "requests waiting for a slot", m.queued);
  return o.str();
}

int run(const kvo::cli::GenerateArgs& model_args, const CLI::App& app, const ServeArgs& a) {
  // SIGTERM and SIGINT are taken by a thread of their own, blocked in every other thread (each
  // started after this inherits the mask). Before the server runs, one ends the process at once.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::mutex stop_mutex;
  std::function<void()> stop_action;
  std::atomic<bool> stopping{false};
  std::atomic<bool> ending{false};  // run() is ending without a signal: the watcher just returns
  std::thread watcher([&] {
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    if (ending) return;
    std::lock_guard<std::mutex> lock(stop_mutex);
    std::fprintf(stderr, "kvo-serve: stopping (signal %d)\n", signal_number);
    if (!stop_action) std::_Exit(0);
    stop_action();
  });
  // Whatever ends run() without a signal (an error) ends the watcher too.
  struct JoinWatcher {
    std::thread& t;
    std::atomic<bool>& ending;
    ~JoinWatcher() {
      if (!t.joinable()) return;
      ending = true;
      pthread_kill(t.native_handle(), SIGTERM);
      t.join();
    }
  } join_watcher{watcher, ending};

  kvo::cli::GenerateRun r;
  kvo::cli::resolve_model(model_args, app, r);
  if (r.source.checkpoint.empty()) {
    throw kvo::cli::UsageError(
        "kvo-serve needs --model DIR or FILE.gguf with a tokenizer (a preset has none); "
        "tools/serve.sh starts it on SmolLM2-135M-Instruct");
  }
  if (a.max_prompt_tokens >= a.max_seq) {
    throw kvo::cli::UsageError("--max-prompt-tokens " + std::to_string(a.max_prompt_tokens) +
                               " leaves no room to generate in --max-seq " +
                               std::to_string(a.max_seq));
  }
  r.decoder.slots = a.slots;
  r.decoder.max_seq = a.max_seq;
  // The decoder's activations hold one piece of a prompt (the engine's, unless --max-prompt).
  r.decoder.max_prompt = model_args.max_prompt > 0 ? model_args.max_prompt
                         : a.prefill_piece > 0     ? std::min(a.prefill_piece, a.max_seq)
                                                   : a.max_seq;
  r.decoder.fit_prompt = model_args.max_prompt == 0;

  // Refused before the weights load: a port taken, a host that does not resolve.
  httplib::Server server;
  if (!server.bind_to_port(a.host, a.port)) {
    throw kvo::cli::UsageError("cannot listen on " + a.host + ":" + std::to_string(a.port) +
                               " (taken, or not an address of this machine)");
  }

  const std::string& dir = r.source.checkpoint;
  std::unique_ptr<kvo::model::Tokenizer> tokenizer = kvo::model::load_tokenizer(dir);
  kvo::model::check_tokenizer_fits(*tokenizer, r.config.vocab_size, dir);
  const std::vector<std::int32_t> stop_ids = kvo::model::stop_ids(dir, *tokenizer);
  std::optional<kvo::model::ChatFormat> chat;
  std::string no_chat;
  try {
    chat = kvo::model::chat_format(kvo::model::load_tokenizer_settings(dir), std::nullopt);
  } catch (const kvo::Error& e) {
    no_chat = std::string("this model's chat format cannot be built (") + e.what() +
              "); use /v1/completions with the prompt formatted";
  }

  // --contexts: checked before the weights load, so that nothing fails after the work.
  if (!a.contexts.empty()) {
    struct stat st {};
    if (::stat(a.contexts.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      throw kvo::cli::UsageError("--contexts: " + a.contexts + " is not a directory");
    }
    try {
      kvo::check_save_path(contexts_file(a.contexts));
    } catch (const kvo::Error& e) {
      throw kvo::cli::UsageError(std::string("--contexts: ") + e.what());
    }
  }

  std::fprintf(stderr, "kvo-serve: loading %s\n", dir.c_str());
  kvo::model::Decoder decoder(r.config, r.source, r.decoder);
  const kvo::CachePlan plan = decoder.cache().stats().plan;
  std::vector<int> all_slots;
  for (int s = 0; s < a.slots; ++s) all_slots.push_back(s);
  std::string fingerprint;
  std::vector<std::vector<std::int32_t>> restored;
  if (!a.contexts.empty()) {
    kvo::cli::check_contexts_hold(plan, "--contexts");
    fingerprint = kvo::tools::TextSession::fingerprint(decoder, r.source);
    const std::string path = contexts_file(a.contexts);
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      // Another model's, shape's or slot count's contexts are refused, never overwritten.
      std::vector<kvo::SlotContext> loaded;
      try {
        loaded = decoder.cache().load_slots(all_slots, path, fingerprint);
      } catch (const kvo::Error& e) {
        throw kvo::cli::UsageError("--contexts: " + path + " cannot be restored here: " + e.what() +
                                   " (give another directory, or remove the file)");
      }
      std::int64_t tokens = 0;
      for (kvo::SlotContext& c : loaded) {
        tokens += static_cast<std::int64_t>(c.tokens.size());
        restored.push_back(std::move(c.tokens));
      }
      std::fprintf(stderr, "kvo-serve: restored %d slots (%lld tokens) from %s\n", a.slots,
                   static_cast<long long>(tokens), path.c_str());
    }
  }
  const std::string model_name = a.name.empty() ? base_name(dir) : a.name;
  kvo::serve::ApiLimits limits;
  limits.max_seq = a.max_seq;
  limits.max_prompt_tokens = a.max_prompt_tokens > 0 ? a.max_prompt_tokens : a.max_seq - 1;
  limits.max_tokens = a.max_tokens;
  limits.vocab = r.config.vocab_size;
  // Handlers tokenize on their threads while the engine detokenizes on its own.
  const kvo::serve::SerialTokenizer shared_tokenizer(*tokenizer);
  kvo::serve::Engine engine(decoder, shared_tokenizer, stop_ids, a.queue, a.prefill_piece,
                            std::move(restored));

  std::atomic<std::uint64_t> refused{0}, rejected{0}, ids{0};
  std::atomic<int> open_responses{0};
  const std::int64_t started_at = static_cast<std::int64_t>(std::time(nullptr));

  auto send_error = [&](httplib::Response& res, int status, const std::string& message) {
    if (status == 503) refused.fetch_add(1);
    if (status >= 400 && status < 500) rejected.fetch_add(1);
    res.status = status;
    res.set_content(kvo::serve::error_body(status, message), "application/json");
  };
  auto authorized = [&](const httplib::Request& req, httplib::Response& res) {
    if (a.api_key.empty()) return true;
    // Compared in time that does not depend on where the texts differ.
    const std::string given = req.get_header_value("Authorization");
    const std::string want = "Bearer " + a.api_key;
    unsigned char differ = given.size() == want.size() ? 0 : 1;
    for (std::size_t i = 0; i < want.size(); ++i) {
      differ |= static_cast<unsigned char>(want[i] ^ (i < given.size() ? given[i] : '\0'));
    }
    if (differ == 0) return true;
    send_error(res, 401, "a valid API key is needed: Authorization: Bearer KEY");
    return false;
  };

  auto complete = [&](Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    kvo::serve::ApiRequest request;
    try {
      request =
          kvo::serve::parse_request(endpoint, req.body, shared_tokenizer, chat, no_chat, limits);
    } catch (const ApiError& e) {
      send_error(res, e.status, e.what());
      return;
    }
    std::shared_ptr<kvo::serve::Job> job;
    try {
      job = engine.submit(std::move(request.completion));
    } catch (const kvo::serve::Busy& e) {
      res.set_header("Retry-After", "1");
      send_error(res, 503, e.what());
      return;
    }
    const std::string id = (endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") +
                           std::to_string(started_at) + "-" + std::to_string(ids.fetch_add(1));
    const std::int64_t created = static_cast<std::int64_t>(std::time(nullptr));
    auto dump = [](const json& j) {
      return j.dump(-1, ' ', false, json::error_handler_t::replace);
    };
    // Whatever ends the response (the client gone, the server stopping) ends the request.
    // Responses written in chunks are counted: the server stops once they are written.
    auto on_done = [job, &open_responses](bool) {
      job->cancel();
      --open_responses;
    };

    // While the request waits for a slot nothing is sent: a refusal then (at shutdown) gets its
    // own status.
    auto gather = [](kvo::serve::Update& into, const kvo::serve::Update& u) {
      const std::string text = into.text + u.text;
      into = u;
      into.text = text;
    };
    kvo::serve::Update early;
    while (!early.done && !early.started) gather(early, job->take(std::chrono::milliseconds(200)));
    if (early.done && !early.error.empty()) {
      send_error(res, early.error_status, early.error);
      return;
    }

    if (request.stream) {
      ++open_responses;
      auto first = std::make_shared<bool>(true);
      auto carried = std::make_shared<std::optional<kvo::serve::Update>>(early);
      res.set_chunked_content_provider(
          "text/event-stream",
          [=](std::size_t, httplib::DataSink& sink) {
            kvo::serve::Update u;
            if (carried->has_value()) {  // what came while the request waited, first
              u = std::move(**carried);
              carried->reset();
            } else {
              u = job->take(std::chrono::milliseconds(500));
            }
            auto send = [&](const json& j) {
              const std::string event = "data: " + dump(j) + "\n\n";
              return sink.write(event.data(), event.size());
            };
            if (!u.error.empty()) {
              const std::string event =
                  "data: " + dump(json::parse(kvo::serve::error_body(u.error_status, u.error))) +
                  "\n\n";
              sink.write(event.data(), event.size());
              sink.done();
              return true;
            }
            if (!u.text.empty() || *first) {
              if (!send(kvo::serve::chunk_body(endpoint, id, created, model_name, u.text, "",
                                               *first))) {
                job->cancel();
                return false;
              }
              *first = false;
            }
            if (u.done) {
              send(kvo::serve::chunk_body(endpoint, id, created, model_name, "", u.finish_reason,
                                          false));
              if (request.include_usage) {
                json usage =
                    kvo::serve::chunk_body(endpoint, id, created, model_name, "", "x", false);
                usage["choices"] = json::array();
                usage["usage"] = kvo::serve::usage_body(u);
                send(usage);
              }
              const std::string end = "data: [DONE]\n\n";
              sink.write(end.data(), end.size());
              sink.done();
            }
            return true;
          },
          on_done);
      return;
    }
    // Not streamed: the answer whole, and for a second its status still open. A request still
    // running then keeps its connection tested by a space now and then (JSON allows it before
    // the value), so that a client that went away cancels it.
    kvo::serve::Update all = early;
    const auto patience = Clock::now() + std::chrono::seconds(1);
    while (!all.done && Clock::now() < patience) {
      gather(all, job->take(std::chrono::duration_cast<std::chrono::milliseconds>(patience -
                                                                                  Clock::now())));
    }
    if (all.done) {
      if (!all.error.empty()) {
        send_error(res, all.error_status, all.error);
        return;
      }
      res.set_content(dump(kvo::serve::response_body(endpoint, id, created, model_name, all)),
                      "application/json");
      return;
    }
    ++open_responses;
    auto sofar = std::make_shared<kvo::serve::Update>(all);
    res.set_chunked_content_provider(
        "application/json",
        [=](std::size_t, httplib::DataSink& sink) {
          const kvo::serve::Update u = job->take(std::chrono::milliseconds(1000));
          gather(*sofar, u);
          if (!sofar->done) {
            if (!sink.write(" ", 1)) {
              job->cancel();
              return false;
            }
            return true;
          }
          const std::string body =
              sofar->error.empty()
                  ? dump(kvo::serve::response_body(endpoint, id, created, model_name, *sofar))
                  : kvo::serve::error_body(sofar->error_status, sofar->error);
          sink.write(body.data(), body.size());
          sink.done();
          return true;
        },
        on_done);
  };

  server.Post("/v1/chat/completions", [&](const httplib::Request& req, httplib::Response& res) {
    complete(Endpoint::kChat, req, res);
  });
  server.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    complete(Endpoint::kCompletions, req, res);
  });
  server.Get("/v1/models", [&](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    json model = {{"id", model_name},
                  {"object", "model"},
                  {"created", started_at},
                  {"owned_by", "kvoffload"},
                  {"max_seq", a.max_seq}};
    res.set_content(json{{"object", "list"}, {"data", json::array({model})}}.dump(),
                    "application/json");
  });
  server.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    const kvo::serve::EngineMetrics m = engine.metrics();
    res.set_content(json{{"status", "ok"},
                         {"slots", m.slots},
                         {"slots_in_use", m.slots_in_use},
                         {"queued", m.queued}}
                        .dump(),
                    "application/json");
  });
  server.Get("/metrics", [&](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    res.set_content(metrics_text(engine.metrics(), refused.load(), rejected.load()),
                    "text/plain; version=0.0.4");
  });
  server.set_exception_handler(
      [&](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(res, 500, what);
      });
  server.set_error_handler([&](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;
    const std::string message =
        res.status == 404 ? "no such endpoint"
        : res.status == 413
            ? "the body is larger than " + std::to_string(a.max_body) + " bytes (--max-body)"
            : "the request was refused";
    res.set_content(kvo::serve::error_body(res.status, message), "application/json");
  });
  server.set_payload_max_length(a.max_body);
  server.set_read_timeout(10, 0);
  server.set_write_timeout(10, 0);
  server.set_keep_alive_timeout(2);
  const int threads = a.http_threads > 0 ? a.http_threads : a.slots + a.queue + 4;
  server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };

  // Destroyed before the engine and the server: a signal after that finds nothing to stop.
  struct ClearStop {
    std::mutex& m;
    std::function<void()>& f;
    ~ClearStop() {
      std::lock_guard<std::mutex> lock(m);
      f = nullptr;
    }
  } clear_stop{stop_mutex, stop_action};
  {
    std::lock_guard<std::mutex> lock(stop_mutex);
    // The engine first (new requests get 503, running ones end or are cancelled at the
    // deadline), then the responses still being written, then the listener: stopping it cuts
    // the responses written in chunks.
    stop_action = [&] {
      stopping = true;
      engine.shutdown(
          std::chrono::milliseconds(static_cast<std::int64_t>(a.shutdown_deadline_s * 1e3)));
      const auto give_up = Clock::now() + std::chrono::seconds(5);
      while (open_responses > 0 && Clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      server.stop();
    };
  }

  std::fprintf(stderr,
               "kvo-serve: %s (%s, %d layers, K/V %s, backend %s) on http://%s:%d, %d slots of "
               "%d tokens; plan %d resident + %d streamed layers\n",
               model_name.c_str(), r.config.architecture.c_str(), r.config.layers,
               kvo::dtype_name(decoder.kv_dtype()), kvo::backend_name(decoder.backend()),
               a.host.c_str(), a.port, a.slots, a.max_seq, plan.resident_layers,
               plan.streamed_layers);
  std::fflush(stderr);
  const bool ok = server.listen_after_bind();
  if (!ok && !stopping) throw kvo::Error(kvo::ErrorCode::kInternal, "the listener stopped");
  watcher.join();  // the engine has stopped
  if (!a.contexts.empty()) {
    std::vector<kvo::SlotContext> contexts;
    std::int64_t tokens = 0;
    for (int s : all_slots) {
      std::vector<std::int32_t> held = engine.held(s);
      if (static_cast<int>(held.size()) != decoder.length(s)) held.clear();  // not matched again
      tokens += static_cast<std::int64_t>(held.size());
      contexts.push_back({std::move(held), fingerprint});
    }
    const std::string path = contexts_file(a.contexts);
    decoder.cache().save_slots(all_slots, path, contexts);
    std::fprintf(stderr, "kvo-serve: saved %d slots (%lld tokens) to %s\n", a.slots,
                 static_cast<long long>(tokens), path.c_str());
  }
  std::fprintf(stderr, "kvo-serve: stopped\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("", "kvo-serve");
  kvo::cli::describe(app,
                     "Serves one model over the OpenAI API (/v1/chat/completions, "
                     "/v1/completions, /v1/models), with /health and /metrics; the K/V cache "
                     "lives in kvoffload's offloaded static cache, its slots shared by the "
                     "requests.");
  kvo::cli::GenerateArgs model_args;
  ServeArgs a;
  app.option_defaults()->group("Server");
  kvo::cli::add_text(app, "--host", a.host, "ADDRESS",
                     "address to listen on (default 127.0.0.1: this machine alone; 0.0.0.0: "
                     "every interface)");
  kvo::cli::add_integer(app, "--port", a.port, 1, 65535, "port to listen on");
  kvo::cli::add_text(app, "--api-key", a.api_key, "KEY",
                     "ask for 'Authorization: Bearer KEY' on /v1/* and /metrics (default: none)");
  kvo::cli::add_text(app, "--name", a.name, "ID",
                     "the model's id in responses (default: the file or directory's name)");
  kvo::cli::add_integer(app, "--slots", a.slots, 1, 4096,
                        "requests decoded together, each a slot of the cache");
  kvo::cli::add_tokens(app, "--max-seq", a.max_seq, 2, kMaxTokens,
                       "tokens per slot: a prompt and what it generates");
  kvo::cli::add_integer(app, "--queue", a.queue, 0, 1 << 20,
                        "requests that may wait for a slot; more are answered 503");
  kvo::cli::add_size(app, "--max-body", a.max_body, 1,
                     "largest request body; a larger one is answered 413 (default 8MiB)");
  kvo::cli::add_tokens(app, "--max-prompt-tokens", a.max_prompt_tokens, 0, kMaxTokens,
                       "longest prompt taken, in tokens (0: --max-seq - 1)");
  kvo::cli::add_tokens(app, "--max-tokens", a.max_tokens, 1, kMaxTokens,
                       "largest max_tokens a request may ask for, and its default");
  kvo::cli::add_real(app, "--shutdown-deadline", a.shutdown_deadline_s, 0, 3600,
                     "seconds running requests get to end after SIGTERM before they are "
                     "cancelled");
  kvo::cli::add_tokens(app, "--prefill-piece", a.prefill_piece, 0, kMaxTokens,
                       "prompt tokens prefilled between two decode steps, so that a long prompt "
                       "delays the running requests a piece at a time (0: a whole prompt at "
                       "once; streamed layers' rows are read again for each piece)");
  kvo::cli::add_text(app, "--contexts", a.contexts, "DIR",
                     "keep the slots' rows across restarts: restored from DIR/contexts.kvo at "
                     "start (refused when saved from another model, shape or slot count), saved "
                     "there when the server stops on SIGTERM or SIGINT");
  kvo::cli::add_integer(app, "--http-threads", a.http_threads, 0, 4096,
                        "connections served at once (0: slots + queue + 4)");
  kvo::cli::declare_model_options(app, model_args);
  return kvo::cli::run(app, argc, argv, [&] { return run(model_args, app, a); });
}
