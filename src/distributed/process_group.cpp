// process_group.cpp: ProcessGroup, Work and what goes with them: options
// from the environment, a free port, this rank's slice of a batch,
// broadcasting parameters (remat/distributed/process_group.h), on c10d's
// TCPStore and Gloo backend.
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
#include "remat/distributed/process_group.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <sstream>
#include <utility>

#include <c10/util/Exception.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "compat/compat.h"

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

/// The longest timeout a group accepts (NOTE in check_group_options).
constexpr std::chrono::milliseconds kLongestTimeout =
    std::chrono::hours(24 * 365 * 100);

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
  // c10d adds the timeout to steady_clock::now() in nanoseconds: beyond
  // about 290 years (milliseconds::max(), say) that overflows into the past
  // and every rendezvous fails at once, reported as a port in use.
  TORCH_CHECK(
      options.timeout() <= kLongestTimeout,
      kWho,
      ": expected a timeout of at most 100 years (",
      kLongestTimeout.count(),
      " ms), got ",
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
      text == nullptr ? " is not set" : " is empty",
      " (expected RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, "
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
  // As group_options_from_env reads it: an empty WORLD_SIZE names none.
  const char* world_size = std::getenv("WORLD_SIZE");
  return world_size != nullptr && *world_size != '\0';
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
      global.dim() >= 1,
      "remat::distributed::local_slice: expected a batch (a tensor of at "
      "least one dimension), got a 0-dimensional tensor");
  TORCH_CHECK(
      global.size(0) % group.world_size() == 0,
      "remat::distributed::local_slice: expected a batch whose size divides "
      "by the world size ",
      group.world_size(),
      ", got ",
      global.size(0),
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

}  // namespace remat::distributed
