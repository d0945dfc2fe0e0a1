// The registry of model families (family.hpp): one line a family.
#include "model/families/family.hpp"

#include "kvoffload/error.hpp"
#include "offload/util/printable.hpp"

namespace kvo::model {

extern const Family kLlamaFamily;
extern const Family kMistralFamily;
extern const Family kQwen2Family;
extern const Family kQwen3Family;
extern const Family kPhi3Family;
extern const Family kGemma2Family;
extern const Family kGemma3Family;
extern const Family kGraniteFamily;
extern const Family kOlmo2Family;

namespace {

const Family* const kFamilies[] = {&kLlamaFamily,  &kMistralFamily, &kQwen2Family,
                                   &kQwen3Family,  &kPhi3Family,    &kGemma2Family,
                                   &kGemma3Family, &kGraniteFamily, &kOlmo2Family};

}  // namespace

std::string served_architectures() {
  std::string names;
  for (const Family* f : kFamilies) {
    for (const char* a : f->architectures) names += (names.empty() ? "" : ", ") + std::string(a);
  }
  return names;
}

std::vector<std::string> family_model_types() {
  std::vector<std::string> types;
  for (const Family* f : kFamilies) types.emplace_back(f->model_type);
  return types;
}

const Family& family_of_architecture(const std::string& architecture, const std::string& source) {
  for (const Family* f : kFamilies) {
    for (const char* a : f->architectures) {
      if (architecture == a) return *f;
    }
  }
  throw Error(ErrorCode::kInvalidArgument,
              source + ": architecture \"" + printable(architecture) +
                  "\" is not supported (supported: " + served_architectures() + ")");
}

const Family& family_of_model_type(const std::string& model_type, const std::string& source) {
  for (const Family* f : kFamilies) {
    if (model_type == f->model_type) return *f;
  }
  throw Error(ErrorCode::kInvalidArgument,
              source + ": no \"architectures\" and no known \"model_type\"" +
                  (model_type.empty() ? "" : " (\"" + printable(model_type) + "\")"));
}

}  // namespace kvo::model
