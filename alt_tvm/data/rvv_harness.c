/* Runs one kernel of a TVM-compiled shared object without TVM's runtime, for a core where no
 * TVM runtime is available (alt_tvm.emulated_rvv runs it under qemu-user).
 *
 * The kernel is called through the TVM FFI C calling convention (__tvm_ffi_<name>) with one
 * DLTensor per argument. The few runtime symbols a kernel imports are defined here; the
 * function-pointer slots a loaded library exposes (its context functions) are filled with them:
 * a parallel launch runs its tasks one after another, workspaces come from aligned malloc.
 *
 * Usage: rvv_harness LIB.so NAME IO.bin [TASKS]
 *   TASKS: tasks a parallel launch that asks for the default count gets (default 1).
 * IO.bin: int32 nargs, then per argument: int32 ndim, int64 shape[ndim], uint8 type code,
 *   uint8 bits, the data (little endian, row-major). After the call the arguments are written
 *   back in the same format over IO.bin.
 * Exit status: 0 done; 1 the kernel or the library failed (message on stderr); 2 bad usage or
 *   a bad IO file. A kernel that executes an instruction the core lacks dies of SIGILL. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tvm/ffi/c_api.h>

static int default_tasks = 1;

void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  fprintf(stderr, "kernel error %s: ", kind);
  for (int i = 0; i < n; ++i) fputs(parts[i], stderr);
  fputc('\n', stderr);
}
void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* message) {
  fprintf(stderr, "kernel error %s: %s\n", kind, message);
}
void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes, int code, int bits) {
  return aligned_alloc(64, (nbytes + 63) / 64 * 64);
}
int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr) {
  free(ptr);
  return 0;
}
typedef struct { void* sync_handle; int32_t num_task; } TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);
/* Serial: every task runs to its end before the next starts, so a barrier has nothing to wait for. */
int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void* cdata, int num_task) {
  TVMParallelGroupEnv env = {NULL, num_task > 0 ? num_task : default_tasks};
  for (int i = 0; i < env.num_task; ++i)
    if (flambda(i, &env, cdata) != 0) return -1;
  return 0;
}
int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv) { return 0; }

static int read_exact(void* out, size_t size, size_t count, FILE* file) {
  return fread(out, size, count, file) == count;
}

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    fprintf(stderr, "usage: %s LIB.so NAME IO.bin [TASKS]\n", argv[0]);
    return 2;
  }
  if (argc == 5 && (default_tasks = atoi(argv[4])) < 1) {
    fprintf(stderr, "TASKS must be a positive integer, got %s\n", argv[4]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 1;
  }
  const char* slots[] = {"__TVMBackendParallelLaunch", "__TVMBackendAllocWorkspace",
                         "__TVMBackendFreeWorkspace", "__TVMBackendParallelBarrier",
                         "__TVMFFIErrorSetRaisedFromCStr"};
  void* impls[] = {(void*)TVMBackendParallelLaunch, (void*)TVMBackendAllocWorkspace,
                   (void*)TVMBackendFreeWorkspace, (void*)TVMBackendParallelBarrier,
                   (void*)TVMFFIErrorSetRaisedFromCStr};
  for (int i = 0; i < 5; ++i) {
    void** slot = (void**)dlsym(lib, slots[i]);
    if (slot) *slot = impls[i];
  }
  char symbol[512];
  snprintf(symbol, sizeof symbol, "__tvm_ffi_%s", argv[2]);
  TVMFFISafeCallType fn = (TVMFFISafeCallType)dlsym(lib, symbol);
  if (!fn) {
    fprintf(stderr, "%s has no symbol %s\n", argv[1], symbol);
    return 1;
  }

  FILE* io = fopen(argv[3], "rb");
  int32_t nargs;
  if (!io || !read_exact(&nargs, 4, 1, io) || nargs < 1 || nargs > 1024) {
    fprintf(stderr, "cannot read the argument count from %s\n", argv[3]);
    return 2;
  }
  DLTensor* tensors = calloc(nargs, sizeof(DLTensor));
  TVMFFIAny* args = calloc(nargs, sizeof(TVMFFIAny));
  for (int i = 0; i < nargs; ++i) {
    int32_t ndim;
    uint8_t code_bits[2];
    if (!read_exact(&ndim, 4, 1, io) || ndim < 0 || ndim > 16) {
      fprintf(stderr, "argument %d: bad ndim\n", i);
      return 2;
    }
    int64_t* shape = malloc(8 * (ndim ? ndim : 1));
    if (!read_exact(shape, 8, ndim, io) || !read_exact(code_bits, 1, 2, io)) {
      fprintf(stderr, "argument %d: truncated header\n", i);
      return 2;
    }
    size_t nbytes = (size_t)code_bits[1] / 8;
    for (int d = 0; d < ndim; ++d) nbytes *= (size_t)shape[d];
    void* data = aligned_alloc(64, (nbytes + 63) / 64 * 64 + 64);
    if (!read_exact(data, 1, nbytes, io)) {
      fprintf(stderr, "argument %d: truncated data\n", i);
      return 2;
    }
    tensors[i] = (DLTensor){data, {kDLCPU, 0}, ndim, {code_bits[0], code_bits[1], 1}, shape, NULL, 0};
    args[i].type_index = kTVMFFIDLTensorPtr;
    args[i].v_ptr = &tensors[i];
  }
  fclose(io);

  TVMFFIAny result;
  memset(&result, 0, sizeof result);
  result.type_index = kTVMFFINone;
  if (fn(NULL, args, nargs, &result) != 0) {
    fprintf(stderr, "kernel %s returned an error\n", argv[2]);
    return 1;
  }

  io = fopen(argv[3], "wb");
  if (!io) {
    fprintf(stderr, "cannot write %s\n", argv[3]);
    return 2;
  }
  fwrite(&nargs, 4, 1, io);
  for (int i = 0; i < nargs; ++i) {
    size_t nbytes = (size_t)tensors[i].dtype.bits / 8;
    for (int d = 0; d < tensors[i].ndim; ++d) nbytes *= (size_t)tensors[i].shape[d];
    uint8_t code_bits[2] = {tensors[i].dtype.code, tensors[i].dtype.bits};
    fwrite(&tensors[i].ndim, 4, 1, io);
    fwrite(tensors[i].shape, 8, tensors[i].ndim, io);
    fwrite(code_bits, 1, 2, io);
    fwrite(tensors[i].data, 1, nbytes, io);
  }
  return fclose(io) == 0 ? 0 : 2;
}
