// A step's kernels chained by programmatic dependent launch (sm_90+). Launched as a programmatic
// dependent (StepLaunch with chained set), a kernel may start as soon as every block of the kernel
// before it in the stream has started (each calls let_next_kernel_launch() first thing): its blocks
// take the SM slots that kernel leaves free and its last blocks leave behind, instead of waiting for it
// to end and for a new launch to ramp up. Before await_prior_kernels() a kernel may only read what no
// kernel before it in the step writes, as those may still run (any of them, not only the one before):
// the topology, and the weights and momenta (a step writes them after every read of them; their writer in
// the step before has ended, as each step is a graph launch of its own, which the stream starts only once
// the one before it has completed: no programmatic edge crosses a step). Every block
// calls await_prior_kernels() on every path, so a kernel ends only after all before it have ended and
// their writes are visible: the chain keeps stream order.
// Without the launch attribute (pre-Hopper, CUDA before 12.3, PVM_CUDA_CHAIN=0, profiling, and past 16
// sequences, where it does not pay: cuda_engine.cu's kChainMaxSeqs; PVM_CUDA_CHAIN=all chains there too, for
// comparisons) both calls do nothing.
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace pvm {
namespace kernels {

__device__ __forceinline__ void let_next_kernel_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void await_prior_kernels() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Launches a step's kernels on one stream, each a programmatic dependent of the one before if chained;
// returns the launch's status (PVM_CUDA_CHECK(launch(kernel, grid, block, shared, args...))).
struct StepLaunch {
    cudaStream_t stream;
    bool chained;

    template <class... Params, class... Args>
    cudaError_t operator()(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, Args&&... args) const {
        cudaLaunchAttribute attr{};
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = shared_bytes;
        cfg.stream = stream;
        cfg.attrs = &attr;
        cfg.numAttrs = chained ? 1 : 0;
        return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
    }
};

}  // namespace kernels
}  // namespace pvm
