// A saved context: one slot's K/V rows of every layer, its length and token ids, under a header
// that fingerprints the cache's shape and the model. Restoring it skips the prefill.
//
// Layout of one record (integers little-endian; a file or stream holds one record per slot):
//
//   header  magic "KVOCTX\r\n", u32 version, u32 layers, kv_heads, head_dim, max_seq, dtype,
//           u32 length, u64 row_bytes, u32 model_bytes, u32 token_count,
//           version 2 only: u32 v_head_dim,
//           model text [model_bytes], token ids i32 [token_count] (0 or `length` of them),
//           u64 XXH3 of the header bytes before it
//   blocks  for each layer l: K rows [length][row_bytes], V rows [length][v_row_bytes],
//           u64 XXH3 of the block's K and V bytes
//
// Version 1 is a record whose V rows are the size of its K rows (v_head_dim = head_dim); version
// 2, written only when they differ (multi-head latent attention), adds v_head_dim.
//
// The model text is the caller's fingerprint of the model, lines "key=value" (architecture,
// shapes, the tensor table), compared line by line so that a refusal names the first difference.
//
// Everything here goes through three small interfaces (bytes in and bytes out, ByteSource and
// ByteSink of offload/util/byte_io.hpp, and where a slot's rows live), so that it does not
// depend on how the cache lays its rows out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvoffload/types.hpp"
#include "offload/util/byte_io.hpp"

namespace kvo::offload {

// Where one slot's rows live: K (kv 0) and V (kv 1) of each layer are rows [0, max_seq), each
// row_bytes long and contiguous, either in host memory (the host store) or on the device (the
// resident layers).
class SlotRows {
 public:
  virtual ~SlotRows() = default;
  // Host memory of the rows, or nullptr when they live on the device.
  virtual std::byte* host_rows(int layer, int kv) = 0;
  // Blocking copies of `bytes` starting `offset` bytes into the rows of a device layer.
  virtual void copy_from_device(int layer, int kv, std::size_t offset, std::size_t bytes,
                                void* host) = 0;
  virtual void copy_to_device(int layer, int kv, std::size_t offset, std::size_t bytes,
                              const void* host) = 0;
};

// The cache side of the fingerprint.
struct ContextShape {
  int layers = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int max_seq = 0;
  DType dtype = DType::kBF16;
  std::uint64_t row_bytes = 0;
  int v_head_dim = 0;             // 0: head_dim
  std::uint64_t v_row_bytes = 0;  // 0: row_bytes
};

struct ContextHeader {
  ContextShape shape;
  int length = 0;                    // rows of the slot
  std::string model;                 // the caller's fingerprint of the model
  std::vector<std::int32_t> tokens;  // empty, or one id per row
};

// The first line of the model text of a context saved by a cache that holds a shard of the model's
// KV heads (CacheConfig::shard): "kv_heads_held=[begin, end) of model_kv_heads", and empty for a
// cache that holds them all. The cache puts it before the caller's fingerprint when it saves, and
// before the caller's when it loads, so that check_context_fits refuses another rank's heads by
// name.
std::string shard_line(int kv_head_begin, int kv_heads, int model_kv_heads);

// Writes one record: the header, then each layer's rows with their checksum.
// REQUIRES: header.tokens is empty or header.length long; rows hold header.length rows.
void write_context(ByteSink& sink, const ContextHeader& header, SlotRows& rows);

// Reads and checks a header: magic, version, sizes, checksum. `what` names the input in errors.
// Throws kvo::Error(kInvalidArgument) for a file that is not a context, truncated, or corrupted.
ContextHeader read_context_header(ByteSource& source, const std::string& what);

// Refuses (kvo::Error kInvalidArgument, naming the first difference) a context that was saved
// from another cache shape, KV dtype, max_seq or model.
void check_context_fits(const ContextHeader& file, const ContextShape& shape,
                        const std::string& model, const std::string& what);

// Reads the blocks of a record whose header was just read, checking each block's checksum.
// staged == nullptr: straight into `rows` (for a slot whose rows nobody can see yet: an empty
// one); else into *staged (resized to fit), for commit_staged_rows once every block checked out.
// Throws kvo::Error(kInvalidArgument) naming the layer whose block is truncated or corrupted.
void read_context_rows(ByteSource& source, const ContextHeader& header, SlotRows& rows,
                       std::vector<std::byte>* staged, const std::string& what);
void commit_staged_rows(const ContextHeader& header, SlotRows& rows,
                        const std::vector<std::byte>& staged);

// Passes over the blocks of a record whose header was just read (for inspecting a file).
// Throws kvo::Error(kInvalidArgument) when the input ends first.
void skip_context_rows(ByteSource& source, const ContextHeader& header, const std::string& what);

// Bytes of one record: what a file of it holds.
std::uint64_t context_record_bytes(const ContextHeader& header);

}  // namespace kvo::offload
