// e6_pytorch.h — benchmark E6: remat next to PyTorch's own checkpointing.
//
// One model (residual FFN blocks, models/residual_ffn.h), one set of weights
// and one input, trained for one step at a time under the same schedules in
// two processes: this one with remat, and /usr/bin/python3 running
// bench/pytorch/e6_pytorch.py with torch.utils.checkpoint. Both measure memory
// with remat's tracking CPU allocator (the Python process loads it from
// libremat_meter.so), time forward and backward separately, and interleave
// their steps round by round. See e6_pytorch.cpp for the exact procedure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace remat::bench {

/// What E6 runs. Defaults: 32 blocks of 512 -> 2048 -> 512 at batch 256,
/// about a second per step on 2 cores.
struct E6Options {
  int64_t blocks = 32;    // residual FFN blocks
  int64_t dim = 512;      // model width
  int64_t hidden = 2048;  // feed-forward width
  int64_t batch = 256;    // rows of the input
  double dropout = 0.1;   // dropout of the timed steps (cross-checks use 0)
  int64_t segments = 6;   // K of the sequential(K) rows
  double budget_fraction = 0.5;  // planned row's budget, a fraction of the
                                 // store-all peak; 0: no planned row
  int warmup = 3;                // discarded rounds
  int rounds = 10;               // measured rounds
  int threads = 2;               // torch threads of both processes
  std::string device = "cpu";    // remat side: cpu, cuda or cuda:N
  bool pytorch = true;           // false: the remat side only
  std::string python = "/usr/bin/python3";  // the PyTorch side's interpreter
  std::string script;         // e6_pytorch.py; empty: the source tree's
  std::string meter;          // libremat_meter.so; empty: the build tree's
  std::string workdir;        // files exchanged; empty: a fresh folder, removed
  int reply_timeout_s = 600;  // longest wait for one PyTorch reply
};

/// Medians and spreads (max - min) of a series of measured steps.
struct E6Timing {
  std::vector<double> forward_ms;
  std::vector<double> backward_ms;
  std::vector<double> step_ms;
};

/// A cross-process gradient comparison (remat's row against PyTorch's).
struct E6GradCompare {
  bool measured = false;
  double max_abs_diff = 0;  // largest |remat - pytorch| over all parameters
  double max_rel_diff = 0;  // max_abs_diff / largest |pytorch gradient|
  int64_t differing = 0;    // gradient elements that are not bitwise equal
};

/// One schedule, measured in both processes.
struct E6Row {
  std::string name;          // "per-block", "sequential(6)", ...
  std::string remat_call;    // what remat runs
  std::string pytorch_kind;  // e6_pytorch.py's schedule; "" = none
  std::string pytorch_call;  // what PyTorch runs
  E6Timing remat;
  E6Timing pytorch;
  int64_t remat_peak_bytes = 0;  // largest activation peak over the rounds
  std::optional<int64_t> pytorch_peak_bytes;
  double remat_grad_diff = 0;               // vs remat's own "none", same seed
  std::optional<double> pytorch_grad_diff;  // vs PyTorch's own "none"
  E6GradCompare eval;                       // dropout off
  E6GradCompare train;  // dropout on, the same seed in both processes
};

struct E6Result {
  E6Options options;
  std::vector<E6Row> rows;           // rows[0] is "none"
  std::string pytorch_unavailable;   // why there is no PyTorch column; or ""
  std::string pytorch_version;       // torch.__version__
  std::string pytorch_notes;         // how the PyTorch side built its schedules
  std::string pytorch_meter;         // "ok" or why its memory is unmeasured
  std::string libtorch_version;      // this process's LibTorch
  int64_t planned_budget_bytes = 0;  // 0 without a planned row
  int64_t input_bytes = 0;
};

/// Runs E6. Throws c10::Error on a remat-side failure (a bad option, no
/// GPU for --device cuda, a budget no plan fits); a PyTorch side that cannot
/// run is reported in pytorch_unavailable instead.
E6Result run_e6(const E6Options& options);

}  // namespace remat::bench
