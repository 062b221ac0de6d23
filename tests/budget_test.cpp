// remat::Budget: its grammar, its validation and its resolution on a chain.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "remat/budget.h"
#include "remat/planner.h"

namespace {

using remat::Budget;

TEST(BudgetParse, AcceptsBytesWithUnits) {
  EXPECT_EQ(Budget::parse("512MiB").budget_bytes(), 512LL << 20);
  EXPECT_EQ(Budget::parse("1GiB").budget_bytes(), 1LL << 30);
  EXPECT_EQ(Budget::parse("300MB").budget_bytes(), 300000000);
  EXPECT_EQ(Budget::parse("1000000").budget_bytes(), 1000000);
  EXPECT_EQ(Budget::parse("64 kib").budget_bytes(), 65536);
  EXPECT_EQ(Budget::parse("1.5KiB").budget_bytes(), 1536);
  EXPECT_EQ(Budget::parse(" 7B ").budget_bytes(), 7);
  EXPECT_EQ(Budget::parse("2TB").kind(), Budget::Kind::kBytes);
  EXPECT_EQ(Budget::parse("512MiB"), Budget::bytes(512LL << 20));
}

TEST(BudgetParse, AcceptsPercentagesAndNone) {
  const Budget half = Budget::parse("50%");
  EXPECT_EQ(half.kind(), Budget::Kind::kFraction);
  EXPECT_TRUE(half.is_fraction());
  EXPECT_DOUBLE_EQ(half.budget_fraction(), 0.5);
  EXPECT_EQ(half, Budget::fraction(0.5));
  EXPECT_DOUBLE_EQ(Budget::parse("12.5%").budget_fraction(), 0.125);
  EXPECT_DOUBLE_EQ(Budget::parse("100%").budget_fraction(), 1.0);
  EXPECT_TRUE(Budget::parse("none").is_none());
  EXPECT_TRUE(Budget::parse("NONE").is_none());
  EXPECT_EQ(Budget::parse("none"), Budget());
}

TEST(BudgetParse, RefusesBadTextNamingIt) {
  for (const std::string text :
       {"10XB",
        "-5%",
        "150%",
        "",
        "   ",
        "-5",
        "0",
        "0%",
        "1.5",
        "abc",
        "MiB",
        "1e9",
        "0.1B",
        "99999999999EiB",
        "99999999TiB",
        "12 34"}) {
    try {
      Budget::parse(text);
      ADD_FAILURE() << "accepted \"" << text << "\"";
    } catch (const c10::Error& error) {
      const std::string message = error.what_without_backtrace();
      EXPECT_NE(message.find("got '" + text + "'"), std::string::npos)
          << message;
      EXPECT_NE(message.find("expected"), std::string::npos) << message;
    }
  }
  try {
    Budget::parse("10XB");
    ADD_FAILURE() << "accepted 10XB";
  } catch (const c10::Error& error) {
    EXPECT_NE(
        std::string(error.what()).find("unknown unit 'XB'"), std::string::npos)
        << error.what();
  }
}

TEST(Budget, ConstructorsValidate) {
  EXPECT_THROW(Budget::bytes(0), c10::Error);
  EXPECT_THROW(Budget::bytes(-1), c10::Error);
  EXPECT_THROW(Budget::fraction(0), c10::Error);
  EXPECT_THROW(Budget::fraction(-0.5), c10::Error);
  EXPECT_THROW(Budget::fraction(1.5), c10::Error);
  EXPECT_THROW(Budget::fraction(std::nan("")), c10::Error);
  // A fraction just above 1 is named with every digit, not as "1".
  try {
    Budget::fraction(1.0000001);
    ADD_FAILURE() << "Budget::fraction(1.0000001) was accepted";
  } catch (const c10::Error& error) {
    EXPECT_NE(
        std::string(error.what()).find("got 1.0000001"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(Budget::bytes(5).budget_bytes(), 5);
  EXPECT_FALSE(Budget::bytes(5).is_fraction());
}

TEST(Budget, ResolvesAgainstTheStoreAllPeak) {
  const remat::planner::Chain chain(
      {{1, 1, 100, 150, 0, 0}, {1, 1, 100, 100, 0, 0}}, 100);
  const int64_t store_all =
      remat::planner::simulate(chain, remat::planner::solve_store_all(chain))
          .peak_bytes;
  EXPECT_EQ(Budget::none().resolve_bytes(chain), store_all);
  EXPECT_EQ(Budget::fraction(1.0).resolve_bytes(chain), store_all);
  EXPECT_EQ(Budget::parse("50%").resolve_bytes(chain), store_all / 2);
  EXPECT_EQ(Budget::parse("2KiB").resolve_bytes(chain), 2048);
  EXPECT_EQ(Budget::fraction(1e-9).resolve_bytes(chain), 1);
}

// Resident bytes (sharded parameters) are in every plan's peak: a fraction
// scales only what lies above them, and the same chain without them
// resolves to the same fraction of its own peak.
TEST(Budget, FractionsScaleOnlyWhatLiesAboveTheResidentBytes) {
  const std::vector<remat::planner::StageCost> stages = {
      {1, 1, 100, 150, 0, 0}, {1, 1, 100, 100, 0, 0}};
  const remat::planner::Chain plain(stages, 100);
  const remat::planner::Chain sharded(stages, 100, 4000);
  auto store_all = [](const remat::planner::Chain& chain) {
    return remat::planner::simulate(
               chain, remat::planner::solve_store_all(chain))
        .peak_bytes;
  };
  ASSERT_EQ(store_all(sharded), store_all(plain) + 4000);
  EXPECT_EQ(
      Budget::parse("50%").resolve_bytes(sharded), 4000 + store_all(plain) / 2);
  EXPECT_EQ(Budget::fraction(1.0).resolve_bytes(sharded), store_all(sharded));
  EXPECT_EQ(Budget::none().resolve_bytes(sharded), store_all(sharded));
  EXPECT_EQ(Budget::fraction(1e-9).resolve_bytes(sharded), 4000);
  EXPECT_EQ(Budget::parse("2KiB").resolve_bytes(sharded), 2048);
}

TEST(Budget, ToString) {
  EXPECT_EQ(Budget::none().to_string(), "none");
  EXPECT_EQ(Budget::parse("50%").to_string(), "50% of the store-all peak");
  EXPECT_EQ(Budget::parse("512MiB").to_string(), "512 MiB (536870912 bytes)");
}

}  // namespace
