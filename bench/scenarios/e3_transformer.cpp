// e3_transformer.cpp — scenario E3: a transformer with no, full, attention-core
// and selective recomputation.
//
// Model: the built-in GPT (models::gpt) at 4 layers, hidden 384, 6 heads,
// sequence 512, batch 4, dropout 0.1, explicit attention (the
// [batch, heads, seq, seq] scores and probabilities exist). Configurations are
// the transformer recipes of models::GptRecompute, run in one interleaved
// Runner run with the plain model as the baseline: full (each block
// checkpointed), attention (each attention core checkpointed), selective
// (each block checkpointed under policies::save_compute_intensive()).
// Loss: the next-token cross-entropy against random targets. Every
// configuration's gradients are gated bitwise against the plain run.
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/scenario.h"
#include "models/gpt.h"
#include "python_peer.h"
#include "remat/offload.h"

#ifndef REMAT_E3_SCRIPT
#error "REMAT_E3_SCRIPT must name bench/pytorch/e3_pytorch.py"
#endif
#ifndef REMAT_BENCH_METER
#error "REMAT_BENCH_METER must name the built libremat_meter.so"
#endif

namespace remat::bench {
namespace {

struct E3Options {
  int64_t layers = 4;
  int64_t hidden = 384;
  int64_t heads = 6;
  int64_t seq = 512;
  int64_t batch = 4;
  double dropout = 0.1;
  bool no_pytorch = false;                  // true: the remat side only
  std::string python = "/usr/bin/python3";  // the PyTorch side's interpreter
  std::string script = REMAT_E3_SCRIPT;     // e3_pytorch.py
  std::string meter = REMAT_BENCH_METER;    // libremat_meter.so
  int reply_timeout_s = 600;                // longest wait for one reply
};

/// PyTorch's own recipes on the same GPT, by e3_pytorch.py's names.
struct PytorchSide {
  std::map<std::string, Measurement> by_kind;  // empty: not measured
  bool memory_measured = false;
  std::string about;  // what ran, or why not
};

/// Runs e3_pytorch.py's recipes interleaved, warm-up and timed rounds as the
/// Runner's, after the remat side (the two processes never run at once).
PytorchSide run_pytorch(
    const E3Options& options,
    const Context& context,
    const models::GptOptions& gpt,
    int64_t batch) {
  PytorchSide side;
  if (options.no_pytorch) {
    side.about = "PyTorch side left out (--no-pytorch).";
    return side;
  }
  if (context.device != "cpu") {
    side.about = "PyTorch side not run: it runs on the CPU only.";
    return side;
  }
  const std::string log =
      (std::filesystem::temp_directory_path() / "remat_bench_e3_pytorch.log")
          .string();
  PythonPeer peer(
      {options.python, options.script,
       "--meter",      options.meter,
       "--threads",    std::to_string(context.threads),
       "--vocab",      std::to_string(gpt.vocab()),
       "--layers",     std::to_string(gpt.layers()),
       "--hidden",     std::to_string(gpt.hidden()),
       "--heads",      std::to_string(gpt.heads()),
       "--seq",        std::to_string(gpt.seq_len()),
       "--batch",      std::to_string(batch),
       "--dropout",    std::to_string(gpt.dropout())},
      log,
      options.reply_timeout_s);
  if (!peer.available()) {
    side.about = "PyTorch side unavailable: " + peer.why_unavailable();
    return side;
  }
  const nlohmann::json& greeting = peer.greeting();
  const auto kinds = greeting.value("kinds", std::vector<std::string>{});
  std::ostringstream about;
  about << "PyTorch side: torch " << greeting.value("torch", std::string("?"))
        << " (bench/pytorch/e3_pytorch.py, Python "
        << greeting.value("python", std::string("?")) << ", "
        << greeting.value("threads", 0) << " threads; memory meter: "
        << greeting.value("meter", std::string("?"))
        << "), the same GPT with its own seeded weights, recipes against its "
           "own `none`: `full` is checkpoint(block, use_reentrant=False) per "
           "block, `attention core` checkpoint(core, use_reentrant=False), "
           "`selective` checkpoint with "
           "create_selective_checkpoint_contexts (aten.mm, aten.bmm, "
           "aten.addmm MUST_SAVE, the rest PREFER_RECOMPUTE).";
  const nlohmann::json missing =
      greeting.value("missing", nlohmann::json::object());
  for (const auto& [kind, why] : missing.items()) {
    about << " Not measured: `" << kind << "`, " << why.get<std::string>()
          << ".";
  }
  const int total_rounds = context.warmup + context.rounds;
  for (int round = 0; round < total_rounds; ++round) {
    for (const std::string& kind : kinds) {
      const auto reply = peer.request(
          {{"cmd", "step"}, {"kind", kind}, {"seed", 1000 + round}},
          options.reply_timeout_s);
      if (!reply || reply->contains("error")) {
        side.by_kind.clear();
        side.about =
            "PyTorch side failed on `" + kind + "`: " +
            (reply ? reply->at("error").dump() : peer.why_unavailable());
        return side;
      }
      if (round < context.warmup) {
        continue;
      }
      Measurement& measured = side.by_kind[kind];
      measured.name = kind;
      const double forward_ms = reply->at("forward_ms").get<double>();
      const double backward_ms = reply->at("backward_ms").get<double>();
      measured.forward_ms.push_back(forward_ms);
      measured.backward_ms.push_back(backward_ms);
      measured.step_ms.push_back(forward_ms + backward_ms);
      if (!reply->at("peak_bytes").is_null()) {
        side.memory_measured = true;
        measured.peak_bytes = std::max(
            measured.peak_bytes, reply->at("peak_bytes").get<int64_t>());
      }
    }
  }
  side.about = about.str();
  return side;
}

Section run_e3(const E3Options& options, const Context& context) {
  const bool quick = context.quick;
  const auto gpt_options = models::GptOptions()
                               .layers(quick ? 2 : options.layers)
                               .hidden(quick ? 64 : options.hidden)
                               .heads(quick ? 2 : options.heads)
                               .seq_len(quick ? 64 : options.seq)
                               .dropout(options.dropout);
  const int64_t batch = quick ? 2 : options.batch;
  torch::manual_seed(5);
  torch::nn::Sequential model = models::gpt(gpt_options);
  const torch::Device device = context.torch_device();
  model->to(device);
  model->train();
  const auto tokens = torch::randint(
      gpt_options.vocab(),
      {batch, gpt_options.seq_len()},
      torch::TensorOptions().dtype(torch::kLong).device(device));
  const auto targets = torch::randint(
      gpt_options.vocab(),
      {batch, gpt_options.seq_len()},
      torch::TensorOptions().dtype(torch::kLong).device(device));

  struct Recipe {
    std::string name;
    models::GptRecompute recompute;
    Policy policy;               // kSelective only
    bool spill_to_file = false;  // the forward under a SaveToFile guard
    std::string pytorch_kind;    // e3_pytorch.py's counterpart; "": none
  };
  const std::vector<Recipe> recipes = {
      {"none", models::GptRecompute::kNone, {}, false, "none"},
      {"full (per block)", models::GptRecompute::kFull, {}, false, "full"},
      {"attention core",
       models::GptRecompute::kAttention,
       {},
       false,
       "attention"},
      {"selective: save_compute_intensive()",
       models::GptRecompute::kSelective,
       policies::save_compute_intensive(),
       false,
       "sac"},
      // The projections kept, the attention products (s x s) recomputed.
      {"selective: projections only",
       models::GptRecompute::kSelective,
       policies::combine(
           {policies::recompute_ops({"aten::bmm", "aten::baddbmm"}),
            policies::save_compute_intensive()}),
       false,
       ""},
      // No recomputation: the saved tensors go to a file until backward.
      {"none, saved tensors to a file (SaveToFile)",
       models::GptRecompute::kNone,
       {},
       true,
       ""},
  };
  std::vector<Configuration> configurations;
  for (const Recipe& recipe : recipes) {
    configurations.push_back(
        {recipe.name, [model, recipe](const torch::Tensor& x) mutable {
           models::set_recompute(model, recipe.recompute, recipe.policy);
           std::optional<SaveToFile> spill;
           if (recipe.spill_to_file) {
             spill.emplace();
           }
           return model->forward(x);
         }});
  }
  Runner runner(
      {model.get(),
       tokens,
       [targets](const torch::Tensor& logits) {
         return models::gpt_loss(logits, targets);
       }},
      context.runner_options());
  const RunResult result = runner.run(configurations);
  models::set_recompute(model, models::GptRecompute::kNone);
  const Measurement& baseline = result.baseline();
  const PytorchSide pytorch = run_pytorch(options, context, gpt_options, batch);
  const auto pytorch_none = pytorch.by_kind.find("none");

  Table table;
  table.name = "recipes";
  table.columns = {"recompute", "activation peak", "memory ratio"};
  for (const std::string& column : step_time_columns()) {
    table.columns.push_back(column);
  }
  table.columns.push_back("max grad diff");
  table.columns.push_back("PyTorch activation peak");
  table.columns.push_back("PyTorch memory ratio");
  table.columns.push_back("PyTorch time ratio [95% CI]");
  // remat's peak minus PyTorch's, in bytes, per recipe both sides run: the
  // ratios divide by each side's own `none`, whose peaks differ too.
  std::ostringstream differences;
  for (size_t r = 0; r < result.configurations.size(); ++r) {
    const Measurement& measured = result.configurations[r];
    std::vector<Cell> row{
        Cell::text(measured.name),
        Cell::bytes(measured.peak_bytes),
        Cell::ratio(
            static_cast<double>(measured.peak_bytes) /
            static_cast<double>(baseline.peak_bytes))};
    for (Cell& cell : step_time_cells(measured, baseline)) {
      row.push_back(std::move(cell));
    }
    row.push_back(Cell::number(measured.max_grad_diff, 0));
    const auto counterpart = pytorch.by_kind.find(recipes[r].pytorch_kind);
    if (counterpart != pytorch.by_kind.end() &&
        pytorch_none != pytorch.by_kind.end()) {
      const Measurement& theirs = counterpart->second;
      const Measurement& their_none = pytorch_none->second;
      if (pytorch.memory_measured) {
        row.push_back(Cell::bytes(theirs.peak_bytes));
        row.push_back(Cell::ratio(
            static_cast<double>(theirs.peak_bytes) /
            static_cast<double>(their_none.peak_bytes)));
        differences << (differences.tellp() > 0 ? "; " : "") << measured.name
                    << " " << (measured.peak_bytes - theirs.peak_bytes);
      } else {
        row.push_back(Cell::empty());
        row.push_back(Cell::empty());
      }
      row.push_back(paired_ratio_cell(theirs.step_ms, their_none.step_ms));
    } else {
      row.push_back(Cell::empty());
      row.push_back(Cell::empty());
      row.push_back(Cell::empty());
    }
    table.add_row(std::move(row));
  }

  Section section;
  section.title =
      "E3 — transformer: none, full, attention-core, selective, offload to a "
      "file";
  std::ostringstream about;
  about << "Model: the built-in GPT, " << gpt_options.layers() << " layers, "
        << "hidden " << gpt_options.hidden() << ", " << gpt_options.heads()
        << " heads, sequence " << gpt_options.seq_len() << ", batch " << batch
        << ", dropout " << gpt_options.dropout()
        << ", explicit attention (the scores and probabilities exist), fp32; "
           "loss: next-token cross-entropy against random targets. "
           "`full`: each block in `remat::checkpoint`; `attention core`: "
           "only each block's attention core (scores, mask, softmax, "
           "dropout, weighted sum) checkpointed; `selective`: each block "
           "checkpointed under a per-op policy, "
           "`policies::save_compute_intensive()` (the outputs of linear, "
           "mm, addmm and bmm kept, the rest recomputed) or the same with "
           "the attention's batched products recomputed "
           "(`combine({recompute_ops({\"aten::bmm\", \"aten::baddbmm\"}), "
           "save_compute_intensive()})`: only the projections kept); "
           "`SaveToFile`: no recomputation, the forward under a "
           "`remat::SaveToFile` guard (default options: saved tensors of "
           "64 KiB or more written to a file in $TMPDIR or /var/tmp, read "
           "back during backward, 2 ahead). Ratios "
           "against `none` in the same interleaved run; "
           "gradients of every configuration bitwise equal to `none`'s "
           "(gate).";
  section.add_text(about.str());
  section.add_table(std::move(table));
  std::ostringstream note;
  note << "Baseline step " << Cell::ms(baseline.step().median).markdown()
       << " ms interleaved, "
       << Cell::ms(result.baseline_rerun.step().median).markdown()
       << " ms re-run alone at the end.";
  if (pytorch_none != pytorch.by_kind.end()) {
    note << " PyTorch `none`: activation peak "
         << Cell::bytes(pytorch_none->second.peak_bytes).markdown() << ", step "
         << Cell::ms(pytorch_none->second.step().median).markdown() << " ms.";
  }
  if (differences.tellp() > 0) {
    note << " remat's activation peak minus PyTorch's, in bytes (the same "
            "model, each process's own meter): "
         << differences.str() << ".";
  }
  section.add_text(note.str());
  section.add_text(pytorch.about);
  return section;
}

}  // namespace

const bool kE3Registered = register_scenario(
    {"E3",
     "transformer: no, full, attention-core and selective recomputation; "
     "offload to a file",
     30,
     [](CLI::App& command) -> ScenarioRun {
       auto options = std::make_shared<E3Options>();
       command.add_option("--layers", options->layers, "Transformer blocks")
           ->capture_default_str();
       command.add_option("--hidden", options->hidden, "Model width")
           ->capture_default_str();
       command.add_option("--heads", options->heads, "Attention heads")
           ->capture_default_str();
       command.add_option("--seq", options->seq, "Sequence length")
           ->capture_default_str();
       command.add_option("--batch", options->batch, "Sequences per batch")
           ->capture_default_str();
       command.add_option("--dropout", options->dropout, "Dropout probability")
           ->capture_default_str();
       command.add_flag(
           "--no-pytorch", options->no_pytorch, "measure the remat side only");
       command
           .add_option(
               "--python", options->python, "the PyTorch side's interpreter")
           ->capture_default_str();
       command.add_option("--script", options->script, "e3_pytorch.py")
           ->capture_default_str();
       command.add_option("--meter", options->meter, "libremat_meter.so")
           ->capture_default_str();
       return [options](const Context& context) {
         return run_e3(*options, context);
       };
     }});

}  // namespace remat::bench
