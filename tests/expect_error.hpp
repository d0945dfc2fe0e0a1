// expect_error: a call must throw kvo::Error with a given code and a message that says what a
// user needs to read. Shared by the tests of every layer of the API.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "kvoffload/error.hpp"

namespace kvo::testing {

inline void expect_error(const std::function<void()>& call, ErrorCode code,
                         const std::string& needle) {
  try {
    call();
    ADD_FAILURE() << "expected an error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' lacks '" << needle << "'";
  }
}

}  // namespace kvo::testing
