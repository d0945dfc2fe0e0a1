#include "tools/serve/engine.hpp"

#include <algorithm>
#include <exception>
#include <utility>

#include "kvoffload/error.hpp"

namespace kvo::serve {

namespace {

using Clock = std::chrono::steady_clock;

// Tokens another slot must hold beyond the best free one for its rows to be copied.
constexpr std::size_t kMinCopyGain = 16;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The longest suffix of `text` that is a proper prefix of one of `stops`: text that may yet
// become a stop text, held back until the next token says.
std::size_t held_back(const std::string& text, const std::vector<std::string>& stops) {
  std::size_t keep = 0;
  for (const std::string& stop : stops) {
    for (std::size_t n = std::min(text.size(), stop.size() - 1); n > keep; --n) {
      if (text.compare(text.size() - n, n, stop, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  return keep;
}

}  // namespace

Update Job::take(std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_for(lock, wait, [&] { return pending_.done || !pending_.text.empty(); });
  Update out = pending_;
  pending_.text.clear();
  return out;
}

void Job::started(int prompt_tokens, int reused_tokens) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.started = true;
  pending_.prompt_tokens = prompt_tokens;
  pending_.reused_tokens = reused_tokens;
}

void Job::append(const std::string& text, int completion_tokens) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.text += text;
    pending_.completion_tokens = completion_tokens;
  }
  if (!text.empty()) changed_.notify_all();
}

void Job::finish(const std::string& reason, int completion_tokens) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.done = true;
    pending_.finish_reason = reason;
    pending_.completion_tokens = completion_tokens;
  }
  changed_.notify_all();
}

void Job::fail(const std::string& message, int status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.done = true;
    pending_.error_status = status;
    pending_.error = message.empty() ? "the request failed" : message;
  }
  changed_.notify_all();
}

Engine::Engine(model::Decoder& decoder, const model::Tokenizer& tokenizer,
               std::vector<std::int32_t> stop_ids, int queue_limit, int prefill_piece,
               std::vector<std::vector<std::int32_t>> held)
    : decoder_(decoder),
      tokenizer_(tokenizer),
      stop_ids_(std::move(stop_ids)),
      queue_limit_(queue_limit),
      prefill_piece_(static_cast<std::size_t>(std::max(prefill_piece, 0))),
      vocab_(decoder.config().vocab_size),
      max_seq_(decoder.options().max_seq),
      slots_(static_cast<std::size_t>(decoder.options().slots)) {
  logits_.resize(slots_.size() * static_cast<std::size_t>(vocab_));
  for (std::size_t s = 0; s < held.size() && s < slots_.size(); ++s) {
    // Rows without their tokens (or not all of them) cannot be matched: the slot starts over.
    if (static_cast<int>(held[s].size()) == decoder_.length(static_cast<int>(s))) {
      slots_[s].held = std::move(held[s]);
    } else {
      decoder_.reset(static_cast<int>(s));
    }
  }
  metrics_.slots = static_cast<int>(slots_.size());
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() {
  shutdown(std::chrono::milliseconds(0));
}

std::shared_ptr<Job> Engine::submit(Completion request) {
  auto job = std::make_shared<Job>(std::move(request));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw Busy("the server is shutting down");
    // Queued requests beyond the free slots wait; at most queue_limit_ of them.
    const int free_slots = static_cast<int>(slots_.size()) - metrics_.slots_in_use;
    if (static_cast<int>(queue_.size()) >= free_slots + queue_limit_) {
      throw Busy("all " + std::to_string(slots_.size()) + " slots are busy and " +
                 std::to_string(queue_limit_) +
                 " requests already wait for one (--queue); try again later");
    }
    queue_.push_back(job);
    metrics_.queued = static_cast<int>(queue_.size());
  }
  wake_.notify_all();
  return job;
}

void Engine::shutdown(std::chrono::milliseconds deadline) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) {
      stopping_ = true;
      deadline_ = Clock::now() + deadline;
    } else {
      deadline_ = std::min(deadline_, Clock::now() + deadline);
    }
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

EngineMetrics Engine::metrics() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return metrics_;
}

void Engine::run() {
  for (;;) {
    std::vector<Start> starts;
    bool any_running = false;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      auto running = [&] {
        return std::any_of(slots_.begin(), slots_.end(), [](const Slot& s) { return s.job; });
      };
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || running(); });
      if (stopping_) {
        // Waiting requests are refused; running ones end by themselves or at the deadline.
        for (auto& job : queue_) job->fail("the server is shutting down", 503);
        queue_.clear();
        metrics_.queued = 0;
        if (Clock::now() >= deadline_) {
          for (Slot& s : slots_) {
            if (s.job) s.job->cancel();
          }
        }
      }
      if (stopping_ && !running()) return;
      starts = admit();
      any_running = running() || !starts.empty();
    }
    for (const Start& s : starts) start(s);
    // A piece of each prompt still being prefilled, then a step of those that decode: a long
    // prompt delays the others by a piece at a time, not by its whole prefill.
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      if (slots_[s].job && slots_[s].prefilling()) prefill_piece(static_cast<int>(s));
    }
    if (any_running) step();
  }
}

std::vector<Engine::Start> Engine::admit() {
  std::vector<Start> starts;
  auto common = [](const std::vector<std::int32_t>& held, const std::vector<std::int32_t>& p) {
    const std::size_t n = std::min(held.size(), p.size());
    return static_cast<std::size_t>(
        std::mismatch(held.begin(), held.begin() + static_cast<std::ptrdiff_t>(n), p.begin())
            .first -
        held.begin());
  };
  while (!queue_.empty()) {
    std::shared_ptr<Job> job = queue_.front();
    const std::vector<std::int32_t>& prompt = job->request().prompt;
    auto taken = [&](std::size_t s) {
      return std::any_of(starts.begin(), starts.end(),
                         [&](const Start& t) { return t.slot == static_cast<int>(s); });
    };
    // The free slot whose rows begin with the longest part of this prompt (the first free one
    // when none does), and any slot not about to change whose rows begin with a longer part.
    int best = -1, source = -1;
    std::size_t best_common = 0, source_common = 0;
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      if (taken(s)) continue;
      const std::size_t c = common(slots_[s].held, prompt);
      if (!slots_[s].job && (best < 0 || c > best_common)) {
        best = static_cast<int>(s);
        best_common = c;
      }
      if (c > source_common) {
        source = static_cast<int>(s);
        source_common = c;
      }
    }
    if (best < 0) break;
    queue_.pop_front();
    // A copy for a handful of tokens is not worth the rows it moves.
    const bool copy = source_common >= best_common + kMinCopyGain;
    starts.push_back({best, copy ? source : -1, std::move(job)});
    ++metrics_.slots_in_use;
  }
  metrics_.queued = static_cast<int>(queue_.size());
  return starts;
}

void Engine::start(const Start& st) {
  const int s = st.slot;
  const std::shared_ptr<Job>& job = st.job;
  Slot& slot = slots_[static_cast<std::size_t>(s)];
  const Completion& r = job->request();
  slot.job = job;
  slot.next = -1;
  slot.text.clear();
  slot.sent = 0;
  slot.generated = 0;
  slot.rest.clear();
  slot.rest_at = 0;
  slot.sampler = std::make_unique<model::Sampler>(r.sampling, r.seed, 0);
  slot.stream = std::make_unique<model::TextStream>(tokenizer_, true);
  if (job->cancelled()) {
    end(s, "cancelled");
    return;
  }
  bool copied = false;
  try {
    if (st.source >= 0) {  // another slot holds more of the prompt: its rows first
      std::vector<int> from(slots_.size());
      for (std::size_t i = 0; i < from.size(); ++i) from[i] = static_cast<int>(i);
      from[static_cast<std::size_t>(s)] = st.source;
      decoder_.cache().reorder_slots(from);
      slot.held = slots_[static_cast<std::size_t>(st.source)].held;
      copied = true;
    }
    // Rows already held for the prompt's first tokens are kept; at least its last token is
    // prefilled, for the logits that draw the first new one.
    std::size_t reuse = 0;
    while (reuse < slot.held.size() && reuse + 1 < r.prompt.size() &&
           slot.held[reuse] == r.prompt[reuse]) {
      ++reuse;
    }
    if (reuse < slot.held.size()) {
      if (reuse == 0) {
        decoder_.reset(s);
      } else {
        try {
          decoder_.cache().truncate_slot(s, static_cast<int>(reuse));
        } catch (const Error&) {  // rows a window layer no longer holds: start over
          decoder_.reset(s);
          reuse = 0;
        }
      }
      slot.held.resize(reuse);
    }
    slot.rest.assign(r.prompt.begin() + static_cast<std::ptrdiff_t>(reuse), r.prompt.end());
    job->started(static_cast<int>(r.prompt.size()), static_cast<int>(reuse));
    std::lock_guard<std::mutex> lock(mutex_);
    ++metrics_.requests_started;
    metrics_.reused_tokens += reuse;
    if (reuse > 0) ++metrics_.prefix_hits;
    if (copied) ++metrics_.prefix_copies;
  } catch (const std::exception& e) {
    fail(s, e.what());
  }
}

void Engine::prefill_piece(int s) {
  Slot& slot = slots_[static_cast<std::size_t>(s)];
  if (slot.job->cancelled()) {
    end(s, "cancelled");
    return;
  }
  const std::size_t left = slot.rest.size() - slot.rest_at;
  const std::size_t n = prefill_piece_ > 0 ? std::min(left, prefill_piece_) : left;
  const auto first = slot.rest.begin() + static_cast<std::ptrdiff_t>(slot.rest_at);
  const std::vector<std::int32_t> piece(first, first + static_cast<std::ptrdiff_t>(n));
  const auto t0 = Clock::now();
  try {
    decoder_.prefill(s, piece, logits_.data());
  } catch (const std::exception& e) {
    fail(s, e.what());
    return;
  }
  slot.held.insert(slot.held.end(), piece.begin(), piece.end());
  slot.rest_at += n;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    metrics_.prompt_tokens += n;
    ++metrics_.prefill_pieces;
    metrics_.prefill_s += seconds_since(t0);
  }
  if (slot.rest_at == slot.rest.size()) {
    slot.rest.clear();
    slot.rest_at = 0;
    take_token(s, slot.sampler->sample(logits_.data(), vocab_));
  }
}

void Engine::fail(int s, const std::string& what) {
  Slot& slot = slots_[static_cast<std::size_t>(s)];
  // The slot's rows are in doubt: it starts over at its next request.
  try {
    decoder_.reset(s);
  } catch (const std::exception&) {
  }
  slot.held.clear();
  slot.rest.clear();
  slot.rest_at = 0;
  const std::shared_ptr<Job> job = std::move(slot.job);
  {  // the slot is free before the client hears: its next request finds it so
    std::lock_guard<std::mutex> lock(mutex_);
    ++metrics_.requests_failed;
    --metrics_.slots_in_use;
  }
  job->fail(what);
}

void Engine::step() {
  std::vector<std::int32_t> tokens(slots_.size(), -1);
  bool any = false;
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    Slot& slot = slots_[s];
    if (!slot.job || slot.prefilling()) continue;
    if (slot.job->cancelled()) {
      end(static_cast<int>(s), "cancelled");
      continue;
    }
    tokens[s] = slot.next;
    any = true;
  }
  if (!any) return;
  const auto t0 = Clock::now();
  try {
    decoder_.decode(tokens, logits_.data());
  } catch (const std::exception& e) {
    for (std::size_t s = 0; s < slots_.size(); ++s) {
      if (tokens[s] >= 0) fail(static_cast<int>(s), e.what());
    }
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++metrics_.decode_steps;
    metrics_.decode_s += seconds_since(t0);
    metrics_.h2d_bytes = decoder_.cache().stats().h2d_bytes_total;
  }
  for (std::size_t s = 0; s < slots_.size(); ++s) {
    if (tokens[s] < 0) continue;
    slots_[s].held.push_back(tokens[s]);
    take_token(
        static_cast<int>(s),
        slots_[s].sampler->sample(logits_.data() + s * static_cast<std::size_t>(vocab_), vocab_));
  }
}

void Engine::take_token(int s, std::int32_t token) {
  Slot& slot = slots_[static_cast<std::size_t>(s)];
  const Completion& r = slot.job->request();
  if (!r.ignore_eos && std::find(stop_ids_.begin(), stop_ids_.end(), token) != stop_ids_.end()) {
    slot.text += slot.stream->finish();
    end(s, "stop");
    return;
  }
  ++slot.generated;
  slot.text += slot.stream->push(token);
  // A stop text ends the generation before it; it may begin in text already held back.
  for (const std::string& stop : r.stop) {
    const std::size_t from = slot.sent;
    const std::size_t at = slot.text.find(stop, from);
    if (at != std::string::npos) {
      slot.text.resize(at);
      end(s, "stop");
      return;
    }
  }
  const bool full =
      slot.generated >= r.max_tokens || static_cast<int>(slot.held.size()) + 1 >= max_seq_;
  if (full) {
    slot.text += slot.stream->finish();
    end(s, "length");
    return;
  }
  const std::size_t ready = slot.text.size() - held_back(slot.text, r.stop);
  if (ready > slot.sent) {
    slot.job->append(slot.text.substr(slot.sent, ready - slot.sent), slot.generated);
    slot.sent = ready;
  }
  slot.next = token;
}

void Engine::end(int s, const std::string& reason) {
  Slot& slot = slots_[static_cast<std::size_t>(s)];
  if (slot.text.size() > slot.sent) {
    slot.job->append(slot.text.substr(slot.sent), slot.generated);
    slot.sent = slot.text.size();
  }
  const std::shared_ptr<Job> job = std::move(slot.job);
  slot.next = -1;
  {  // the slot is free before the client hears: its next request finds it so
    std::lock_guard<std::mutex> lock(mutex_);
    --metrics_.slots_in_use;
    ++(reason == "cancelled" ? metrics_.requests_cancelled : metrics_.requests_finished);
    metrics_.completion_tokens += static_cast<std::uint64_t>(slot.generated);
  }
  job->finish(reason, slot.generated);
}

}  // namespace kvo::serve
