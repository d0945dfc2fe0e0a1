// The same view lets a file of model/ include what its floor may: the public API, offload/util/
// and model/ itself.
#include "kvoffload/types.hpp"
#include "model/common/numerics.hpp"
#include "offload/util/printable.hpp"

int main() {
  return kvo::printable("x") == "x" ? 0 : 1;
}
