// JSON for Chain and Plan (format in remat/planner/json.h), on nlohmann-json.
//
// Readers are strict: every field required, unknown or repeated fields
// rejected, integers must be JSON integers that fit int64. Every failure is a
// std::invalid_argument naming the JSON path ("stages[2].saved_bytes") and the
// bad value; nlohmann exceptions never escape. Nesting deeper than
// kMaxDepth is rejected before parsing, so hostile input cannot exhaust the
// stack of the recursive parser.
#include "remat/planner/json.h"

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace remat::planner {
namespace {

using nlohmann::json;

constexpr int kMaxDepth = 64;
constexpr size_t kMaxShownValue = 60;

// Finds the first key that appears twice in one object while the parser
// runs (nlohmann keeps the last one silently), with its JSON path. Fed every
// parse event; answers true (keep the value) throughout.
class DuplicateKeys {
 public:
  bool see(json::parse_event_t event, const json& parsed) {
    using Event = json::parse_event_t;
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        count_element();
        levels_.push_back({event == Event::array_start, 0, {}, {}});
        break;
      case Event::object_end:
      case Event::array_end:
        if (!levels_.empty()) {
          levels_.pop_back();
        }
        break;
      case Event::key:
        if (!levels_.empty() && !found_) {
          Level& level = levels_.back();
          level.key = parsed.get<std::string>();
          if (!level.keys.insert(level.key).second) {
            found_ = true;
            path_ = current_path();
          }
        }
        break;
      case Event::value:
        count_element();
        break;
    }
    return true;
  }
  bool found() const {
    return found_;
  }
  /// The duplicate's path, "stages[2].saved_bytes" style.
  const std::string& path() const {
    return path_;
  }

 private:
  struct Level {
    bool array;
    int64_t elements;            // arrays: elements started so far
    std::string key;             // objects: the key being read
    std::set<std::string> keys;  // objects: keys seen
  };
  void count_element() {
    if (!levels_.empty() && levels_.back().array) {
      ++levels_.back().elements;
    }
  }
  std::string current_path() const {
    std::string path;
    for (const Level& level : levels_) {
      if (level.array) {
        path += "[" + std::to_string(level.elements - 1) + "]";
      } else {
        path += (path.empty() ? "" : ".") + level.key;
      }
    }
    return path;
  }
  std::vector<Level> levels_;
  bool found_ = false;
  std::string path_;
};

class JsonReader {
 public:
  explicit JsonReader(const char* function) : function_(function) {}

  [[noreturn]] void fail(
      const std::string& path, const std::string& what) const {
    throw std::invalid_argument(
        std::string("remat::planner::") + function_ + ": " +
        (path.empty() ? std::string("document") : path) + ": " + what);
  }

  static std::string shown(const json& value) {
    std::string text = value.dump();
    if (text.size() > kMaxShownValue) {
      // Cut at a character boundary: never inside a UTF-8 sequence, so the
      // message stays valid UTF-8 (and can itself be put into JSON).
      size_t cut = kMaxShownValue;
      while (cut > 0 &&
             (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) {
        --cut;
      }
      text = text.substr(0, cut) + "...";
    }
    return text;
  }

  json parse(std::string_view text) const {
    check_depth(text);
    DuplicateKeys duplicates;
    json value;
    try {
      value = json::parse(
          text.begin(),
          text.end(),
          [&duplicates](int, json::parse_event_t event, json& parsed) {
            return duplicates.see(event, parsed);
          });
    } catch (const json::exception& e) {
      fail("", std::string("malformed JSON: ") + e.what());
    }
    if (duplicates.found()) {
      fail(duplicates.path(), "duplicate field (each field may appear once)");
    }
    return value;
  }

  // REQUIRES: `object` is a JSON object. Fails on keys outside `known`.
  void check_keys(
      const json& object,
      const std::string& path,
      const std::set<std::string>& known) const {
    for (auto it = object.begin(); it != object.end(); ++it) {
      if (known.count(it.key()) == 0) {
        fail(join(path, it.key()), "unknown field");
      }
    }
  }

  const json& object(const json& value, const std::string& path) const {
    if (!value.is_object()) {
      fail(path, "expected an object, got " + shown(value));
    }
    return value;
  }

  const json& field(
      const json& object,
      const std::string& path,
      const std::string& key) const {
    auto it = object.find(key);
    if (it == object.end()) {
      fail(join(path, key), "missing field");
    }
    return *it;
  }

  const json& array(const json& value, const std::string& path) const {
    if (!value.is_array()) {
      fail(path, "expected an array, got " + shown(value));
    }
    return value;
  }

  int64_t non_negative_integer(
      const json& value, const std::string& path) const {
    const std::string expected = "expected a non-negative integer, got ";
    if (value.is_number_unsigned()) {
      const uint64_t v = value.get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail(path, expected + shown(value) + " (does not fit int64)");
      }
      return static_cast<int64_t>(v);
    }
    if (!value.is_number_integer() || value.get<int64_t>() < 0) {
      fail(path, expected + shown(value));
    }
    return value.get<int64_t>();
  }

  int64_t integer(const json& value, const std::string& path) const {
    if (value.is_number_unsigned()) {
      return non_negative_integer(value, path);
    }
    if (!value.is_number_integer()) {
      fail(path, "expected an integer, got " + shown(value));
    }
    return value.get<int64_t>();
  }

  double non_negative_number(const json& value, const std::string& path) const {
    if (!value.is_number() || !(value.get<double>() >= 0)) {
      fail(path, "expected a non-negative number, got " + shown(value));
    }
    return value.get<double>();
  }

  std::string string(const json& value, const std::string& path) const {
    if (!value.is_string()) {
      fail(path, "expected a string, got " + shown(value));
    }
    return value.get<std::string>();
  }

  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  static std::string item(const std::string& path, size_t index) {
    return path + "[" + std::to_string(index) + "]";
  }

 private:
  void check_depth(std::string_view text) const {
    int depth = 0;
    bool in_string = false;
    bool escaped = false;
    for (size_t k = 0; k < text.size(); ++k) {
      const char c = text[k];
      if (in_string) {
        if (escaped) {
          escaped = false;
        } else if (c == '\\') {
          escaped = true;
        } else if (c == '"') {
          in_string = false;
        }
      } else if (c == '"') {
        in_string = true;
      } else if (c == '[' || c == '{') {
        if (++depth > kMaxDepth) {
          fail(
              "",
              "malformed JSON: nesting deeper than " +
                  std::to_string(kMaxDepth) + " at byte " + std::to_string(k));
        }
      } else if (c == ']' || c == '}') {
        --depth;
      }
    }
  }

  const char* function_;
};

template <typename Read>
auto guarded(const char* function, Read read) {
  try {
    return read(JsonReader(function));
  } catch (const json::exception& e) {
    // Unreachable by construction; kept so no library exception escapes.
    throw std::invalid_argument(
        std::string("remat::planner::") + function + ": " + e.what());
  }
}

constexpr OpKind kOpKinds[] = {
    OpKind::kForwardNoSave,
    OpKind::kForwardCheckpoint,
    OpKind::kForwardRecord,
    OpKind::kForwardSelective,
    OpKind::kBackward};

// The chain's "model_state" object (every field required).
ModelState read_model_state(const JsonReader& r, const json& value) {
  const std::string path = "model_state";
  const json& object = r.object(value, path);
  r.check_keys(
      object, path, {"parameter_bytes", "gradient_bytes", "optimizer_bytes"});
  const auto bytes = [&](const char* key) {
    return r.non_negative_integer(
        r.field(object, path, key), JsonReader::join(path, key));
  };
  ModelState state;
  state.parameter_bytes = bytes("parameter_bytes");
  state.gradient_bytes = bytes("gradient_bytes");
  state.optimizer_bytes = bytes("optimizer_bytes");
  return state;
}

// The "selective" object of stage `path` (every field required).
SelectiveCost read_selective(
    const JsonReader& r, const json& value, const std::string& stage_path) {
  const std::string path = JsonReader::join(stage_path, "selective");
  const json& object = r.object(value, path);
  r.check_keys(
      object,
      path,
      {"saved_bytes",
       "forward_tmp_bytes",
       "backward_tmp_bytes",
       "recompute_ms"});
  const auto at = [&](const char* key) -> const json& {
    return r.field(object, path, key);
  };
  const auto key_path = [&](const char* key) {
    return JsonReader::join(path, key);
  };
  SelectiveCost cost;
  cost.saved_bytes =
      r.non_negative_integer(at("saved_bytes"), key_path("saved_bytes"));
  cost.forward_tmp_bytes = r.non_negative_integer(
      at("forward_tmp_bytes"), key_path("forward_tmp_bytes"));
  cost.backward_tmp_bytes = r.integer(
      at("backward_tmp_bytes"), key_path("backward_tmp_bytes"));  // may be < 0
  cost.recompute_ms =
      r.non_negative_number(at("recompute_ms"), key_path("recompute_ms"));
  return cost;
}

json stage_json(const StageCost& s) {
  json stage{
      {"forward_ms", s.forward_ms},
      {"backward_ms", s.backward_ms},
      {"output_bytes", s.output_bytes},
      {"saved_bytes", s.saved_bytes},
      {"forward_tmp_bytes", s.forward_tmp_bytes},
      {"backward_tmp_bytes", s.backward_tmp_bytes}};
  if (s.record_tmp_bytes) {
    stage["record_tmp_bytes"] = *s.record_tmp_bytes;
  }
  if (s.gathered_bytes != 0) {
    stage["gathered_bytes"] = s.gathered_bytes;
  }
  if (s.selective) {
    stage["selective"] = json{
        {"saved_bytes", s.selective->saved_bytes},
        {"forward_tmp_bytes", s.selective->forward_tmp_bytes},
        {"backward_tmp_bytes", s.selective->backward_tmp_bytes},
        {"recompute_ms", s.selective->recompute_ms}};
  }
  return stage;
}

// What chains and graphs share beside their stages: the model state and
// the cold-write cost, each written only when not the default.
void add_step_costs(
    json& doc, const ModelState& state, double cold_write_ms_per_mib) {
  if (state != ModelState{}) {
    doc["model_state"] = {
        {"parameter_bytes", state.parameter_bytes},
        {"gradient_bytes", state.gradient_bytes},
        {"optimizer_bytes", state.optimizer_bytes}};
  }
  if (cold_write_ms_per_mib != 0) {
    doc["cold_write_ms_per_mib"] = cold_write_ms_per_mib;
  }
}

double read_cold_write_ms_per_mib(const JsonReader& r, const json& doc) {
  return doc.contains("cold_write_ms_per_mib")
             ? r.non_negative_number(
                   doc["cold_write_ms_per_mib"], "cold_write_ms_per_mib")
             : 0.0;
}

// The costs of the stage object `stage` at `path`; `extra` names a field
// the caller reads besides the costs (a graph stage's "inputs"), or is null.
StageCost read_stage(
    const JsonReader& r,
    const json& stage,
    const std::string& path,
    const char* extra) {
  std::set<std::string> known{
      "forward_ms",
      "backward_ms",
      "output_bytes",
      "saved_bytes",
      "forward_tmp_bytes",
      "backward_tmp_bytes",
      "record_tmp_bytes",
      "gathered_bytes",
      "selective"};
  if (extra != nullptr) {
    known.insert(extra);
  }
  r.check_keys(stage, path, known);
  auto ms = [&](const char* key) {
    return r.non_negative_number(
        r.field(stage, path, key), JsonReader::join(path, key));
  };
  auto bytes = [&](const char* key) {
    return r.non_negative_integer(
        r.field(stage, path, key), JsonReader::join(path, key));
  };
  StageCost cost;
  cost.forward_ms = ms("forward_ms");
  cost.backward_ms = ms("backward_ms");
  cost.output_bytes = bytes("output_bytes");
  cost.saved_bytes = bytes("saved_bytes");
  cost.forward_tmp_bytes = bytes("forward_tmp_bytes");
  cost.backward_tmp_bytes = r.integer(
      r.field(stage, path, "backward_tmp_bytes"),
      JsonReader::join(path, "backward_tmp_bytes"));  // may be < 0
  if (stage.contains("record_tmp_bytes")) {
    cost.record_tmp_bytes = bytes("record_tmp_bytes");
  }
  if (stage.contains("gathered_bytes")) {
    cost.gathered_bytes = bytes("gathered_bytes");
  }
  if (stage.contains("selective")) {
    cost.selective = read_selective(r, stage["selective"], path);
  }
  return cost;
}

}  // namespace

std::string to_json(const Chain& chain) {
  json stages = json::array();
  for (const StageCost& s : chain.stages()) {
    stages.push_back(stage_json(s));
  }
  json doc{{"input_bytes", chain.input_bytes()}, {"stages", stages}};
  if (chain.resident_bytes() != 0) {
    doc["resident_bytes"] = chain.resident_bytes();
  }
  add_step_costs(doc, chain.model_state(), chain.cold_write_ms_per_mib());
  return doc.dump();
}

std::string to_json(const Graph& graph) {
  json stages = json::array();
  for (int64_t i = 0; i < graph.size(); ++i) {
    json stage = stage_json(graph.stage(i));
    stage["inputs"] = graph.inputs(i);
    stages.push_back(std::move(stage));
  }
  json doc{{"input_bytes", graph.input_bytes()}, {"stages", stages}};
  add_step_costs(doc, graph.model_state(), graph.cold_write_ms_per_mib());
  return doc.dump();
}

Chain chain_from_json(std::string_view text) {
  return guarded("chain_from_json", [&](const JsonReader& r) {
    const json doc = r.parse(text);
    r.object(doc, "");
    r.check_keys(
        doc,
        "",
        {"input_bytes",
         "resident_bytes",
         "model_state",
         "cold_write_ms_per_mib",
         "stages"});
    const int64_t input_bytes =
        r.non_negative_integer(r.field(doc, "", "input_bytes"), "input_bytes");
    const int64_t resident_bytes =
        doc.contains("resident_bytes")
            ? r.non_negative_integer(doc["resident_bytes"], "resident_bytes")
            : 0;
    const ModelState model_state = doc.contains("model_state")
                                       ? read_model_state(r, doc["model_state"])
                                       : ModelState{};
    const double cold_write = read_cold_write_ms_per_mib(r, doc);
    const json& stages = r.array(r.field(doc, "", "stages"), "stages");
    std::vector<StageCost> costs;
    for (size_t k = 0; k < stages.size(); ++k) {
      const std::string path = JsonReader::item("stages", k);
      costs.push_back(
          read_stage(r, r.object(stages[k], path), path, /*extra=*/nullptr));
    }
    try {
      return Chain(std::move(costs), input_bytes, resident_bytes, model_state)
          .with_cold_write_ms_per_mib(cold_write);
    } catch (const std::invalid_argument& e) {
      r.fail("", e.what());
    }
  });
}

Graph graph_from_json(std::string_view text) {
  return guarded("graph_from_json", [&](const JsonReader& r) {
    const json doc = r.parse(text);
    r.object(doc, "");
    r.check_keys(
        doc,
        "",
        {"input_bytes", "model_state", "cold_write_ms_per_mib", "stages"});
    const int64_t input_bytes =
        r.non_negative_integer(r.field(doc, "", "input_bytes"), "input_bytes");
    const ModelState model_state = doc.contains("model_state")
                                       ? read_model_state(r, doc["model_state"])
                                       : ModelState{};
    const double cold_write = read_cold_write_ms_per_mib(r, doc);
    const json& stages = r.array(r.field(doc, "", "stages"), "stages");
    std::vector<StageCost> costs;
    std::vector<std::vector<int64_t>> inputs;
    for (size_t k = 0; k < stages.size(); ++k) {
      const std::string path = JsonReader::item("stages", k);
      const json& stage = r.object(stages[k], path);
      costs.push_back(read_stage(r, stage, path, "inputs"));
      const std::string inputs_path = JsonReader::join(path, "inputs");
      const json& list = r.array(r.field(stage, path, "inputs"), inputs_path);
      inputs.emplace_back();
      for (size_t j = 0; j < list.size(); ++j) {
        inputs.back().push_back(
            r.integer(list[j], JsonReader::item(inputs_path, j)));
      }
    }
    try {
      return Graph(
                 std::move(costs), std::move(inputs), input_bytes, model_state)
          .with_cold_write_ms_per_mib(cold_write);
    } catch (const std::invalid_argument& e) {
      r.fail("", e.what());
    }
  });
}

std::string to_json(const Plan& plan) {
  json ops = json::array();
  for (const Op& op : plan.ops) {
    ops.push_back(json{{"kind", op_kind_name(op.kind)}, {"stage", op.stage}});
  }
  return json{{"ops", ops}}.dump();
}

Plan plan_from_json(std::string_view text) {
  return guarded("plan_from_json", [&](const JsonReader& r) {
    const json doc = r.parse(text);
    r.object(doc, "");
    r.check_keys(doc, "", {"ops"});
    const json& ops = r.array(r.field(doc, "", "ops"), "ops");
    Plan plan;
    for (size_t k = 0; k < ops.size(); ++k) {
      const std::string path = JsonReader::item("ops", k);
      const json& entry = r.object(ops[k], path);
      r.check_keys(entry, path, {"kind", "stage"});
      const std::string kind_path = JsonReader::join(path, "kind");
      const std::string kind =
          r.string(r.field(entry, path, "kind"), kind_path);
      Op op;
      bool known = false;
      for (OpKind candidate : kOpKinds) {
        if (kind == op_kind_name(candidate)) {
          op.kind = candidate;
          known = true;
        }
      }
      if (!known) {
        r.fail(
            kind_path,
            "expected one of forward_no_save, forward_checkpoint, "
            "forward_record, forward_selective, backward, got " +
                JsonReader::shown(r.field(entry, path, "kind")));
      }
      op.stage = r.non_negative_integer(
          r.field(entry, path, "stage"), JsonReader::join(path, "stage"));
      plan.ops.push_back(op);
    }
    return plan;
  });
}

}  // namespace remat::planner
