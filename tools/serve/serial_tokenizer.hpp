// A Tokenizer shared by threads: every call to the one it wraps is made under one lock (a
// tokenizer keeps scratch state even in its const calls: model/text/tokenizer.hpp).
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "model/text/tokenizer.hpp"

namespace kvo::serve {

class SerialTokenizer : public model::Tokenizer {
 public:
  explicit SerialTokenizer(const model::Tokenizer& inner) : inner_(inner) {}
  std::vector<std::int32_t> encode(const std::string& text, bool add_special) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return inner_.encode(text, add_special);
  }
  std::string token_bytes(std::int32_t id, bool first) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return inner_.token_bytes(id, first);
  }
  bool is_special(std::int32_t id) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return inner_.is_special(id);
  }
  std::optional<std::int32_t> special_id(const std::string& content) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return inner_.special_id(content);
  }
  int vocab_size() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return inner_.vocab_size();
  }
  std::string kind() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return inner_.kind();
  }
  std::optional<std::int32_t> eos_id() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return inner_.eos_id();
  }

 private:
  const model::Tokenizer& inner_;
  mutable std::mutex mutex_;
};

}  // namespace kvo::serve
