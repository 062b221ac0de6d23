// checkpoint_impl.h (private): the two checkpoint mechanisms behind
// remat::checkpoint. Both expect validated arguments and grad mode on.
#pragma once

#include "remat/checkpoint.h"

namespace remat::detail {

/// Saved-tensor-hook checkpoint (checkpoint.cpp).
torch::autograd::variable_list checkpoint_nonreentrant(
    const Function& fn,
    const torch::autograd::variable_list& inputs,
    const CheckpointOptions& options);

/// Custom-autograd-function checkpoint (checkpoint_reentrant.cpp).
torch::autograd::variable_list checkpoint_reentrant(
    const Function& fn,
    const torch::autograd::variable_list& inputs,
    const CheckpointOptions& options);

}  // namespace remat::detail
