// fit.cpp: `remat fit`: the largest batch, or sequence length, of a built-in
// model that trains under a memory cap, with no checkpointing, the best
// checkpoint_sequential and the optimal plan (remat::fit_batch,
// remat::fit_size), each confirmed by a measured step.
//
// --over batch: the chain is the workload's model; inputs of batch b come
// from a workload made with the same flags and seed but --batch b (the same
// kind of data). --over seq-len (gpt only): the model has positions up to
// --max-seq-len (no length above it is profiled: remat::fit_profile_sizes);
// at length n its stages are models::gpt_stages with the causal mask of n,
// and the input comes from a workload with --seq n, at the fixed --batch.
// --over image (unet2d, unet3d): the U-Net's training graph (its stages and
// the loss, workload.h) at image edges that are multiples of 2^levels:
// fit_size on the graph over the multiple k (edge = k 2^levels), the
// quadratic model (2D memory grows with k^2; 3D's k^3 is what the checks
// correct), probed at k = 1, 2, 4 (within --max-image); the strategies none,
// per-block and optimal. The report's header names the sizes profiled.
#include <algorithm>
#include <iomanip>
#include <optional>
#include <sstream>

#include <models/gpt.h>
#include <models/segmentation_data.h>
#include <remat/fit.h>
#include <remat/planner/units.h>
#include <nlohmann/json.hpp>

#include "cli_error.h"
#include "commands.h"
#include "runtime.h"

namespace remat::cli {
namespace {

/// The model state of a total cap: what the profile predicts (and the cap
/// leaves the activations after it) and what a copy of the model measures.
struct CapState {
  planner::ModelState predicted;
  planner::ModelState measured;
};

/// The answers of `options`, and the workload whose model was fitted.
struct Fitted {
  std::vector<FitAnswer> answers;
  std::string description;
  /// With a total cap: the model state it includes.
  std::optional<CapState> state;
  /// The sizes profiled for the cost model (remat::fit_profile_sizes), in
  /// the units of FitAnswer::size (a batch, a length, an edge).
  std::vector<int64_t> profiled_sizes;
};

/// The activation cap (activations + input, fit_batch's units) of `cap`
/// for `model`: the bytes, or a total less the predicted model state, which
/// `state` then receives (with the measured one).
int64_t activation_cap(
    const FitCommandOptions& options,
    const Budget& cap,
    const torch::nn::Sequential& model,
    std::optional<CapState>& state) {
  if (!cap.is_total()) {
    return cap.budget_bytes();
  }
  const OptimizerChoice optimizer{options.optimizer, 1e-3};
  state = CapState{
      model_state_of(stages_of(model), optimizer.state_ratio()),
      measure_model_state(model, optimizer)};
  const int64_t left = cap.budget_bytes() - state->predicted.total_bytes();
  if (left <= 0) {
    throw UsageError(
        "--cap " + options.cap + ": the model state alone is " +
        planner::format_bytes(state->predicted.total_bytes()) +
        " (parameters and buffers " +
        planner::format_bytes(state->predicted.parameter_bytes) +
        ", gradients " +
        planner::format_bytes(state->predicted.gradient_bytes) + ", " +
        options.optimizer + " state " +
        planner::format_bytes(state->predicted.optimizer_bytes) +
        "): nothing is left for activations");
  }
  return left;
}

Fitted fit_over_batch(const FitCommandOptions& options, const Budget& cap) {
  if (options.max_batch < options.probe_batch) {
    throw UsageError(
        "--max-batch: expected at least --probe-batch (" +
        std::to_string(options.probe_batch) + "), got " +
        std::to_string(options.max_batch));
  }
  Workload workload(options.model, options.seed);
  auto make_input = [&](int64_t batch) {
    ModelFlags flags = options.model;
    flags.batch = batch;
    return Workload(flags, options.seed).next_batch().inputs;
  };
  std::optional<CapState> state;
  const int64_t cap_bytes =
      activation_cap(options, cap, workload.model(), state);
  return {
      fit_batch(
          make_input,
          stages_of(workload.model()),
          cap_bytes,
          FitOptions()
              .probe_batch(options.probe_batch)
              .max_batch(options.max_batch)
              .max_time_ratio(options.max_time_ratio)),
      workload.description(),
      state,
      fit_profile_sizes(FitSizeOptions()
                            .probe_size(options.probe_batch)
                            .max_size(options.max_batch)
                            .size_model(SizeModel::kAffine))};
}

/// The largest edge --over image considers: --max-image, or its default.
int64_t max_image_edge(const FitCommandOptions& options) {
  if (options.max_image > 0) {
    return options.max_image;
  }
  return options.model.model == "unet3d" ? 128 : 512;
}

/// The multiple of 2^levels every U-Net edge is.
int64_t edge_step(const FitCommandOptions& options) {
  return int64_t{1} << options.model.levels;
}

/// The pixels (unet2d) or voxels (unet3d) of one image of edge `edge`.
double image_elements(const FitCommandOptions& options, int64_t edge) {
  const double side = static_cast<double>(edge);
  return options.model.model == "unet3d" ? side * side * side : side * side;
}

Fitted fit_over_image(const FitCommandOptions& options, const Budget& cap) {
  if (!is_graph_model(options.model.model)) {
    throw UsageError(
        "--over image: only --model unet2d and unet3d fit an image size, got "
        "--model " +
        options.model.model);
  }
  // The workload checks --levels and --image (the edge it is built at).
  Workload workload(options.model, options.seed);
  const int64_t step = edge_step(options);
  if (options.model.batch == 1) {
    throw UsageError(
        "--batch 1: --over image tries edges from 2^levels = " +
        std::to_string(step) +
        ", where the bottleneck's BatchNorm sees one value per channel; use "
        "--batch 2 or more");
  }
  const int64_t max_edge = max_image_edge(options);
  if (max_edge % step != 0) {
    throw UsageError(
        "--max-image: must be divisible by 2^levels = " + std::to_string(step) +
        " (--levels " + std::to_string(options.model.levels) + "), got " +
        std::to_string(max_edge));
  }
  if (cap.is_total()) {
    throw UsageError(
        "--cap " + options.cap +
        ": a total cap is for chain models; give the activations' bytes "
        "with --over image");
  }
  const TrainingGraph& model = workload.training_graph();
  auto make_problem = [&](int64_t multiple) {
    const models::SegmentationBatch data = models::phantom_batch(
        options.model.batch,
        unet_spatial_size(options.model.model, multiple * step),
        options.seed);
    // Each size keeps its own labels: checks and timed rounds interleave
    // sizes.
    return GraphFitProblem{
        stages_with_targets(model, data.labels), data.images};
  };
  const FitSizeOptions fit_options =
      FitSizeOptions()
          .probe_size(1)
          .max_size(max_edge / step)
          .size_model(SizeModel::kQuadratic)
          .max_time_ratio(options.max_time_ratio)
          .units_of_size([&](int64_t multiple) {
            return image_elements(options, multiple * step);
          });
  std::vector<FitAnswer> answers = fit_size(
      std::function<GraphFitProblem(int64_t)>(make_problem),
      cap.budget_bytes(),
      fit_options);
  for (FitAnswer& answer : answers) {
    answer.size *= step;  // the edge
  }
  std::vector<int64_t> edges = fit_profile_sizes(fit_options);
  for (int64_t& edge : edges) {
    edge *= step;
  }
  return {
      std::move(answers),
      workload.description(),
      std::nullopt,
      std::move(edges)};
}

Fitted fit_over_seq_len(const FitCommandOptions& options, const Budget& cap) {
  if (options.model.model != "gpt") {
    throw UsageError(
        "--over seq-len: only --model gpt has a sequence length, got --model " +
        options.model.model);
  }
  if (options.max_seq_len < options.probe_seq_len) {
    throw UsageError(
        "--max-seq-len: expected at least --probe-seq-len (" +
        std::to_string(options.probe_seq_len) + "), got " +
        std::to_string(options.max_seq_len));
  }
  ModelFlags model_flags = options.model;
  model_flags.seq = options.max_seq_len;  // no longer length is made
  Workload workload(model_flags, options.seed);
  std::optional<CapState> state;
  const int64_t cap_bytes =
      activation_cap(options, cap, workload.model(), state);
  auto make_problem = [&](int64_t length) {
    ModelFlags flags = options.model;
    flags.seq = length;
    return FitProblem{
        models::gpt_stages(workload.model(), models::causal_mask(length)),
        Workload(flags, options.seed).next_batch().inputs};
  };
  const FitSizeOptions fit_options =
      FitSizeOptions()
          .probe_size(options.probe_seq_len)
          .max_size(options.max_seq_len)
          .size_model(SizeModel::kQuadratic)
          .max_time_ratio(options.max_time_ratio);
  return {
      fit_size(make_problem, cap_bytes, fit_options),
      workload.description(),
      state,
      fit_profile_sizes(fit_options)};
}

}  // namespace

CLI::App* add_fit_command(CLI::App& app, FitCommandOptions& options) {
  CLI::App* command = app.add_subcommand(
      "fit",
      "Find the largest batch (or, for the gpt, sequence length) of a "
      "built-in model that trains under a memory cap (activations plus "
      "input), with no checkpointing, the best checkpoint_sequential and the "
      "optimal plan; each answer is confirmed by a measured step");
  add_model_flags(*command, options.model);
  command
      ->add_option(
          "--cap",
          options.cap,
          "Memory cap: activations + input in bytes with a unit (64MiB), or "
          "the whole step with parameters, gradients and optimizer state "
          "(total:1GiB)")
      ->check(budget_validator(/*percentages=*/false))
      ->required();
  command
      ->add_option(
          "--optimizer",
          options.optimizer,
          "With a total cap: the optimizer whose state the cap includes")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  command
      ->add_option(
          "--over",
          options.over,
          "What to fit: batch (at --seq for the gpt), seq-len (gpt only, at "
          "--batch; --seq is not used) or image (unet2d, unet3d: the image "
          "or volume edge, a multiple of 2^levels, at --batch; also "
          "spelled image-size or patch)")
      ->transform(CLI::CheckedTransformer(std::map<std::string, std::string>{
          {"batch", "batch"},
          {"seq-len", "seq-len"},
          {"image", "image"},
          {"image-size", "image"},
          {"patch", "image"}}))
      ->capture_default_str();
  command
      ->add_option(
          "--probe-batch",
          options.probe_batch,
          "--over batch: the smallest batch considered and the first "
          "profiled (the other is twice it, or --max-batch if smaller)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  command
      ->add_option(
          "--max-batch",
          options.max_batch,
          "--over batch: largest batch considered")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  command
      ->add_option(
          "--probe-seq-len",
          options.probe_seq_len,
          "--over seq-len: the smallest length considered and the first of "
          "the three profiled (the others are 2 and 4 times it, or spread up "
          "to --max-seq-len where that is smaller)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str();
  command
      ->add_option(
          "--max-seq-len",
          options.max_seq_len,
          "--over seq-len: largest length considered")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 18))
      ->capture_default_str();
  command
      ->add_option(
          "--max-image",
          options.max_image,
          "--over image: largest edge considered, a multiple of 2^levels "
          "(0: 512 in 2D, 128 in 3D)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 16))
      ->capture_default_str();
  command
      ->add_option(
          "--max-time-ratio",
          options.max_time_ratio,
          "Checkpointing may cost at most this multiple of no checkpointing's "
          "measured time per sample (per position for seq-len; 0: no limit)")
      ->check(finite_number())
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  command->add_flag("--json", options.json, "Print JSON instead of text");
  add_run_flags(*command, options.threads, options.seed);
  return command;
}

namespace {

/// The cap flag as a Budget: bytes or a total. Throws UsageError otherwise.
Budget parse_cap(const std::string& text) {
  auto refuse = [&text](const std::string& why) {
    return UsageError(
        "--cap: expected bytes with a unit (64MiB, 1GiB, 500MB) or a total "
        "(total:1GiB), got '" +
        text + "'" + why);
  };
  if (const std::optional<std::string> hint =
          bare_number_hint(text, /*percentages=*/false)) {
    throw UsageError("--cap: " + *hint);
  }
  Budget cap;
  try {
    cap = Budget::parse(text);
  } catch (const c10::Error&) {
    throw refuse("");
  }
  if (cap.is_none()) {
    throw refuse(" (a cap is bytes; 'none' would set no limit to fit under)");
  }
  if (cap.kind() != Budget::Kind::kBytes && !cap.is_total()) {
    throw refuse(" (a cap is bytes, not a percentage of a plan's peak)");
  }
  return cap;
}

/// The largest size considered: an answer there may not be the largest
/// that fits.
int64_t search_bound(const FitCommandOptions& options) {
  if (options.over == "image") {
    return max_image_edge(options);
  }
  return options.over == "batch" ? options.max_batch : options.max_seq_len;
}

/// The column and unit names of what is fitted.
struct OverNames {
  std::string column;    ///< "batch", "seq-len", "edge"
  std::string per_unit;  ///< "ms/sample", "ms/token", "ms/Mpixel", "ms/Mvoxel"
  std::string smallest;  ///< the flag of the smallest size considered
  std::string bound;     ///< the flag of the largest
  std::string unit;      ///< what the time column is per: "sample", ...
};

OverNames over_names(const FitCommandOptions& options) {
  if (options.over == "image") {
    return {
        "edge",
        options.model.model == "unet3d" ? "ms/Mvoxel" : "ms/Mpixel",
        "the edge 2^levels = " + std::to_string(edge_step(options)),
        "--max-image",
        options.model.model == "unet3d" ? "megavoxel" : "megapixel"};
  }
  if (options.over == "seq-len") {
    return {"seq-len", "ms/token", "--probe-seq-len", "--max-seq-len", "token"};
  }
  return {"batch", "ms/sample", "--probe-batch", "--max-batch", "sample"};
}

/// The measured time per unit of what is fitted (OverNames::unit): per
/// sample, per token of a sequence, per million pixels or voxels of an
/// image; 0 for an answer of size 0.
double ms_per_unit(const FitCommandOptions& options, const FitAnswer& answer) {
  if (answer.size == 0) {
    return 0;
  }
  if (options.over == "seq-len") {
    return answer.ms_per_sample() / static_cast<double>(answer.size);
  }
  if (options.over == "image") {
    return answer.ms_per_sample() /
           (image_elements(options, answer.size) / 1e6);
  }
  return answer.ms_per_sample();
}

void render_fit_json(
    const FitCommandOptions& options,
    const Budget& cap,
    const Fitted& fitted,
    std::ostream& out) {
  // The sequence length of an answer: the fitted size, or the fixed --seq
  // of a gpt fitted over the batch (null for the other models).
  auto seq_len_of = [&](const FitAnswer& answer) -> nlohmann::json {
    if (options.over == "seq-len") {
      return answer.size;
    }
    return options.model.model == "gpt" ? nlohmann::json(options.model.seq)
                                        : nlohmann::json(nullptr);
  };
  auto state_json = [](const planner::ModelState& state) {
    return nlohmann::json{
        {"parameter_bytes", state.parameter_bytes},
        {"gradient_bytes", state.gradient_bytes},
        {"optimizer_bytes", state.optimizer_bytes}};
  };
  nlohmann::json report;
  report["model"] = fitted.description;
  report["over"] = options.over;
  report["unit"] = over_names(options).unit;
  report["cap_bytes"] = cap.budget_bytes();
  report["cap_total"] = cap.is_total();
  if (fitted.state) {
    report["model_state"] = {
        {"predicted", state_json(fitted.state->predicted)},
        {"measured", state_json(fitted.state->measured)}};
  }
  report["profiled_sizes"] = fitted.profiled_sizes;
  report["answers"] = nlohmann::json::array();
  const FitAnswer& none = fitted.answers.front();
  for (const FitAnswer& answer : fitted.answers) {
    report["answers"].push_back(
        {{"strategy", answer.strategy},
         {"segments", answer.segments},
         {"size", answer.size},
         {"batch", answer.batch},
         {"seq_len", seq_len_of(answer)},
         {"at_search_bound", answer.size >= search_bound(options)},
         {"plan", answer.plan.to_string()},
         {"predicted",
          {{"peak_bytes", answer.predicted_peak_bytes},
           {"step_ms", answer.predicted_step_ms}}},
         {"measured",
          {{"peak_bytes", answer.measured_peak_bytes},
           {"step_ms", answer.measured_step_ms},
           {"ms_per_sample", answer.ms_per_sample()},
           {"ms_per_unit", ms_per_unit(options, answer)}}}});
    if (options.max_time_ratio > 0) {
      const measure::RatioInterval& ratio = answer.measured_time_ratio;
      // Against no checkpointing's answer: undefined where either is 0.
      report["answers"].back()["predicted"]["time_ratio"] =
          answer.size > 0 && none.size > 0
              ? nlohmann::json(answer.predicted_time_ratio)
              : nlohmann::json(nullptr);
      report["answers"].back()["measured"]["time_ratio"] =
          ratio.rounds == 0 ? nlohmann::json(nullptr)
                            : nlohmann::json{
                                  {"median", ratio.median},
                                  {"low", ratio.low},
                                  {"high", ratio.high},
                                  {"rounds", ratio.rounds},
                                  {"has_interval", ratio.has_interval}};
    }
  }
  out << report_text(report) << '\n';
}

/// A "vs none" cell of the text table, `width` columns: the ratio to two
/// decimals, or "—" where there is none (no checkpointing fits nothing).
std::string ratio_cell(const std::optional<double>& ratio, int width) {
  std::ostringstream cell;
  if (ratio) {
    cell << std::fixed << std::setprecision(2) << std::setw(width) << *ratio;
  } else {
    cell << std::string(static_cast<size_t>(width - 1), ' ') << "—";
  }
  return cell.str();
}

/// "16, 32 and 64": `sizes` for the header.
std::string size_list(const std::vector<int64_t>& sizes) {
  std::string list;
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (k > 0) {
      list += k + 1 == sizes.size() ? " and " : ", ";
    }
    list += std::to_string(sizes[k]);
  }
  return list;
}

/// Under --max-time-ratio: each answer's time per unit against no
/// checkpointing's, predicted (what the limit was applied to) and measured
/// in paired rounds.
void render_time_limit(
    const FitCommandOptions& options,
    const std::vector<FitAnswer>& answers,
    std::ostringstream& text) {
  text << "\ntime per " << over_names(options).unit
       << ", against none's (--max-time-ratio " << std::setprecision(2)
       << options.max_time_ratio
       << "): predicted, which the limit applies to; measured in paired "
          "rounds, with the 95% interval\n";
  for (const FitAnswer& answer : answers) {
    const measure::RatioInterval& ratio = answer.measured_time_ratio;
    if (answer.size == 0 || ratio.rounds == 0) {
      continue;
    }
    std::string name = answer.strategy;
    if (answer.segments > 0) {
      name += "(" + std::to_string(answer.segments) + ")";
    }
    text << "  " << std::left << std::setw(26) << name << std::right
         << std::setprecision(2) << answer.predicted_time_ratio
         << "x predicted, " << ratio.median << "x measured";
    if (ratio.has_interval) {
      text << " [" << ratio.low << ", " << ratio.high << "]"
           << (ratio.low > options.max_time_ratio
                   ? ": over the limit as measured"
               : ratio.high <= options.max_time_ratio
                   ? ": within the limit as measured"
                   : "");
    }
    text << '\n';
  }
}

void render_fit_text(
    const FitCommandOptions& options,
    const Budget& cap,
    const Fitted& fitted,
    std::ostream& out) {
  using planner::format_bytes;
  const bool over_batch = options.over == "batch";
  const int64_t predicted_state =
      fitted.state ? fitted.state->predicted.total_bytes() : 0;
  const int64_t measured_state =
      fitted.state ? fitted.state->measured.total_bytes() : 0;
  std::ostringstream text;
  text << "model  " << fitted.description << '\n';
  if (fitted.state) {
    text << "cap    " << format_bytes(cap.budget_bytes())
         << " for the whole step: model state " << format_bytes(predicted_state)
         << " (parameters and buffers "
         << format_bytes(fitted.state->predicted.parameter_bytes)
         << ", gradients "
         << format_bytes(fitted.state->predicted.gradient_bytes) << ", "
         << options.optimizer << " state "
         << format_bytes(fitted.state->predicted.optimizer_bytes)
         << "; measured on a copy: " << format_bytes(measured_state)
         << ") + activations and input up to "
         << format_bytes(cap.budget_bytes() - predicted_state) << '\n';
  } else {
    text << "cap    " << format_bytes(cap.budget_bytes())
         << " (activations plus the input, measured; total:SIZE for the "
            "whole step)\n";
  }
  text << "fit    "
       << (over_batch ? std::string("the batch")
           : options.over == "image"
               ? "the image edge (steps of 2^levels = " +
                     std::to_string(edge_step(options)) + "), at batch " +
                     std::to_string(options.model.batch)
               : "the sequence length, at batch " +
                     std::to_string(options.model.batch))
       << '\n';
  const OverNames names = over_names(options);
  text << "probes " << names.column << ' ' << size_list(fitted.profiled_sizes)
       << " (profiled for the cost model)\n\n";
  if (fitted.state) {
    text << "measured and predicted peaks are of the whole step (model state "
            "included)\n";
  }
  text << std::left << std::setw(24) << "strategy" << std::right << std::setw(8)
       << names.column << std::setw(9) << "vs none" << std::setw(12)
       << "measured" << std::setw(12) << "predicted" << std::setw(11)
       << names.per_unit << std::setw(9) << "vs none" << '\n';
  text << std::fixed;
  const FitAnswer& none = fitted.answers.front();
  bool any_at_bound = false;
  for (const FitAnswer& answer : fitted.answers) {
    std::string name = answer.strategy;
    if (answer.segments > 0) {
      name += "(" + std::to_string(answer.segments) + ")";
    }
    const bool at_bound = answer.size >= search_bound(options);
    any_at_bound = any_at_bound || at_bound;
    text << std::left << std::setw(24) << name << std::right << std::setw(8)
         << answer.size;
    if (answer.size == 0) {
      const std::string& smallest = names.smallest;
      // The time limit applies to a checkpointing strategy, and only
      // against no checkpointing's answer: elsewhere the cap alone said no.
      const bool limited = options.max_time_ratio > 0 &&
                           answer.strategy != "none" && none.size > 0;
      text
          << (limited ? "  (none fits within the cap and --max-time-ratio, "
                        "from " +
                            smallest + " up)\n"
                      : "  (not even " + smallest + " fits)\n");
      continue;
    }
    // Ratios against no checkpointing's answer: none where it is 0.
    const bool relative = none.size > 0;
    text << ratio_cell(
                relative ? std::optional<double>(
                               static_cast<double>(answer.size) / none.size)
                         : std::nullopt,
                9)
         << std::setw(12)
         << format_bytes(answer.measured_peak_bytes + measured_state)
         << std::setw(12)
         << format_bytes(answer.predicted_peak_bytes + predicted_state)
         << std::setw(11) << std::setprecision(4)
         << ms_per_unit(options, answer)
         << ratio_cell(
                relative ? std::optional<double>(
                               ms_per_unit(options, answer) /
                               ms_per_unit(options, none))
                         : std::nullopt,
                9)
         << (at_bound ? "  *" : "") << '\n';
  }
  if (options.max_time_ratio > 0 && none.size > 0) {
    render_time_limit(options, fitted.answers, text);
  } else if (std::any_of(
                 fitted.answers.begin(),
                 fitted.answers.end(),
                 [](const FitAnswer& answer) { return answer.size > 0; })) {
    text << "\n"
         << names.per_unit
         << ": one measured step each, a rough figure (--max-time-ratio "
            "times the answers in paired rounds, with intervals)\n";
  }
  if (any_at_bound) {
    text << "\n* at the search bound (" << names.bound << " "
         << search_bound(options)
         << "): a larger size may fit; raise the bound to find it\n";
  }
  out << text.str();
}

}  // namespace

void run_fit(const FitCommandOptions& options, const CommandIo& io) {
  apply_threads(options.threads);
  const Budget cap = parse_cap(options.cap);
  if (options.over != "batch" && options.over != "seq-len" &&
      options.over != "image") {
    throw UsageError(
        "--over: expected batch, seq-len or image, got '" + options.over + "'");
  }
  if (options.over != "image" && is_graph_model(options.model.model)) {
    throw UsageError(
        "--over " + options.over + ": a U-Net (--model " + options.model.model +
        ") fits its image edge at a fixed batch: --over image (also spelled "
        "patch or image-size)");
  }
  const Fitted fitted = options.over == "batch" ? fit_over_batch(options, cap)
                        : options.over == "image"
                            ? fit_over_image(options, cap)
                            : fit_over_seq_len(options, cap);
  if (options.json) {
    render_fit_json(options, cap, fitted, io.out);
  } else {
    render_fit_text(options, cap, fitted, io.out);
  }
}

}  // namespace remat::cli
