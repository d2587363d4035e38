/*
 * alt-tvm's parallel launcher: TVM's parallel loops with their blocks handed out at run time.
 *
 * TVM's code generator turns a parallel loop into a lambda that runs the block
 * [task_id * step, (task_id + 1) * step) of the loop, step = ceil(extent / penv->num_task),
 * and calls the module's __TVMBackendParallelLaunch pointer with it. TVM's own launcher
 * gives each thread one block and waits at a barrier; a thread the OS has descheduled
 * (another process holds its core) stalls every parallel kernel of the model.
 *
 * Here a launch has `tasks_per_thread` tasks per thread. Each thread owns a contiguous range
 * of them and takes them from its front; a thread whose range is empty takes tasks from the
 * back of the others' ranges. On a quiet machine each thread runs its own range in order, as
 * TVM's static split does; a thread that is not running takes no task, and the others run its
 * range. A range is one 64-bit word (launch number, front, back), so a thread still holding
 * an earlier launch's job cannot take a task of this one.
 *
 * The calling thread runs tasks too and, while it waits for tasks other threads are running,
 * polls without yielding: a caller that sleeps or yields leaves its core idle, and the
 * scheduler moves a busy process onto it. Idle workers poll for `spin_polls` rounds, then
 * sleep on a condition variable: a worker that wakes from sleep runs its short burst before
 * a busy process on its core gets the core back, one that polls loses its time slice to it.
 *
 * A worker does not run on the caller's CPU (`avoid_caller_cpu`): there the two take turns on
 * one core, and the caller polls while the worker it waits for is not running. On a quiet
 * machine the scheduler keeps them apart; with a busy process on the other core, the worker
 * the caller wakes was often placed on the caller's CPU (74% of its tasks in one measured
 * run), and ResNet-18 took about its one-thread time. So a worker that finds itself on the
 * caller's CPU when a launch starts takes that CPU out of its affinity mask (the other CPUs
 * the process allowed it stay in): the kernel moves it at once, to share a core with the busy
 * process instead.
 *
 * A worker the OS preempts in the middle of a task costs the caller the rest of the busy
 * thread's time slice (milliseconds) at the end of the launch. So the caller keeps an account
 * (`solo_when_stalled`): per launch, the time it would have taken alone (its own time per task
 * times all the tasks) less the time it took, waits for the workers included. Over a window of
 * ALT_WINDOW_NS where the workers cost more than they gave, the caller runs the launches of the
 * next ALT_SOLO_NS alone, whole, and the workers sleep; then it tries them again. On a quiet
 * machine the account is the parallel speed-up and never goes negative.
 *
 * alt_tvm/deploy/parallel.py links this file into every model library and, once TVM has
 * loaded the library, points the library's __TVMBackendParallelLaunch at
 * alt_tvm_parallel_launch.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  void* sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

#define ALT_MAX_THREADS 64
#define ALT_MAX_TASKS_PER_THREAD 64

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* A thread's tasks of one launch: (launch number << 32) | (front << 16) | back. */
typedef struct {
  _Atomic uint64_t span;
  char pad[64 - sizeof(uint64_t)];
} Range;

static inline uint64_t span_of(uint32_t launch, uint32_t front, uint32_t back) {
  return ((uint64_t)launch << 32) | ((uint64_t)front << 16) | back;
}

static struct {
  pthread_mutex_t lock;
  pthread_cond_t wake;
  int threads;          /* threads per launch, the caller included */
  int tasks_per_thread; /* tasks of a launch per thread */
  _Atomic int spin_polls; /* polls for the next launch an idle worker makes before it sleeps */
  _Atomic int avoid_caller_cpu; /* a worker on the caller's CPU moves off it (see above) */
  int solo_when_stalled; /* the caller runs launches alone while the workers cost it time (see above) */
  /* The caller's account (touched only by the thread holding `busy`): ns the workers saved it
     in the window that began at window_start; launches until solo_until run on the caller alone. */
  long long window_start, window_gain, solo_until;
  int workers;          /* workers started (this process) */
  pid_t owner;          /* the process that started them (a forked child starts its own) */
  _Atomic int sleepers; /* workers asleep on `wake` */
  _Atomic int busy;     /* a launch is in flight (another, nested or concurrent, runs serially) */
  _Atomic uint32_t created_at; /* `launch` when the workers being started were created */
  /* The current launch, published by its number (release) after the fields below. */
  _Atomic uint32_t launch;
  _Atomic(FTVMParallelLambda) lambda;
  _Atomic(void*) cdata;
  _Atomic int participants;
  TVMParallelGroupEnv env;
  _Atomic int unfinished; /* tasks of the current launch not finished */
  _Atomic int failed;
  /* Counters since the last alt_tvm_parallel_stats call. */
  _Atomic int caller_cpu; /* the CPU the caller was on when it started the current launch */
  _Atomic long long stat_launches, stat_tasks, stat_worker_tasks, stat_stolen, stat_sleeps, stat_moves;
  _Atomic long long stat_losses, stat_max_lost; /* workers' stretches that lost over ALT_STAY_NS; the longest loss */
  _Atomic long long stat_solo; /* launches the caller ran alone because the workers had cost it time */
  Range ranges[ALT_MAX_THREADS];
} pool = {.lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .threads = 1, .tasks_per_thread = 8,
        .spin_polls = 2000, .avoid_caller_cpu = 1, .solo_when_stalled = 1};

static __thread int worker_index; /* 0: not a worker of this pool */

/* A worker that lost more than ALT_LOST_NS of one polling-and-running stretch to other threads
   (wall time minus its CPU time), or woke that late after waiting on a run queue, shares its core with a busy thread: for
   ALT_CONTENDED_NS it sleeps as soon as it is idle. Polling, it would lose its time slice to the busy thread in
   the middle of a task, which the caller then waits for. A busy thread's time slice is
   milliseconds; shorter losses (kernel threads, a wake-up on a busy core) do not count. */
#define ALT_LOST_NS 1000000LL
#define ALT_CONTENDED_NS 500000000LL
/* One such loss on a quiet machine happens (another thread of the process, a kernel thread):
   a second within ALT_CONFIRM_NS makes the worker contended. While contended, a loss of
   ALT_STAY_NS keeps it so: a worker that sleeps when idle loses little, but not nothing. */
#define ALT_CONFIRM_NS 100000000LL
#define ALT_STAY_NS 30000LL
/* The caller's account of its workers is kept over windows of ALT_WINDOW_NS; after a window
   where they cost more than they gave, the launches of the next ALT_SOLO_NS run on the caller
   alone. A busy thread's time slice is 0.75-3 ms: a window sees a few of them. */
#define ALT_WINDOW_NS 20000000LL
#define ALT_SOLO_NS 200000000LL

typedef struct {
  long long last_loss, contended_until;
} Contention;

static void note_loss(Contention* c, long long now, long long lost) {
  int contended = now < c->contended_until;
  if (lost > ALT_STAY_NS) {
    atomic_fetch_add_explicit(&pool.stat_losses, 1, memory_order_relaxed);
    long long longest = atomic_load_explicit(&pool.stat_max_lost, memory_order_relaxed);
    while (lost > longest && !atomic_compare_exchange_weak(&pool.stat_max_lost, &longest, lost)) {
    }
  }
  if (lost > ALT_LOST_NS) {
    if (contended || now - c->last_loss < ALT_CONFIRM_NS) c->contended_until = now + ALT_CONTENDED_NS;
    c->last_loss = now;
  } else if (contended && lost > ALT_STAY_NS) {
    c->contended_until = now + ALT_CONTENDED_NS;
  }
}

static long long clock_ns(clockid_t clock) {
  struct timespec t;
  clock_gettime(clock, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Take a task of launch `launch` from the front of range `own` or, once it is empty, from the
   back of another range; -1 when no range has one. */
static int take_task(uint32_t launch, int own, int participants, int* stolen) {
  for (int k = 0; k < participants; ++k) {
    int r = (own + k) % participants;
    Range* range = &pool.ranges[r];
    uint64_t span = atomic_load_explicit(&range->span, memory_order_acquire);
    for (;;) {
      uint32_t front = (uint32_t)(span >> 16) & 0xFFFF, back = (uint32_t)span & 0xFFFF;
      if ((uint32_t)(span >> 32) != launch || front >= back) break;
      uint64_t next = k == 0 ? span_of(launch, front + 1, back) : span_of(launch, front, back - 1);
      if (atomic_compare_exchange_weak_explicit(&range->span, &span, next, memory_order_acq_rel,
                                                memory_order_acquire)) {
        *stolen = k != 0;
        return (int)(k == 0 ? front : back - 1);
      }
    }
  }
  return -1;
}

/* Run tasks of launch `launch` as thread `own` until none is left to take; returns how many it ran. */
static int run_tasks(uint32_t launch, int own, int participants, FTVMParallelLambda lambda, void* cdata) {
  int stolen = 0, ran = 0;
  for (int task; (task = take_task(launch, own, participants, &stolen)) >= 0; ++ran) {
    if (lambda(task, &pool.env, cdata) != 0) atomic_store_explicit(&pool.failed, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool.stat_tasks, 1, memory_order_relaxed);
    if (own != 0) atomic_fetch_add_explicit(&pool.stat_worker_tasks, 1, memory_order_relaxed);
    if (stolen) atomic_fetch_add_explicit(&pool.stat_stolen, 1, memory_order_relaxed);
    atomic_fetch_sub_explicit(&pool.unfinished, 1, memory_order_acq_rel);
  }
  return ran;
}

/* ns this thread has waited on a run queue (Linux schedstat), or -1 when not readable. */
static long long run_delay(int fd) {
  char text[96];
  ssize_t n = fd < 0 ? -1 : pread(fd, text, sizeof text - 1, 0);
  if (n <= 0) return -1;
  text[n] = 0;
  char* rest = 0;
  strtoll(text, &rest, 10); /* first: time on the CPU */
  return rest && *rest ? strtoll(rest, 0, 10) : -1;
}

/* Off the caller's CPU: `allowed` less the CPU this worker and the caller are both on. */
static void leave_caller_cpu(const cpu_set_t* allowed) {
  if (!atomic_load_explicit(&pool.avoid_caller_cpu, memory_order_relaxed)) return;
  int here = sched_getcpu();
  if (here < 0 || here != atomic_load_explicit(&pool.caller_cpu, memory_order_relaxed) ||
      !CPU_ISSET(here, allowed) || CPU_COUNT(allowed) < 2)
    return;
  cpu_set_t away = *allowed;
  CPU_CLR(here, &away);
  if (sched_setaffinity(0, sizeof away, &away) == 0) atomic_fetch_add_explicit(&pool.stat_moves, 1, memory_order_relaxed);
}

static void* worker_main(void* arg) {
  worker_index = (int)(intptr_t)arg;
  /* The CPUs the process let this thread use when it started (the creating thread's mask). */
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) CPU_ZERO(&allowed);
  int schedstat = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  /* The launch number when this thread was created, not when it first runs: a launch the
     caller published meanwhile (a new thread can take 100 us to start) is this worker's too. */
  uint32_t seen = atomic_load_explicit(&pool.created_at, memory_order_acquire);
  Contention contention = {-ALT_CONFIRM_NS, 0};
  for (;;) {
    uint32_t launch = seen;
    long long wall = clock_ns(CLOCK_MONOTONIC), cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    int spin = wall < contention.contended_until ? 0 : atomic_load_explicit(&pool.spin_polls, memory_order_relaxed);
    for (int polls = 0; polls < spin; ++polls) {
      launch = atomic_load_explicit(&pool.launch, memory_order_acquire);
      if (launch != seen) break;
      cpu_relax();
    }
    if (launch == seen) {
      long long delay = run_delay(schedstat);
      pthread_mutex_lock(&pool.lock);
      atomic_fetch_add(&pool.sleepers, 1);
      atomic_fetch_add_explicit(&pool.stat_sleeps, 1, memory_order_relaxed);
      while ((launch = atomic_load(&pool.launch)) == seen) pthread_cond_wait(&pool.wake, &pool.lock);
      atomic_fetch_sub(&pool.sleepers, 1);
      pthread_mutex_unlock(&pool.lock);
      wall = clock_ns(CLOCK_MONOTONIC);
      cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
      /* Time on a run queue after the wake-up: the core was another thread's (a core that
         was asleep takes long to wake too, but that is not run-queue time). */
      if (delay >= 0) note_loss(&contention, wall, run_delay(schedstat) - delay);
    }
    seen = launch;
    /* Fields of a later launch make take_task fail (its range words carry their launch). */
    int participants = atomic_load_explicit(&pool.participants, memory_order_acquire);
    FTVMParallelLambda lambda = atomic_load_explicit(&pool.lambda, memory_order_acquire);
    void* cdata = atomic_load_explicit(&pool.cdata, memory_order_acquire);
    if (worker_index < participants) {
      leave_caller_cpu(&allowed);
      run_tasks(launch, worker_index, participants, lambda, cdata);
    }
    long long end = clock_ns(CLOCK_MONOTONIC);
    note_loss(&contention, end, (end - wall) - (clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu));
  }
  return 0;
}

static void start_workers(int threads) {
  if (pool.owner != getpid()) { /* first use, or a forked child: its parent's workers are not here */
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
    pool.lock = lock;
    pool.wake = wake;
    atomic_store(&pool.sleepers, 0);
    pool.workers = 0;
    pool.owner = getpid();
  }
  atomic_store_explicit(&pool.created_at, atomic_load(&pool.launch), memory_order_release);
  while (pool.workers < threads - 1) {
    pthread_t thread;
    if (pthread_create(&thread, 0, worker_main, (void*)(intptr_t)(pool.workers + 1)) != 0) break;
    pthread_detach(thread);
    ++pool.workers;
  }
  pool.threads = pool.workers + 1 < threads ? pool.workers + 1 : threads;
}

/* Threads per launch (the caller included; the workers start now), tasks per thread, polls
   before an idle worker sleeps, whether a worker moves off the caller's CPU, whether the caller
   runs launches alone while its workers cost it time (its account starts afresh). Waits for a
   launch in flight. Returns the threads per launch (fewer than asked when the system refused
   a thread). */
int alt_tvm_parallel_configure(int threads, int tasks_per_thread, int spin_polls, int avoid_caller_cpu,
                               int solo_when_stalled) {
  int expected = 0;
  while (!atomic_compare_exchange_weak(&pool.busy, &expected, 1)) {
    expected = 0;
    cpu_relax();
  }
  threads = threads < 1 ? 1 : threads > ALT_MAX_THREADS ? ALT_MAX_THREADS : threads;
  tasks_per_thread = tasks_per_thread < 1 ? 1
                     : tasks_per_thread > ALT_MAX_TASKS_PER_THREAD ? ALT_MAX_TASKS_PER_THREAD
                                                                   : tasks_per_thread;
  pool.tasks_per_thread = tasks_per_thread;
  pool.spin_polls = spin_polls < 0 ? 0 : spin_polls;
  pool.avoid_caller_cpu = avoid_caller_cpu != 0;
  pool.solo_when_stalled = solo_when_stalled != 0;
  pool.window_start = clock_ns(CLOCK_MONOTONIC);
  pool.window_gain = pool.solo_until = 0;
  start_workers(threads);
  int started = pool.threads;
  atomic_store(&pool.busy, 0);
  return started;
}

int alt_tvm_parallel_threads(void) { return pool.threads; }

int alt_tvm_parallel_tasks_per_thread(void) { return pool.tasks_per_thread; }

/* out: launches, tasks run, tasks run by workers, tasks taken from another thread's range,
   times a worker went to sleep, times a worker moved off the caller's CPU, workers' stretches
   that lost more than ALT_STAY_NS to other threads, the longest such loss in ns, launches the
   caller ran alone because its workers had cost it time; all since the last call. */
void alt_tvm_parallel_stats(long long* out) {
  out[0] = atomic_exchange(&pool.stat_launches, 0);
  out[1] = atomic_exchange(&pool.stat_tasks, 0);
  out[2] = atomic_exchange(&pool.stat_worker_tasks, 0);
  out[3] = atomic_exchange(&pool.stat_stolen, 0);
  out[4] = atomic_exchange(&pool.stat_sleeps, 0);
  out[5] = atomic_exchange(&pool.stat_moves, 0);
  out[6] = atomic_exchange(&pool.stat_losses, 0);
  out[7] = atomic_exchange(&pool.stat_max_lost, 0);
  out[8] = atomic_exchange(&pool.stat_solo, 0);
}

int alt_tvm_parallel_launch(FTVMParallelLambda lambda, void* cdata, int num_task) {
  (void)num_task; /* the task count is this launcher's: the lambda reads penv->num_task */
  int expected = 0;
  if (worker_index != 0 || pool.threads <= 1 || pool.owner != getpid() ||
      !atomic_compare_exchange_strong(&pool.busy, &expected, 1)) {
    /* Nested, one thread, a forked child, or another launch in flight: run it here, whole. */
    TVMParallelGroupEnv env = {0, 1};
    return lambda(0, &env, cdata) != 0 ? -1 : 0;
  }
  long long start = clock_ns(CLOCK_MONOTONIC);
  if (start < pool.solo_until) {
    atomic_fetch_add_explicit(&pool.stat_solo, 1, memory_order_relaxed);
    TVMParallelGroupEnv env = {0, 1};
    int result = lambda(0, &env, cdata) != 0 ? -1 : 0;
    atomic_store(&pool.busy, 0);
    return result;
  }
  int participants = pool.threads, per = pool.tasks_per_thread, total = participants * per;
  uint32_t launch = atomic_load_explicit(&pool.launch, memory_order_relaxed) + 1;
  pool.env.sync_handle = 0;
  pool.env.num_task = total;
  for (int t = 0; t < participants; ++t)
    atomic_store_explicit(&pool.ranges[t].span, span_of(launch, (uint32_t)(t * per), (uint32_t)((t + 1) * per)),
                          memory_order_relaxed);
  atomic_store_explicit(&pool.unfinished, total, memory_order_relaxed);
  atomic_store_explicit(&pool.failed, 0, memory_order_relaxed);
  atomic_store_explicit(&pool.caller_cpu, sched_getcpu(), memory_order_relaxed);
  atomic_store_explicit(&pool.participants, participants, memory_order_relaxed);
  atomic_store_explicit(&pool.lambda, lambda, memory_order_relaxed);
  atomic_store_explicit(&pool.cdata, cdata, memory_order_relaxed);
  atomic_store(&pool.launch, launch); /* sequentially consistent: pairs with a sleeper's count */
  if (atomic_load(&pool.sleepers) > 0) {
    pthread_mutex_lock(&pool.lock);
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
  }
  atomic_fetch_add_explicit(&pool.stat_launches, 1, memory_order_relaxed);
  long long own_start = clock_ns(CLOCK_MONOTONIC);
  int own = run_tasks(launch, 0, participants, lambda, cdata);
  long long own_end = clock_ns(CLOCK_MONOTONIC);
  /* What is left runs on other threads: wait for it without leaving this core idle. */
  while (atomic_load_explicit(&pool.unfinished, memory_order_acquire) > 0) cpu_relax();
  if (pool.solo_when_stalled) {
    long long end = clock_ns(CLOCK_MONOTONIC);
    /* Alone, every task at the caller's own pace; with the workers, what it took. */
    if (own > 0) pool.window_gain += (own_end - own_start) * total / own - (end - own_start);
    if (end - pool.window_start > ALT_WINDOW_NS) {
      if (pool.window_gain < 0) pool.solo_until = end + ALT_SOLO_NS;
      pool.window_start = pool.window_gain < 0 ? pool.solo_until : end; /* the next window: with the workers */
      pool.window_gain = 0;
    }
  }
  int failed = atomic_load_explicit(&pool.failed, memory_order_relaxed);
  atomic_store(&pool.busy, 0);
  return failed ? -1 : 0;
}
