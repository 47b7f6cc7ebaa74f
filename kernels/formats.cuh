// Generated from schemas/src/element_formats.rs (KERNEL_FORMATS) by capture/src/backend/cuda/kernel_units.rs
// (formats_header): edit the contract, then regenerate this file with
//   FP8SCOPE_WRITE_FORMATS_CUH=1 cargo test --release -p fp8-capture --lib the_kernels_formats_come_from_the_contract
#define FMT_BF16 0
#define FMT_E4M3 1
#define FMT_E5M2 2
#define E4M3_MAX 448.0f
#define E5M2_MAX 57344.0f
#define FMT_COUNT 3
#define FOR_EACH_FMT(M, A) M(A, 0) M(A, 1) M(A, 2)
#define FOR_EACH_FMT2(M, A, B) M(A, B, 0) M(A, B, 1) M(A, B, 2)
#define FOR_EACH_FP8_FMT(M, A) M(A, 1) M(A, 2)
__device__ __forceinline__ __nv_fp8_interpretation_t fmt_interp(int fmt) {
    if (fmt == FMT_E4M3) return __NV_E4M3;
    if (fmt == FMT_E5M2) return __NV_E5M2;
    __trap();
    return __NV_E4M3;
}
__device__ __forceinline__ float fmt_max(int fmt) {
    if (fmt == FMT_E4M3) return E4M3_MAX;
    if (fmt == FMT_E5M2) return E5M2_MAX;
    __trap();
    return 0.0f;
}
__device__ __forceinline__ float fmt_overflow(int fmt) {
    if (fmt == FMT_E4M3) return 464.0f;
    if (fmt == FMT_E5M2) return 61440.0f;
    __trap();
    return 0.0f;
}
__device__ __forceinline__ u8 fmt_overflow_code(int fmt) {
    if (fmt == FMT_E4M3) return 0x7f;
    if (fmt == FMT_E5M2) return 0x7c;
    __trap();
    return 0;
}
__device__ __forceinline__ bool fmt_overflows_to_inf(int fmt) {
    if (fmt == FMT_E4M3) return false;
    if (fmt == FMT_E5M2) return true;
    __trap();
    return false;
}
// x -> FP8 byte: round to nearest even, saturate to +-max, NaN stays NaN (cvt.rn.satfinite).
__device__ __forceinline__ u8 to_fp8(float x, int fmt) {
    if (fmt == FMT_E4M3) return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    if (fmt == FMT_E5M2) return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E5M2);
    __trap();
    return 0;
}
__device__ __forceinline__ float from_fp8(u8 q, int fmt) {
    if (fmt == FMT_E4M3) return __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E4M3)));
    if (fmt == FMT_E5M2) return __half2float(__half(__nv_cvt_fp8_to_halfraw(q, __NV_E5M2)));
    __trap();
    return 0.0f;
}
