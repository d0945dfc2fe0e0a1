// kvo-serve's engine: the requests of every client share one Decoder as the slots of its one
// cache. One thread runs the steps: between two decode steps it takes waiting requests into free
// slots (prefilling each), then one decode step advances every running request together. Each
// request is a Job its HTTP handler reads text from as it comes.
//
// A prompt whose first tokens a free slot already holds (the rows of an earlier request: a long
// document asked another question) prefills only the rest: the slot is truncated to the common
// prefix and the remainder prefilled after it. The free slot holding the longest such prefix is
// taken; where another slot (one still running, say) holds a longer one, its rows are first
// copied into the free slot (OffloadedStaticCache::reorder_slots: within the host store for the
// streamed layers, on the device for the resident ones).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "model/decoder/decoder.hpp"
#include "model/decoder/sampler.hpp"
#include "model/text/tokenizer.hpp"

namespace kvo::serve {

// A request the engine cannot take now (the HTTP layer answers 503 with its message).
struct Busy : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One request, as the engine runs it (checked by the HTTP layer).
struct Completion {
  std::vector<std::int32_t> prompt;  // not empty; ids in the vocabulary
  int max_tokens = 16;               // >= 1; prompt + max_tokens <= max_seq
  model::SamplingParams sampling;
  std::uint64_t seed = 0;
  std::vector<std::string> stop;  // text that ends the generation (not itself returned)
  bool ignore_eos = false;        // generate max_tokens even past the end-of-sequence token
};

// What a Job has for its client since the last take().
struct Update {
  std::string text;
  bool done = false;
  bool started = false;       // the request has a slot (it waited in the queue before)
  std::string finish_reason;  // "stop" (end of sequence or a stop text), "length", "cancelled"
  std::string error;          // non-empty: the request failed (done is then true)
  int error_status = 500;     // its HTTP status: 503 for a request refused at shutdown
  int prompt_tokens = 0;
  int reused_tokens = 0;  // prompt tokens found in the slot, not prefilled again
  int completion_tokens = 0;
};

class Job {
 public:
  explicit Job(Completion request) : request_(std::move(request)) {}
  const Completion& request() const { return request_; }

  // Client side. Waits up to `wait` for text or the end, and returns what came (text taken).
  Update take(std::chrono::milliseconds wait);
  // The client went away, or the server is stopping: the engine ends the request at its next
  // step and frees its slot.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

  // Engine side.
  void started(int prompt_tokens, int reused_tokens);
  void append(const std::string& text, int completion_tokens);
  void finish(const std::string& reason, int completion_tokens);
  void fail(const std::string& message, int status = 500);

 private:
  const Completion request_;
  std::atomic<bool> cancelled_{false};
  std::mutex mutex_;
  std::condition_variable changed_;
  Update pending_;  // text not yet taken, and the counts and end so far
};

// Counters since start, for /metrics.
struct EngineMetrics {
  std::uint64_t requests_started = 0;
  std::uint64_t requests_finished = 0;
  std::uint64_t requests_cancelled = 0;
  std::uint64_t requests_failed = 0;
  std::uint64_t prompt_tokens = 0;  // prefilled
  std::uint64_t reused_tokens = 0;  // found in a slot instead
  std::uint64_t prefix_hits = 0;    // requests that reused at least one token
  std::uint64_t prefix_copies = 0;  // requests whose prefix was copied from another slot
  std::uint64_t completion_tokens = 0;
  std::uint64_t decode_steps = 0;
  std::uint64_t prefill_pieces = 0;
  double prefill_s = 0;
  double decode_s = 0;
  std::uint64_t h2d_bytes = 0;
  int slots = 0;
  int slots_in_use = 0;
  int queued = 0;
};

class Engine {
 public:
  // `stop_ids`: tokens that end a generation (the model's end of sequence). `queue_limit`:
  // requests that may wait for a slot. `prefill_piece`: prompt tokens prefilled between two
  // decode steps (0: a whole prompt at once). `held`: the tokens whose rows each slot already
  // holds (a restored context), or empty. Starts the engine's thread.
  Engine(model::Decoder& decoder, const model::Tokenizer& tokenizer,
         std::vector<std::int32_t> stop_ids, int queue_limit, int prefill_piece,
         std::vector<std::vector<std::int32_t>> held = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Throws Busy when every slot is busy and the queue is full, or the engine
  // is stopping, saying which.
  std::shared_ptr<Job> submit(Completion request);

  // Takes no more requests; the running ones go on until they end or `deadline` passes, when
  // they are cancelled. Returns once the engine's thread has ended.
  void shutdown(std::chrono::milliseconds deadline);

  EngineMetrics metrics() const;
  // The tokens whose rows slot s holds. REQUIRES: shutdown() has returned.
  const std::vector<std::int32_t>& held(int slot) const {
    return slots_[static_cast<std::size_t>(slot)].held;
  }

 private:
  struct Slot {
    std::shared_ptr<Job> job;        // null: free
    std::vector<std::int32_t> held;  // the tokens whose rows the cache holds
    std::int32_t next = -1;          // drawn, fed at the next step
    std::vector<std::int32_t> rest;  // prompt tokens still to prefill, from rest_at
    std::size_t rest_at = 0;
    bool prefilling() const { return rest_at < rest.size(); }
    std::unique_ptr<model::Sampler> sampler;
    std::unique_ptr<model::TextStream> stream;
    std::string text;      // generated so far
    std::size_t sent = 0;  // bytes of text given to the job
    int generated = 0;
  };

  void run();
  struct Start {
    int slot;    // a free slot
    int source;  // a slot whose rows to copy into it first, or -1
    std::shared_ptr<Job> job;
  };
  // Takes queued requests into free slots.
  std::vector<Start> admit();
  // Takes the slot for the request: its rows copied or truncated to the prompt's held prefix,
  // the rest of the prompt left for prefill_piece().
  void start(const Start& start);
  // Prefills the next piece of slot s's prompt; after the last, draws its first token.
  void prefill_piece(int s);
  // Slot s's request failed: the slot starts over, the client hears why.
  void fail(int s, const std::string& what);
  void step();
  // A token drawn for slot s: ends the request or keeps it for the next step.
  void take_token(int s, std::int32_t token);
  void end(int s, const std::string& reason);

  model::Decoder& decoder_;
  const model::Tokenizer& tokenizer_;
  const std::vector<std::int32_t> stop_ids_;
  const int queue_limit_;
  const std::size_t prefill_piece_;
  const int vocab_;
  const int max_seq_;
  std::vector<Slot> slots_;
  std::vector<float> logits_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  bool stopping_ = false;
  std::chrono::steady_clock::time_point deadline_{};
  EngineMetrics metrics_;  // under mutex_
  std::thread thread_;
};

}  // namespace kvo::serve
