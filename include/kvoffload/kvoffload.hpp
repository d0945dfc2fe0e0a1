// The C++ API of kvoffload, in one include.
#pragma once

#include "kvoffload/cache.hpp"
#include "kvoffload/config.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/fingerprint.hpp"
#include "kvoffload/plan.hpp"
#include "kvoffload/types.hpp"
