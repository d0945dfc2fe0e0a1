// FlashInfer's decode schedules on the host (model/cuda/decode_pages.hpp): a model of window and
// full layers decoding several slots, step after step, each layer's call given the schedule the
// device would read, and every page index of that schedule checked against the rows the layer
// really holds: its slot's, within its buffer, from the first page of the row's window to the
// page of its own key.
#include "model/cuda/decode_pages.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"

namespace kvo::model {
namespace {

struct LayerKind {
  bool window = false;
  PageGeometry geometry;
};

// The device's copy of each schedule's table, as the CUDA path keeps it: rewritten only when a
// call plans.
struct Device {
  std::vector<std::int32_t> mirror;
  std::vector<std::vector<std::int32_t>> tables;
  int plans = 0;
};

// What a layer reads for `rows`, through the schedules: returns the table the device holds for
// the call's schedule.
const std::vector<std::int32_t>& decode(DecodeSchedules& schedules, Device& device,
                                        const PageGeometry& g, const PagedRows& rows) {
  const DecodeSchedules::Use use = schedules.use(g, rows);
  auto& table = device.tables[static_cast<std::size_t>(use.schedule)];
  if (use.plan) {
    const std::size_t count = schedules.write_table(device.mirror.data(), device.mirror.size());
    table.assign(device.mirror.begin(), device.mirror.begin() + static_cast<std::ptrdiff_t>(count));
    schedules.planned();
    ++device.plans;
  }
  return table;
}

// Every row's pages are its slot's, inside the layer's buffer, consecutive from the page of the
// first key its window admits to the page of its own key; the last page holds the rest.
void expect_rows_held(const std::vector<std::int32_t>& table, const PageGeometry& g,
                      const PagedRows& rows, int slots, const std::string& where) {
  ASSERT_GE(table.size(), 2 * static_cast<std::size_t>(rows.n) + 1) << where;
  const PageTableView v = page_table_view(table.data(), rows.n);
  ASSERT_EQ(v.indptr[0], 0) << where;
  ASSERT_EQ(table.size(), 2 * static_cast<std::size_t>(rows.n) + 1 + v.indptr[rows.n]) << where;
  for (int i = 0; i < rows.n; ++i) {
    const int len = rows.kv_lens[i];
    const int first_key = rows.window_left >= 0 ? std::max(0, len - 1 - rows.window_left) : 0;
    const int pages = v.indptr[i + 1] - v.indptr[i];
    ASSERT_EQ(pages, (len - 1) / g.page_size - first_key / g.page_size + 1)
        << where << " row " << i;
    for (int p = 0; p < pages; ++p) {
      const int index = v.indices[v.indptr[i] + p];
      ASSERT_GE(index, 0) << where;
      ASSERT_LT(index, slots * g.pages_per_slot) << where << ": past the layer's buffer";
      EXPECT_EQ(index / g.pages_per_slot, rows.slots[i])
          << where << " row " << i << " page " << p << ": another slot's rows";
      EXPECT_EQ(index % g.pages_per_slot, first_key / g.page_size + p) << where << " row " << i;
    }
    EXPECT_EQ(v.last_page_len[i], len - (len - 1) / g.page_size * g.page_size) << where;
  }
}

// Slots decode together from prompts shorter than the window, through layers of both kinds in
// the order given, for enough steps that the window buffers move.
void run_model(const std::vector<bool>& window_layers, int slots, std::mt19937& rng,
               int* plans_per_step) {
  const int page_size = 4, max_seq = 64, window = 6, window_rows = 8;
  const PageGeometry full{page_size, max_seq / page_size};
  const PageGeometry windowed{page_size, window_rows / page_size};
  const bool both = std::count(window_layers.begin(), window_layers.end(), true) > 0 &&
                    std::count(window_layers.begin(), window_layers.end(), false) > 0;
  DecodeSchedules schedules(both ? 2 : 1);
  Device device;
  device.mirror.assign(2 * static_cast<std::size_t>(slots) + 1 +
                           static_cast<std::size_t>(slots) * full.pages_per_slot,
                       -1);
  device.tables.resize(2);
  std::vector<std::int32_t> position(static_cast<std::size_t>(slots));
  std::vector<std::int32_t> first(static_cast<std::size_t>(slots), 0);  // window rows' start
  for (auto& p : position) p = std::uniform_int_distribution<int>(1, window - 2)(rng);
  for (int step = 0; step < 12; ++step) {
    // Not every slot decodes every step; the rows come in a shuffled order.
    std::vector<std::int32_t> row_slots;
    for (int s = 0; s < slots; ++s) {
      if (step % 3 != 2 || s % 2 == 0) row_slots.push_back(s);
    }
    std::shuffle(row_slots.begin(), row_slots.end(), rng);
    const int n = static_cast<int>(row_slots.size());
    std::vector<std::int32_t> full_lens(static_cast<std::size_t>(n)), window_lens(full_lens);
    for (int i = 0; i < n; ++i) {
      const auto s = static_cast<std::size_t>(row_slots[static_cast<std::size_t>(i)]);
      // The window buffer keeps the last rows once the next would not fit.
      if (position[s] - first[s] + 1 > window_rows) first[s] = position[s] + 1 - window;
      full_lens[static_cast<std::size_t>(i)] = position[s] + 1;
      window_lens[static_cast<std::size_t>(i)] = position[s] - first[s] + 1;
    }
    const int plans_before = device.plans;
    for (std::size_t layer = 0; layer < window_layers.size(); ++layer) {
      const bool w = window_layers[layer];
      const PageGeometry& g = w ? windowed : full;
      const PagedRows rows{n, row_slots.data(), w ? window_lens.data() : full_lens.data(),
                           w ? window - 1 : -1};
      const std::string where = std::to_string(slots) + " slots, step " + std::to_string(step) +
                                ", layer " + std::to_string(layer) + (w ? " (window)" : " (full)");
      expect_rows_held(decode(schedules, device, g, rows), g, rows, slots, where);
      if (::testing::Test::HasFailure()) return;
    }
    plans_per_step[step] = device.plans - plans_before;
    for (const std::int32_t s : row_slots) ++position[static_cast<std::size_t>(s)];
  }
}

TEST(DecodeSchedules, EveryLayerReadsTheRowsItHolds) {
  std::mt19937 rng(40);
  const std::vector<std::vector<bool>> orders = {
      {true, false, true, true, false, true},   // window first (Gemma 2 alternates, 3 5:1)
      {false, true, false, false, true, true},  // full first
      {true, true, true},                       // window layers alone
      {false, false}};                          // full layers alone
  for (const int slots : {2, 3}) {
    for (const auto& order : orders) {
      int plans[12] = {};
      run_model(order, slots, rng, plans);
      if (HasFailure()) return;
      // Each kind plans at most once a step, however the kinds interleave.
      const int kinds = static_cast<int>(std::count(order.begin(), order.end(), true) > 0) +
                        static_cast<int>(std::count(order.begin(), order.end(), false) > 0);
      for (int step = 0; step < 12; ++step) {
        EXPECT_GE(plans[step], 1) << slots << " slots, step " << step;
        EXPECT_LE(plans[step], kinds) << slots << " slots, step " << step;
      }
    }
  }
}

// A call repeated reuses its schedule; a row changed, the window, or the layer's pages each make
// a new one; a plan that never finished is made again.
TEST(DecodeSchedules, AnyChangeOfKeyPlansAnew) {
  DecodeSchedules schedules(2);
  std::vector<std::int32_t> slots = {1, 0}, lens = {5, 9};
  const PageGeometry g{4, 4};
  PagedRows rows{2, slots.data(), lens.data(), -1};
  EXPECT_TRUE(schedules.use(g, rows).plan);
  EXPECT_TRUE(schedules.use(g, rows).plan);  // not yet planned(): still to plan
  schedules.planned();
  EXPECT_FALSE(schedules.use(g, rows).plan);
  lens[1] = 10;
  EXPECT_TRUE(schedules.use(g, rows).plan);
  schedules.planned();
  EXPECT_TRUE(schedules.use(PageGeometry{4, 8}, rows).plan);  // another layer's pages
  schedules.planned();
  EXPECT_TRUE(schedules.use(PageGeometry{8, 2}, rows).plan);
  rows.window_left = 3;  // a window layer: its own schedule
  const DecodeSchedules::Use w = schedules.use(g, rows);
  EXPECT_EQ(w.schedule, 1);
  EXPECT_TRUE(w.plan);
  schedules.planned();
  rows.window_left = 2;
  EXPECT_TRUE(schedules.use(g, rows).plan);
}

TEST(DecodeSchedules, RowsOutsideTheLayerAreRefused) {
  DecodeSchedules schedules(1);
  std::vector<std::int32_t> slots = {0}, lens = {17};
  const PagedRows rows{1, slots.data(), lens.data(), -1};
  kvo::testing::expect_error(
      [&] {
        schedules.use(PageGeometry{4, 4}, rows);
      },
      ErrorCode::kInternal, "17 keys in slot 0 of a layer of 16 rows");
  lens[0] = 0;
  kvo::testing::expect_error(
      [&] {
        schedules.use(PageGeometry{4, 4}, rows);
      },
      ErrorCode::kInternal, "0 keys");
  lens[0] = 3;
  slots[0] = -1;
  kvo::testing::expect_error(
      [&] {
        schedules.use(PageGeometry{4, 4}, rows);
      },
      ErrorCode::kInternal, "slot -1");
  slots[0] = 2;
  EXPECT_TRUE(schedules.use(PageGeometry{4, 4}, rows).plan);
  std::vector<std::int32_t> table(3);  // indptr and last_page_len, no room for the index
  kvo::testing::expect_error([&] { schedules.write_table(table.data(), table.size()); },
                             ErrorCode::kInternal, "exceed");
  table.resize(4);
  EXPECT_EQ(schedules.write_table(table.data(), table.size()), 4u);
  EXPECT_EQ(table[3], 2 * 4);  // slot 2's first page
  kvo::testing::expect_error([] { DecodeSchedules three(3); }, ErrorCode::kInternal, "3 kinds");
}

}  // namespace
}  // namespace kvo::model
