// The emulator's runtime: fibers, the block scheduler, barriers, warp exchange, the kernel
// list. See cuda_emu.h for what is emulated and kernels/README.md for why.
//
// One launch at a time per process (a mutex), one block at a time, each of the block's
// threads a fiber with its own stack on the launching OS thread. The scheduler makes passes
// over the fibers in thread order and runs each ready one until it blocks at a barrier or
// returns. A barrier completes when the number of its waiters equals the number of live
// threads it covers (the block for __syncthreads, the warp for warp operations); the thread
// that completes it marks the others ready and carries on. A pass that finds no ready fiber
// while some are alive is a deadlock: reported, then abort().

#include "cuda_emu.h"

#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define EMBER_EMU_ASAN 1
#endif

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace ember_emu {
namespace {

// ---- contexts ---------------------------------------------------------------------------------
#if defined(__x86_64__)
extern "C" void ember_emu_switch(void** save, void* to);
// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack,
// stores the stack pointer in *save, and resumes the context whose stack pointer is `to`.
asm(R"(
    .text
    .p2align 4
    .globl ember_emu_switch
    .hidden ember_emu_switch
    .type ember_emu_switch,@function
ember_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size ember_emu_switch, .-ember_emu_switch
)");

struct Context {
    void* sp = nullptr;
};
void switch_context(Context& from, Context& to) { ember_emu_switch(&from.sp, to.sp); }
void make_context(Context& c, unsigned char* stack, size_t size, void (*entry)()) {
    auto top = reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t{15};
    auto* sp = reinterpret_cast<uint64_t*>(top);
    *--sp = 0;                                     // entry's return address: never used
    *--sp = reinterpret_cast<uint64_t>(entry);     // popped by `ret` (16-byte aligned slot)
    for (int i = 0; i < 6; i++) *--sp = 0;         // rbp rbx r12 r13 r14 r15
    *--sp = (uint64_t{0x037f} << 32) | 0x1f80;     // default MXCSR, x87 control word
    c.sp = sp;
}
#else
struct Context {
    ucontext_t uc;
};
void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
void make_context(Context& c, unsigned char* stack, size_t size, void (*entry)()) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
}
#endif

// ---- stacks -----------------------------------------------------------------------------------
constexpr size_t kStackBytes = 256 * 1024;  // reserved per thread; pages are touched lazily
constexpr size_t kGuardBytes = 4096;        // PROT_NONE below each stack: overflow faults

std::vector<unsigned char*>& stack_pool() {
    static std::vector<unsigned char*> pool;
    return pool;
}

unsigned char* stack_at(size_t i) {
    auto& pool = stack_pool();
    while (pool.size() <= i) {
        void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) fatal("cannot map a fiber stack");
        mprotect(p, kGuardBytes, PROT_NONE);
        pool.push_back(static_cast<unsigned char*>(p) + kGuardBytes);
    }
    return pool[i];
}

// ---- the running block --------------------------------------------------------------------
enum class State : uint8_t { Ready, AtSyncthreads, AtWarpBarrier, Done };

struct Fiber {
    Context ctx;
    State state = State::Ready;
    uint3 tid{};
    unsigned char* stack = nullptr;
#if defined(EMBER_EMU_ASAN)
    void* fake_stack = nullptr;
#endif
};

struct Warp {
    unsigned live_mask = 0;
    int live = 0;
    int waiting = 0;
    uint64_t slots[32] = {};
};

struct Run {
    const char* name = nullptr;
    const EmberKernelLaunch* launch = nullptr;
    void (*body)(void*) = nullptr;
    void* ctx = nullptr;
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    int live = 0;
    int block_waiting = 0;
    int current = -1;
    Context scheduler;
    std::vector<unsigned char> shared;  // dynamic shared memory (+ alignment slack)
    unsigned char* shared_base = nullptr;
#if defined(EMBER_EMU_ASAN)
    const void* scheduler_stack = nullptr;
    size_t scheduler_stack_size = 0;
    void* scheduler_fake_stack = nullptr;
#endif
};

thread_local Run* g_run = nullptr;
std::mutex g_launch_mutex;

Run& run() {
    if (g_run == nullptr) fatal("a CUDA device function was called outside an emulated launch");
    return *g_run;
}

}  // namespace

void* translate_device_address(uint64_t address) {
    if (address == 0) return nullptr;
    const EmberKernelLaunch* l = run().launch;
    void* host = l->translate(l->translate_ctx, address);
    if (host == nullptr) fatal("a kernel dereferenced a device address outside every live allocation");
    return host;
}

namespace {

void to_scheduler(Run& r, Fiber& f, bool dying) {
#if defined(EMBER_EMU_ASAN)
    __sanitizer_start_switch_fiber(dying ? nullptr : &f.fake_stack, r.scheduler_stack, r.scheduler_stack_size);
#else
    (void)dying;
#endif
    switch_context(f.ctx, r.scheduler);
#if defined(EMBER_EMU_ASAN)
    __sanitizer_finish_switch_fiber(f.fake_stack, nullptr, nullptr);
#endif
}

void to_fiber(Run& r, int i) {
    Fiber& f = r.fibers[i];
    r.current = i;
    threadIdx = f.tid;
#if defined(EMBER_EMU_ASAN)
    __sanitizer_start_switch_fiber(&r.scheduler_fake_stack, f.stack, kStackBytes);
#endif
    switch_context(r.scheduler, f.ctx);
#if defined(EMBER_EMU_ASAN)
    __sanitizer_finish_switch_fiber(r.scheduler_fake_stack, nullptr, nullptr);
#endif
}

const char* state_name(State s) {
    switch (s) {
        case State::Ready: return "ready";
        case State::AtSyncthreads: return "waiting at __syncthreads";
        case State::AtWarpBarrier: return "waiting at a warp barrier (shuffle, vote or __syncwarp)";
        case State::Done: return "returned";
    }
    return "?";
}

// Prints the block's threads grouped into runs of equal state, then aborts.
[[noreturn]] void report_and_abort(Run& r, const char* what) {
    const EmberKernelLaunch& l = *r.launch;
    std::fprintf(stderr,
                 "ember emulator: %s in kernel %s, block (%u, %u, %u) of grid (%u, %u, %u), block "
                 "size (%u, %u, %u), %d of %zu threads live\n",
                 what, r.name, blockIdx.x, blockIdx.y, blockIdx.z, l.grid[0], l.grid[1], l.grid[2],
                 l.block[0], l.block[1], l.block[2], r.live, r.fibers.size());
    size_t i = 0;
    while (i < r.fibers.size()) {
        size_t j = i;
        while (j + 1 < r.fibers.size() && r.fibers[j + 1].state == r.fibers[i].state) j++;
        std::fprintf(stderr, "  threads %zu..=%zu (linear ids): %s\n", i, j, state_name(r.fibers[i].state));
        i = j + 1;
    }
    std::fflush(stderr);
    std::abort();
}

void release_block(Run& r) {
    for (Fiber& f : r.fibers) {
        if (f.state == State::AtSyncthreads) f.state = State::Ready;
    }
    r.block_waiting = 0;
}

void release_warp(Run& r, int w) {
    size_t end = std::min(r.fibers.size(), static_cast<size_t>(w + 1) * 32);
    for (size_t i = static_cast<size_t>(w) * 32; i < end; i++) {
        if (r.fibers[i].state == State::AtWarpBarrier) r.fibers[i].state = State::Ready;
    }
    r.warps[w].waiting = 0;
}

void warp_barrier(Run& r) {
    int w = r.current / 32;
    Warp& warp = r.warps[w];
    Fiber& f = r.fibers[r.current];
    f.state = State::AtWarpBarrier;
    if (++warp.waiting == warp.live) {
        release_warp(r, w);
    } else {
        to_scheduler(r, f, false);
    }
}

void check_mask(Run& r, unsigned mask, const char* op) {
    const Warp& warp = r.warps[r.current / 32];
    if ((mask & warp.live_mask) != warp.live_mask || !(mask >> (r.current % 32) & 1)) {
        std::fprintf(stderr,
                     "ember emulator: %s with mask %#010x, but the warp's live lanes are %#010x (thread "
                     "%d); the emulator needs every live lane of the warp to take part\n",
                     op, mask, warp.live_mask, r.current);
        report_and_abort(r, "partial-warp operation");
    }
}

void fiber_main() {
    Run& r = run();
#if defined(EMBER_EMU_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, &r.scheduler_stack, &r.scheduler_stack_size);
#endif
    r.body(r.ctx);
    Fiber& f = r.fibers[r.current];
    f.state = State::Done;
    r.live--;
    int w = r.current / 32;
    Warp& warp = r.warps[w];
    warp.live--;
    warp.live_mask &= ~(1u << (r.current % 32));
    if (warp.waiting > 0 && warp.waiting == warp.live) release_warp(r, w);
    if (r.block_waiting > 0 && r.block_waiting == r.live) release_block(r);
    to_scheduler(r, f, true);
    fatal("a finished fiber was resumed");
}

void run_block(Run& r) {
    const size_t n = r.fibers.size();
    const unsigned bx = blockDim.x, by = blockDim.y;
    if (!r.shared.empty()) std::memset(r.shared.data(), 0xff, r.shared.size());
    for (size_t i = 0; i < n; i++) {
        Fiber& f = r.fibers[i];
        f.state = State::Ready;
        const auto id = static_cast<unsigned>(i);
        f.tid = uint3{id % bx, (id / bx) % by, id / (bx * by)};
        f.stack = stack_at(i);
        make_context(f.ctx, f.stack, kStackBytes, fiber_main);
    }
    for (size_t w = 0; w < r.warps.size(); w++) {
        int lanes = static_cast<int>(std::min<size_t>(32, n - w * 32));
        r.warps[w] = Warp{};
        r.warps[w].live = lanes;
        r.warps[w].live_mask = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1);
    }
    r.live = static_cast<int>(n);
    r.block_waiting = 0;
    while (r.live > 0) {
        bool progressed = false;
        for (size_t i = 0; i < n; i++) {
            if (r.fibers[i].state == State::Ready) {
                to_fiber(r, static_cast<int>(i));
                progressed = true;
            }
        }
        if (!progressed && r.live > 0) report_and_abort(r, "deadlock: no barrier can complete");
    }
    r.current = -1;
}

struct Entry {
    const char* name;
    EmberEmulatedKernel kernel;
};

std::vector<Entry>& registry() {
    static std::vector<Entry> entries;
    return entries;
}

}  // namespace

[[noreturn]] void fatal(const char* what) {
    std::fprintf(stderr, "ember emulator: %s\n", what);
    std::fflush(stderr);
    std::abort();
}

void syncthreads() {
    Run& r = run();
    Fiber& f = r.fibers[r.current];
    f.state = State::AtSyncthreads;
    if (++r.block_waiting == r.live) {
        release_block(r);
    } else {
        to_scheduler(r, f, false);
    }
}

void syncwarp(unsigned mask) {
    Run& r = run();
    check_mask(r, mask, "__syncwarp");
    warp_barrier(r);
}

unsigned char* dynamic_shared() { return run().shared_base; }

unsigned active_mask() {
    Run& r = run();
    return r.warps[r.current / 32].live_mask;
}

uint64_t warp_exchange(unsigned mask, uint64_t value, int (*source)(int, int, int), int arg, int width) {
    Run& r = run();
    check_mask(r, mask, "a warp shuffle");
    if (width <= 0 || width > 32 || (width & (width - 1)) != 0) fatal("shuffle width must be a power of two <= 32");
    Warp& warp = r.warps[r.current / 32];
    const int lane = r.current % 32;
    warp.slots[lane] = value;
    warp_barrier(r);
    const int src = source(lane, arg, width);
    const uint64_t out = (src < 0 || src >= 32 || !(warp.live_mask >> src & 1)) ? value : warp.slots[src];
    warp_barrier(r);
    return out;
}

unsigned warp_vote(unsigned mask, bool predicate, unsigned* voters) {
    Run& r = run();
    check_mask(r, mask, "a warp vote");
    Warp& warp = r.warps[r.current / 32];
    warp.slots[r.current % 32] = predicate ? 1 : 0;
    warp_barrier(r);
    // Between the two barriers no lane of the warp can exit: the live mask is the voters.
    const unsigned participants = warp.live_mask & mask;
    unsigned bits = 0;
    for (int lane = 0; lane < 32; lane++) {
        if ((participants >> lane & 1) && warp.slots[lane]) bits |= 1u << lane;
    }
    warp_barrier(r);
    if (voters != nullptr) *voters = participants;
    return bits;
}

int bad_launch(const char* name, const char* what, size_t index) {
    std::fprintf(stderr, "ember emulator: kernel %s: %s (parameter %zu)\n", name, what, index);
    return 2;
}

int run_grid(const char* name, const EmberKernelLaunch* launch, void (*body)(void*), void* ctx) {
    std::lock_guard<std::mutex> lock(g_launch_mutex);
    const EmberKernelLaunch& l = *launch;
    const uint64_t threads = uint64_t{l.block[0]} * l.block[1] * l.block[2];
    if (threads == 0 || threads > 1024 || l.grid[0] == 0 || l.grid[1] == 0 || l.grid[2] == 0) {
        std::fprintf(stderr, "ember emulator: kernel %s: invalid launch geometry\n", name);
        return 3;
    }
    Run r;
    r.name = name;
    r.launch = launch;
    r.body = body;
    r.ctx = ctx;
    r.fibers.resize(threads);
    r.warps.resize((threads + 31) / 32);
    if (l.shared_mem_bytes > 0) {
        r.shared.resize(l.shared_mem_bytes + 256);
        auto p = reinterpret_cast<uintptr_t>(r.shared.data());
        r.shared_base = reinterpret_cast<unsigned char*>((p + 255) & ~uintptr_t{255});
    }
    gridDim = dim3{l.grid[0], l.grid[1], l.grid[2]};
    blockDim = dim3{l.block[0], l.block[1], l.block[2]};
    g_run = &r;
    for (unsigned z = 0; z < l.grid[2]; z++) {
        for (unsigned y = 0; y < l.grid[1]; y++) {
            for (unsigned x = 0; x < l.grid[0]; x++) {
                blockIdx = uint3{x, y, z};
                run_block(r);
            }
        }
    }
    g_run = nullptr;
    return 0;
}

void register_kernel(const char* name, EmberEmulatedKernel kernel) { registry().push_back(Entry{name, kernel}); }

}  // namespace ember_emu

// The kernel list, read by ember_kernels::register_emulated().
extern "C" size_t ember_emu_kernel_count() { return ember_emu::registry().size(); }

extern "C" int ember_emu_kernel_at(size_t i, const char** name, EmberEmulatedKernel* kernel) {
    const auto& entries = ember_emu::registry();
    if (i >= entries.size()) return 1;
    *name = entries[i].name;
    *kernel = entries[i].kernel;
    return 0;
}
