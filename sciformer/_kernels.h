// Shared by the package's compiled kernels (C ABI, loaded with ctypes).
#pragma once

#include <cstdint>

typedef int64_t i64;

// Hot functions are compiled twice, for AVX2 + FMA (x86-64-v3) and for the baseline; the
// loader picks one for the CPU at hand (GCC function multi-versioning).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define SF_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define SF_CLONES
#endif
