// Fused global-norm kernels for MindSpore's ops.Custom(func_type="aot") on CPU (gradmon.cells.fused_norm).
//
// One pass reads every gradient tensor once, in place: no concatenated copy, no squared copy. Squares are
// exact in float64 (float32, float16 and bfloat16 mantissas are at most 24 bits wide) and accumulate in
// float64, so the result is closer to the exact sum than a float32 reduction of any order. Work is cut
// into fixed chunks (never across tensors) whose partial sums are combined in chunk order: the result is
// bitwise the same for any number of threads.
//
// Every exported function has the aot signature
//   int f(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *stream, void *extra)
// with the inputs first, then the outputs. A non-zero return makes MindSpore raise.
//
// Only C functions are exported, so no MindSpore header is needed and any C++17 compiler will do.

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(GRADMON_NO_CLONES)
// One build for every x86-64 CPU; the loader picks the AVX2 copy where the CPU has it.
#define GRADMON_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define GRADMON_CLONES
#endif

namespace {

constexpr int kAbiVersion = 2;
constexpr int64_t kChunk = int64_t{1} << 15;         // elements per chunk: 128 KiB of float32
constexpr int64_t kParallelMin = int64_t{1} << 18;   // below this many elements one thread is faster
constexpr int kMaxThreads = 16;

enum class DType { kF32, kF16, kBF16, kF64, kOther };

DType ParseDType(const char *name) {
  if (std::strcmp(name, "float32") == 0 || std::strcmp(name, "float") == 0) return DType::kF32;
  if (std::strcmp(name, "float16") == 0) return DType::kF16;
  if (std::strcmp(name, "bfloat16") == 0) return DType::kBF16;
  if (std::strcmp(name, "float64") == 0) return DType::kF64;
  return DType::kOther;
}

inline float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// |h| for an IEEE half, without float subnormal arithmetic (which flush-to-zero modes would lose).
inline float HalfMagnitude(uint16_t h) {
  const uint32_t a = h & 0x7fffu;
  const float subnormal = static_cast<float>(a) * 0x1p-24f;
  const float normal = BitsToFloat((a << 13) + (112u << 23));  // rebias the exponent 15 -> 127
  const float special = BitsToFloat((a << 13) | 0x7f800000u);  // inf stays inf, NaN stays NaN
  return a < 0x0400u ? subnormal : (a >= 0x7c00u ? special : normal);
}

GRADMON_CLONES double SumSquaresF32(const float *p, int64_t n) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) {
    const double v = p[i];
    acc += v * v;
  }
  return acc;
}

GRADMON_CLONES double SumSquaresF16(const uint16_t *p, int64_t n) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) {
    const float v = HalfMagnitude(p[i]);
    acc += static_cast<double>(v * v);  // 11-bit mantissa: the float32 square is exact
  }
  return acc;
}

GRADMON_CLONES double SumSquaresBF16(const uint16_t *p, int64_t n) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) {
    const double v = BitsToFloat(static_cast<uint32_t>(p[i] & 0x7fffu) << 16);  // may exceed float32 squared
    acc += v * v;
  }
  return acc;
}

GRADMON_CLONES double SumSquaresF64(const double *p, int64_t n) {
  double acc = 0.0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += p[i] * p[i];
  return acc;
}

// The benchmarks' floor: the same read, the cheapest possible arithmetic (an OR of the raw words).
GRADMON_CLONES uint64_t OrWords(const unsigned char *p, int64_t bytes) {
  uint64_t acc = 0;
  const int64_t words = bytes / 8;
  const uint64_t *w = reinterpret_cast<const uint64_t *>(p);
#pragma omp simd reduction(| : acc)
  for (int64_t i = 0; i < words; ++i) acc |= w[i];
  for (int64_t i = words * 8; i < bytes; ++i) acc |= p[i];
  return acc;
}

int ElementSize(DType t) { return t == DType::kF64 ? 8 : t == DType::kF32 ? 4 : 2; }

// A run of at most kChunk elements of one tensor.
struct Chunk {
  const unsigned char *data;
  int64_t count;
  DType dtype;
  int tensor;
};

double SumSquares(const Chunk &c) {
  switch (c.dtype) {
    case DType::kF32: return SumSquaresF32(reinterpret_cast<const float *>(c.data), c.count);
    case DType::kF16: return SumSquaresF16(reinterpret_cast<const uint16_t *>(c.data), c.count);
    case DType::kBF16: return SumSquaresBF16(reinterpret_cast<const uint16_t *>(c.data), c.count);
    case DType::kF64: return SumSquaresF64(reinterpret_cast<const double *>(c.data), c.count);
    default: return std::nan("");
  }
}

// ------------------------------------------------------------------------------------------ threads
// A small persistent pool: a condition-variable wake costs microseconds, a thread start tens of them.
// One job at a time; a second kernel running concurrently (e.g. the local and the global norm) just
// works alone instead of waiting.
class Pool {
 public:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) std::thread([this] { WorkerLoop(); }).detach();
    workers_ = workers;
  }

  int workers() const { return workers_; }

  // Runs job() on the calling thread and every worker; returns when all have returned.
  bool TryRun(const std::function<void()> &job) {
    std::unique_lock<std::mutex> busy(run_mutex_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &job;
      pending_ = workers_;
      ++generation_;
    }
    wake_.notify_all();
    job();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
    job_ = nullptr;
    return true;
  }

 private:
  void WorkerLoop() {
    uint64_t seen = 0;
    for (;;) {
      const std::function<void()> *job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        job = job_;
      }
      (*job)();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        --pending_;
      }
      done_.notify_one();
    }
  }

  int workers_ = 0;
  std::mutex run_mutex_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void()> *job_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
};

int WantedThreads() {
  if (const char *env = std::getenv("GRADMON_FUSED_NORM_THREADS")) {
    const int n = std::atoi(env);
    if (n >= 1) return n < kMaxThreads ? n : kMaxThreads;
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  int n = 1;
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);  // respects taskset / cgroups cpusets
  return n < 1 ? 1 : (n < kMaxThreads ? n : kMaxThreads);
}

std::mutex g_pool_mutex;
Pool *g_pool = nullptr;  // leaked on purpose: detached workers must never see it destroyed at exit

// After fork() the child has none of the parent's workers: forget the pool (and leak it).
void ForgetPoolInChild() {
  new (&g_pool_mutex) std::mutex();
  g_pool = nullptr;
}

Pool *GetPool() {
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (g_pool == nullptr) {
    static bool registered = false;
    if (!registered) {
      pthread_atfork(nullptr, nullptr, ForgetPoolInChild);
      registered = true;
    }
    const int threads = WantedThreads();
    if (threads <= 1) return nullptr;
    g_pool = new Pool(threads - 1);
  }
  return g_pool;
}

// Calls body(i) for every i in [0, n), spread over the pool when total_elements is large enough.
void ParallelFor(int64_t n, int64_t total_elements, const std::function<void(int64_t)> &body) {
  Pool *pool = total_elements >= kParallelMin && n > 1 ? GetPool() : nullptr;
  if (pool != nullptr) {
    std::atomic<int64_t> next{0};
    const std::function<void()> job = [&] {
      for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) body(i);
    };
    if (pool->TryRun(job)) return;
  }
  for (int64_t i = 0; i < n; ++i) body(i);
}

// ------------------------------------------------------------------------------------------ passes
int64_t Elements(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

// Chunks of tensors params[first, first + count); returns false on an unsupported dtype.
bool MakeChunks(void **params, int *ndims, int64_t **shapes, const char **dtypes, int first, int count,
                std::vector<Chunk> *chunks, int64_t *total) {
  *total = 0;
  for (int t = 0; t < count; ++t) {
    const int i = first + t;
    const DType dtype = ParseDType(dtypes[i]);
    if (dtype == DType::kOther) return false;
    const int64_t n = Elements(ndims[i], shapes[i]);
    const auto *base = static_cast<const unsigned char *>(params[i]);
    for (int64_t off = 0; off < n; off += kChunk) {
      const int64_t len = n - off < kChunk ? n - off : kChunk;
      chunks->push_back(Chunk{base + off * ElementSize(dtype), len, dtype, t});
    }
    *total += n;
  }
  return true;
}

// Squared L2 norm of each tensor params[first, first + count), in float64, in one pass.
bool PerTensorSquares(void **params, int *ndims, int64_t **shapes, const char **dtypes, int first, int count,
                      std::vector<double> *sums) {
  std::vector<Chunk> chunks;
  int64_t total = 0;
  if (!MakeChunks(params, ndims, shapes, dtypes, first, count, &chunks, &total)) return false;
  std::vector<double> partial(chunks.size());
  ParallelFor(static_cast<int64_t>(chunks.size()), total,
              [&](int64_t c) { partial[c] = SumSquares(chunks[c]); });
  sums->assign(count, 0.0);
  for (size_t c = 0; c < chunks.size(); ++c) (*sums)[chunks[c].tensor] += partial[c];  // chunk order
  return true;
}

bool IsFloat32(const char *dtype) { return ParseDType(dtype) == DType::kF32; }

double ScaleSquared(void *scale) {
  const double s = *static_cast<const float *>(scale);
  return s * s;
}

double TotalOf(const std::vector<double> &sums) {
  double total = 0.0;
  for (double s : sums) total += s;
  return total;
}

}  // namespace

extern "C" {

int GradmonFusedNormAbi() { return kAbiVersion; }

// inputs: scale (float32 scalar), g_1..g_n; output: float32 scalar scale^2 * sum_i sum(g_i^2).
int GradmonSquaredNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                       void *, void *) {
  if (nparam < 2 || !IsFloat32(dtypes[0]) || !IsFloat32(dtypes[nparam - 1])) return 1;
  std::vector<double> sums;
  if (!PerTensorSquares(params, ndims, shapes, dtypes, 1, nparam - 2, &sums)) return 2;
  *static_cast<float *>(params[nparam - 1]) = static_cast<float>(ScaleSquared(params[0]) * TotalOf(sums));
  return 0;
}

// inputs: scale, g_1..g_n; output: float32 |scale| * sqrt(sum_i sum(g_i^2)) -- the norm in one launch.
int GradmonNorm(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  if (nparam < 2 || !IsFloat32(dtypes[0]) || !IsFloat32(dtypes[nparam - 1])) return 1;
  std::vector<double> sums;
  if (!PerTensorSquares(params, ndims, shapes, dtypes, 1, nparam - 2, &sums)) return 2;
  *static_cast<float *>(params[nparam - 1]) = static_cast<float>(std::sqrt(ScaleSquared(params[0]) * TotalOf(sums)));
  return 0;
}

// inputs: scale, g_1..g_n; output: float32 [n], scale^2 * sum(g_i^2) per tensor (layer statistics).
int GradmonSquaredNorms(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                        void *, void *) {
  const int n = nparam - 2;
  if (n < 0 || !IsFloat32(dtypes[0]) || !IsFloat32(dtypes[nparam - 1])) return 1;
  if (Elements(ndims[nparam - 1], shapes[nparam - 1]) != n) return 3;
  std::vector<double> sums;
  if (!PerTensorSquares(params, ndims, shapes, dtypes, 1, n, &sums)) return 2;
  const double s2 = ScaleSquared(params[0]);
  auto *out = static_cast<float *>(params[nparam - 1]);
  for (int t = 0; t < n; ++t) out[t] = static_cast<float>(s2 * sums[t]);
  return 0;
}

// inputs: scale, max_norm (float32 scalars), g_1..g_n; outputs: the norm and the clip coefficient
// min(1, max_norm / (norm + 1e-6)) as float32 scalars (1 when the norm is not finite).
int GradmonNormClipCoef(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes,
                        void *, void *) {
  if (nparam < 4 || !IsFloat32(dtypes[0]) || !IsFloat32(dtypes[1])) return 1;
  std::vector<double> sums;
  if (!PerTensorSquares(params, ndims, shapes, dtypes, 2, nparam - 4, &sums)) return 2;
  const float norm = static_cast<float>(std::sqrt(ScaleSquared(params[0]) * TotalOf(sums)));
  const float max_norm = *static_cast<const float *>(params[1]);
  float coef = max_norm / (norm + 1e-6f);
  coef = std::isfinite(norm) ? (coef < 1.0f ? coef : 1.0f) : 1.0f;
  *static_cast<float *>(params[nparam - 2]) = norm;
  *static_cast<float *>(params[nparam - 1]) = coef;
  return 0;
}

// The defaults' monitoring in one launch (MonitoredTrainStep with no clipping, detector, loss scale or
// per-tensor sums): with those options the step's whole history row and its counters follow from the
// norm, so they are written here instead of by ~12 scalar kernels. The norm is GradmonSquaredNorm's
// float32 sum followed by a float32 sqrt: the bits of the two-launch form it replaces.
// inputs:  scale, loss (float32 scalars); config (int32 [2]: ring rows, skips -- non-zero when a
//          non-finite step is skipped); counts (int32 [5]: steps, clipped, spikes, skipped, nonfinite);
//          g_1..g_n;
// outputs: norm (float32 scalar); finite (bool scalar); row (float32 [1, width >= 8]: loss, norm,
//          clip_coef 1, zscore 0, clipped 0, spike 0, skipped, nonfinite, zeros after); slot (int32 [1]:
//          steps mod ring rows, where the row goes); counts after this step (int32 [5]).
int GradmonNormRecord(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *,
                      void *) {
  constexpr int kInputs = 4, kOutputs = 5, kCounts = 5, kBaseWidth = 8;
  if (nparam < kInputs + kOutputs || !IsFloat32(dtypes[0]) || !IsFloat32(dtypes[1])) return 1;
  const int out = nparam - kOutputs;
  if (Elements(ndims[2], shapes[2]) != 2 || Elements(ndims[3], shapes[3]) != kCounts) return 3;
  if (Elements(ndims[out + 3], shapes[out + 3]) != 1 || Elements(ndims[out + 4], shapes[out + 4]) != kCounts) {
    return 3;
  }
  const int64_t width = Elements(ndims[out + 2], shapes[out + 2]);
  if (width < kBaseWidth) return 3;
  std::vector<double> sums;
  if (!PerTensorSquares(params, ndims, shapes, dtypes, kInputs, out - kInputs, &sums)) return 2;
  const float squared = static_cast<float>(ScaleSquared(params[0]) * TotalOf(sums));
  const float norm = std::sqrt(squared);  // float32 sqrt, correctly rounded: ops.sqrt's result
  const bool finite = std::isfinite(norm);
  const auto *config = static_cast<const int32_t *>(params[2]);
  const auto *counts = static_cast<const int32_t *>(params[3]);
  const int32_t rows = config[0] > 0 ? config[0] : 1;
  const bool skipped = !finite && config[1] != 0;
  *static_cast<float *>(params[out]) = norm;
  *static_cast<bool *>(params[out + 1]) = finite;
  auto *row = static_cast<float *>(params[out + 2]);
  const float values[kBaseWidth] = {*static_cast<const float *>(params[1]), norm, 1.0f, 0.0f, 0.0f, 0.0f,
                                    skipped ? 1.0f : 0.0f, finite ? 0.0f : 1.0f};
  for (int64_t i = 0; i < width; ++i) row[i] = i < kBaseWidth ? values[i] : 0.0f;
  int32_t slot = counts[0] % rows;
  *static_cast<int32_t *>(params[out + 3]) = slot < 0 ? slot + rows : slot;  // floor_mod
  auto *after = static_cast<int32_t *>(params[out + 4]);
  const int32_t add[kCounts] = {1, 0, 0, skipped ? 1 : 0, finite ? 0 : 1};
  for (int i = 0; i < kCounts; ++i) after[i] = counts[i] + add[i];
  return 0;
}

// inputs: coef (float32 scalar), g_1..g_n (float32); outputs: g_i * coef -- all n multiplies in one launch.
int GradmonScale(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *, void *) {
  const int n = (nparam - 1) / 2;
  if (nparam < 1 || nparam != 2 * n + 1 || !IsFloat32(dtypes[0])) return 1;
  std::vector<Chunk> chunks;
  int64_t total = 0;
  if (!MakeChunks(params, ndims, shapes, dtypes, 1, n, &chunks, &total)) return 2;
  for (const Chunk &c : chunks) {
    if (c.dtype != DType::kF32) return 2;
  }
  const float coef = *static_cast<const float *>(params[0]);
  std::vector<int64_t> offsets(chunks.size());
  for (size_t c = 1; c < chunks.size(); ++c) {
    offsets[c] = chunks[c].tensor == chunks[c - 1].tensor ? offsets[c - 1] + chunks[c - 1].count : 0;
  }
  ParallelFor(static_cast<int64_t>(chunks.size()), total, [&](int64_t c) {
    const auto *in = reinterpret_cast<const float *>(chunks[c].data);
    float *out = static_cast<float *>(params[1 + n + chunks[c].tensor]) + offsets[c];
    for (int64_t i = 0; i < chunks[c].count; ++i) out[i] = in[i] * coef;
  });
  return 0;
}

// Benchmark floor probes. GradmonReadFloor reads every byte of g_1..g_n once, in the same chunks and
// threads as the norm, with the cheapest arithmetic; its float32 output is meaningless (0 or 1).
// GradmonTouchFloor reads nothing: the cost of one launch that waits for every gradient.
int GradmonReadFloor(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *,
                     void *) {
  std::vector<Chunk> chunks;
  int64_t total = 0;
  if (nparam < 1 || !MakeChunks(params, ndims, shapes, dtypes, 0, nparam - 1, &chunks, &total)) return 2;
  std::vector<uint64_t> partial(chunks.size());
  ParallelFor(static_cast<int64_t>(chunks.size()), total, [&](int64_t c) {
    partial[c] = OrWords(chunks[c].data, chunks[c].count * ElementSize(chunks[c].dtype));
  });
  uint64_t any = 0;
  for (uint64_t p : partial) any |= p;
  *static_cast<float *>(params[nparam - 1]) = any != 0 ? 1.0f : 0.0f;
  return 0;
}

int GradmonTouchFloor(int nparam, void **params, int *, int64_t **, const char **, void *, void *) {
  if (nparam < 1) return 1;
  *static_cast<float *>(params[nparam - 1]) = 0.0f;
  return 0;
}

}  // extern "C"
