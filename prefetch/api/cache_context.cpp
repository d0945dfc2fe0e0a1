// Saved contexts: a cache's slots written to a file or stream, each record checksummed under a
// header that fingerprints the cache's shape and the model (offload/context/), and read back
// into slots, every record checked before any slot changes.
#include <string>
#include <vector>

#include "offload/util/byte_io.hpp"
#include "prefetch/api/cache_impl.hpp"

namespace kvo {

void OffloadedStaticCache::Impl::save(const std::vector<int>& slots, offload::ByteSink& sink,
                                      const std::vector<SlotContext>& contexts, const char* call) {
  check_slots(slots, call);
  check_no_windows(call);
  if (contexts.size() != slots.size()) {
    throw invalid(std::string(call) + ": " + std::to_string(contexts.size()) + " contexts for " +
                  std::to_string(slots.size()) + " slots");
  }
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const std::size_t ids = contexts[i].tokens.size();
    if (ids != 0 && ids != static_cast<std::size_t>(lengths[slots[i]])) {
      throw invalid(std::string(call) + ": slot " + std::to_string(slots[i]) + " holds " +
                    std::to_string(lengths[slots[i]]) + " rows but " + std::to_string(ids) +
                    " token ids were given (give one per row, or none)");
    }
  }
  const offload::ContextShape shape = context_shape();
  quiesce();
  for (std::size_t i = 0; i < slots.size(); ++i) {
    offload::ContextHeader header{shape, lengths[slots[i]], held() + contexts[i].model,
                                  contexts[i].tokens};
    CacheSlotRows rows(*backend, *store, *arena, plan, slots[i]);
    offload::write_context(sink, header, rows);
  }
}

std::vector<SlotContext> OffloadedStaticCache::Impl::load(const std::vector<int>& slots,
                                                          offload::ByteSource& source,
                                                          const std::string& model,
                                                          const std::string& what,
                                                          bool whole_input) {
  check_slots(slots, "load_slot");
  check_no_windows("load_slot");
  const offload::ContextShape shape = context_shape();
  quiesce();
  // Every record is read and checked before any length changes: a slot that holds rows gets
  // its record staged, an empty one gets it in place (rows past length 0 are nobody's).
  std::vector<offload::ContextHeader> headers;
  std::vector<std::vector<std::byte>> staged(slots.size());
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const std::string record = slots.size() > 1
                                   ? what + " (saved context " + std::to_string(i + 1) + " of " +
                                         std::to_string(slots.size()) + ")"
                                   : what;
    offload::ContextHeader header = offload::read_context_header(source, record);
    offload::check_context_fits(header, shape, held() + model, record);
    CacheSlotRows rows(*backend, *store, *arena, plan, slots[i]);
    const bool in_place = lengths[slots[i]] == 0;
    offload::read_context_rows(source, header, rows, in_place ? nullptr : &staged[i], record);
    headers.push_back(std::move(header));
  }
  if (whole_input) {
    char extra = 0;
    if (source.read(&extra, 1) != 0) {
      throw invalid(what + ": more bytes follow its " + std::to_string(slots.size()) +
                    " saved context(s) (load as many slots as were saved); nothing was loaded");
    }
  }
  std::vector<SlotContext> contexts;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    CacheSlotRows rows(*backend, *store, *arena, plan, slots[i]);
    if (lengths[slots[i]] != 0) offload::commit_staged_rows(headers[i], rows, staged[i]);
    lengths[slots[i]] = headers[i].length;
    contexts.push_back({std::move(headers[i].tokens), std::move(headers[i].model)});
  }
  if (ring) ring->forget_prefetches();
  return contexts;
}

struct __attribute__((visibility("hidden"))) SavedContextFile::Impl {
  Impl(const std::string& p, ContextReading reading)
      : path(p), source(p, reading == ContextReading::kMapped) {}
  std::string path;
  offload::FileSource source;
  SavedContextInfo info;
};

SavedContextFile::SavedContextFile(const std::string& path, ContextReading reading)
    : impl_(std::make_unique<Impl>(path, reading)) {
  offload::FileSource& source = impl_->source;
  SavedContextInfo& info = impl_->info;
  const std::string what = "saved context " + path;
  std::uint64_t offset = 0;
  do {
    offload::ContextHeader header = offload::read_context_header(source, what);
    if (!info.lengths.empty() &&
        (header.shape.layers != info.layers || header.shape.kv_heads != info.kv_heads ||
         header.shape.head_dim != info.head_dim || header.shape.max_seq != info.max_seq ||
         header.shape.v_head_dim != info.v_head_dim || header.shape.dtype != info.dtype)) {
      throw invalid(what + ": its saved contexts differ in shape");
    }
    info.layers = header.shape.layers;
    info.kv_heads = header.shape.kv_heads;
    info.head_dim = header.shape.head_dim;
    info.v_head_dim = header.shape.v_head_dim;
    info.max_seq = header.shape.max_seq;
    info.dtype = header.shape.dtype;
    info.lengths.push_back(header.length);
    offload::skip_context_rows(source, header, what);
    offset += offload::context_record_bytes(header);
    info.contexts.push_back({std::move(header.tokens), std::move(header.model)});
  } while (offset < source.size());
}

SavedContextFile::~SavedContextFile() = default;
SavedContextFile::SavedContextFile(SavedContextFile&&) noexcept = default;
SavedContextFile& SavedContextFile::operator=(SavedContextFile&&) noexcept = default;

const SavedContextInfo& SavedContextFile::info() const {
  return impl_->info;
}
const std::string& SavedContextFile::path() const {
  return impl_->path;
}

SavedContextInfo inspect_saved_context(const std::string& path) {
  return SavedContextFile(path).info();
}

void check_save_path(const std::string& path) {
  offload::AtomicFileSink::check_path(path);
}

void OffloadedStaticCache::save_slot(int slot, const std::string& path,
                                     const SlotContext& context) {
  save_slots({slot}, path, {context});
}

void OffloadedStaticCache::save_slots(const std::vector<int>& slots, const std::string& path,
                                      const std::vector<SlotContext>& contexts) {
  impl_->check_slots(slots, "save_slot");
  offload::AtomicFileSink sink(path);
  impl_->save(slots, sink, contexts, "save_slot");
  sink.commit();
}

void OffloadedStaticCache::save_slot(int slot, std::ostream& out, const SlotContext& context) {
  offload::StreamSink sink(out);
  impl_->save({slot}, sink, {context}, "save_slot");
}

SlotContext OffloadedStaticCache::load_slot(int slot, const std::string& path,
                                            const std::string& model) {
  return load_slots({slot}, path, model).front();
}

std::vector<SlotContext> OffloadedStaticCache::load_slots(const std::vector<int>& slots,
                                                          const std::string& path,
                                                          const std::string& model) {
  impl_->check_slots(slots, "load_slot");
  SavedContextFile file(path, impl_->config.context_reading);
  return load_slots(slots, file, model);
}

std::vector<SlotContext> OffloadedStaticCache::load_slots(const std::vector<int>& slots,
                                                          SavedContextFile& file,
                                                          const std::string& model) {
  impl_->check_slots(slots, "load_slot");
  offload::FileSource& source = file.impl_->source;
  source.rewind();
  return impl_->load(slots, source, model, "saved context " + file.path(), /*whole_input=*/true);
}

SlotContext OffloadedStaticCache::load_slot(int slot, std::istream& in, const std::string& model) {
  offload::StreamSource source(in);
  return impl_->load({slot}, source, model, "saved context (stream)", /*whole_input=*/false)
      .front();
}

}  // namespace kvo
