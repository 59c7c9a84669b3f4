// Programmatic dependent launch (sm_90): a kernel launched with ``launch(..., pdl=True)`` may
// start while the kernel before it in the stream still runs.
//
// pdl_wait: returns once the kernel before this one has completed and its writes are visible.
// Call it before reading anything that kernel writes, and before writing any global memory
// (torch's allocator may have handed this kernel memory the one before still reads).
// pdl_launch_dependents: lets the next kernel in the stream start once every block of this one
// has called it (or exited). Both are no-ops before sm_90 and in a plain launch.

#pragma once

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
