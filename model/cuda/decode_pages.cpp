#include "model/cuda/decode_pages.hpp"

#include <algorithm>
#include <string>

#include "kvoffload/error.hpp"

namespace kvo::model {
namespace {

Error internal(const std::string& what) {
  return Error(ErrorCode::kInternal, "FlashInfer decode pages: " + what);
}

constexpr std::size_t kKeyHead = 3;  // page_size, pages_per_slot, window_left

}  // namespace

PageTableView page_table_view(const std::int32_t* table, int n) {
  PageTableView v;
  v.indptr = table;
  v.last_page_len = table + n + 1;
  v.indices = table + 2 * n + 1;
  return v;
}

DecodeSchedules::DecodeSchedules(int kinds) : kinds_(kinds) {
  if (kinds < 1 || kinds > kMaxKinds) {
    throw internal(std::to_string(kinds) + " kinds of schedule, not 1 or 2");
  }
}

DecodeSchedules::Use DecodeSchedules::use(const PageGeometry& g, const PagedRows& rows) {
  if (g.page_size < 1 || g.pages_per_slot < 1) {
    throw internal("pages of " + std::to_string(g.page_size) + " tokens, " +
                   std::to_string(g.pages_per_slot) + " per slot");
  }
  const int rows_per_slot = g.page_size * g.pages_per_slot;
  key_.assign({g.page_size, g.pages_per_slot, rows.window_left});
  key_.reserve(kKeyHead + 3 * static_cast<std::size_t>(rows.n));
  for (int i = 0; i < rows.n; ++i) {
    const int len = rows.kv_lens[i];
    if (len < 1 || len > rows_per_slot || rows.slots[i] < 0) {
      throw internal("row " + std::to_string(i) + " has " + std::to_string(len) + " keys in slot " +
                     std::to_string(rows.slots[i]) + " of a layer of " +
                     std::to_string(rows_per_slot) + " rows per slot");
    }
    const int first_key = rows.window_left >= 0 ? std::max(0, len - 1 - rows.window_left) : 0;
    key_.insert(key_.end(), {rows.slots[i], first_key / g.page_size, len});
  }
  // Window layers have a schedule of their own where there are two.
  last_ = kinds_ == 2 && rows.window_left >= 0 ? 1 : 0;
  std::vector<std::int32_t>& planned = planned_[static_cast<std::size_t>(last_)];
  if (key_ == planned) return {last_, false};
  planned.clear();  // its table and plan are about to be rewritten
  return {last_, true};
}

std::size_t DecodeSchedules::write_table(std::int32_t* table, std::size_t capacity) const {
  const int n = static_cast<int>((key_.size() - kKeyHead) / 3);
  const int page_size = key_[0];
  const int pages_per_slot = key_[1];
  const std::size_t head = 2 * static_cast<std::size_t>(n) + 1;
  if (head > capacity) {
    throw internal("the page table of " + std::to_string(n) + " rows exceeds the workspace");
  }
  std::int32_t* indptr = table;
  std::int32_t* last_page_len = indptr + n + 1;
  std::int32_t* indices = last_page_len + n;
  indptr[0] = 0;
  for (int i = 0; i < n; ++i) {
    const std::int32_t* row = key_.data() + kKeyHead + 3 * static_cast<std::size_t>(i);
    const int slot = row[0];
    const int first = row[1];
    const int len = row[2];
    const int end = (len + page_size - 1) / page_size;
    if (head + static_cast<std::size_t>(indptr[i]) + static_cast<std::size_t>(end - first) >
        capacity) {
      throw internal("the page indices of " + std::to_string(n) +
                     " rows exceed the planned workspace");
    }
    for (int p = first; p < end; ++p) indices[indptr[i] + p - first] = slot * pages_per_slot + p;
    indptr[i + 1] = indptr[i] + end - first;
    last_page_len[i] = len - (end - 1) * page_size;
  }
  return head + static_cast<std::size_t>(indptr[n]);
}

void DecodeSchedules::planned() {
  planned_[static_cast<std::size_t>(last_)] = key_;
}

}  // namespace kvo::model
