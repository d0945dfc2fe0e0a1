// ...but not offload/ beyond its utilities: the host store is the library's own.
#include "offload/store/host_store.hpp"
