// distributed.cpp: process groups, gradient averaging and local launches
// (remat/distributed.h) on c10d's TCPStore and Gloo backend.
//
// NOTE: [Gradient buckets]
// GradientSync lays the parameters that require grad out in buckets, walking
// them from the last to the first (backward produces the gradients of the
// last layers first), a bucket holding parameters of one dtype up to about
// bucket_bytes. Each bucket owns one flat buffer; each parameter has a slot
// (its offset in its bucket's buffer) and a ready flag for the current step.
// A hook registered with Tensor::register_hook on the parameter (a leaf)
// receives its gradient when autograd's accumulation node for it runs, which
// happens once per backward that computes that gradient: in the plain graph,
// inside a non-reentrant checkpoint's recomputed graph, inside a reentrant
// checkpoint's inner backward, or inside a planned stage's backward. The hook
// copies the gradient into the slot, marks it ready and returns zeros, so
// that autograd leaves param.grad() as it was (it exists on every LibTorch
// from 1.13 on; post-accumulation hooks do not exist before 2.1).
// A bucket is complete when all its slots are ready. Buckets start their
// allreduce strictly in bucket order: a complete bucket whose predecessors
// have not started waits for them. Gloo matches collectives by the order in
// which each rank issues them, so this keeps every rank issuing the same
// sequence even when the ranks' backwards complete buckets in different
// orders. finish() starts what is left (missing gradients as zeros), waits,
// divides the sums by the world size and adds them to param.grad().
// A second gradient for a ready slot within one step is refused: it means
// the parameter is reached by several backwards (or several reentrant
// regions), and its bucket may already be on the wire.
//
// NOTE: [Failures and timeouts]
// Every wait is bounded by the group's timeout: the store's operations (the
// rendezvous, share()) by TCPStoreOptions::timeout, Gloo's collectives by its
// context timeout and Work::wait(timeout). A peer that dies closes its TCP
// connections, so the others' pending collectives fail at once with Gloo's
// I/O error; a peer that hangs makes them fail at the timeout. Either way the
// error is rethrown as a c10::Error naming the operation and this rank. A
// write to a closed connection would raise SIGPIPE, whose default action
// ends the process without a message, so joining a group ignores SIGPIPE
// unless the program handles it itself.
#include "remat/distributed.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "compat/compat.h"

extern char** environ;

namespace remat::distributed {
namespace {

using std::chrono::milliseconds;

/// The message of an exception, without LibTorch's backtrace.
std::string message_of(const std::exception& error) {
  if (const auto* torch_error = dynamic_cast<const c10::Error*>(&error)) {
    return torch_error->what_without_backtrace();
  }
  return error.what();
}

std::string seconds_text(milliseconds timeout) {
  std::ostringstream text;
  text << static_cast<double>(timeout.count()) / 1000.0 << " s";
  return text.str();
}

bool is_loopback(const std::string& address) {
  return address == "localhost" || address == "::1" ||
         address.rfind("127.", 0) == 0;
}

void check_group_options(const GroupOptions& options) {
  constexpr const char* kWho = "remat::distributed::ProcessGroup";
  TORCH_CHECK(
      options.world_size() >= 1,
      kWho,
      ": expected a world size of at least 1, got ",
      options.world_size());
  TORCH_CHECK(
      options.rank() >= 0 && options.rank() < options.world_size(),
      kWho,
      ": expected a rank in [0, ",
      options.world_size(),
      "), got ",
      options.rank());
  TORCH_CHECK(
      options.master_port() >= 1 && options.master_port() <= 65535,
      kWho,
      ": expected a master port in [1, 65535], got ",
      options.master_port());
  TORCH_CHECK(
      !options.master_addr().empty(),
      kWho,
      ": expected a master address, got an empty one");
  TORCH_CHECK(
      options.timeout().count() > 0,
      kWho,
      ": expected a positive timeout, got ",
      options.timeout().count(),
      " ms");
}

constexpr const char* kFromEnv = "remat::distributed::group_options_from_env";

const char* required_env(const char* name) {
  const char* text = std::getenv(name);
  TORCH_CHECK(
      text != nullptr && *text != '\0',
      kFromEnv,
      ": ",
      name,
      " is not set (expected RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, "
      "as torchrun or `remat train --nproc N` set them)");
  return text;
}

int64_t integer_env(const char* name) {
  const char* text = required_env(name);
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  TORCH_CHECK(
      errno == 0 && end != text && *end == '\0',
      kFromEnv,
      ": ",
      name,
      " must be an integer, got '",
      text,
      "'");
  return static_cast<int64_t>(value);
}

std::vector<uint8_t> to_bytes(const std::string& text) {
  return std::vector<uint8_t>(text.begin(), text.end());
}

/// What Gloo's collectives accept: a dense, contiguous CPU tensor.
void check_collective_tensor(const char* call, const torch::Tensor& tensor) {
  TORCH_CHECK(
      tensor.defined() && tensor.device().is_cpu() && tensor.is_contiguous() &&
          tensor.layout() == torch::kStrided,
      "remat::distributed::ProcessGroup::",
      call,
      ": expected a dense, contiguous CPU tensor, got ",
      tensor.defined() ? tensor.toString() : std::string("an undefined one"));
}

/// Makes writing to a connection whose peer has gone fail with EPIPE
/// instead of killing the process with SIGPIPE (the default action), so that
/// a dead peer is reported as a failed collective (NOTE: [Failures and
/// timeouts]). A handler the program installed itself is left alone.
void ignore_broken_pipes() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 &&
      current.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
}

/// A collective's root must be a rank of the group.
void check_root(const char* call, int64_t root, int64_t world_size) {
  TORCH_CHECK(
      root >= 0 && root < world_size,
      "remat::distributed::ProcessGroup::",
      call,
      ": expected a root rank in [0, ",
      world_size,
      "), got ",
      root);
}

/// At most `limit` characters of `text`, for messages.
std::string shortened(const std::string& text, size_t limit = 160) {
  return text.size() <= limit
             ? text
             : text.substr(0, limit) + "... (" + std::to_string(text.size()) +
                   " characters)";
}

}  // namespace

GroupOptions group_options_from_env(GroupOptions defaults) {
  const int64_t world_size = integer_env("WORLD_SIZE");
  TORCH_CHECK(
      world_size >= 1,
      kFromEnv,
      ": WORLD_SIZE must be at least 1, got ",
      world_size);
  const int64_t rank = integer_env("RANK");
  TORCH_CHECK(
      rank >= 0 && rank < world_size,
      kFromEnv,
      ": RANK must be in [0, WORLD_SIZE) = [0, ",
      world_size,
      "), got ",
      rank);
  const std::string master_addr = required_env("MASTER_ADDR");
  const int64_t master_port = integer_env("MASTER_PORT");
  TORCH_CHECK(
      master_port >= 1 && master_port <= 65535,
      kFromEnv,
      ": MASTER_PORT must be in [1, 65535], got ",
      master_port);
  return defaults.rank(rank)
      .world_size(world_size)
      .master_addr(master_addr)
      .master_port(master_port);
}

bool environment_names_a_group() {
  return std::getenv("WORLD_SIZE") != nullptr;
}

int64_t find_free_port() {
  const int socket_fd = ::socket(AF_INET, SOCK_STREAM, 0);
  TORCH_CHECK(
      socket_fd >= 0,
      "remat::distributed::find_free_port: cannot open a socket: ",
      std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  const bool bound =
      ::bind(
          socket_fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) ==
          0 &&
      ::getsockname(
          socket_fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int bind_errno = errno;
  ::close(socket_fd);
  TORCH_CHECK(
      bound,
      "remat::distributed::find_free_port: cannot bind a loopback socket: ",
      std::strerror(bind_errno));
  return ntohs(address.sin_port);
}

// ---- Work ------------------------------------------------------------------

struct Work::Impl {
  c10::intrusive_ptr<c10d::Work> work;
  /// "allreduce of gradient bucket 2 (4096 bytes)", for messages.
  std::string what;
  int64_t rank = 0;
  int64_t world_size = 1;
  milliseconds timeout{0};

  static Work make(
      c10::intrusive_ptr<c10d::Work> work,
      std::string what,
      const GroupOptions& options) {
    Work result;
    result.impl_ = std::make_unique<Impl>();
    result.impl_->work = std::move(work);
    result.impl_->what = std::move(what);
    result.impl_->rank = options.rank();
    result.impl_->world_size = options.world_size();
    result.impl_->timeout = options.timeout();
    return result;
  }
};

Work::Work() = default;
Work::~Work() = default;
Work::Work(Work&&) noexcept = default;
Work& Work::operator=(Work&&) noexcept = default;

bool Work::valid() const {
  return impl_ != nullptr;
}

void Work::wait() {
  TORCH_CHECK(
      valid(),
      "remat::distributed::Work::wait: expected a collective not yet waited "
      "for, got none");
  const std::unique_ptr<Impl> impl = std::move(impl_);
  try {
    impl->work->wait(impl->timeout);
  } catch (const std::exception& error) {
    TORCH_CHECK(
        false,
        "remat::distributed: ",
        impl->what,
        " failed on rank ",
        impl->rank,
        " of ",
        impl->world_size,
        " (a peer exited, hangs or cannot be reached; timeout ",
        seconds_text(impl->timeout),
        "): ",
        message_of(error));
  }
}

// ---- ProcessGroup ----------------------------------------------------------

struct ProcessGroup::Impl {
  GroupOptions options;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
  /// Keys used by share(), numbered in call order (the same on every rank).
  int64_t shared_values = 0;
};

ProcessGroup::ProcessGroup(const GroupOptions& options)
    : impl_(std::make_shared<Impl>()) {
  check_group_options(options);
  ignore_broken_pipes();
  impl_->options = options;
  const int64_t rank = options.rank();
  const std::string where =
      options.master_addr() + ":" + std::to_string(options.master_port());

  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<uint16_t>(options.master_port());
  store_options.isServer = rank == 0;
  store_options.numWorkers = static_cast<size_t>(options.world_size());
  // The rendezvous below waits for every rank, with its own message.
  store_options.waitWorkers = false;
  store_options.timeout = options.timeout();
  compat::use_socket_store(store_options);
  try {
    impl_->store = c10::make_intrusive<c10d::TCPStore>(
        options.master_addr(), store_options);
  } catch (const std::exception& error) {
    if (rank == 0) {
      TORCH_CHECK(
          false,
          "remat::distributed::ProcessGroup: rank 0 cannot host the "
          "rendezvous store at ",
          where,
          " (is the port in use, or the address not this machine's?): ",
          message_of(error));
    }
    TORCH_CHECK(
        false,
        "remat::distributed::ProcessGroup: rank ",
        rank,
        " cannot reach the rendezvous store of rank 0 at ",
        where,
        " within ",
        seconds_text(options.timeout()),
        " (is rank 0 running, and the address reachable?): ",
        message_of(error));
  }

  auto gloo_options =
      c10d::ProcessGroupGloo::Options::create(options.timeout());
  std::string bind_addr = options.bind_addr();
  if (bind_addr.empty() && is_loopback(options.master_addr())) {
    bind_addr = "127.0.0.1";
  }
  try {
    gloo_options->devices.push_back(
        bind_addr.empty()
            ? c10d::ProcessGroupGloo::createDefaultDevice()
            : c10d::ProcessGroupGloo::createDeviceForHostname(bind_addr));
    impl_->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(
        impl_->store,
        static_cast<int>(rank),
        static_cast<int>(options.world_size()),
        gloo_options);
  } catch (const std::exception& error) {
    TORCH_CHECK(
        false,
        "remat::distributed::ProcessGroup: rank ",
        rank,
        " of ",
        options.world_size(),
        " could not connect to the others through the store at ",
        where,
        " within ",
        seconds_text(options.timeout()),
        " (did every rank start, with the same world size?): ",
        message_of(error));
  }
}

int64_t ProcessGroup::rank() const {
  return impl_->options.rank();
}

int64_t ProcessGroup::world_size() const {
  return impl_->options.world_size();
}

const GroupOptions& ProcessGroup::options() const {
  return impl_->options;
}

Work ProcessGroup::allreduce_sum(const torch::Tensor& tensor) {
  check_collective_tensor("allreduce_sum", tensor);
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions reduce;
  reduce.reduceOp = c10d::ReduceOp::SUM;
  reduce.timeout = impl_->options.timeout();
  return Work::Impl::make(
      impl_->gloo->allreduce(tensors, reduce),
      "allreduce of " + std::to_string(tensor.nbytes()) + " bytes",
      impl_->options);
}

Work ProcessGroup::reduce_sum(const torch::Tensor& tensor, int64_t root) {
  check_collective_tensor("reduce_sum", tensor);
  check_root("reduce_sum", root, world_size());
  std::vector<at::Tensor> tensors{tensor};
  c10d::ReduceOptions options;
  options.reduceOp = c10d::ReduceOp::SUM;
  options.rootRank = root;
  options.timeout = impl_->options.timeout();
  return Work::Impl::make(
      impl_->gloo->reduce(tensors, options),
      "reduce of " + std::to_string(tensor.nbytes()) + " bytes to rank " +
          std::to_string(root),
      impl_->options);
}

void ProcessGroup::broadcast(const torch::Tensor& tensor, int64_t root) {
  check_collective_tensor("broadcast", tensor);
  check_root("broadcast", root, world_size());
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  options.timeout = impl_->options.timeout();
  Work::Impl::make(
      impl_->gloo->broadcast(tensors, options),
      "broadcast of " + std::to_string(tensor.nbytes()) + " bytes from rank " +
          std::to_string(root),
      impl_->options)
      .wait();
}

void ProcessGroup::barrier() {
  c10d::BarrierOptions options;
  options.timeout = impl_->options.timeout();
  Work::Impl::make(impl_->gloo->barrier(options), "barrier", impl_->options)
      .wait();
}

std::string ProcessGroup::share(const std::string& value) {
  const std::string key =
      "remat/shared/" + std::to_string(impl_->shared_values++);
  try {
    if (rank() == 0) {
      impl_->store->set(key, to_bytes(value));
      return value;
    }
    const std::vector<uint8_t> bytes = impl_->store->get(key);
    return std::string(bytes.begin(), bytes.end());
  } catch (const std::exception& error) {
    TORCH_CHECK(
        false,
        "remat::distributed::ProcessGroup::share: rank ",
        rank(),
        " could not exchange a value through the store at ",
        impl_->options.master_addr(),
        ":",
        impl_->options.master_port(),
        " within ",
        seconds_text(impl_->options.timeout()),
        ": ",
        message_of(error));
  }
}

void ProcessGroup::check_same(
    const std::string& what, const std::string& value) {
  const std::string reference = share(value);
  const bool differs = reference != value;
  // Every rank learns whether any differs, so that all of them fail.
  torch::Tensor differing = torch::tensor({differs ? 1.0 : 0.0});
  allreduce_sum(differing).wait();
  const auto count = static_cast<int64_t>(differing.item<double>());
  TORCH_CHECK(
      !differs,
      "remat::distributed: ",
      what,
      " differs between ranks: rank 0 has '",
      shortened(reference),
      "', rank ",
      rank(),
      " has '",
      shortened(value),
      "'");
  TORCH_CHECK(
      count == 0,
      "remat::distributed: ",
      what,
      " differs between ranks: ",
      count,
      " of the ",
      world_size(),
      " ranks differ from rank 0's '",
      shortened(reference),
      "'");
}

torch::Tensor local_slice(
    const torch::Tensor& global, const ProcessGroup& group) {
  TORCH_CHECK(
      global.dim() >= 1 && global.size(0) % group.world_size() == 0,
      "remat::distributed::local_slice: expected a batch whose size divides "
      "by the world size ",
      group.world_size(),
      ", got ",
      global.dim() >= 1 ? global.size(0) : int64_t{0},
      " rows");
  const int64_t rows = global.size(0) / group.world_size();
  return global.narrow(0, group.rank() * rows, rows);
}

void broadcast_parameters(
    const std::vector<torch::Tensor>& parameters, ProcessGroup& group) {
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& parameter : parameters) {
    torch::Tensor values = parameter.detach();
    if (values.is_contiguous()) {
      group.broadcast(values);
    } else {
      torch::Tensor copy = values.contiguous();
      group.broadcast(copy);
      values.copy_(copy);
    }
  }
}

// ---- GradientSync ----------------------------------------------------------

struct GradientSync::State {
  /// One parameter's place (NOTE: [Gradient buckets]).
  struct Slot {
    int64_t bucket = 0;
    int64_t offset = 0;  ///< elements into the bucket's buffer
    bool ready = false;  ///< its gradient of this step is in the buffer
  };
  struct Bucket {
    std::vector<int64_t> members;  ///< parameter indices, in layout order
    torch::Tensor buffer;
    int64_t pending = 0;  ///< members not ready yet
    Work work;
  };

  State(ProcessGroup group_in, std::vector<torch::Tensor> parameters_in)
      : group(std::move(group_in)), parameters(std::move(parameters_in)) {}

  ProcessGroup group;
  std::vector<torch::Tensor> parameters;  ///< those that require grad
  std::vector<unsigned> hooks;
  std::vector<Slot> slots;
  std::vector<Bucket> buckets;
  int64_t next_to_start = 0;
  int64_t started_in_backward = 0;
  int64_t last_started_in_backward = 0;
  std::mutex mutex;

  torch::Tensor slot_view(int64_t index) {
    const Slot& slot = slots[index];
    const torch::Tensor& parameter = parameters[index];
    return buckets[slot.bucket]
        .buffer.narrow(0, slot.offset, parameter.numel())
        .view(parameter.sizes());
  }

  void start(int64_t bucket_index, bool in_backward) {
    Bucket& bucket = buckets[bucket_index];
    bucket.work = group.allreduce_sum(bucket.buffer);
    started_in_backward += in_backward ? 1 : 0;
  }

  /// Starts, in bucket order, every complete bucket whose predecessors have
  /// all started.
  void start_complete_buckets(bool in_backward) {
    while (next_to_start < static_cast<int64_t>(buckets.size()) &&
           buckets[next_to_start].pending == 0) {
      start(next_to_start++, in_backward);
    }
  }

  torch::Tensor on_gradient(int64_t index, const torch::Tensor& grad) {
    std::lock_guard<std::mutex> lock(mutex);
    Slot& slot = slots[index];
    TORCH_CHECK(
        !slot.ready,
        "remat::distributed::GradientSync: parameter ",
        index,
        " (",
        parameters[index].sizes(),
        ") received a second gradient in one step; expected one per "
        "parameter between finish() calls (is it used by several reentrant "
        "checkpoint regions, or was backward() called twice?)");
    TORCH_CHECK(
        !grad.is_sparse(),
        "remat::distributed::GradientSync: expected dense gradients, got a "
        "sparse one for parameter ",
        index);
    {
      torch::NoGradGuard no_grad;
      slot_view(index).copy_(grad);
    }
    slot.ready = true;
    if (--buckets[slot.bucket].pending == 0) {
      start_complete_buckets(/*in_backward=*/true);
    }
    // Autograd adds these zeros to param.grad(), which stays as it was: one
    // zero, broadcast, so that nothing of the gradient's size is allocated
    // when param.grad() exists (AccumulateGrad adds in place).
    return torch::zeros({}, grad.options()).expand(grad.sizes());
  }

  void reset_step() {
    for (Slot& slot : slots) {
      slot.ready = false;
    }
    for (Bucket& bucket : buckets) {
      bucket.pending = static_cast<int64_t>(bucket.members.size());
      bucket.work = Work();
    }
    next_to_start = 0;
    last_started_in_backward = started_in_backward;
    started_in_backward = 0;
  }
};

GradientSync::GradientSync(
    std::vector<torch::Tensor> parameters,
    ProcessGroup group,
    GradientSyncOptions options) {
  TORCH_CHECK(
      options.bucket_bytes() > 0,
      "remat::distributed::GradientSync: expected a positive bucket size, "
      "got ",
      options.bucket_bytes(),
      " bytes");
  std::vector<torch::Tensor> trained;
  for (size_t index = 0; index < parameters.size(); ++index) {
    const torch::Tensor& parameter = parameters[index];
    TORCH_CHECK(
        parameter.defined() && parameter.device().is_cpu() &&
            parameter.layout() == torch::kStrided,
        "remat::distributed::GradientSync: expected dense CPU parameters, "
        "got ",
        parameter.defined() ? parameter.toString() : std::string("undefined"),
        " at index ",
        index);
    if (parameter.requires_grad()) {
      trained.push_back(parameter);
    }
  }
  state_ = std::make_unique<State>(std::move(group), std::move(trained));
  State& state = *state_;
  const auto count = static_cast<int64_t>(state.parameters.size());
  state.slots.resize(static_cast<size_t>(count));

  // Layout: from the last parameter to the first.
  std::vector<int64_t> bucket_elements;
  int64_t bucket_bytes = 0;
  for (int64_t index = count - 1; index >= 0; --index) {
    const torch::Tensor& parameter = state.parameters[index];
    const int64_t bytes = static_cast<int64_t>(parameter.nbytes());
    const bool fits =
        !state.buckets.empty() &&
        state.parameters[state.buckets.back().members.front()].scalar_type() ==
            parameter.scalar_type() &&
        bucket_bytes + bytes <= options.bucket_bytes();
    if (!fits) {
      state.buckets.emplace_back();
      bucket_elements.push_back(0);
      bucket_bytes = 0;
    }
    State::Slot& slot = state.slots[index];
    slot.bucket = static_cast<int64_t>(state.buckets.size()) - 1;
    slot.offset = bucket_elements.back();
    state.buckets.back().members.push_back(index);
    bucket_elements.back() += parameter.numel();
    bucket_bytes += bytes;
  }
  for (size_t bucket = 0; bucket < state.buckets.size(); ++bucket) {
    const torch::Tensor& first =
        state.parameters[state.buckets[bucket].members.front()];
    state.buckets[bucket].buffer =
        torch::empty({bucket_elements[bucket]}, first.options());
  }
  state.reset_step();
  state.last_started_in_backward = 0;

  State* raw = state_.get();
  for (int64_t index = 0; index < count; ++index) {
    state.hooks.push_back(state.parameters[index].register_hook(
        [raw, index](torch::Tensor grad) -> torch::Tensor {
          return raw->on_gradient(index, grad);
        }));
  }
}

GradientSync::~GradientSync() {
  for (size_t index = 0; index < state_->parameters.size(); ++index) {
    state_->parameters[index].remove_hook(state_->hooks[index]);
  }
}

void GradientSync::finish() {
  State& state = *state_;
  std::lock_guard<std::mutex> lock(state.mutex);
  // However finish() ends, the next backward starts a fresh step.
  struct ResetAtExit {
    State& state;
    ~ResetAtExit() {
      state.reset_step();
    }
  } reset_at_exit{state};

  for (int64_t bucket = state.next_to_start;
       bucket < static_cast<int64_t>(state.buckets.size());
       ++bucket) {
    for (int64_t index : state.buckets[bucket].members) {
      if (!state.slots[index].ready) {
        state.slot_view(index).zero_();
      }
    }
    state.buckets[bucket].pending = 0;
  }
  state.start_complete_buckets(/*in_backward=*/false);

  // Wait for every bucket before reporting the first failure, so that none
  // is left writing into a buffer.
  std::exception_ptr failure;
  for (size_t bucket = 0; bucket < state.buckets.size(); ++bucket) {
    try {
      state.buckets[bucket].work.wait();
    } catch (...) {
      if (!failure) {
        failure = std::current_exception();
      }
    }
  }
  if (failure) {
    std::rethrow_exception(failure);
  }

  torch::NoGradGuard no_grad;
  const auto world_size = static_cast<double>(state.group.world_size());
  for (State::Bucket& bucket : state.buckets) {
    bucket.buffer.div_(world_size);
  }
  for (size_t index = 0; index < state.parameters.size(); ++index) {
    const torch::Tensor& parameter = state.parameters[index];
    const torch::Tensor average = state.slot_view(static_cast<int64_t>(index));
    if (parameter.grad().defined()) {
      parameter.mutable_grad().add_(average);
    } else {
      parameter.mutable_grad() = average.clone();
    }
  }
}

int64_t GradientSync::bucket_count() const {
  return static_cast<int64_t>(state_->buckets.size());
}

int64_t GradientSync::buckets_started_in_backward() const {
  return state_->last_started_in_backward;
}

// ---- launch_local ----------------------------------------------------------

namespace {

/// argv or envp for execve: owns the strings, exposes the pointer array.
class CStringArray {
 public:
  explicit CStringArray(std::vector<std::string> strings)
      : strings_(std::move(strings)) {
    for (std::string& text : strings_) {
      pointers_.push_back(text.data());
    }
    pointers_.push_back(nullptr);
  }
  char* const* data() {
    return pointers_.data();
  }

 private:
  std::vector<std::string> strings_;
  std::vector<char*> pointers_;
};

bool is_group_variable(const std::string& entry) {
  for (const char* name :
       {"RANK=",
        "WORLD_SIZE=",
        "MASTER_ADDR=",
        "MASTER_PORT=",
        "LOCAL_RANK=",
        "LOCAL_WORLD_SIZE="}) {
    if (entry.rfind(name, 0) == 0) {
      return true;
    }
  }
  return false;
}

/// Exit code and description of a wait status.
std::pair<int, std::string> describe_status(int64_t rank, int status) {
  if (WIFSIGNALED(status)) {
    return {
        128 + WTERMSIG(status),
        "rank " + std::to_string(rank) + " was killed by signal " +
            std::to_string(WTERMSIG(status))};
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  return {
      code,
      "rank " + std::to_string(rank) + " exited with status " +
          std::to_string(code)};
}

void signal_all(const std::vector<pid_t>& pids, int signal_number) {
  for (const pid_t pid : pids) {
    if (pid > 0) {
      ::kill(pid, signal_number);
    }
  }
}

// NOTE: [No worker outlives its launcher]
// A launcher that dies must not leave its workers training (or holding a
// port) on their own. Two mechanisms cover every way it can die:
//  - a signal it can catch (SIGINT, SIGTERM, SIGHUP): while launch_local
//    waits, those are caught; the workers are sent SIGTERM (SIGKILL 5 s
//    later), and once all are reaped the previous handlers are back and the
//    launch returns 128 + the signal's number, naming it;
//  - one it cannot (SIGKILL) or a crash: every worker asks the kernel, before
//    exec, for SIGTERM when its launcher thread dies (PR_SET_PDEATHSIG), and
//    exits at once if the launcher died before that request.
// Workers find the launcher's pid in REMAT_LAUNCHER_PID, so they can tell a
// lost launcher from another sender of SIGTERM in their message.

volatile sig_atomic_t caught_signal = 0;

extern "C" void note_signal(int signal_number) {
  caught_signal = signal_number;
}

constexpr std::array<int, 3> kStopSignals{SIGINT, SIGTERM, SIGHUP};

/// Catches SIGINT, SIGTERM and SIGHUP for its lifetime (the first one caught
/// is in caught_signal); restores the previous handlers.
class CatchStopSignals {
 public:
  CatchStopSignals() {
    caught_signal = 0;
    struct sigaction action {};
    action.sa_handler = note_signal;
    sigemptyset(&action.sa_mask);
    for (size_t k = 0; k < kStopSignals.size(); ++k) {
      ::sigaction(kStopSignals[k], &action, &previous_[k]);
    }
  }
  CatchStopSignals(const CatchStopSignals&) = delete;
  CatchStopSignals& operator=(const CatchStopSignals&) = delete;
  ~CatchStopSignals() {
    for (size_t k = 0; k < kStopSignals.size(); ++k) {
      ::sigaction(kStopSignals[k], &previous_[k], nullptr);
    }
  }

 private:
  std::array<struct sigaction, kStopSignals.size()> previous_{};
};

}  // namespace

LaunchResult launch_local(const LocalLaunchOptions& options) {
  TORCH_CHECK(
      options.nproc() >= 1,
      "remat::distributed::launch_local: expected at least 1 worker, got ",
      options.nproc());
  const int64_t port =
      options.master_port() > 0 ? options.master_port() : find_free_port();
  std::vector<std::string> arguments = options.arguments();
  if (arguments.empty()) {
    arguments.push_back(options.executable());
  }
  std::vector<std::string> inherited;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (!is_group_variable(*entry)) {
      inherited.emplace_back(*entry);
    }
  }

  const int64_t nproc = options.nproc();
  const pid_t launcher = ::getpid();
  const CatchStopSignals catching;  // NOTE: [No worker outlives its launcher]
  // pid of each rank; 0 once it has been waited for.
  std::vector<pid_t> running;
  for (int64_t rank = 0; rank < nproc; ++rank) {
    std::vector<std::string> environment = inherited;
    environment.push_back("RANK=" + std::to_string(rank));
    environment.push_back("LOCAL_RANK=" + std::to_string(rank));
    environment.push_back("WORLD_SIZE=" + std::to_string(nproc));
    environment.push_back("LOCAL_WORLD_SIZE=" + std::to_string(nproc));
    environment.push_back("MASTER_ADDR=127.0.0.1");
    environment.push_back("MASTER_PORT=" + std::to_string(port));
    environment.push_back("REMAT_LAUNCHER_PID=" + std::to_string(launcher));
    // Everything the child needs is built before fork(): after it, only
    // async-signal-safe calls (execve, _exit) run in the child.
    CStringArray child_argv(arguments);
    CStringArray child_envp(std::move(environment));
    const pid_t pid = ::fork();
    if (pid == 0) {
      // NOTE: [No worker outlives its launcher]. The launcher's handlers
      // would swallow a SIGTERM that comes before execve resets them.
      struct sigaction default_action {};
      default_action.sa_handler = SIG_DFL;
      for (const int signal_number : kStopSignals) {
        ::sigaction(signal_number, &default_action, nullptr);
      }
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher) {
        ::_exit(128 + SIGTERM);  // the launcher died before the request
      }
      ::execve(
          options.executable().c_str(), child_argv.data(), child_envp.data());
      ::_exit(127);  // the forked child only; the caller's process goes on
    }
    if (pid < 0) {
      const int fork_errno = errno;
      signal_all(running, SIGKILL);
      for (const pid_t started : running) {
        ::waitpid(started, nullptr, 0);
      }
      TORCH_CHECK(
          false,
          "remat::distributed::launch_local: cannot start rank ",
          rank,
          ": ",
          std::strerror(fork_errno));
    }
    running.push_back(pid);
  }

  LaunchResult result;
  // After a failure: when the workers still running get SIGKILL.
  bool killing = false;
  auto kill_at = std::chrono::steady_clock::time_point::max();
  int64_t left = nproc;
  while (left > 0) {
    bool reaped = false;
    if (caught_signal != 0 && result.exit_code == 0) {
      const int signal_number = caught_signal;
      result.exit_code = 128 + signal_number;
      result.message = "the launcher received signal " +
          std::to_string(signal_number) + " (" + ::strsignal(signal_number) +
          "); every worker was stopped";
      signal_all(running, SIGTERM);
      killing = true;
      kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    }
    for (int64_t rank = 0; rank < nproc; ++rank) {
      if (running[rank] == 0) {
        continue;
      }
      int status = 0;
      const pid_t done = ::waitpid(running[rank], &status, WNOHANG);
      if (done == 0) {
        continue;
      }
      running[rank] = 0;
      --left;
      reaped = true;
      const bool failed =
          done < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0;
      if (failed && result.exit_code == 0) {
        auto [code, text] = describe_status(rank, done < 0 ? 1 << 8 : status);
        result.exit_code = code;
        result.failed_rank = rank;
        result.message = text;
        signal_all(running, SIGTERM);
        killing = true;
        kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      }
    }
    if (killing && std::chrono::steady_clock::now() >= kill_at) {
      signal_all(running, SIGKILL);
      killing = false;
    }
    if (!reaped && left > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return result;
}

}  // namespace remat::distributed
