/* Driver entry points defined in sim_streams.c that simcuda.c's cuGetProcAddress table names.
 * (Not in sim_internal.h: sim_stubs_cuda.c includes that and declares every cuda.h name its own way.) */
#ifndef MEMSLICE_SIM_STREAMS_API_H
#define MEMSLICE_SIM_STREAMS_API_H

#include "cuda_abi.h"

CUresult cuStreamCreate(CUstream *ps, unsigned int flags);
CUresult cuStreamDestroy(CUstream s);
CUresult cuStreamDestroy_v2(CUstream s);

#endif
