// WindowLayers: the window layers of a cache (CacheConfig::layer_windows), the peer of the
// StagingRing for layers that are never streamed. Each window layer keeps, per slot, its last
// rows in a device buffer of window_rows(window, max_append) rows (offload/store/
// window_layers.hpp), in position order: row 0 of a slot holds position first_position(slot).
//
// An append goes after the slot's held rows. When it would pass the buffer, the window - 1 rows
// before the first new one (all its window needs) move to the front first, on the caller's
// stream, in pieces of `shift` rows from the front: no piece overlaps itself and none reads a row
// an earlier one wrote; the buffer's gap of (window - 1) / 8 rows makes the shift more than an
// eighth of the rows kept, so there are at most 8 pieces.
//
// A slot whose rows moved in a step that was then aborted holds fewer rows than its committed
// length needs: it is marked lost, and takes no step until it is reset or truncated to a length
// its windows still hold.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "offload/store/window_layers.hpp"
#include "prefetch/backend/backend.hpp"

namespace kvo::prefetch {

class WindowLayers {
 public:
  // `base`: the device region of the plan's windows (its bytes); `slots` of each. Moves and
  // appends run on `backend`.
  WindowLayers(Backend& backend, const offload::WindowPlan& plan, std::byte* base, int slots);
  WindowLayers(const WindowLayers&) = delete;
  WindowLayers& operator=(const WindowLayers&) = delete;

  int count() const { return static_cast<int>(plan_.windows.size()); }
  const offload::WindowPlan::Window& window(int w) const {
    return plan_.windows[static_cast<std::size_t>(w)];
  }
  // Window layer w's K (kv 0) or V rows of `slot`, from its row 0.
  std::byte* slot_rows(int w, int slot, int kv) const;
  // [slots]: the position of each slot's row 0 in window layer w.
  const std::int32_t* first_positions(int w) const {
    return first_[static_cast<std::size_t>(w)].data();
  }

  // Appends `count` rows of `slot` at `position` (the slot's length plus what this step appended
  // before), moving the rows a window needs to the front first where they would pass the buffer.
  // REQUIRES: count <= the plan's max_append.
  void append(int w, int slot, int position, const void* k_rows, const void* v_rows, int count,
              StreamHandle stream);

  // Whether every window layer of `slot` holds what a length of `length` needs: the window - 1
  // rows before it (all rows, from position 0, when it is shorter).
  bool covers(int slot, int length) const;
  // After an aborted step: marks each slot whose windows no longer cover its committed length.
  void mark_lost(const std::vector<std::int32_t>& lengths);
  bool lost(int slot) const { return lost_[static_cast<std::size_t>(slot)] != 0; }
  // The slot holds nothing (its windows start over at position 0), or was truncated to a length
  // its windows cover: no longer lost.
  void reset(int slot);
  void clear_lost(int slot) { lost_[static_cast<std::size_t>(slot)] = 0; }
  // Slot s takes slot source[s]'s held rows (and its first position and lost mark), each slot's
  // rows through host memory (a window's worth). `lengths`: the committed length of each slot
  // before the move. Blocking (the caller has quiesced the streams). Returns the bytes written.
  std::uint64_t reorder(const std::vector<int>& source, const std::vector<std::int32_t>& lengths);

 private:
  Backend& backend_;
  const offload::WindowPlan& plan_;
  std::byte* base_;
  std::vector<std::vector<std::int32_t>> first_;  // [window layer][slot]
  std::vector<std::uint8_t> lost_;                // [slot]
};

}  // namespace kvo::prefetch
