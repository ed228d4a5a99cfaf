// test_check.cpp: engine/core/check.h's error lines -- the kind an error text starts with, the plain "error: " for
// texts without one, and where a rank's error says which rank and host saw it.
#include <gtest/gtest.h>

#include <string>

#include "engine/core/check.h"

namespace {

TEST(ErrorLine, KeepsAKindAndPrefixesTheRest) {
    EXPECT_EQ(ms::user_error_line("data error: cannot open x.idx"), "data error: cannot open x.idx");
    EXPECT_EQ(ms::user_error_line("cannot open x.idx"), "error: cannot open x.idx");
    // a head that is not "<words> error" is not a kind
    EXPECT_EQ(ms::user_error_line("Error: x"), "error: Error: x");
    EXPECT_EQ(ms::error_kind_length("config error: x"), std::string("config error: ").size());
    EXPECT_EQ(ms::error_kind_length("no kind: x"), 0u);
}

TEST(ErrorLine, ErrorAtPutsTheRankAfterTheKind) {
    EXPECT_EQ(ms::error_at("data error: cannot open x.idx", "world rank 1 (host h)"),
              "data error: world rank 1 (host h): cannot open x.idx");
    EXPECT_EQ(ms::error_at("cannot open x.idx", "world rank 1 (host h)"),
              "error: world rank 1 (host h): cannot open x.idx");
}

TEST(RunErrorTest, FailedRankIsThisRankUnlessSet) {
    ms::UserError e("config error: x");
    EXPECT_EQ(e.failed_rank(), -1);
    e.set_failed_rank(3);
    EXPECT_EQ(e.failed_rank(), 3);
    EXPECT_EQ(e.exit_code(), ms::kExitConfigError);
}

}  // namespace
