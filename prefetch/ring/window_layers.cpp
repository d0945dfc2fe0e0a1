#include "prefetch/ring/window_layers.hpp"

#include <algorithm>

namespace kvo::prefetch {

WindowLayers::WindowLayers(Backend& backend, const offload::WindowPlan& plan, std::byte* base,
                           int slots)
    : backend_(backend),
      plan_(plan),
      base_(base),
      first_(plan.windows.size(), std::vector<std::int32_t>(static_cast<std::size_t>(slots), 0)),
      lost_(static_cast<std::size_t>(slots), 0) {}

std::byte* WindowLayers::slot_rows(int w, int slot, int kv) const {
  const offload::WindowPlan::Window& win = window(w);
  const KvLayout& l = win.layout;
  return base_ + win.offset + (kv == 0 ? l.k_offset(slot, 0) : l.v_begin() + l.v_offset(slot, 0));
}

void WindowLayers::append(int w, int slot, int position, const void* k_rows, const void* v_rows,
                          int count, StreamHandle stream) {
  const offload::WindowPlan::Window& win = window(w);
  const KvLayout& l = win.layout;
  std::int32_t& first = first_[static_cast<std::size_t>(w)][static_cast<std::size_t>(slot)];
  int held = position - first;
  if (held + count > l.max_seq) {
    const int keep = std::min(held, win.window - 1);
    const int shift = held - keep;  // >= 1: held > max_seq - count >= window - 1
    for (int done = 0; done < keep; done += shift) {
      const int rows = std::min(shift, keep - done);
      for (int kv = 0; kv < 2; ++kv) {
        const auto bytes = [&](int n) { return kv == 0 ? l.k_bytes(n) : l.v_bytes(n); };
        backend_.copy_async(slot_rows(w, slot, kv) + bytes(done),
                            slot_rows(w, slot, kv) + bytes(shift + done), bytes(rows), stream);
      }
    }
    first = position - keep;
    held = keep;
  }
  backend_.copy_async(slot_rows(w, slot, 0) + l.k_bytes(held), k_rows, l.k_bytes(count), stream);
  backend_.copy_async(slot_rows(w, slot, 1) + l.v_bytes(held), v_rows, l.v_bytes(count), stream);
}

bool WindowLayers::covers(int slot, int length) const {
  for (int w = 0; w < count(); ++w) {
    const int need = std::max(0, length - (window(w).window - 1));
    if (first_[static_cast<std::size_t>(w)][static_cast<std::size_t>(slot)] > need) return false;
  }
  return true;
}

void WindowLayers::mark_lost(const std::vector<std::int32_t>& lengths) {
  for (std::size_t s = 0; s < lost_.size(); ++s) {
    if (!covers(static_cast<int>(s), lengths[s])) lost_[s] = 1;
  }
}

void WindowLayers::reset(int slot) {
  for (std::vector<std::int32_t>& first : first_) first[static_cast<std::size_t>(slot)] = 0;
  lost_[static_cast<std::size_t>(slot)] = 0;
}

std::uint64_t WindowLayers::reorder(const std::vector<int>& source,
                                    const std::vector<std::int32_t>& lengths) {
  const int slots = static_cast<int>(source.size());
  std::uint64_t written = 0;
  for (int w = 0; w < count(); ++w) {
    const KvLayout& l = window(w).layout;
    std::vector<std::int32_t>& first = first_[static_cast<std::size_t>(w)];
    std::vector<std::vector<std::byte>> held(static_cast<std::size_t>(slots) * 2);
    for (int s = 0; s < slots; ++s) {
      const std::int64_t rows =
          lengths[static_cast<std::size_t>(s)] - first[static_cast<std::size_t>(s)];
      for (int kv = 0; kv < 2; ++kv) {
        std::vector<std::byte>& h = held[static_cast<std::size_t>(2 * s + kv)];
        h.resize(kv == 0 ? l.k_bytes(rows) : l.v_bytes(rows));
        if (!h.empty()) backend_.copy_sync(h.data(), slot_rows(w, s, kv), h.size());
      }
    }
    const std::vector<std::int32_t> old_first = first;
    for (int s = 0; s < slots; ++s) {
      const int from = source[static_cast<std::size_t>(s)];
      first[static_cast<std::size_t>(s)] = old_first[static_cast<std::size_t>(from)];
      if (from == s) continue;
      for (int kv = 0; kv < 2; ++kv) {
        const std::vector<std::byte>& h = held[static_cast<std::size_t>(2 * from + kv)];
        if (!h.empty()) backend_.copy_sync(slot_rows(w, s, kv), h.data(), h.size());
        written += h.size();
      }
    }
  }
  std::vector<std::uint8_t> lost(lost_.size());
  for (int s = 0; s < slots; ++s) {
    lost[static_cast<std::size_t>(s)] = lost_[static_cast<std::size_t>(source[s])];
  }
  lost_ = lost;
  return written;
}

}  // namespace kvo::prefetch
