// A program that plans device memory through the installed planner component alone.
#include <cstdio>

#include <kvoffload/planner.hpp>

int main() {
  kvo::MemoryQuery query;
  query.model = "llama3-8b";
  query.max_seq = 131072;
  query.budget = kvo::parse_size("24GiB");
  try {
    const kvo::MemoryPlan plan = kvo::plan_memory(query);
    if (!plan.fits || plan.resident_layers < 1 || plan.resident_layers >= plan.layers ||
        plan.total_bytes > query.budget) {
      std::fprintf(stderr, "consumer: an implausible plan: %d of %d layers, %llu bytes\n",
                   plan.resident_layers, plan.layers,
                   static_cast<unsigned long long>(plan.total_bytes));
      return 1;
    }
    std::printf("planner: Llama-3-8B at 128K in 24 GiB keeps %d of %d layers resident (%s)\n",
                plan.resident_layers, plan.layers, kvo::format_bytes(plan.total_bytes).c_str());
  } catch (const kvo::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
  return 0;
}
