// Releases the OpenMP worker threads that the calling thread's parallel regions started.
//
// libgomp keeps one pool of workers per thread that opened a parallel region, and once it
// manages more threads than there are CPUs it stops spinning between regions and sleeps: each
// of the ~80 parallel regions of a decode step (one per product) then waits for a futex
// wake-up. The engine loads and packs the model on one thread and steps on another, so the
// loader's idle pool would throttle the stepping thread's. Releasing the loader's pool once
// the model is ready keeps the stepping thread's workers spinning.

#include <omp.h>
#include <torch/library.h>

#include <cstdint>

namespace {

int64_t release_thread_pool() {  // 0 when released (OpenMP 5.0 omp_pause_resource_all)
  return omp_pause_resource_all(omp_pause_hard);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(polyhead, m) {
  // no tensor argument to dispatch on: a catch-all kernel
  m.def("release_thread_pool() -> int", &release_thread_pool);
}
