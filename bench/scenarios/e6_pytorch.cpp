// e6_pytorch.cpp — scenario E6 of remat_bench: remat next to PyTorch's own
// checkpointing, measured the same way.
//
// Procedure (the PyTorch side is bench/pytorch/e6_pytorch.py, a PythonPeer):
//  1. This process builds the model (residual FFN blocks, seed 0) and the
//     input, and writes the parameters (raw little-endian float32, named as
//     the Sequential names them) and the input with a JSON manifest into a
//     work folder. The Python process builds the same modules and loads
//     them: both sides train exactly the same numbers.
//  2. Gradients, before any timing: every schedule takes one step in both
//     processes with dropout off (eval mode) and one with dropout on and the
//     same seed (both processes draw from the same CPU generator algorithm, so
//     the masks agree when both consume random numbers in the same order). The
//     Python side writes its parameter gradients; they are compared here with
//     remat's, element by element. The planned row, which PyTorch cannot
//     express, is compared with PyTorch's plain run.
//  3. Rounds: warm-up rounds, then timed rounds. In each round every schedule
//     takes one step in each process (A_remat A_torch B_remat B_torch ...),
//     the process going first alternating from round to round. Every step of
//     a round has the same seed, so each process checks its schedules'
//     gradients against its own plain run of the round: remat's must be
//     bitwise equal on CPU (GradientMismatch otherwise, as the harness's
//     gate); PyTorch's differences are reported. Then both plain runs are
//     re-run, interleaved, `rounds` times (has the machine's speed moved?).
//  4. A remat step is Runner::step (remat/measure/runner.h); the Python side
//     takes its steps the same way: gradients zeroed (allocated, not freed),
//     input gradient dropped, seed set, meter restarted, forward + loss
//     (mean(y^2)) timed, backward timed. Both processes count bytes with
//     remat's tracking CPU allocator (NOTE: [Tracking allocator] in
//     src/measure/memory_meter.cpp): the Python process loads it from
//     libremat_meter.so over the same libc10, so peaks are comparable byte
//     for byte.
// The remat side may run on a GPU (--device cuda); the PyTorch side is
// CPU-only and is then left out, with the reason in the section.
#include "python_peer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include "harness/scenario.h"
#include "models/models.h"
#include "remat/remat.h"

#ifndef REMAT_E6_SCRIPT
#error "REMAT_E6_SCRIPT must name bench/pytorch/e6_pytorch.py"
#endif
#ifndef REMAT_BENCH_METER
#error "REMAT_BENCH_METER must name the built libremat_meter.so"
#endif

static_assert(
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
    "E6 exchanges raw little-endian float32 files");

namespace remat::bench {
namespace {

namespace fs = std::filesystem;

/// E6's own flags (the common ones come from the Context).
struct E6Options {
  int64_t blocks = 32;    // residual FFN blocks
  int64_t dim = 512;      // model width
  int64_t hidden = 2048;  // feed-forward width
  int64_t batch = 256;    // rows of the input
  double dropout = 0.1;   // dropout of the timed steps
  int64_t segments = 6;   // K of the sequential(K) rows
  double budget = 0.5;  // planned row: fraction of the store-all peak; 0: none
  bool no_pytorch = false;                  // true: the remat side only
  std::string python = "/usr/bin/python3";  // the PyTorch side's interpreter
  std::string script = REMAT_E6_SCRIPT;     // e6_pytorch.py
  std::string meter = REMAT_BENCH_METER;    // libremat_meter.so
  std::string workdir;        // exchanged files; empty: a fresh folder, removed
  int reply_timeout_s = 600;  // longest wait for one PyTorch reply
};

// The exchange folder: the given one, or a fresh one removed at the end.
class Workdir {
 public:
  explicit Workdir(const std::string& requested) {
    if (!requested.empty()) {
      path_ = requested;
      fs::create_directories(path_);
      return;
    }
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
        "/remat-e6-XXXXXX";
    TORCH_CHECK(
        ::mkdtemp(pattern.data()) != nullptr,
        "remat_bench E6: expected to create a work folder from ",
        pattern,
        ", got an error");
    path_ = pattern;
    owned_ = true;
  }
  ~Workdir() {
    if (owned_) {
      std::error_code ignored;
      fs::remove_all(path_, ignored);
    }
  }
  Workdir(const Workdir&) = delete;
  Workdir& operator=(const Workdir&) = delete;
  std::string file(const std::string& name) const {
    return (path_ / name).string();
  }

 private:
  fs::path path_;
  bool owned_ = false;
};

void write_floats(std::ofstream& stream, const torch::Tensor& tensor) {
  const auto host = tensor.detach().to(torch::kCPU, torch::kFloat).contiguous();
  stream.write(
      reinterpret_cast<const char*>(host.data_ptr<float>()),
      static_cast<std::streamsize>(host.numel() * sizeof(float)));
}

// weights.bin, input.bin and manifest.json for the Python side.
void write_exchange_files(
    const Workdir& workdir,
    const E6Options& options,
    int threads,
    torch::nn::Sequential& model,
    const torch::Tensor& input) {
  nlohmann::json parameters = nlohmann::json::array();
  std::ofstream weights(workdir.file("weights.bin"), std::ios::binary);
  int64_t offset_bytes = 0;
  for (const auto& item : model->named_parameters()) {
    const auto& tensor = item.value();
    parameters.push_back(
        {{"name", item.key()},
         {"shape", tensor.sizes().vec()},
         {"numel", tensor.numel()},
         {"offset_bytes", offset_bytes}});
    write_floats(weights, tensor);
    offset_bytes += tensor.numel() * static_cast<int64_t>(sizeof(float));
  }
  std::ofstream input_file(workdir.file("input.bin"), std::ios::binary);
  write_floats(input_file, input);
  const nlohmann::json manifest = {
      {"format", "remat-e6 1"},
      {"blocks", options.blocks},
      {"dim", options.dim},
      {"hidden", options.hidden},
      {"dropout", options.dropout},
      {"threads", threads},
      {"weights", "weights.bin"},
      {"parameters", parameters},
      {"input", {{"file", "input.bin"}, {"shape", input.sizes().vec()}}}};
  std::ofstream(workdir.file("manifest.json")) << manifest.dump(1) << "\n";
  TORCH_CHECK(
      weights.good() && input_file.good(),
      "remat_bench E6: expected to write the weights and input into ",
      workdir.file(""),
      ", got a write error");
}

// Copies of the parameter gradients, on the parameters' device.
std::vector<torch::Tensor> gradients(torch::nn::Sequential& model) {
  std::vector<torch::Tensor> grads;
  for (const auto& parameter : model->parameters()) {
    grads.push_back(parameter.grad().detach().clone());
  }
  return grads;
}

/// A cross-process gradient comparison (remat's row against PyTorch's).
struct GradCompare {
  bool measured = false;
  double max_abs_diff = 0;  // largest |remat - pytorch| over all parameters
  double max_rel_diff = 0;  // max_abs_diff / largest |pytorch gradient|
  int64_t differing = 0;    // elements that are not bitwise equal
};

// remat's gradients against the raw float32 file the Python side wrote.
GradCompare compare_with_file(
    const std::vector<torch::Tensor>& remat_grads, const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  GradCompare compare;
  double largest_pytorch = 0;
  for (const auto& grad : remat_grads) {
    auto pytorch = torch::empty_like(grad);
    stream.read(
        reinterpret_cast<char*>(pytorch.data_ptr<float>()),
        static_cast<std::streamsize>(grad.numel() * sizeof(float)));
    TORCH_CHECK(
        stream.good(),
        "remat_bench E6: expected ",
        grad.numel(),
        " more gradient values in ",
        path,
        ", got fewer");
    compare.max_abs_diff = std::max(
        compare.max_abs_diff, (grad - pytorch).abs().max().item<double>());
    largest_pytorch =
        std::max(largest_pytorch, pytorch.abs().max().item<double>());
    compare.differing += grad.ne(pytorch).sum().item<int64_t>();
  }
  compare.max_rel_diff =
      largest_pytorch > 0 ? compare.max_abs_diff / largest_pytorch : 0;
  compare.measured = true;
  return compare;
}

torch::Tensor per_block(
    torch::nn::Sequential& model, torch::Tensor x, remat::Mode mode) {
  for (auto& module : *model) {
    auto block = module;
    x = remat::checkpoint(
        [block](const torch::Tensor& in) mutable { return block.forward(in); },
        x,
        remat::CheckpointOptions().mode(mode));
  }
  return x;
}

/// One schedule, measured in both processes.
struct Row {
  std::string name;          // "per-block", "sequential(6)", ...
  std::string remat_call;    // what remat runs
  std::string pytorch_kind;  // e6_pytorch.py's schedule; "" = no counterpart
  std::string pytorch_call;  // what PyTorch runs
  ForwardFn forward;         // the remat side
  Measurement remat;
  Measurement pytorch;  // empty series: not measured
  bool pytorch_peak_measured = false;
  bool pytorch_grad_measured = false;
  GradCompare dropout_off;
  GradCompare dropout_on;
};

/// The planned row's budget (0: no planned row) and the chain input's bytes,
/// which the budget counts and the activation peak does not.
struct PlannedBudget {
  int64_t budget_bytes = 0;
  int64_t input_bytes = 0;
};

std::vector<Row> make_rows(
    const E6Options& options,
    torch::nn::Sequential model,
    const torch::Tensor& input,
    PlannedBudget* planned) {
  const std::string k = std::to_string(options.segments);
  std::vector<Row> rows;
  const auto add = [&](std::string name,
                       std::string remat_call,
                       std::string pytorch_kind,
                       std::string pytorch_call,
                       ForwardFn forward) {
    Row row;
    row.name = std::move(name);
    row.remat_call = std::move(remat_call);
    row.pytorch_kind = std::move(pytorch_kind);
    row.pytorch_call = std::move(pytorch_call);
    row.forward = std::move(forward);
    row.remat.name = row.name;
    row.pytorch.name = row.name;
    rows.push_back(std::move(row));
  };
  add("none",
      "plain autograd",
      "none",
      "plain autograd",
      [model](const torch::Tensor& x) mutable { return model->forward(x); });
  add("per-block",
      "remat::checkpoint per block",
      "per-block",
      "checkpoint(block, use_reentrant=False) per block",
      [model](const torch::Tensor& x) mutable {
        return per_block(model, x, remat::Mode::kNonReentrant);
      });
  add("per-block-reentrant",
      "remat::checkpoint per block, Mode::kReentrant",
      "per-block-reentrant",
      "checkpoint(block, use_reentrant=True) per block",
      [model](const torch::Tensor& x) mutable {
        return per_block(model, x, remat::Mode::kReentrant);
      });
  add("sequential(" + k + ")",
      "remat::checkpoint_sequential(" + k + ")",
      "sequential",
      "checkpoint_sequential(" + k + "), non-reentrant",
      [model, segments = options.segments](const torch::Tensor& x) {
        return remat::checkpoint_sequential(model, segments, x);
      });
  add("sequential(" + k + ")-reentrant",
      "remat::checkpoint_sequential(" + k + "), Mode::kReentrant",
      "sequential-reentrant",
      "checkpoint_sequential(" + k + "), reentrant",
      [model, segments = options.segments](const torch::Tensor& x) {
        return remat::checkpoint_sequential(
            model,
            segments,
            x,
            remat::CheckpointOptions().mode(remat::Mode::kReentrant));
      });
  if (options.budget > 0) {
    const auto budget = remat::Budget::fraction(options.budget);
    model->train();
    const auto chain = remat::profile_chain(model, input);
    const int64_t budget_bytes = budget.resolve_bytes(chain);
    const auto plan = remat::planner::solve_optimal(chain, budget_bytes);
    TORCH_CHECK(
        plan.has_value(),
        "remat_bench E6: expected a plan within ",
        budget.to_string(),
        " (",
        budget_bytes,
        " bytes), got none; the minimum is ",
        remat::planner::min_feasible_budget_bytes(chain),
        " bytes");
    remat::PlannedSequential planned_model(model, *plan);
    const std::string percent =
        std::to_string(std::lround(options.budget * 100)) + "%";
    add("planned(" + percent + ")",
        "remat::PlannedSequential, the optimal plan within " +
            budget.to_string(),
        "",
        "no counterpart (its gradients are compared with PyTorch's plain run)",
        [planned_model](const torch::Tensor& x) mutable {
          return planned_model->forward(x);
        });
    planned->budget_bytes = budget_bytes;
    planned->input_bytes = chain.input_bytes();
  }
  return rows;
}

nlohmann::json pytorch_command(
    const Row& row, const E6Options& options, uint64_t seed, bool train) {
  return {
      {"cmd", "step"},
      {"kind", row.pytorch_kind.empty() ? "none" : row.pytorch_kind},
      {"segments", options.segments},
      {"seed", seed},
      {"train", train}};
}

// Appends one PyTorch step's reply to `row` (when `timed`). Returns false,
// with `why` set, when the PyTorch side failed.
bool pytorch_step(
    PythonPeer& peer,
    Row& row,
    const E6Options& options,
    uint64_t seed,
    bool reference,
    bool timed,
    std::string* why) {
  auto command = pytorch_command(row, options, seed, /*train=*/true);
  command["reference"] = reference;
  const auto reply = peer.request(command, options.reply_timeout_s);
  if (!reply) {
    *why = peer.why_unavailable();
    return false;
  }
  if (reply->contains("error")) {
    *why = "schedule " + row.name + ": " + reply->at("error").dump();
    return false;
  }
  if (!timed) {
    return true;
  }
  const double forward_ms = reply->at("forward_ms").get<double>();
  const double backward_ms = reply->at("backward_ms").get<double>();
  row.pytorch.forward_ms.push_back(forward_ms);
  row.pytorch.backward_ms.push_back(backward_ms);
  row.pytorch.step_ms.push_back(forward_ms + backward_ms);
  if (!reply->at("peak_bytes").is_null()) {
    row.pytorch_peak_measured = true;
    row.pytorch.peak_bytes = std::max(
        row.pytorch.peak_bytes, reply->at("peak_bytes").get<int64_t>());
  }
  if (!reply->at("grad_diff").is_null()) {
    row.pytorch_grad_measured = true;
    row.pytorch.max_grad_diff = std::max(
        row.pytorch.max_grad_diff, reply->at("grad_diff").get<double>());
  }
  return true;
}

void append(Measurement& into, const Measurement& step) {
  into.forward_ms.insert(
      into.forward_ms.end(), step.forward_ms.begin(), step.forward_ms.end());
  into.backward_ms.insert(
      into.backward_ms.end(), step.backward_ms.begin(), step.backward_ms.end());
  into.step_ms.insert(
      into.step_ms.end(), step.step_ms.begin(), step.step_ms.end());
  into.cpu_ms.insert(into.cpu_ms.end(), step.cpu_ms.begin(), step.cpu_ms.end());
  into.peak_bytes = std::max(into.peak_bytes, step.peak_bytes);
}

std::string format_difference(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

std::string preamble(const E6Options& options, const Context& context) {
  std::ostringstream text;
  text << "E6 runs one model under the same checkpointing schedules twice: "
          "with remat in this process, and with PyTorch's own "
          "torch.utils.checkpoint in "
       << options.python
       << " (bench/pytorch/e6_pytorch.py, driven step by step). Model: "
       << options.blocks << " residual FFN blocks x + Linear(" << options.hidden
       << "→" << options.dim << ")(Dropout(" << options.dropout
       << ")(GELU(Linear(" << options.dim << "→" << options.hidden
       << ")(LayerNorm(x))))), batch " << options.batch
       << ", fp32, loss mean(y²), " << context.threads
       << " torch threads in each process. The C++ side writes its "
          "parameters and input to files that the Python side loads, so both "
          "train the same numbers. Schedules: per-block checkpointing and "
          "checkpoint_sequential("
       << options.segments
       << ") in both modes; the planned row (remat's optimal plan within a "
          "budget) has no PyTorch counterpart.\n\n"
          "**Memory** is counted the same way in both processes: by remat's "
          "tracking CPU allocator, which the Python process loads from "
          "libremat_meter.so (ctypes) before importing torch, over the same "
          "libc10. Activation peak = peak live bytes during forward, loss and "
          "backward minus the live bytes just before forward, with the "
          "parameter gradients allocated and zeroed. **Time**: forward (with "
          "the loss) and backward timed separately; "
       << context.warmup << " warm-up and " << context.rounds
       << " timed rounds, each running every schedule once in each process, "
          "interleaved, the process going first alternating; medians and "
          "spreads (max − min). Time ratios are against each process's own "
          "no-checkpoint run, remat/PyTorch between the two processes' runs "
          "of one schedule; each is paired by round (the median of the "
          "per-round ratios, with its 95 % interval: a difference only where "
          "the interval excludes 1). **Gradients**: each process checks every schedule "
          "against its own plain run of the round (same seed), and the "
          "parameter gradients of the two processes are compared element by "
          "element, with dropout off and with dropout on under one seed.";
  return text.str();
}

Section run_e6(const E6Options& requested, const Context& context) {
  E6Options options = requested;
  if (context.quick) {
    options.blocks = 4;
    options.dim = 64;
    options.hidden = 256;
    options.batch = 32;
    options.segments = 2;
  }
  const torch::Device device = context.torch_device();
  Section section;
  section.scenario = "E6";
  section.title = "E6 — remat next to PyTorch's own checkpointing";
  section.add_text(preamble(options, context));

  torch::manual_seed(0);
  auto model =
      remat::models::residual_ffn_stack(remat::models::ResidualFfnStackOptions()
                                            .blocks(options.blocks)
                                            .dim(options.dim)
                                            .hidden(options.hidden)
                                            .dropout(options.dropout));
  model->to(device);
  model->train();
  // Reentrant checkpointing reaches the parameters only through an input
  // that requires grad, so every schedule gets such an input.
  auto input = torch::randn({options.batch, options.dim})
                   .to(device)
                   .requires_grad_(true);
  Workload workload;
  workload.model = model.ptr().get();
  workload.input = input;
  workload.loss = [](const torch::Tensor& output) {
    return output.pow(2).mean();
  };
  Runner runner(workload, context.runner_options());
  PlannedBudget planned;
  auto rows = make_rows(options, model, input, &planned);

  // The PyTorch side.
  Workdir workdir(options.workdir);
  std::unique_ptr<PythonPeer> peer;
  std::string unavailable;
  if (options.no_pytorch) {
    unavailable = "left out (--no-pytorch)";
  } else if (!device.is_cpu()) {
    unavailable =
        "the PyTorch side runs on the CPU only, remat ran on " + device.str();
  } else {
    write_exchange_files(workdir, options, context.threads, model, input);
    peer = std::make_unique<PythonPeer>(
        std::vector<std::string>{
            options.python,
            options.script,
            "--manifest",
            workdir.file("manifest.json"),
            "--meter",
            options.meter,
            "--threads",
            std::to_string(context.threads)},
        workdir.file("pytorch.log"),
        options.reply_timeout_s);
    if (!peer->available()) {
      unavailable = peer->why_unavailable();
    }
  }
  const auto pytorch_up = [&] { return unavailable.empty(); };

  // 2. gradients across the processes
  constexpr uint64_t kCompareSeed = 7;
  for (auto& row : rows) {
    for (const bool train : {false, true}) {
      if (!pytorch_up()) {
        break;
      }
      model->train(train);
      runner.step(row.forward, kCompareSeed);
      const auto remat_grads = gradients(model);
      auto command = pytorch_command(row, options, kCompareSeed, train);
      command["cmd"] = "grad";
      command["path"] = workdir.file("grads.bin");
      const auto reply = peer->request(command, options.reply_timeout_s);
      if (!reply || reply->contains("error")) {
        unavailable = reply ? "gradients of " + row.name + ": " +
                                  reply->at("error").dump()
                            : peer->why_unavailable();
        break;
      }
      (train ? row.dropout_on : row.dropout_off) =
          compare_with_file(remat_grads, workdir.file("grads.bin"));
    }
  }
  model->train();

  // 3. interleaved rounds
  const uint64_t first_seed = context.runner_options().seed;
  std::vector<torch::Tensor> reference_grads;
  for (int round = 0; round < context.warmup + context.rounds; ++round) {
    const bool timed = round >= context.warmup;
    const uint64_t seed = first_seed + 1 + static_cast<uint64_t>(round);
    for (size_t index = 0; index < rows.size(); ++index) {
      Row& row = rows[index];
      const auto run_remat = [&] {
        const Measurement step = runner.step(row.forward, seed);
        if (index == 0) {
          reference_grads = gradients(model);
        } else {
          const auto grads = gradients(model);
          for (size_t p = 0; p < grads.size(); ++p) {
            const double diff =
                (grads[p] - reference_grads[p]).abs().max().item<double>();
            row.remat.max_grad_diff = std::max(row.remat.max_grad_diff, diff);
            if (device.is_cpu() && diff != 0) {
              throw GradientMismatch(
                  "remat_bench E6: " + row.name +
                  " computed other gradients "
                  "than none in round " +
                  std::to_string(round) + " (parameter " + std::to_string(p) +
                  ", max |diff| " + format_difference(diff) + ")");
            }
          }
        }
        if (timed) {
          append(row.remat, step);
        }
      };
      const auto run_pytorch = [&] {
        if (pytorch_up() && !row.pytorch_kind.empty() &&
            !pytorch_step(
                *peer, row, options, seed, index == 0, timed, &unavailable)) {
          unavailable = "during the rounds: " + unavailable;
        }
      };
      if (round % 2 == 0) {
        run_remat();
        run_pytorch();
      } else {
        run_pytorch();
        run_remat();
      }
    }
  }
  // The baselines once more, interleaved: has the machine's speed moved?
  Row& none = rows.front();
  Measurement remat_rerun;
  Row pytorch_rerun = none;
  pytorch_rerun.pytorch = Measurement{};
  for (int round = 0; round < context.rounds; ++round) {
    const uint64_t seed = first_seed + 1000 + static_cast<uint64_t>(round);
    append(remat_rerun, runner.step(none.forward, seed));
    if (pytorch_up()) {
      std::string why;
      if (!pytorch_step(
              *peer, pytorch_rerun, options, seed, false, true, &why)) {
        unavailable = "during the baseline re-run: " + why;
      }
    }
  }

  // The report.
  if (!unavailable.empty()) {
    section.add_text("PyTorch column unavailable: " + unavailable + ".");
  } else {
    const auto& greeting = peer->greeting();
    section.add_text(
        "PyTorch " + greeting.value("torch", std::string("?")) + " (" +
        greeting.value("executable", options.python) + ", Python " +
        greeting.value("python", std::string("?")) +
        "); memory meter in the Python process: " +
        greeting.value("meter", std::string("?")) + ". PyTorch schedules: " +
        greeting.value("sequential", std::string("?")) + ".");
  }
  const bool with_pytorch = unavailable.empty();
  const auto pytorch_has = [&](const Row& row) {
    return with_pytorch && !row.pytorch.step_ms.empty();
  };

  Table summary;
  summary.name = "E6";
  summary.caption = "remat and PyTorch per schedule";
  summary.columns = {
      "schedule",
      "remat peak",
      "PyTorch peak",
      "memory remat/PyTorch",
      "remat memory ratio",
      "remat time ratio [95% CI]",
      "PyTorch time ratio [95% CI]",
      "remat/PyTorch forward [95% CI]",
      "remat/PyTorch backward [95% CI]",
      "remat/PyTorch step [95% CI]"};
  for (const Row& row : rows) {
    const bool both = pytorch_has(row);
    const bool peaks = both && row.pytorch_peak_measured;
    const auto remat_over_pytorch = [&](const std::vector<double>& lhs,
                                        const std::vector<double>& rhs) {
      return both ? paired_ratio_cell(lhs, rhs) : Cell::empty();
    };
    summary.add_row(
        {Cell::text(row.name),
         Cell::bytes(row.remat.peak_bytes),
         peaks ? Cell::bytes(row.pytorch.peak_bytes) : Cell::empty(),
         peaks && row.pytorch.peak_bytes > 0
             ? Cell::ratio(
                   static_cast<double>(row.remat.peak_bytes) /
                   static_cast<double>(row.pytorch.peak_bytes))
             : Cell::empty(),
         Cell::ratio(
             static_cast<double>(row.remat.peak_bytes) /
             static_cast<double>(none.remat.peak_bytes)),
         paired_ratio_cell(row.remat.step_ms, none.remat.step_ms),
         both ? paired_ratio_cell(row.pytorch.step_ms, none.pytorch.step_ms)
              : Cell::empty(),
         remat_over_pytorch(row.remat.forward_ms, row.pytorch.forward_ms),
         remat_over_pytorch(row.remat.backward_ms, row.pytorch.backward_ms),
         remat_over_pytorch(row.remat.step_ms, row.pytorch.step_ms)});
  }
  section.add_table(summary);

  Table times;
  times.name = "E6-times";
  times.caption = "Step times of each side (ratio: to its own none)";
  times.columns = {"schedule", "side", "call"};
  for (const auto& column : step_time_columns()) {
    times.columns.push_back(column);
  }
  times.columns.push_back("peak");
  times.columns.push_back("max grad diff vs none");
  for (const Row& row : rows) {
    std::vector<Cell> cells = {
        Cell::text(row.name), Cell::text("remat"), Cell::text(row.remat_call)};
    for (auto& cell : step_time_cells(row.remat, none.remat)) {
      cells.push_back(std::move(cell));
    }
    cells.push_back(Cell::bytes(row.remat.peak_bytes));
    cells.push_back(Cell::text(format_difference(row.remat.max_grad_diff)));
    times.add_row(std::move(cells));
    if (pytorch_has(row)) {
      cells = {
          Cell::text(row.name),
          Cell::text("PyTorch"),
          Cell::text(row.pytorch_call)};
      for (auto& cell : step_time_cells(row.pytorch, none.pytorch)) {
        cells.push_back(std::move(cell));
      }
      cells.push_back(
          row.pytorch_peak_measured ? Cell::bytes(row.pytorch.peak_bytes)
                                    : Cell::empty());
      cells.push_back(
          row.pytorch_grad_measured
              ? Cell::text(format_difference(row.pytorch.max_grad_diff))
              : Cell::empty());
      times.add_row(std::move(cells));
    }
  }
  section.add_table(times);

  if (with_pytorch) {
    Table gradients;
    gradients.name = "E6-gradients";
    gradients.caption =
        "remat's parameter gradients against PyTorch's (same schedule; "
        "planned: PyTorch's plain run), one step each";
    gradients.columns = {
        "schedule",
        "dropout",
        "max abs diff",
        "max rel diff",
        "elements differing",
        "elements"};
    int64_t elements = 0;
    for (const auto& parameter : model->parameters()) {
      elements += parameter.numel();
    }
    for (const Row& row : rows) {
      for (const bool train : {false, true}) {
        const GradCompare& compare = train ? row.dropout_on : row.dropout_off;
        if (!compare.measured) {
          continue;
        }
        gradients.add_row(
            {Cell::text(row.name),
             Cell::text(
                 train ? "on (p " + format_difference(options.dropout) +
                             ", one seed)"
                       : "off"),
             Cell::text(format_difference(compare.max_abs_diff)),
             Cell::text(format_difference(compare.max_rel_diff)),
             Cell::integer(compare.differing),
             Cell::integer(elements)});
      }
    }
    section.add_table(gradients);
  }

  std::ostringstream rerun;
  rerun << "Baselines re-run after the rounds: remat none "
        << summarize(remat_rerun.step_ms).median
        << " ms (rounds: " << none.remat.step().median << " ms)";
  if (pytorch_has(none) && !pytorch_rerun.pytorch.step_ms.empty()) {
    rerun << ", PyTorch none " << pytorch_rerun.pytorch.step().median
          << " ms (rounds: " << none.pytorch.step().median << " ms)";
  }
  rerun << ".";
  if (planned.budget_bytes > 0) {
    const Row& row = rows.back();
    const int64_t counted = row.remat.peak_bytes + planned.input_bytes;
    rerun << " " << row.name << ": activation peak " << row.remat.peak_bytes
          << " + input " << planned.input_bytes << " = " << counted
          << " bytes against a budget of " << planned.budget_bytes
          << " bytes: " << (counted <= planned.budget_bytes ? "within" : "OVER")
          << ".";
  }
  section.add_text(rerun.str());
  return section;
}

ScenarioRun setup_e6(CLI::App& command) {
  auto options = std::make_shared<E6Options>();
  command.add_option("--blocks", options->blocks, "residual FFN blocks")
      ->capture_default_str();
  command.add_option("--dim", options->dim, "model width")
      ->capture_default_str();
  command.add_option("--hidden", options->hidden, "feed-forward width")
      ->capture_default_str();
  command.add_option("--batch", options->batch, "input rows")
      ->capture_default_str();
  command.add_option("--dropout", options->dropout, "dropout probability")
      ->capture_default_str();
  command
      .add_option(
          "--segments", options->segments, "K of the sequential(K) schedules")
      ->capture_default_str();
  command
      .add_option(
          "--budget",
          options->budget,
          "budget of the planned row, a fraction of the store-all peak (0: "
          "no planned row)")
      ->capture_default_str();
  command.add_flag(
      "--no-pytorch", options->no_pytorch, "measure the remat side only");
  command
      .add_option(
          "--python", options->python, "the interpreter of the PyTorch side")
      ->capture_default_str();
  command.add_option("--script", options->script, "e6_pytorch.py")
      ->capture_default_str();
  command.add_option("--meter", options->meter, "libremat_meter.so")
      ->capture_default_str();
  command.add_option(
      "--workdir",
      options->workdir,
      "folder for the exchanged files (default: a fresh one, removed)");
  return
      [options](const Context& context) { return run_e6(*options, context); };
}

const bool kRegistered = register_scenario(
    {"E6",
     "remat next to PyTorch's torch.utils.checkpoint: same model, weights, "
     "schedules, memory meter",
     60,
     setup_e6});

}  // namespace
}  // namespace remat::bench
