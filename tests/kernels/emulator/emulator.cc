// The emulator's runtime: fibers, the block scheduler, the synchronisation primitives and the
// checkers (emulator.h says what each does). This file is compiled with AddressSanitizer but
// without the load/store hooks, so only the kernel code's own accesses are tracked.
#include "emulator.h"

#include <absl/container/flat_hash_map.h>
#include <absl/container/inlined_vector.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#include <sys/mman.h>

#include <algorithm>
#include <boost/context/detail/fcontext.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>

namespace tost::emu {
namespace {

namespace fctx = boost::context::detail;

constexpr int kWarpSize = 32;
constexpr int kMaxBlockThreads = 1024;
constexpr unsigned kMaxGridX = 2147483647u;
constexpr unsigned kMaxGridYZ = 65535u;
constexpr unsigned kMaxBlockZ = 64u;
constexpr size_t kMaxDynamicSharedBytes = 48 * 1024;  // without cudaFuncSetAttribute opt-in
// ASan-instrumented frames keep every per-thread array of the kernels (up to 32 channels per
// thread) with redzones; 256 KiB leaves a wide margin. Stacks are mapped once and reused.
constexpr size_t kFiberStackBytes = 256 * 1024;
// Tracking granularity: the smallest element the kernels access (half, bfloat16), so two threads
// writing the two halves of one 32-bit word are not a race.
constexpr uintptr_t kUnitBytes = 2;

enum class Wait { kRunnable, kBarrier, kWarp, kDone };

struct Fiber {
  int index = 0;  // linear thread index in the block; lane = index % 32, warp = index / 32
  uint3 tid{};
  fctx::fcontext_t context = nullptr;
  char* stack = nullptr;
  Wait wait = Wait::kRunnable;
  uint32_t clock[kWarpSize];  // vector clock over the lanes of the warp
  uint32_t shuffle_result = 0;
};

// A warp-level rendezvous in progress: a shuffle or __syncwarp of `mask`.
struct WarpCollective {
  bool open = false;
  bool shuffle = false;
  unsigned mask = 0;
  int line = 0;
  unsigned arrived = 0;
  uint32_t value[kWarpSize];
  int lane_mask[kWarpSize];
  int width[kWarpSize];
};

// One earlier access to a unit, within the current barrier interval of the current block.
struct Access {
  int thread;
  uint32_t clock;  // the thread's own clock component when it accessed
  uintptr_t pc;
};

struct InBlockShadow {
  uint64_t block_seq = ~uint64_t{0};
  uint32_t generation = 0;
  bool has_write = false;
  Access write{};
  absl::InlinedVector<Access, 2> readers;
};

struct GlobalShadow {
  InBlockShadow in_block;
  int64_t writer_block = -1;
  int64_t reader_block = -1;  // -2: read by several blocks
};

struct CarvedBuffer {
  char* begin;
  size_t bytes;
  std::string name;
  std::vector<uint8_t> written;  // per unit
};

struct Block {
  uint3 idx{};
  int64_t linear = 0;
  uint64_t seq = 0;
  int threads = 0;
  int live = 0;
  int at_barrier = 0;
  int barrier_line = 0;
  uint32_t generation = 0;
  std::vector<Fiber> fibers;
  std::vector<int> runnable;
  std::vector<WarpCollective> warps;
  std::vector<InBlockShadow> shared_shadow;  // per unit of shared memory
  std::vector<uint8_t> shared_written;       // per unit
};

struct Launch {
  std::string_view kernel;
  dim3 grid, block;
  size_t shared_bytes = 0;
  const std::function<void()>* body = nullptr;
  Block* current_block = nullptr;
  Fiber* current = nullptr;
  fctx::fcontext_t scheduler = nullptr;
  const void* main_stack_bottom = nullptr;
  size_t main_stack_size = 0;
  char* shared = nullptr;
  absl::flat_hash_map<uintptr_t, GlobalShadow> global;
  std::vector<int> barrier_lines;  // distinct __syncthreads lines, in the order first reached
  std::vector<std::string> reports;
  size_t kept_by_kind[6] = {};
  // One memory access may span several units: it is reported once per kind.
  uint64_t access_serial = 0;  // 0 outside OnAccess
  uint64_t reported_serial[6] = {};
  size_t dropped_reports = 0;
  bool abandoned = false;  // a deadlock ended the launch
  std::mt19937_64 rng;
};

// Process-wide state. Launches are serialised by g_launch_mutex; the hooks read g_launch only on
// the launching thread (kernel code runs nowhere else).
std::mutex g_launch_mutex;
Options g_options;
Faults g_faults;
Counters g_counters;
Launch* g_launch = nullptr;
std::string g_last_report;
std::vector<std::string> g_all_reports;
std::vector<CarvedBuffer> g_carved;
char* g_stacks = nullptr;  // kMaxBlockThreads fiber stacks
alignas(16) char g_shared[kMaxDynamicSharedBytes];

bool Matches(const std::string& pattern, std::string_view kernel) {
  return !pattern.empty() && kernel.find(pattern) != std::string_view::npos;
}

std::string Where(uintptr_t pc) {
  if (pc == 0) return "?";
  char buf[512];
  __sanitizer_symbolize_pc(reinterpret_cast<void*>(pc), "%s:%l", buf, sizeof buf);
  std::string_view s = buf;
  const size_t slash = s.rfind('/');
  if (slash != std::string_view::npos) s.remove_prefix(slash + 1);
  return std::string(s);
}

std::string Dim(uint3 v) { return absl::StrFormat("(%u,%u,%u)", v.x, v.y, v.z); }

// What a report is about: each kind keeps its own first max_reports, so a flood of one kind (say
// uninitialised reads) never hides another (the race behind them).
enum class Kind { kRace, kUninitialised, kWarp, kShuffleSource, kBarrier, kBounds, kCount };

void Report(Kind kind, std::string text) {
  Launch& l = *g_launch;
  const int k = static_cast<int>(kind);
  if (l.access_serial != 0) {
    if (l.reported_serial[k] == l.access_serial) return;
    l.reported_serial[k] = l.access_serial;
  }
  size_t& kept = l.kept_by_kind[k];
  if (kept >= g_options.max_reports) {
    ++l.dropped_reports;
    return;
  }
  ++kept;
  l.reports.push_back(absl::StrCat(std::string(l.kernel), ": ", text));
}

// Report prefix naming the block and the current thread.
std::string At() {
  Launch& l = *g_launch;
  std::string s = absl::StrCat("block ", Dim(l.current_block->idx));
  if (l.current != nullptr) absl::StrAppend(&s, " thread ", Dim(l.current->tid));
  return s;
}

uint3 ThreadOf(const Block& b, int index) { return b.fibers[static_cast<size_t>(index)].tid; }

// -- Fibers ---------------------------------------------------------------------------------------

void YieldToScheduler(bool finished) {
  Launch& l = *g_launch;
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(finished ? nullptr : &fake_stack, l.main_stack_bottom,
                                 l.main_stack_size);
  const fctx::transfer_t t = fctx::jump_fcontext(l.scheduler, nullptr);
  __sanitizer_finish_switch_fiber(fake_stack, &l.main_stack_bottom, &l.main_stack_size);
  g_launch->scheduler = t.fctx;
}

void FiberMain(fctx::transfer_t t) {
  Launch& l = *static_cast<Launch*>(t.data);
  l.scheduler = t.fctx;
  __sanitizer_finish_switch_fiber(nullptr, &l.main_stack_bottom, &l.main_stack_size);
  (*l.body)();
  l.current->wait = Wait::kDone;
  YieldToScheduler(/*finished=*/true);
  std::abort();  // a finished fiber is never resumed
}

void SwitchTo(Fiber& f) {
  Launch& l = *g_launch;
  l.current = &f;
  ++g_counters.fiber_switches;
  void* fake_stack = nullptr;
  __sanitizer_start_switch_fiber(&fake_stack, f.stack, kFiberStackBytes);
  const fctx::transfer_t t = fctx::jump_fcontext(f.context, &l);
  __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
  f.context = t.fctx;
  l.current = nullptr;
}

char* FiberStack(int index) {
  if (g_stacks == nullptr) {
    void* p = mmap(nullptr, kFiberStackBytes * kMaxBlockThreads, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::perror("emulator: mmap of the fiber stacks");
      std::abort();
    }
    g_stacks = static_cast<char*>(p);
  }
  return g_stacks + static_cast<size_t>(index) * kFiberStackBytes;
}

// -- Synchronisation ------------------------------------------------------------------------------

void ReleaseBarrier(Block& b) {
  ++b.generation;
  b.at_barrier = 0;
  for (Fiber& f : b.fibers) {
    if (f.wait == Wait::kBarrier) {
      f.wait = Wait::kRunnable;
      b.runnable.push_back(f.index);
    }
  }
}

void CompleteWarp(Block& b, int warp) {
  WarpCollective& c = b.warps[static_cast<size_t>(warp)];
  const int base = warp * kWarpSize;
  uint32_t joined[kWarpSize] = {};
  for (int lane = 0; lane < kWarpSize; ++lane) {
    if (!(c.arrived >> lane & 1u)) continue;
    const Fiber& f = b.fibers[static_cast<size_t>(base + lane)];
    for (int j = 0; j < kWarpSize; ++j) joined[j] = std::max(joined[j], f.clock[j]);
  }
  for (int lane = 0; lane < kWarpSize; ++lane) {
    if (!(c.arrived >> lane & 1u)) continue;
    Fiber& f = b.fibers[static_cast<size_t>(base + lane)];
    if (c.shuffle) {
      const int width = c.width[lane];
      const int segment = lane / width * width;
      int src = lane ^ c.lane_mask[lane];
      if (src < segment || src >= segment + width) src = lane;  // outside the segment: own value
      if (!(c.mask >> src & 1u)) {
        g_launch->current = &f;
        Report(Kind::kShuffleSource, absl::StrFormat("%s: __shfl_xor_sync (line %d) reads lane %d, "
                                                     "outside the mask 0x%08x (undefined on "
                                                     "the device)",
                                                     At(), c.line, src, c.mask));
        g_launch->current = nullptr;
        f.shuffle_result = c.value[lane];
      } else {
        f.shuffle_result = c.value[src];
      }
    }
    std::copy(joined, joined + kWarpSize, f.clock);
    ++f.clock[lane];
    f.wait = Wait::kRunnable;
    b.runnable.push_back(f.index);
  }
  c.open = false;
  c.arrived = 0;
}

// A shuffle or __syncwarp by the current fiber: joins the warp's rendezvous and waits for every
// lane of the mask.
uint32_t WarpRendezvous(bool shuffle, unsigned mask, uint32_t value, int lane_mask, int width,
                        int line) {
  Launch& l = *g_launch;
  Block& b = *l.current_block;
  Fiber& f = *l.current;
  const int lane = f.index % kWarpSize;
  const int warp = f.index / kWarpSize;
  const char* what = shuffle ? "__shfl_xor_sync" : "__syncwarp";
  if (Matches(g_faults.drop_lane_kernel, l.kernel)) mask &= ~(1u << g_faults.drop_lane);
  if (!(mask >> lane & 1u)) {
    Report(Kind::kWarp,
           absl::StrFormat("%s: %s (line %d) by lane %d whose mask 0x%08x does not include it",
                           At(), what, line, lane, mask));
    return value;
  }
  const int lanes_in_warp = std::min(kWarpSize, b.threads - warp * kWarpSize);
  const unsigned existing = lanes_in_warp == kWarpSize ? ~0u : (1u << lanes_in_warp) - 1;
  if ((mask & ~existing) != 0) {
    Report(Kind::kWarp,
           absl::StrFormat("%s: %s (line %d) mask 0x%08x names lanes the block does not have", At(),
                           what, line, mask));
    mask &= existing;
  }
  if (shuffle && (width < 1 || width > kWarpSize || (width & (width - 1)) != 0)) {
    Report(Kind::kWarp,
           absl::StrFormat("%s: __shfl_xor_sync (line %d) width %d is not a power of two <= 32",
                           At(), line, width));
    width = kWarpSize;
  }
  WarpCollective& c = b.warps[static_cast<size_t>(warp)];
  if (!c.open) {
    c.open = true;
    c.shuffle = shuffle;
    c.mask = mask;
    c.line = line;
    c.arrived = 0;
  } else if (c.shuffle != shuffle || c.mask != mask) {
    Report(Kind::kWarp,
           absl::StrFormat("%s: %s (line %d) with mask 0x%08x meets %s (line %d) with mask 0x%08x "
                           "in the same warp",
                           At(), what, line, mask, c.shuffle ? "__shfl_xor_sync" : "__syncwarp",
                           c.line, c.mask));
  }
  c.arrived |= 1u << lane;
  c.value[lane] = value;
  c.lane_mask[lane] = lane_mask;
  c.width[lane] = width;
  f.wait = Wait::kWarp;
  if ((c.arrived & c.mask) == c.mask) CompleteWarp(b, warp);
  YieldToScheduler(false);
  return f.shuffle_result;
}

// -- Memory checks --------------------------------------------------------------------------------

bool Ordered(const Fiber& f, const Access& earlier) {
  if (earlier.thread == f.index) return true;
  if (earlier.thread / kWarpSize != f.index / kWarpSize) return false;
  return f.clock[earlier.thread % kWarpSize] >= earlier.clock;
}

void CheckInBlock(InBlockShadow& s, const std::string& where, bool write, uintptr_t pc) {
  Launch& l = *g_launch;
  Block& b = *l.current_block;
  const Fiber& f = *l.current;
  if (s.block_seq != b.seq || s.generation != b.generation) {
    // Another block, or a barrier since: everything before is ordered.
    s.block_seq = b.seq;
    s.generation = b.generation;
    s.has_write = false;
    s.readers.clear();
  }
  const Access me{f.index, f.clock[f.index % kWarpSize], pc};
  if (s.has_write && !Ordered(f, s.write)) {
    Report(Kind::kRace,
           absl::StrFormat("race: %s %s %s (%s); written by thread %s (%s) with no barrier or warp "
                           "synchronisation between them",
                           At(), write ? "writes" : "reads", where, Where(pc),
                           Dim(ThreadOf(b, s.write.thread)), Where(s.write.pc)));
  }
  if (write) {
    for (const Access& r : s.readers) {
      if (!Ordered(f, r)) {
        Report(Kind::kRace,
               absl::StrFormat("race: %s writes %s (%s); read by thread %s (%s) with no barrier or "
                               "warp synchronisation between them",
                               At(), where, Where(pc), Dim(ThreadOf(b, r.thread)), Where(r.pc)));
        break;
      }
    }
    s.readers.clear();
    s.has_write = true;
    s.write = me;
  } else {
    for (Access& r : s.readers) {
      if (r.thread == me.thread) {
        r = me;
        return;
      }
    }
    s.readers.push_back(me);
  }
}

void CheckAcrossBlocks(GlobalShadow& s, const std::string& where, bool write, uintptr_t pc) {
  const Block& b = *g_launch->current_block;
  if (s.writer_block >= 0 && s.writer_block != b.linear) {
    Report(Kind::kRace,
           absl::StrFormat("race: %s %s %s (%s), which block %d of the same launch writes", At(),
                           write ? "writes" : "reads", where, Where(pc), s.writer_block));
  } else if (write &&
             (s.reader_block == -2 || (s.reader_block >= 0 && s.reader_block != b.linear))) {
    Report(Kind::kRace,
           absl::StrFormat("race: %s writes %s (%s), which another block of the same launch reads",
                           At(), where, Where(pc)));
  }
  if (write) {
    s.writer_block = b.linear;
  } else if (s.reader_block == -1) {
    s.reader_block = b.linear;
  } else if (s.reader_block != b.linear) {
    s.reader_block = -2;
  }
}

void OnAccess(const void* addr, size_t size, bool write, uintptr_t pc) {
  Launch* l = g_launch;
  if (l == nullptr || l->current == nullptr) return;  // host code of the kernel file
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  const Fiber& f = *l->current;
  const uintptr_t stack = reinterpret_cast<uintptr_t>(f.stack);
  if (a >= stack && a < stack + kFiberStackBytes) return;  // the thread's own registers
  ++g_counters.tracked_accesses;
  l->access_serial = g_counters.tracked_accesses;
  struct EndAccess {
    Launch* l;
    ~EndAccess() { l->access_serial = 0; }
  } end_access{l};
  Block& b = *l->current_block;
  const uintptr_t shared = reinterpret_cast<uintptr_t>(l->shared);
  if (a >= shared && a < shared + sizeof g_shared) {
    for (uintptr_t u = (a - shared) / kUnitBytes; u <= (a - shared + size - 1) / kUnitBytes; ++u) {
      const std::string where = absl::StrFormat("shared[+%#x]", u * kUnitBytes);
      if (u >= b.shared_written.size()) continue;  // beyond the dynamic size: ASan's business
      if (!write && !b.shared_written[u]) {
        Report(Kind::kUninitialised,
               absl::StrFormat("uninitialised read: %s reads %s (%s), never written in this block",
                               At(), where, Where(pc)));
      }
      if (write) b.shared_written[u] = 1;
      CheckInBlock(b.shared_shadow[u], where, write, pc);
    }
    return;
  }
  CarvedBuffer* buffer = nullptr;
  for (CarvedBuffer& c : g_carved) {
    if (a >= reinterpret_cast<uintptr_t>(c.begin) &&
        a < reinterpret_cast<uintptr_t>(c.begin) + c.bytes) {
      buffer = &c;
      break;
    }
  }
  for (uintptr_t u = a / kUnitBytes; u <= (a + size - 1) / kUnitBytes; ++u) {
    std::string where;
    if (buffer != nullptr) {
      const size_t unit = u - reinterpret_cast<uintptr_t>(buffer->begin) / kUnitBytes;
      where = absl::StrFormat("workspace %s[+%#x]", buffer->name, unit * kUnitBytes);
      if (unit < buffer->written.size()) {
        if (!write && !buffer->written[unit]) {
          Report(Kind::kUninitialised,
                 absl::StrFormat("uninitialised read: %s reads %s (%s), never written since the "
                                 "workspace was carved",
                                 At(), where, Where(pc)));
        }
        if (write) buffer->written[unit] = 1;
      }
    } else {
      where = absl::StrFormat("global %#x", u * kUnitBytes);
    }
    GlobalShadow& s = l->global[u];
    CheckInBlock(s.in_block, where, write, pc);
    CheckAcrossBlocks(s, where, write, pc);
  }
}

// -- Blocks ---------------------------------------------------------------------------------------

void ReportDeadlock(Block& b) {
  for (size_t w = 0; w < b.warps.size(); ++w) {
    const WarpCollective& c = b.warps[w];
    if (!c.open) continue;
    unsigned missing = c.mask & ~c.arrived;
    Report(
        Kind::kWarp,
        absl::StrFormat(
            "block %s warp %d: lanes 0x%08x wait at %s (line %d, mask 0x%08x); lanes 0x%08x never "
            "arrive",
            Dim(b.idx), w, c.arrived, c.shuffle ? "__shfl_xor_sync" : "__syncwarp", c.line, c.mask,
            missing));
  }
  if (b.at_barrier > 0) {
    Report(Kind::kBarrier, absl::StrFormat("block %s: %d of %d live threads wait at __syncthreads "
                                           "(line %d); the others never reach it",
                                           Dim(b.idx), b.at_barrier, b.live, b.barrier_line));
  }
}

void RunBlock(Launch& l, Block& b) {
  const dim3 bd = l.block;
  b.threads = static_cast<int>(bd.x * bd.y * bd.z);
  b.live = b.threads;
  b.at_barrier = 0;
  b.generation = 0;
  b.fibers.assign(static_cast<size_t>(b.threads), Fiber{});
  b.warps.assign(static_cast<size_t>((b.threads + kWarpSize - 1) / kWarpSize), WarpCollective{});
  b.runnable.clear();
  const size_t units = (l.shared_bytes + kUnitBytes - 1) / kUnitBytes;
  b.shared_written.assign(units, 0);
  if (b.shared_shadow.size() < units) b.shared_shadow.resize(units);
  // Fresh shared memory holds garbage on a device; poison the bytes beyond the dynamic size.
  ASAN_UNPOISON_MEMORY_REGION(g_shared, sizeof g_shared);
  ASAN_POISON_MEMORY_REGION(g_shared + l.shared_bytes, sizeof g_shared - l.shared_bytes);
  for (int i = 0; i < b.threads; ++i) {
    Fiber& f = b.fibers[static_cast<size_t>(i)];
    f.index = i;
    f.tid = uint3{static_cast<unsigned>(i) % bd.x, static_cast<unsigned>(i) / bd.x % bd.y,
                  static_cast<unsigned>(i) / (bd.x * bd.y)};
    std::fill(f.clock, f.clock + kWarpSize, 0u);
    f.clock[i % kWarpSize] = 1;
    f.stack = FiberStack(i);
    ASAN_UNPOISON_MEMORY_REGION(f.stack, kFiberStackBytes);
    f.context = fctx::make_fcontext(f.stack + kFiberStackBytes, kFiberStackBytes, &FiberMain);
    b.runnable.push_back(i);
  }
  g_counters.threads += static_cast<uint64_t>(b.threads);
  ++g_counters.blocks;
  l.current_block = &b;
  while (b.live > 0) {
    if (b.runnable.empty()) {
      ReportDeadlock(b);
      l.abandoned = true;
      break;
    }
    const size_t pick = std::uniform_int_distribution<size_t>(0, b.runnable.size() - 1)(l.rng);
    const int index = b.runnable[pick];
    b.runnable[pick] = b.runnable.back();
    b.runnable.pop_back();
    Fiber& f = b.fibers[static_cast<size_t>(index)];
    SwitchTo(f);
    if (f.wait == Wait::kDone) {
      --b.live;
      if (b.at_barrier > 0 && b.at_barrier == b.live) {
        l.current = &f;
        Report(Kind::kBarrier,
               absl::StrFormat(
                   "%s exited without reaching the __syncthreads (line %d) that %d threads wait at",
                   At(), b.barrier_line, b.at_barrier));
        l.current = nullptr;
        ReleaseBarrier(b);
      }
    }
  }
  l.current_block = nullptr;
}

const char* RefusalError(Launch& l, int max_threads, std::string* why) {
  const dim3 g = l.grid, bd = l.block;
  const long long threads = static_cast<long long>(bd.x) * bd.y * bd.z;
  if (g.x == 0 || g.y == 0 || g.z == 0 || bd.x == 0 || bd.y == 0 || bd.z == 0) {
    *why = "a grid or block dimension is 0";
    return "cudaErrorInvalidConfiguration";
  }
  if (g.x > kMaxGridX || g.y > kMaxGridYZ || g.z > kMaxGridYZ) {
    *why = absl::StrFormat("grid (%u,%u,%u) exceeds the device limits (2^31-1, 65535, 65535)", g.x,
                           g.y, g.z);
    return "cudaErrorInvalidConfiguration";
  }
  if (threads > kMaxBlockThreads || bd.z > kMaxBlockZ) {
    *why = absl::StrFormat("block (%u,%u,%u) exceeds the device limit of 1024 threads", bd.x, bd.y,
                           bd.z);
    return "cudaErrorInvalidConfiguration";
  }
  if (threads > max_threads) {
    *why = absl::StrFormat("block of %lld threads exceeds the kernel's launch bound of %d", threads,
                           max_threads);
    return "cudaErrorLaunchOutOfResources";
  }
  if (l.shared_bytes > kMaxDynamicSharedBytes) {
    *why = absl::StrFormat(
        "%zu bytes of dynamic shared memory exceed the 48 KiB a kernel gets without opt-in",
        l.shared_bytes);
    return "cudaErrorInvalidValue";
  }
  return nullptr;
}

cudaError_t ErrorFromName(const char* name) {
  const std::string_view n = name;
  if (n == "cudaErrorInvalidConfiguration") return cudaErrorInvalidConfiguration;
  if (n == "cudaErrorLaunchOutOfResources") return cudaErrorLaunchOutOfResources;
  return cudaErrorInvalidValue;
}

void OnAsanReport(const char* text) {
  Launch* l = g_launch;
  if (l == nullptr || l->current == nullptr) {
    // Outside emulated kernel code an ASan report is fatal, as without the emulator.
    std::fprintf(stderr, "emulator: AddressSanitizer report outside kernel code: aborting\n");
    std::abort();
  }
  std::string_view t = text;
  const size_t summary = t.find("SUMMARY: ");
  std::string_view line = summary == std::string_view::npos ? t.substr(0, 200) : t.substr(summary);
  line = line.substr(0, line.find('\n'));
  Report(Kind::kBounds, absl::StrCat("out of bounds: ", At(), ": ", std::string(line)));
}

}  // namespace

// -- Public API -----------------------------------------------------------------------------------

void SetOptions(const Options& options) {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  g_options = options;
}
Options GetOptions() {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  return g_options;
}
void SetFaults(const Faults& faults) {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  g_faults = faults;
}
std::string LastLaunchReport() {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  return g_last_report;
}
std::vector<std::string> TakeReports() {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  return std::exchange(g_all_reports, {});
}
Counters GetCounters() {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  return g_counters;
}
const char* ErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorLaunchOutOfResources:
      return "cudaErrorLaunchOutOfResources";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    default:
      return "cudaError (other)";
  }
}

void RegisterWorkspace(void* base, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  g_carved.clear();
  ASAN_POISON_MEMORY_REGION(base, bytes);
}

void* WorkspaceBuffer(void* p, size_t bytes, const char* name) {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  if (g_faults.shrink_workspace_buffer == name && bytes >= sizeof(float)) bytes -= sizeof(float);
  ASAN_UNPOISON_MEMORY_REGION(p, bytes);
  g_carved.push_back(CarvedBuffer{static_cast<char*>(p), bytes, name,
                                  std::vector<uint8_t>((bytes + kUnitBytes - 1) / kUnitBytes, 0)});
  return p;
}

cudaError_t RunKernel(std::string_view kernel, int max_threads, dim3 grid, dim3 block,
                      size_t shared_bytes, const std::function<void()>& body) {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  static const bool callback_installed = [] {
    __asan_set_error_report_callback(&OnAsanReport);
    return true;
  }();
  (void)callback_installed;
  Launch l;
  l.kernel = kernel;
  l.grid = grid;
  l.block = block;
  if (Matches(g_faults.widen_block_kernel, kernel)) l.block.x *= g_faults.widen_block_factor;
  l.shared_bytes = shared_bytes;
  l.body = &body;
  l.shared = g_shared;
  l.rng.seed(g_options.seed * 0x9e3779b97f4a7c15ull + g_counters.launches);
  ++g_counters.launches;
  g_last_report.clear();

  std::string why;
  if (const char* error = RefusalError(l, max_threads, &why)) {
    g_last_report = absl::StrCat(std::string(kernel), ": launch refused (", error, "): ", why);
    g_all_reports.push_back(g_last_report);
    return ErrorFromName(error);
  }

  g_launch = &l;
  const int64_t blocks = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  std::vector<int64_t> order(static_cast<size_t>(blocks));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), l.rng);
  auto block_state = std::make_unique<Block>();
  uint64_t seq = 0;
  for (const int64_t linear : order) {
    Block& b = *block_state;
    b.linear = linear;
    b.seq = seq++;
    b.idx = uint3{static_cast<unsigned>(linear % grid.x),
                  static_cast<unsigned>(linear / grid.x % grid.y),
                  static_cast<unsigned>(linear / (static_cast<int64_t>(grid.x) * grid.y))};
    RunBlock(l, b);
    if (l.abandoned) break;
  }
  g_launch = nullptr;
  if (l.reports.empty()) return cudaSuccess;
  for (const std::string& r : l.reports) {
    absl::StrAppend(&g_last_report, g_last_report.empty() ? "" : "\n", r);
    g_all_reports.push_back(r);
  }
  if (l.dropped_reports > 0) {
    absl::StrAppend(&g_last_report, "\n(", l.dropped_reports, " more reports not shown)");
  }
  return cudaErrorLaunchFailure;
}

uint3 ThreadIdx() { return g_launch->current->tid; }
uint3 BlockIdx() { return g_launch->current_block->idx; }
dim3 BlockDim() { return g_launch->block; }
dim3 GridDim() { return g_launch->grid; }
void* DynamicSharedMemory() { return g_launch->shared; }

void SyncThreads(int line) {
  Launch& l = *g_launch;
  Block& b = *l.current_block;
  auto known = std::find(l.barrier_lines.begin(), l.barrier_lines.end(), line);
  if (known == l.barrier_lines.end()) known = l.barrier_lines.insert(known, line);
  const int ordinal = static_cast<int>(known - l.barrier_lines.begin()) + 1;
  if (Matches(g_faults.skip_barrier_kernel, l.kernel) && ordinal == g_faults.skip_barrier_ordinal) {
    return;
  }
  if (b.at_barrier == 0) {
    b.barrier_line = line;
  } else if (line != b.barrier_line) {
    Report(Kind::kBarrier,
           absl::StrFormat("%s waits at __syncthreads (line %d) while %d threads wait at line %d",
                           At(), line, b.at_barrier, b.barrier_line));
  }
  l.current->wait = Wait::kBarrier;
  if (++b.at_barrier == b.live) {
    if (b.live < b.threads) {
      Report(Kind::kBarrier,
             absl::StrFormat("block %s: %d threads exited without reaching the __syncthreads "
                             "(line %d) the other %d wait at",
                             Dim(b.idx), b.threads - b.live, line, b.at_barrier));
    }
    ReleaseBarrier(b);
  }
  YieldToScheduler(false);
}

void SyncWarp(unsigned mask, int line) { WarpRendezvous(false, mask, 0, 0, kWarpSize, line); }

uint32_t ShuffleXor(unsigned mask, uint32_t value, int lane_mask, int width, int line) {
  return WarpRendezvous(true, mask, value, lane_mask, width, line);
}

}  // namespace tost::emu

// The load/store hooks of -fsanitize-coverage=trace-loads,trace-stores, called by every access of
// the kernel file.
#define TOST_EMU_HOOK(kind, bytes, type, is_write)                                 \
  extern "C" void __sanitizer_cov_##kind##bytes(type* addr) {                      \
    tost::emu::OnAccess(addr, bytes, is_write,                                     \
                        reinterpret_cast<uintptr_t>(__builtin_return_address(0))); \
  }
TOST_EMU_HOOK(load, 1, uint8_t, false)
TOST_EMU_HOOK(load, 2, uint16_t, false)
TOST_EMU_HOOK(load, 4, uint32_t, false)
TOST_EMU_HOOK(load, 8, uint64_t, false)
TOST_EMU_HOOK(load, 16, __int128, false)
TOST_EMU_HOOK(store, 1, uint8_t, true)
TOST_EMU_HOOK(store, 2, uint16_t, true)
TOST_EMU_HOOK(store, 4, uint32_t, true)
TOST_EMU_HOOK(store, 8, uint64_t, true)
TOST_EMU_HOOK(store, 16, __int128, true)

// Recover from ASan reports inside kernel code (OnAsanReport turns them into emulator reports and
// aborts on any other); leak checking is off because LibTorch's static state is never freed.
extern "C" const char* __asan_default_options() {
  return "halt_on_error=0:detect_leaks=0:detect_stack_use_after_return=0";
}
