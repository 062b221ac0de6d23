// e6_pytorch.h — what the three files of scenario E6 share (remat next to
// PyTorch's own checkpointing; the procedure is at the top of
// e6_pytorch.cpp).
//
//  - e6_pytorch.cpp: the scenario itself: its flags, the model and its
//    schedules (rows), the remat side of the interleaved rounds;
//  - e6_pytorch_peer.cpp: the PyTorch side: the exchange folder and files,
//    the Python process, its steps and the cross-process gradient check;
//  - e6_pytorch_report.cpp: the section's texts and tables.
// Everything here is internal to remat_bench (namespace remat::bench::e6).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "harness/scenario.h"
#include "python_peer.h"
#include "remat/remat.h"

#ifndef REMAT_E6_SCRIPT
#error "REMAT_E6_SCRIPT must name bench/pytorch/e6_pytorch.py"
#endif
#ifndef REMAT_BENCH_METER
#error "REMAT_BENCH_METER must name the built libremat_meter.so"
#endif

namespace remat::bench::e6 {

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

/// A cross-process gradient comparison (remat's row against PyTorch's).
struct GradCompare {
  bool measured = false;
  double max_abs_diff = 0;  // largest |remat - pytorch| over all parameters
  double max_rel_diff = 0;  // max_abs_diff / largest |pytorch gradient|
  int64_t differing = 0;    // elements that are not bitwise equal
};

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

/// The plain runs of both processes once more after the rounds: has the
/// machine's speed moved?
struct BaselineRerun {
  Measurement remat;
  Measurement pytorch;  // empty series: not measured
};

/// Copies of the parameter gradients, on the parameters' device.
std::vector<torch::Tensor> gradients(torch::nn::Sequential& model);

// ---------------------------------------------- the PyTorch side (peer.cpp)

/// The exchange folder: the given one, or a fresh one removed at the end.
class Workdir {
 public:
  explicit Workdir(const std::string& requested);
  ~Workdir();
  Workdir(const Workdir&) = delete;
  Workdir& operator=(const Workdir&) = delete;
  std::string file(const std::string& name) const;

 private:
  std::filesystem::path path_;
  bool owned_ = false;
};

/// The Python process of a run, or why it takes no (further) part.
struct PytorchSide {
  std::unique_ptr<PythonPeer> peer;  // null when it was never started
  std::string unavailable;           // empty while the side takes part

  bool up() const {
    return unavailable.empty();
  }
};

/// Writes the exchange files into `workdir` and starts e6_pytorch.py on
/// them; the side is unavailable, with the reason, under --no-pytorch, when
/// remat runs off the CPU, or when the process does not come up.
PytorchSide start_pytorch_side(
    const E6Options& options,
    const Context& context,
    const torch::Device& device,
    const Workdir& workdir,
    torch::nn::Sequential& model,
    const torch::Tensor& input);

/// Step 2 of the procedure: one step of every row in both processes with
/// dropout off, then on (one seed), filling Row::dropout_off/dropout_on.
/// Stops, with `pytorch.unavailable` set, at the first failure. Leaves the
/// model in training mode.
void compare_gradients_with_pytorch(
    std::vector<Row>& rows,
    Runner& runner,
    torch::nn::Sequential& model,
    PytorchSide& pytorch,
    const Workdir& workdir,
    const E6Options& options);

/// Appends one PyTorch step's reply to `row` (when `timed`). Returns false,
/// with `why` set, when the PyTorch side failed.
bool pytorch_step(
    PythonPeer& peer,
    Row& row,
    const E6Options& options,
    uint64_t seed,
    bool reference,
    bool timed,
    std::string* why);

// ------------------------------------------------ the section (report.cpp)

/// A difference as the tables and texts print it (a stream's default
/// format: "0" when equal).
std::string format_difference(double value);

/// What E6 runs and how it measures (the section's first text).
std::string preamble(const E6Options& options, const Context& context);

/// Which PyTorch ran, or why its columns are empty.
std::string pytorch_side_text(
    const PytorchSide& pytorch, const E6Options& options);

/// The tables and the closing text, appended to `section`. `with_pytorch`:
/// the PyTorch side took part to the end; `parameter_elements`: the
/// elements of all parameters (what the gradient comparison covers).
void add_results(
    Section& section,
    const std::vector<Row>& rows,
    const BaselineRerun& rerun,
    const PlannedBudget& planned,
    bool with_pytorch,
    int64_t parameter_elements,
    const E6Options& options);

}  // namespace remat::bench::e6
