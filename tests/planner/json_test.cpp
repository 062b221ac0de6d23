// JSON for Chain and Plan: round-trip, errors naming the field, and a seeded
// random-mutation fuzz corpus (only std::invalid_argument may escape).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <random>
#include <stdexcept>
#include <string>

#include "test_chains.h"

namespace remat::planner {
namespace {

std::string chain_error(const std::string& json) {
  try {
    chain_from_json(json);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

const char* kGoodChain =
    R"({"input_bytes": 8, "stages": [{"forward_ms": 1.5, "backward_ms": 3,
    "output_bytes": 16, "saved_bytes": 24, "forward_tmp_bytes": 0,
    "backward_tmp_bytes": 4}]})";

TEST(ChainJson, RoundTripsExactly) {
  std::mt19937_64 rng(99);
  for (int k = 0; k < 100; ++k) {
    const Chain chain =
        testing::random_chain(rng, 20, 1 << 30, true, k % 2, k % 3 == 0);
    EXPECT_EQ(chain_from_json(to_json(chain)), chain);
  }
  EXPECT_EQ(chain_from_json(kGoodChain).stage(0).backward_tmp_bytes, 4);
  EXPECT_FALSE(chain_from_json(kGoodChain).stage(0).record_tmp_bytes);
  // backward_tmp_bytes may be negative (down to -|x_i|, checked by Chain).
  std::string negative = kGoodChain;
  const std::string four = "\"backward_tmp_bytes\": 4";
  negative.replace(
      negative.find(four), four.size(), "\"backward_tmp_bytes\": -2");
  EXPECT_EQ(chain_from_json(negative).stage(0).backward_tmp_bytes, -2);
  // The cold-write cost: written when set, read back, 0 when absent.
  const Chain cold =
      chain_from_json(kGoodChain).with_cold_write_ms_per_mib(0.0625);
  EXPECT_NE(to_json(cold).find("\"cold_write_ms_per_mib\""), std::string::npos);
  EXPECT_EQ(chain_from_json(to_json(cold)), cold);
  EXPECT_EQ(chain_from_json(kGoodChain).cold_write_ms_per_mib(), 0);
  const Graph graph = graph_of(cold);
  EXPECT_EQ(graph_from_json(to_json(graph)), graph);
}

TEST(ChainJson, NamesTheFieldAndValueOfBadInput) {
  struct Case {
    std::string json;
    std::string expected;
  };
  for (
      const Case& c : std::vector<Case>{
          {"{", "malformed JSON"},
          {"[]", "document: expected an object"},
          {R"({"stages": []})", "input_bytes: missing field"},
          {R"({"input_bytes": 1, "stages": []})", "empty"},
          {R"({"input_bytes": -1, "stages": []})",
           "input_bytes: expected a non-negative integer, got -1"},
          {R"({"input_bytes": 1.5, "stages": []})", "got 1.5"},
          {R"({"input_bytes": 1, "stages": {}})", "stages: expected an array"},
          {R"({"input_bytes": 1, "stages": [3]})",
           "stages[0]: expected an object"},
          {R"({"input_bytes": 1, "stages": [{"forward_ms": "1"}]})",
           "stages[0].forward_ms: expected a non-negative number, got \"1\""},
          {R"({"input_bytes": 1, "stages": [{"forward_ms": 1}]})",
           "stages[0].backward_ms: missing field"},
          {R"({"input_bytes": 1, "stages": [], "extra": 2})",
           "extra: unknown field"},
          {R"({"input_bytes": 1, "cold_write_ms_per_mib": -0.5, "stages": []})",
           "cold_write_ms_per_mib: expected a non-negative number, got -0.5"},
          {R"({"input_bytes": 18446744073709551615, "stages": []})",
           "does not fit int64"},
          {std::string(1000, '['), "nesting deeper than"},
          // A repeated field is refused, not read as its last value.
          {R"({"input_bytes": 1, "input_bytes": 2, "stages": []})",
           "input_bytes: duplicate field"},
          {R"({"input_bytes": 1, "stages": [{}, {"forward_ms": 1,
             "backward_ms": 2, "forward_ms": 3}]})",
           "stages[1].forward_ms: duplicate field"},
          {R"({"input_bytes": 1, "stages": [[1, [2]], {"a": {"b": 1,
             "b": 2}}]})",
           "stages[1].a.b: duplicate field"},
      }) {
    const std::string error = chain_error(c.json);
    EXPECT_NE(error.find(c.expected), std::string::npos)
        << c.json << " -> " << error;
  }
  std::string negative = kGoodChain;
  negative.replace(negative.find("24"), 2, "-24");
  EXPECT_NE(
      chain_error(negative).find("stages[0].saved_bytes: expected a "
                                 "non-negative integer, got -24"),
      std::string::npos)
      << chain_error(negative);
  // The selective object: every field required, unknown fields refused.
  std::string selective = kGoodChain;
  const std::string tail = "\"backward_tmp_bytes\": 4";
  selective.replace(
      selective.find(tail),
      tail.size(),
      tail + R"(, "selective": {"saved_bytes": 20, "forward_tmp_bytes": 0,
      "backward_tmp_bytes": 0})");
  EXPECT_NE(
      chain_error(selective).find(
          "stages[0].selective.recompute_ms: missing field"),
      std::string::npos)
      << chain_error(selective);
  selective.replace(
      selective.find("\"backward_tmp_bytes\": 0}"),
      24,
      "\"backward_tmp_bytes\": 0, \"recompute_ms\": 0.5}");
  EXPECT_EQ(chain_error(selective), "") << selective;
  EXPECT_EQ(
      chain_from_json(selective).stage(0).selective,
      (SelectiveCost{20, 0, 0, 0.5}));
}

TEST(PlanJson, RoundTripsAndRejectsBadOps) {
  const Plan plan = plan_from_string("C0 N1 R2 B2 R0 R1 B1 B0");
  EXPECT_EQ(plan_from_json(to_json(plan)), plan);
  for (const auto& [json, expected] :
       std::vector<std::pair<std::string, std::string>>{
           {R"({"ops": [{"kind": "jump", "stage": 0}]})", "ops[0].kind"},
           {R"({"ops": [{"kind": "backward", "stage": -1}]})", "ops[0].stage"},
           {R"({"ops": [{"kind": 3, "stage": 1}]})", "expected a string"},
           {R"({"ops": [{"kind": "backward"}]})", "ops[0].stage: missing"},
           {R"({"op": []})", "op: unknown field"},
           {R"({"ops": [{"kind": "backward", "stage": 0, "stage": 1}]})",
            "ops[0].stage: duplicate field"},
       }) {
    try {
      plan_from_json(json);
      ADD_FAILURE() << json;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos)
          << e.what();
    }
  }
}

// Mutates `text` in place: flips, inserts, deletes or duplicates bytes, or
// splices in a JSON-ish token.
void mutate(std::string& text, std::mt19937_64& rng) {
  static const char* kTokens[] = {
      "{",
      "}",
      "[",
      "]",
      ",",
      ":",
      "\"",
      "-",
      "1e999",
      "null",
      "true",
      "-1",
      "9223372036854775808",
      "0.5",
      "\"stages\"",
      "\\u0000",
      "[[[[",
      "\xff"};
  std::uniform_int_distribution<int> what(0, 4);
  std::uniform_int_distribution<size_t> where(0, text.size());
  const size_t at = where(rng);
  switch (what(rng)) {
    case 0:
      if (at < text.size()) {
        text[at] = static_cast<char>(rng() & 0xff);
      }
      break;
    case 1:
      text.insert(at, 1, static_cast<char>(rng() & 0xff));
      break;
    case 2:
      text.erase(at, std::min<size_t>(text.size() - at, 1 + rng() % 8));
      break;
    case 3:
      text.insert(at, text.substr(at, rng() % 16));
      break;
    default:
      text.insert(at, kTokens[rng() % (sizeof(kTokens) / sizeof(*kTokens))]);
  }
}

TEST(Json, SurvivesARandomMutationCorpus) {
  constexpr uint64_t kSeed = 5150;
  std::mt19937_64 rng(kSeed);
  const std::string chain_json = to_json(testing::random_chain(rng, 6, 1000));
  const std::string plan_json =
      to_json(plan_from_string("C0 N1 R2 B2 R0 R1 B1 B0"));
  int accepted = 0;
  for (int k = 0; k < 6000; ++k) {
    std::string text = k % 2 == 0 ? chain_json : plan_json;
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int n = 0; n < mutations; ++n) {
      mutate(text, rng);
    }
    try {
      if (k % 2 == 0) {
        const Chain chain = chain_from_json(text);
        EXPECT_EQ(chain_from_json(to_json(chain)), chain);
      } else {
        const Plan plan = plan_from_json(text);
        EXPECT_EQ(plan_from_json(to_json(plan)), plan);
      }
      ++accepted;
    } catch (const std::invalid_argument&) {
    } catch (...) {
      ADD_FAILURE() << "seed " << kSeed << ", case " << k
                    << ": an exception other than std::invalid_argument for "
                    << text;
    }
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
// A long non-ASCII value is shortened in the message at a character
// boundary: the message stays valid UTF-8, so it can be dumped as JSON.
TEST(ChainJson, ShortenedValuesInMessagesStayValidUtf8) {
  std::string value = "\"";
  for (int k = 0; k < 40; ++k) {
    value += "\xc3\xa9";  // U+00E9, two bytes
  }
  value += "\"";
  const std::string doc =
      R"({"input_bytes": 1, "stages": [{"forward_ms": )" + value +
      R"(, "backward_ms": 1, "output_bytes": 1, "saved_bytes": 1,
         "forward_tmp_bytes": 0, "backward_tmp_bytes": 0}]})";
  try {
    remat::planner::chain_from_json(doc);
    FAIL() << "accepted a string time";
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("stages[0].forward_ms"), std::string::npos);
    // nlohmann refuses to dump invalid UTF-8 (type_error 316).
    std::string dumped;
    EXPECT_NO_THROW(dumped = nlohmann::json(message).dump()) << message;
  }
}

}  // namespace remat::planner
