// The host side of FlashInfer's decode schedules, in plain C++ so that the host tests cover it:
// which schedule a layer's decode uses, when it must be planned anew, and the page table it reads
// (model/cuda/flashinfer_attention.cpp copies that table to the device and plans on it).
//
// Decode reads a layer's K/V as pages of page_size tokens: slot s, token t is page
// s * pages_per_slot + t / page_size. A window layer's buffer holds fewer rows per slot than a
// full layer's, so the two kinds of layer differ in pages_per_slot even where every row has the
// same keys, and a table made for one kind addresses other slots' rows in the other. Each kind
// keeps its own schedule, keyed by its geometry and rows: within a step every layer of a kind has
// the same key, so each kind plans once per step however the kinds interleave.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvo::model {

// How one layer's K/V is paged.
struct PageGeometry {
  int page_size = 0;       // tokens per page
  int pages_per_slot = 0;  // the layer's rows per slot / page_size
};

// One decode call's rows: row i attends keys [0, kv_lens[i]) of slot slots[i] (counted in the
// layer's rows), those before kv_lens[i] - 1 - window_left masked and, whole pages of them, not
// read (window_left -1: none).
struct PagedRows {
  int n = 0;
  const std::int32_t* slots = nullptr;    // [n]
  const std::int32_t* kv_lens = nullptr;  // [n]
  int window_left = -1;
};

// The int32s of a page table of `n` rows: indptr [n + 1] | last_page_len [n] | indices.
struct PageTableView {
  const std::int32_t* indptr = nullptr;
  const std::int32_t* last_page_len = nullptr;
  const std::int32_t* indices = nullptr;
};
PageTableView page_table_view(const std::int32_t* table, int n);

class DecodeSchedules {
 public:
  static constexpr int kMaxKinds = 2;  // full layers, window layers

  // `kinds` schedules: 2 when the model has window layers, else 1.
  explicit DecodeSchedules(int kinds);

  struct Use {
    int schedule = 0;   // which schedule the call reads
    bool plan = false;  // its table must be written (write_table) and planned anew
  };
  // The schedule for a call of `rows` over a layer paged as `g`. Throws kvo::Error(kInternal)
  // for a row outside the layer (no keys, more than its rows, a negative slot). A Use with plan
  // leaves that schedule unplanned until planned() says it is whole.
  Use use(const PageGeometry& g, const PagedRows& rows);
  // The last use()'s page table written to `table` (capacity int32s): returns the int32s
  // written. Throws kvo::Error(kInternal) when they exceed capacity.
  std::size_t write_table(std::int32_t* table, std::size_t capacity) const;
  // The last use()'s schedule is planned: calls with its key reuse it.
  void planned();

  int kinds() const { return kinds_; }

 private:
  int kinds_ = 1;
  // The key of each schedule: geometry, window, then [slot, first page, kv_len] per row; empty:
  // none planned.
  std::array<std::vector<std::int32_t>, kMaxKinds> planned_;
  std::vector<std::int32_t> key_;  // the last use()'s
  int last_ = 0;
};

}  // namespace kvo::model
