// The engine's tile kernels of the per-unit products, instantiated alone: a cubin of them builds in seconds (the whole
// engine takes a minute), for reading their SASS and registers (dev/cuda/sass_loops.py; cuobjdump -res-usage).
//   nvcc -std=c++17 -O3 -arch=sm_90a -fmad=false -Inative/include -cubin \
//       -o /tmp/products.cubin dev/cuda/product_kernels.cu
#include "../../native/src/fma_product.cuh"
#include "../../native/src/mma_products.cuh"

namespace pvm {
namespace kernels {

template __global__ void mma_product<W0Forward, W0Forward::MmaTiles>(StepArgs, const int32_t*);
template __global__ void mma_product<W0Forward, W0Forward::MmaTilesOneColumn>(StepArgs, const int32_t*);
template __global__ void mma_product<W1Forward, W1Forward::MmaTiles>(StepArgs, const int32_t*);
template __global__ void mma_product<W0Update, W0Update::MmaTiles>(StepArgs, const int32_t*);
template __global__ void fma_product<W0Update, W0Update::FmaTilesMid>(StepArgs, const int32_t*);
template __global__ void mma_product<W1Update, W1Update::MmaTiles>(StepArgs, const int32_t*);
template __global__ void fma_product<W1Update, W1Update::FmaTilesFew>(StepArgs, const int32_t*);
template __global__ void fma_product<W1Update, W1Update::FmaTilesMid>(StepArgs, const int32_t*);
template __global__ void mma_product<HiddenDeltas, HiddenDeltas::MmaTilesFew>(StepArgs, const int32_t*);
template __global__ void mma_product<HiddenDeltas, HiddenDeltas::MmaTiles>(StepArgs, const int32_t*);

}  // namespace kernels
}  // namespace pvm
