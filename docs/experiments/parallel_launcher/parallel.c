/*
 * alt-tvm's parallel launcher: TVM's parallel loops with chunks handed out at run time.
 *
 * TVM's code generator turns a parallel loop into a lambda that computes the block
 * [task_id * step, (task_id + 1) * step) of the loop from penv->num_task, and calls the
 * module's __TVMBackendParallelLaunch pointer. TVM's own launcher gives each of its
 * threads one block and waits at a barrier for all of them: when the OS deschedules one
 * thread (another process holds its core), every parallel kernel waits for it.
 *
 * Here a launch is cut into more blocks ("chunks") than threads, and threads claim chunks
 * from a shared counter as they run: the calling thread starts at once and takes every
 * chunk no other thread has claimed, so a thread that is not running takes no work and
 * delays the kernel by at most the chunk it is in. Idle workers sleep on a condition
 * variable (after a short spin, so back-to-back kernels on a quiet machine keep them hot).
 *
 * The module's pointer is set to alt_tvm_parallel_launch after loading
 * (alt_tvm/deploy/parallel.py); it is linked into every artifact's library.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>

typedef struct {
  void* sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

#define ALT_MAX_THREADS 256

static struct {
  pthread_mutex_t lock;
  pthread_cond_t wake;
  int threads;           /* threads per launch, the caller included */
  int chunks_per_thread; /* chunks of a launch per thread */
  int spin_polls;        /* polls of the job counter a worker makes before it sleeps */
  int workers_started;
  /* The current job, published under lock with a new generation. */
  FTVMParallelLambda lambda;
  void* cdata;
  TVMParallelGroupEnv env;
  int total;
  /* (generation << 32) | next chunk: a claim is valid only for its own job. */
  _Atomic uint64_t ticket;
  _Atomic int done;
  _Atomic int failed;
  _Atomic uint32_t generation;
  _Atomic int busy; /* a launch is in flight (a nested one runs serially) */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 1, 4, 2000};

static __thread int in_worker;

/* Claim and run chunks of job `gen` until none is left. */
static void run_chunks(uint32_t gen, FTVMParallelLambda lambda, void* cdata, int total) {
  for (;;) {
    uint64_t ticket = atomic_load_explicit(&pool.ticket, memory_order_acquire);
    for (;;) {
      if ((uint32_t)(ticket >> 32) != gen || (int)(uint32_t)ticket >= total) return;
      if (atomic_compare_exchange_weak_explicit(&pool.ticket, &ticket, ticket + 1, memory_order_acq_rel,
                                                memory_order_acquire))
        break;
    }
    if (lambda((int)(uint32_t)ticket, &pool.env, cdata) != 0) atomic_store(&pool.failed, 1);
    atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
  }
}

static void* worker_main(void* arg) {
  (void)arg;
  in_worker = 1;
  uint32_t seen = 0;
  for (;;) {
    int polls = 0;
    while (atomic_load_explicit(&pool.generation, memory_order_acquire) == seen && polls < pool.spin_polls) {
      ++polls;
      if (pool.spin_polls > 100000) { sched_yield(); continue; }
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
    pthread_mutex_lock(&pool.lock);
    while (atomic_load_explicit(&pool.generation, memory_order_acquire) == seen)
      pthread_cond_wait(&pool.wake, &pool.lock);
    seen = atomic_load_explicit(&pool.generation, memory_order_acquire);
    FTVMParallelLambda lambda = pool.lambda;
    void* cdata = pool.cdata;
    int total = pool.total;
    pthread_mutex_unlock(&pool.lock);
    run_chunks(seen, lambda, cdata, total);
  }
  return 0;
}

/* Threads per launch (the caller included), chunks per thread, polls before a worker sleeps;
   returns the threads per launch. */
int alt_tvm_parallel_configure(int threads, int chunks_per_thread, int spin_polls) {
  pthread_mutex_lock(&pool.lock);
  pool.spin_polls = spin_polls < 0 ? 0 : spin_polls;
  if (threads < 1) threads = 1;
  if (threads > ALT_MAX_THREADS) threads = ALT_MAX_THREADS;
  if (chunks_per_thread < 1) chunks_per_thread = 1;
  pool.chunks_per_thread = chunks_per_thread;
  while (pool.workers_started < threads - 1) {
    pthread_t thread;
    if (pthread_create(&thread, 0, worker_main, 0) != 0) break;
    pthread_detach(thread);
    ++pool.workers_started;
  }
  pool.threads = pool.workers_started + 1 < threads ? pool.workers_started + 1 : threads;
  int started = pool.threads;
  pthread_mutex_unlock(&pool.lock);
  return started;
}

int alt_tvm_parallel_threads(void) { return pool.threads; }

int alt_tvm_parallel_launch(FTVMParallelLambda lambda, void* cdata, int num_task) {
  (void)num_task; /* the chunk count is this launcher's choice: the lambda reads penv->num_task */
  int expected = 0;
  if (in_worker || pool.threads <= 1 ||
      !atomic_compare_exchange_strong(&pool.busy, &expected, 1)) {
    /* Nested in a parallel region, one thread, or another launch in flight: run it here, whole. */
    TVMParallelGroupEnv env = {0, 1};
    return lambda(0, &env, cdata) != 0 ? -1 : 0;
  }
  int total = pool.threads * pool.chunks_per_thread;
  pthread_mutex_lock(&pool.lock);
  uint32_t gen = atomic_load(&pool.generation) + 1;
  pool.lambda = lambda;
  pool.cdata = cdata;
  pool.env.sync_handle = 0;
  pool.env.num_task = total;
  pool.total = total;
  atomic_store(&pool.done, 0);
  atomic_store(&pool.failed, 0);
  atomic_store_explicit(&pool.ticket, (uint64_t)gen << 32, memory_order_release);
  atomic_store_explicit(&pool.generation, gen, memory_order_release);
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.lock);

  run_chunks(gen, lambda, cdata, total);
  /* Only chunks another thread claimed and is running are left: wait for them, yielding
     the core in case that thread shares it. */
  while (atomic_load_explicit(&pool.done, memory_order_acquire) < total) sched_yield();
  int failed = atomic_load(&pool.failed);
  atomic_store(&pool.busy, 0);
  return failed ? -1 : 0;
}
