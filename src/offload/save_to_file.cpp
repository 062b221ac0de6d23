// save_to_file.cpp: SaveToFile, whose store spills saved CPU tensors to a
// file through one background thread (remat/offload.h).
//
// NOTE: [Spill file]
// One unnamed file per guard (O_TMPFILE, or a name unlinked at once). Space
// is handed out at the end of the file and given back all at once: when the
// last moved tensor is released the file is truncated and reuse starts at
// offset 0. The worker thread runs the jobs in the order they were queued,
// so the read of a tensor always follows its write, and a write into reused
// space follows every older write there. Reads go to fresh tensors of the
// process's allocator with pread(): the bytes read back are allocations like
// any other, counted by MemoryMeter and freed by autograd, rather than pages
// of a mapping outside the allocator's view. A write that fails leaves the
// tensor held in memory, and take() hands that back.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "stores.h"

namespace remat {
namespace detail {
namespace {

/// A tensor's bytes in the spill file.
class FileSlot final : public OffloadSlot,
                       public std::enable_shared_from_this<FileSlot> {
 public:
  // Set by put(), then read-only.
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  at::ScalarType dtype = at::kFloat;
  int64_t nbytes = 0;
  int64_t offset = 0;
  // Guarded by the store's mutex.
  at::Tensor source;   // until written; for good if the write failed
  at::Tensor fetched;  // read back, until taken
  bool written = false;
  bool write_failed = false;
  bool released = false;
  std::string read_error;
};

/// Writes or reads all of `nbytes` at `offset`; returns errno, or 0.
template <typename Io>
int transfer_all(Io io, int fd, char* data, int64_t nbytes, int64_t offset) {
  while (nbytes > 0) {
    const ssize_t done = io(fd, data, static_cast<size_t>(nbytes), offset);
    if (done < 0 && errno == EINTR) {
      continue;
    }
    if (done <= 0) {
      return done < 0 ? errno : EIO;  // 0: end of file before the bytes
    }
    data += done;
    nbytes -= done;
    offset += done;
  }
  return 0;
}

std::string default_directory() {
  const char* tmpdir = std::getenv("TMPDIR");
  return tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/var/tmp";
}

/// Opens an unnamed read-write file in `directory`.
int open_spill_file(const std::string& directory) {
#ifdef O_TMPFILE
  const int fd =
      ::open(directory.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) {
    return fd;
  }
#endif
  std::string name = directory + "/remat-spill-XXXXXX";
  const int named = ::mkstemp(name.data());
  TORCH_CHECK(
      named >= 0,
      "remat::SaveToFile: cannot create a spill file in directory '",
      directory,
      "': ",
      std::strerror(errno));
  ::unlink(name.c_str());
  return named;
}

/// The spill file, its job queue and its counts: the state the worker thread
/// shares with the store (NOTE: [Who ends the worker]).
class SpillFile {
 public:
  SpillFile(int fd, int64_t max_pending_bytes)
      : fd_(fd), max_pending_bytes_(max_pending_bytes) {}
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;
  ~SpillFile() {
    ::close(fd_);
  }

  std::shared_ptr<OffloadSlot> put(const at::Tensor& tensor) {
    auto slot = std::make_shared<FileSlot>();
    // A dense tensor's elements fill [data_ptr, data_ptr + nbytes) whatever
    // its strides, so its bytes go as they are and come back with its strides.
    // A conjugate or negative view's bytes are not its values (the bit is
    // applied lazily): write the values, and they come back as a plain tensor.
    const at::Tensor values = tensor.resolve_conj().resolve_neg();
    slot->source =
        values.is_non_overlapping_and_dense() ? values : values.contiguous();
    slot->sizes = slot->source.sizes().vec();
    slot->strides = slot->source.strides().vec();
    slot->dtype = slot->source.scalar_type();
    slot->nbytes = static_cast<int64_t>(slot->source.nbytes());
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] {
      return pending_bytes_ == 0 ||
             pending_bytes_ + slot->nbytes <= max_pending_bytes_;
    });
    slot->offset = end_;
    end_ += slot->nbytes;
    peak_file_bytes_ = std::max(peak_file_bytes_, end_);
    pending_bytes_ += slot->nbytes;
    ++live_slots_;
    jobs_.push_back({Job::kWrite, slot});
    lock.unlock();
    changed_.notify_all();
    return slot;
  }

  void fetch(FileSlot& slot) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (slot.write_failed) {
      return;  // still in memory
    }
    jobs_.push_back({Job::kRead, slot.shared_from_this()});
    lock.unlock();
    changed_.notify_all();
  }

  at::Tensor take(FileSlot& slot) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] {
      return slot.fetched.defined() || slot.write_failed ||
             !slot.read_error.empty();
    });
    if (slot.write_failed) {
      return slot.source;
    }
    if (!slot.read_error.empty()) {
      std::string error = std::exchange(slot.read_error, std::string());
      TORCH_CHECK(
          false,
          "remat::SaveToFile: cannot read back a saved tensor of ",
          slot.nbytes,
          " bytes at offset ",
          slot.offset,
          " of the spill file: ",
          error);
    }
    return std::exchange(slot.fetched, at::Tensor());
  }

  void release(FileSlot& slot) {
    // Dropped after the lock: a saved tensor can hold a graph whose saved
    // variables release other slots of this file.
    at::Tensor fetched;
    at::Tensor source;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      slot.released = true;
      fetched = std::exchange(slot.fetched, at::Tensor());
      if (slot.written || slot.write_failed) {
        source = std::exchange(slot.source, at::Tensor());
      }  // else the queued write drops it without writing
      if (--live_slots_ == 0) {
        end_ = 0;  // NOTE: [Spill file]
        jobs_.push_back({Job::kTruncate, nullptr});
        changed_.notify_all();
      }
    }
  }

  void add_stats(OffloadStats& stats) const {
    std::lock_guard<std::mutex> lock(mutex_);
    stats.write_failures = write_failures_;
    stats.peak_file_bytes = peak_file_bytes_;
  }

  /// Asks work() to return once the queue is empty.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
  }

  /// The worker thread: runs the jobs in order until stop() and an empty
  /// queue.
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      changed_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) {
        return;  // stopping, nothing left
      }
      Job job = std::move(jobs_.front());
      jobs_.pop_front();
      switch (job.kind) {
        case Job::kWrite:
          write(*job.slot, lock);
          break;
        case Job::kRead:
          read(*job.slot, lock);
          break;
        case Job::kTruncate:
          if (live_slots_ == 0 && ::ftruncate(fd_, 0) != 0) {
            // Only disk space is lost; the next writes still land correctly.
          }
          break;
      }
      changed_.notify_all();
      // The job may hold the last reference to its slot, whose tensors may
      // hold a graph: dropped outside the lock.
      lock.unlock();
      job = Job{};
      lock.lock();
    }
  }

 private:
  struct Job {
    enum Kind { kWrite, kRead, kTruncate } kind = kTruncate;
    std::shared_ptr<FileSlot> slot;
  };

  void write(FileSlot& slot, std::unique_lock<std::mutex>& lock) {
    at::Tensor source = slot.source;  // kept alive while unlocked
    int error = 0;
    if (!slot.released) {
      lock.unlock();
      error = transfer_all(
          ::pwrite,
          fd_,
          static_cast<char*>(source.data_ptr()),
          slot.nbytes,
          slot.offset);
      lock.lock();
    }
    pending_bytes_ -= slot.nbytes;
    if (error != 0) {
      slot.write_failed = true;  // keeps slot.source
      ++write_failures_;
      return;
    }
    slot.written = true;
    slot.source = at::Tensor();  // the memory goes back to the allocator
    lock.unlock();
    source = at::Tensor();  // frees outside the lock
    lock.lock();
  }

  void read(FileSlot& slot, std::unique_lock<std::mutex>& lock) {
    if (slot.released || slot.write_failed) {
      return;
    }
    lock.unlock();
    at::Tensor tensor = at::empty_strided(
        slot.sizes, slot.strides, at::TensorOptions().dtype(slot.dtype));
    const int error = transfer_all(
        ::pread,
        fd_,
        static_cast<char*>(tensor.data_ptr()),
        slot.nbytes,
        slot.offset);
    lock.lock();
    if (error != 0) {
      slot.read_error = std::strerror(error);
    } else {
      slot.fetched = std::move(tensor);
    }
  }

  const int fd_;
  const int64_t max_pending_bytes_;
  mutable std::mutex mutex_;  // guards what follows and every slot's state
  std::condition_variable changed_;
  std::deque<Job> jobs_;
  bool stopping_ = false;
  int64_t end_ = 0;            // where the next tensor goes in the file
  int64_t pending_bytes_ = 0;  // queued for writing, not written yet
  int64_t live_slots_ = 0;
  int64_t peak_file_bytes_ = 0;
  int64_t write_failures_ = 0;
};

// NOTE: [Who ends the worker]
// The last reference to the store can go on any thread: the guard's, the
// thread of a backward, or the worker itself, when a saved tensor it drops
// after writing it was the last owner of the graph that held the store (a
// forward left by an exception, a loss never backpropagated). A thread
// cannot join itself, so the worker owns the spill file too: the store's
// destructor asks it to stop and joins it, except on the worker itself,
// which it detaches; the worker then finishes its queue and its reference
// to the file is the last.
class FileStore final : public OffloadStore {
 public:
  explicit FileStore(const SaveToFileOptions& options)
      : file_(std::make_shared<SpillFile>(
            open_spill_file(
                options.directory().empty() ? default_directory()
                                            : options.directory()),
            options.max_pending_bytes())),
        worker_([file = file_] {
          // A write past RLIMIT_FSIZE must fail with EFBIG (a write failure,
          // the tensor stays in memory), not kill the process with SIGXFSZ.
          sigset_t blocked;
          sigemptyset(&blocked);
          sigaddset(&blocked, SIGXFSZ);
          pthread_sigmask(SIG_BLOCK, &blocked, nullptr);
          file->work();
        }) {}

  ~FileStore() override {
    file_->stop();
    if (worker_.get_id() == std::this_thread::get_id()) {
      worker_.detach();
    } else {
      worker_.join();
    }
  }

  bool moves(const at::Tensor& tensor) const override {
    return tensor.device().is_cpu() && tensor.layout() == at::kStrided;
  }
  std::shared_ptr<OffloadSlot> put(const at::Tensor& tensor) override {
    return file_->put(tensor);
  }
  void fetch(OffloadSlot& slot) override {
    file_->fetch(static_cast<FileSlot&>(slot));
  }
  at::Tensor take(OffloadSlot& slot) override {
    return file_->take(static_cast<FileSlot&>(slot));
  }
  void release(OffloadSlot& slot) override {
    file_->release(static_cast<FileSlot&>(slot));
  }
  void add_stats(OffloadStats& stats) const override {
    file_->add_stats(stats);
  }

 private:
  std::shared_ptr<SpillFile> file_;
  std::thread worker_;  // last: starts once the file is ready
};

}  // namespace
}  // namespace detail

SaveToFile::SaveToFile(SaveToFileOptions options) {
  detail::check_not_negative("SaveToFile", "prefetch", options.prefetch());
  detail::check_not_negative("SaveToFile", "min_bytes", options.min_bytes());
  TORCH_CHECK(
      options.max_pending_bytes() > 0,
      "remat::SaveToFile: expected max_pending_bytes > 0, got ",
      options.max_pending_bytes());
  offloader_ = std::make_shared<detail::Offloader>(
      "remat::SaveToFile",
      std::make_unique<detail::FileStore>(options),
      options.prefetch(),
      options.min_bytes());
  hooks_ = detail::offload_hooks(offloader_);
}

SaveToFile::~SaveToFile() = default;

OffloadStats SaveToFile::stats() const {
  return offloader_->stats();
}

}  // namespace remat
