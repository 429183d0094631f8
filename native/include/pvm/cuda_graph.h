// A captured CUDA graph: record what a callable enqueues on a stream once, replay it many times.
#pragma once

#if !PVM_WITH_CUDA
#error "pvm/cuda_graph.h is only for CUDA builds"
#endif

#include <cuda_runtime_api.h>

#include "pvm/cuda_check.h"

namespace pvm {

class CudaGraph {
public:
    template <class Enqueue>
    CudaGraph(cudaStream_t stream, Enqueue&& enqueue) {
        PVM_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        try {
            enqueue();
        } catch (...) {
            cudaGraph_t broken = nullptr;
            cudaStreamEndCapture(stream, &broken);
            if (broken) cudaGraphDestroy(broken);
            throw;
        }
        PVM_CUDA_CHECK(cudaStreamEndCapture(stream, &graph_));
        PVM_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
    }
    CudaGraph(const CudaGraph&) = delete;
    CudaGraph& operator=(const CudaGraph&) = delete;
    ~CudaGraph() {
        if (exec_) cudaGraphExecDestroy(exec_);
        if (graph_) cudaGraphDestroy(graph_);
    }

    void launch(cudaStream_t stream) { PVM_CUDA_CHECK(cudaGraphLaunch(exec_, stream)); }

private:
    cudaGraph_t graph_ = nullptr;
    cudaGraphExec_t exec_ = nullptr;
};

}  // namespace pvm
