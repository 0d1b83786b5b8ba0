// The spike detector's whole update in one MindSpore ops.Custom(func_type="aot") CPU kernel
// (gradmon.cells.spike_kernel). It computes what gradmon.cells.spike.zclip_update computes with ~75
// small stock kernels: ZClip's EMA z-score, the Welford warm-up, the early median/MAD rule over the
// ring of log-norms, the run's scale and floor, the ring write, the loss test (the loss over the
// median of a ring of recent losses, with the run's loss scale as a floor), and the learning-rate
// test (the step's rate over the largest rate of the earlier steps).
//
// Every quantity is float32 and every operation is the op path's, in its order (a + b * c / d reads
// as there), so the kernel and the op path give the same bits. exp is MindSpore's own (MsCpuExp
// below: the polynomial of its CPU Exp kernel, not libm's expf); log is libm's logf in both. The
// median of the n <= 16 filled ring slots is a small insertion sort. No constant lives here: the Python side passes
// every setting (from SpikeConfig) in the `params` input, whose layout is kParam* below.
//
// Signature (the aot ABI): int f(int nparam, void **params, int *ndims, int64_t **shapes,
// const char **dtypes, void *stream, void *extra), inputs first, then outputs. Inputs: norm (float32,
// 1 element), finite (bool, 1 element), loss (float32, 1 element; read only with the loss test), lr
// (float32, 1 element; read only with the learning-rate test), state (float32: [3] without the early
// rule, [4 + window] with it, then [2 + loss_window] with the loss test, then [2] with the
// learning-rate test), params (float32 [kParamCount]). Outputs: zscore (float32), spike (bool), target
// (float32), new_state (float32, the state's shape), loss_spike (bool), lr_spike (bool). A non-zero
// return makes MindSpore raise.

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

constexpr int kAbiVersion = 3;
constexpr int kMaxWindow = 4096;  // a sanity bound on the ring (SpikeConfig's default is 16)

// The params input, float32 each.
enum Param {
  kParamWarmup,         // finite norms of the EMA's warm-up
  kParamOneMinusAlpha,  // float32(1 - alpha): the EMA weight after the warm-up
  kParamZ,              // ZClip's z threshold
  kParamZSquared,       // float32(z * z), as the op path's Python constant
  kParamEps,            // added to the std in the z-score
  kParamTiny,           // log(0) guard
  kParamWindow,         // ring length; 0: no early rule (state [count, mean, var])
  kParamEarlyMin,       // finite norms before the early rule judges
  kParamEarlyZ,         // early_z * 1.4826
  kParamLogLo,          // log(early_min_ratio)
  kParamLogHi,          // log(early_max_ratio)
  kParamFloor,          // no spike at or below floor * scale
  kParamLossWindow,     // loss ring length; 0: no loss test
  kParamLossMin,        // finite losses before the loss test judges
  kParamLossRatio,      // a loss spike is more than ratio * |median| above the median ...
  kParamLossFloor,      // ... and more than floor * the run's loss scale
  kParamLrRatio,        // an lr spike is a rate above ratio * the largest earlier rate; 0: no lr test
  kParamLrMin,          // rates (finite, > 0) before the lr test judges
  kParamCount
};

int64_t Elements(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

bool Is(const char *dtype, const char *name) { return std::strcmp(dtype, name) == 0; }
bool IsF32(const char *dtype) { return Is(dtype, "float32") || Is(dtype, "float"); }

// exp exactly as MindSpore's CPU Exp kernel computes it on a 1-element float32 tensor (the op path's
// exps are all on shape () or (1,) tensors). That kernel runs nnacl's ExpFp32, whose 1 to 3 leftover
// elements (all of a 1-element tensor) take its scalar loop, then copies NaN inputs through. Read
// from MindSpore 2.10's x86-64 libnnacl.so: clamp to [-87.3365, 88.7228] (so -inf -> 0, inf -> inf);
// n = floor(x * log2(e) + 0.5); d = x - n * ln2; a degree-5 Taylor polynomial in d by Horner; times
// 2^n built as 2 * 2^(n-1) from the exponent bits (n = -126 gives 0). Its build contracts every
// a * b + c into one fused multiply-add, hence fmaf (libm's, correctly rounded like the instruction).
// Large tensors take its AVX/AVX-512 loops instead, which multiply by 2^(n-1) before doubling: other
// bits where x >= 88.3765 (finite there, inf here) and in the subnormal band near -86.5. Tested
// against ops.exp over a sweep of float32 (tests/test_cells_spike_exp.py).
float MsCpuExp(float x) {
  if (std::isnan(x)) return x;
  constexpr float kMax = 88.72283935546875f, kMin = -87.3365478515625f;
  constexpr float kLog2e = 1.44269502f, kLn2 = 0.693147f;  // float32 0x3fb8aa3b, 0x3f317215
  const float t = x < kMax ? (x > kMin ? x : kMin) : kMax;
  const float n = std::floor(std::fmaf(t, kLog2e, 0.5f));
  const float d = std::fmaf(-n, kLn2, t);
  float poly = std::fmaf(d, 1.0f / 120, 1.0f / 24);
  poly = std::fmaf(d, poly, 1.0f / 6);
  poly = std::fmaf(d, poly, 0.5f);
  poly = std::fmaf(d, poly, 1.0f);
  poly = std::fmaf(d, poly, 1.0f);
  const int32_t bits = (static_cast<int32_t>(n) + 126) << 23;  // n in [-126, 128]
  float half_power;
  std::memcpy(&half_power, &bits, sizeof(float));
  return (half_power + half_power) * poly;
}

float Max(float a, float b) { return a > b ? a : b; }  // operands are never NaN where used
float Min(float a, float b) { return a < b ? a : b; }

void SortAscending(float *v, int n) {
  for (int i = 1; i < n; ++i) {
    const float x = v[i];
    int j = i - 1;
    for (; j >= 0 && v[j] > x; --j) v[j + 1] = v[j];
    v[j + 1] = x;
  }
}

// The median of sorted v[0..n) (n >= 1) as the op path takes it: the values at (n - 1) // 2 and
// n // 2, weighted 0.5 each (one value, weight 1, when they coincide), summed.
float MedianOfSorted(const float *v, float n) {
  const int lo = static_cast<int>(Max(std::floor((n - 1.0f) * 0.5f), 0.0f));
  const int hi = static_cast<int>(std::floor(n * 0.5f));
  return lo == hi ? v[lo] : v[lo] * 0.5f + v[hi] * 0.5f;
}

// The median of the first n (as a float) slots of ring, sorted into `scratch`.
float MedianOfFirst(const float *ring, float n, float *scratch) {
  const int filled = static_cast<int>(n);
  std::memcpy(scratch, ring, sizeof(float) * filled);
  SortAscending(scratch, filled);
  return MedianOfSorted(scratch, n);
}

}  // namespace

extern "C" {

int GradmonSpikeDetectorAbi() { return kAbiVersion; }

// The kernel's exp over n floats, for its tests (through ctypes).
void GradmonSpikeExp(const float *x, float *y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = MsCpuExp(x[i]);
}

int GradmonSpikeUpdate(int nparam, void **params, int *ndims, int64_t **shapes, const char **dtypes, void *,
                       void *) {
  if (nparam != 12) return 1;
  // Inputs 0-5, outputs 6-11.
  if (!IsF32(dtypes[0]) || !Is(dtypes[1], "bool") || !IsF32(dtypes[2]) || !IsF32(dtypes[3]) ||
      !IsF32(dtypes[4]) || !IsF32(dtypes[5]) || !IsF32(dtypes[6]) || !Is(dtypes[7], "bool") ||
      !IsF32(dtypes[8]) || !IsF32(dtypes[9]) || !Is(dtypes[10], "bool") || !Is(dtypes[11], "bool")) {
    return 2;
  }
  const int64_t size = Elements(ndims[4], shapes[4]);
  if (Elements(ndims[0], shapes[0]) != 1 || Elements(ndims[1], shapes[1]) != 1 ||
      Elements(ndims[2], shapes[2]) != 1 || Elements(ndims[3], shapes[3]) != 1 ||
      Elements(ndims[5], shapes[5]) != kParamCount || Elements(ndims[9], shapes[9]) != size) {
    return 3;
  }
  const float *p = static_cast<const float *>(params[5]);
  const float window_f = p[kParamWindow];
  const int window = static_cast<int>(window_f);
  const float loss_window_f = p[kParamLossWindow];
  const int loss_window = static_cast<int>(loss_window_f);
  const int norm_size = window > 0 ? 4 + window : 3;
  const int loss_end = norm_size + (loss_window > 0 ? 2 + loss_window : 0);
  const bool lr_test = p[kParamLrRatio] > 0.0f;
  if (window < 0 || window > kMaxWindow || static_cast<float>(window) != window_f || loss_window < 0 ||
      loss_window > kMaxWindow || static_cast<float>(loss_window) != loss_window_f ||
      size != loss_end + (lr_test ? 2 : 0)) {
    return 4;
  }
  const float norm = *static_cast<const float *>(params[0]);
  const bool finite = *static_cast<const bool *>(params[1]);
  const float loss = *static_cast<const float *>(params[2]);
  const float lr = *static_cast<const float *>(params[3]);
  const float *state = static_cast<const float *>(params[4]);
  const float count = state[0], mean = state[1], var = state[2];

  // ZClip after the warm-up, with the statistics before this step.
  const float z = p[kParamZ];
  const bool in_warmup = count < p[kParamWarmup];
  // A zero norm (at most tiny): no test but the lr test judges or learns its step (zclip_reference).
  const bool learns = finite && norm > p[kParamTiny];
  const bool active = learns && !in_warmup;
  const float sd = std::sqrt(var);
  const float z_raw = (norm - mean) / (sd + p[kParamEps]);
  bool spike = active && z_raw > z;
  float zscore = active ? z_raw : 0.0f;
  float target = spike ? mean + p[kParamZSquared] * sd / z_raw : norm;

  // The early rule during the warm-up, and the run's scale (only judged once the ring has early_min).
  float scale = window > 0 ? state[3] : 0.0f;
  if (window > 0) {
    const float *ring = state + 4;
    const bool has_ring = count >= p[kParamEarlyMin];
    if (has_ring) {
      const float n = Min(count, window_f);  // the ring fills slot by slot from slot 0
      const int filled = static_cast<int>(n);
      float sorted[kMaxWindow];
      const float med = MedianOfFirst(ring, n, sorted);
      for (int i = 0; i < filled; ++i) sorted[i] = std::fabs(ring[i] - med);
      SortAscending(sorted, filled);
      const float mad = MedianOfSorted(sorted, n);
      const float thr = Min(Max(p[kParamEarlyZ] * mad, p[kParamLogLo]), p[kParamLogHi]);
      const float dev = std::log(Max(norm, p[kParamTiny])) - med;
      const bool early_spike = dev > thr;
      const float early_z = z * dev / thr;
      scale = Max(scale, MsCpuExp(med));
      // floor 0 is no floor, also where exp overflows a median near log(FLT_MAX) to inf (0 * inf
      // would be NaN).
      const bool above_floor = norm > (p[kParamFloor] > 0.0f ? p[kParamFloor] * scale : 0.0f);
      spike = spike && above_floor;
      if (!spike) target = norm;  // a ZClip outlier under the floor is no spike: its own target
      if (learns && in_warmup) {  // judged
        zscore = early_z;
        if (early_spike && above_floor) {
          target = MsCpuExp(med + thr * thr / Max(dev, thr));
          spike = true;
        }
      }
    }
  }

  // The loss test, on finite steps with a nonzero norm and a finite loss, from the loss_min-th such loss on.
  bool loss_spike = false;
  const bool loss_ok = loss_window > 0 && learns && std::isfinite(loss);
  const float loss_count = loss_window > 0 ? state[norm_size] : 0.0f;
  float loss_scale = loss_window > 0 ? state[norm_size + 1] : 0.0f;
  if (loss_ok && loss_count >= p[kParamLossMin]) {
    float sorted[kMaxWindow];
    const float med = MedianOfFirst(state + norm_size + 2, Min(loss_count, loss_window_f), sorted);
    const float size_med = std::fabs(med);
    loss_scale = Max(loss_scale, size_med);
    const float dev = loss - med;
    loss_spike = dev > p[kParamLossRatio] * size_med && dev > p[kParamLossFloor] * loss_scale;
    if (loss_spike && !spike) target = Min(norm, mean);  // clipped to the norm's running level
    spike = spike || loss_spike;
  }

  // The learning-rate test: judged on finite steps, its count and top moved by every finite rate > 0.
  bool lr_spike = false;
  const bool lr_ok = lr_test && std::isfinite(lr) && lr > 0.0f;
  const float lr_count = lr_test ? state[loss_end] : 0.0f;
  const float lr_top = lr_test ? state[loss_end + 1] : 0.0f;
  if (lr_ok && finite && lr_count >= p[kParamLrMin]) lr_spike = lr > p[kParamLrRatio] * lr_top;

  float *new_state = static_cast<float *>(params[9]);
  if (new_state != state) std::memcpy(new_state, state, sizeof(float) * size);
  if (learns) {
    const float weight = in_warmup ? 1.0f / (count + 1.0f) : p[kParamOneMinusAlpha];
    const float delta = target - mean;
    const float new_mean = mean + weight * delta;
    const float err = target - new_mean;
    const float new_var = var + weight * (err * (in_warmup ? delta : err) - var);
    new_state[0] = count + 1.0f;
    new_state[1] = new_mean;
    new_state[2] = new_var;
    if (window > 0) {
      new_state[3] = scale;
      // count mod window, as the op path computes it; past 2**24 a non-integer slot writes nothing there too.
      const float slot = count - std::floor(count / window_f) * window_f;
      const int index = static_cast<int>(slot);
      if (slot >= 0.0f && slot < window_f && static_cast<float>(index) == slot) {
        new_state[4 + index] = std::log(Max(target, p[kParamTiny]));
      }
    }
  }
  if (loss_ok) {
    new_state[norm_size] = loss_count + 1.0f;
    new_state[norm_size + 1] = loss_scale;
    const float slot = loss_count - std::floor(loss_count / loss_window_f) * loss_window_f;
    const int index = static_cast<int>(slot);
    if (slot >= 0.0f && slot < loss_window_f && static_cast<float>(index) == slot) {
      new_state[norm_size + 2 + index] = loss;
    }
  }
  if (lr_ok) {
    new_state[loss_end] = lr_count + 1.0f;
    new_state[loss_end + 1] = Max(lr_top, lr);
  }
  *static_cast<float *>(params[6]) = zscore;
  *static_cast<bool *>(params[7]) = spike;
  *static_cast<float *>(params[8]) = target;
  *static_cast<bool *>(params[10]) = loss_spike;
  *static_cast<bool *>(params[11]) = lr_spike;
  return 0;
}

}  // extern "C"
