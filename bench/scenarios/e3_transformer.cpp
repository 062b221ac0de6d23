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
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "harness/scenario.h"
#include "models/gpt.h"
#include "remat/offload.h"

namespace remat::bench {
namespace {

struct E3Options {
  int64_t layers = 4;
  int64_t hidden = 384;
  int64_t heads = 6;
  int64_t seq = 512;
  int64_t batch = 4;
  double dropout = 0.1;
};

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
    Policy policy;            // kSelective only
    bool spill_to_file = false;  // the forward under a SaveToFile guard
  };
  const std::vector<Recipe> recipes = {
      {"none", models::GptRecompute::kNone, {}},
      {"full (per block)", models::GptRecompute::kFull, {}},
      {"attention core", models::GptRecompute::kAttention, {}},
      {"selective: save_compute_intensive()",
       models::GptRecompute::kSelective,
       policies::save_compute_intensive()},
      // The projections kept, the attention products (s x s) recomputed.
      {"selective: projections only",
       models::GptRecompute::kSelective,
       policies::combine(
           {policies::recompute_ops({"aten::bmm", "aten::baddbmm"}),
            policies::save_compute_intensive()})},
      // No recomputation: the saved tensors go to a file until backward.
      {"none, saved tensors to a file (SaveToFile)",
       models::GptRecompute::kNone,
       {},
       true},
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

  Table table;
  table.name = "recipes";
  table.columns = {"recompute", "activation peak", "memory ratio"};
  for (const std::string& column : step_time_columns()) {
    table.columns.push_back(column);
  }
  table.columns.push_back("max grad diff");
  for (const Measurement& measured : result.configurations) {
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
  section.add_text(note.str());
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
       return [options](const Context& context) {
         return run_e3(*options, context);
       };
     }});

}  // namespace remat::bench
