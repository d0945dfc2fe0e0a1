// Rotary position embedding: the inverse frequencies of every rope type the served checkpoints
// use, and the scale some of them put on cos and sin, computed as transformers computes them
// (model_config.cpp reads them from config.json's rope_scaling or rope_parameters).
//
// Two types depend on the length of the forward: `dynamic` (NTK) stretches the base once a
// forward reaches past max_position_embeddings, and `longrope` switches from its short factors to
// its long ones once a forward reaches past original_max_position_embeddings. Keys already in the
// cache keep the rotation of the forward that wrote them, in transformers and here alike, so a
// decoder follows the table forward by forward (RopeSchedule).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvo::model {

enum class RopeType { kDefault, kLinear, kDynamic, kYarn, kLongRope, kLlama3 };

// "default", "linear", "dynamic", "yarn", "longrope", "llama3".
const char* rope_type_name(RopeType type);
// "default, linear, dynamic, yarn, longrope, llama3"
std::string rope_type_names();

struct RopeScaling {
  RopeType type = RopeType::kDefault;
  // linear, dynamic, llama3: the stretch; yarn and longrope: max_position_embeddings over
  // original_max_position where config.json gives none.
  double factor = 1;
  double low_freq_factor = 1;   // llama3
  double high_freq_factor = 4;  // llama3
  // llama3, yarn, longrope: the pretraining length (config.json's, else max_position_embeddings).
  double original_max_position = 0;
  double beta_fast = 32;  // yarn: the correction range's rotations
  double beta_slow = 1;
  bool truncate = true;  // yarn: the correction range rounded outward to whole dimensions
  // yarn and longrope: the scale on cos and sin, derived as transformers derives it where
  // config.json gives none (yarn: from factor, mscale and mscale_all_dim; longrope: from factor
  // and original_max_position).
  double attention_factor = 1;
  std::vector<double> short_factor, long_factor;  // longrope: head_dim / 2 each
};

// Every parameter that changes the rotation, on one line ("default", "llama3 factor=8
// low_freq_factor=1 high_freq_factor=4 original_max_position=8192", ...): a model's fingerprint
// carries it.
std::string describe(const RopeScaling& scaling);

// What the rotation of one forward uses: inv_freq [head_dim / 2] and the scale on cos and sin.
struct RopeTable {
  std::vector<float> inv_freq;
  float scale = 1;
};

// The table of a forward whose highest position is seq_len - 1, as transformers' rope_init_fn
// gives it for that seq_len (float32 arithmetic in the same order). REQUIRES: head_dim even,
// theta > 0, and the scaling as parse_model_config validates it.
RopeTable rope_table(const RopeScaling& scaling, float theta, int head_dim,
                     int max_position_embeddings, std::int64_t seq_len);

// True for the types whose table depends on the forward's length (dynamic, longrope).
bool rope_depends_on_length(const RopeScaling& scaling);

// The table forward by forward, as transformers' rotary embedding keeps it: dynamic grows its
// table when a forward reaches past the longest seen and goes back to the original one when a
// forward ends inside max_position_embeddings again; longrope picks short or long factors for
// each forward. Other types never change.
class RopeSchedule {
 public:
  // A model's rope: its scaling, base, head size and pretraining length (ModelConfig's).
  RopeSchedule(const RopeScaling& scaling, float theta, int head_dim, int max_position_embeddings);
  // Before a forward whose highest position is seq_len - 1: true when the table changed.
  bool update(std::int64_t seq_len);
  const RopeTable& table() const { return table_; }

 private:
  RopeScaling scaling_;
  float theta_;
  int head_dim_;
  int max_position_;
  RopeTable table_;
  std::int64_t cached_len_ = 0;    // dynamic: the length the table was computed for
  std::int64_t original_len_ = 0;  // dynamic: max_position_embeddings
  bool long_ = false;              // longrope: the long factors are in the table
};

}  // namespace kvo::model
