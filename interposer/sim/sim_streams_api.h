/* Driver entry points defined in sim_streams.c (streams and events).
 * Every exported function has its prototype here (the build uses -Wmissing-prototypes). Weak stubs of the
 * same names (sim_stubs_*.c) are replaced by these definitions at link time. */
#ifndef MEMSLICE_SIM_STREAMS_API_H
#define MEMSLICE_SIM_STREAMS_API_H

#include "sim_internal.h"

CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest);
CUresult cuStreamCreateWithPriority(CUstream *ps, unsigned int flags, int priority);
CUresult cuStreamCreate(CUstream *ps, unsigned int flags);
CUresult cuStreamDestroy_v2(CUstream s);
CUresult cuStreamDestroy(CUstream s);
CUresult cuStreamGetPriority(CUstream s, int *priority);
CUresult cuStreamGetPriority_ptsz(CUstream s, int *p);
CUresult cuStreamGetFlags(CUstream s, unsigned int *flags);
CUresult cuStreamGetFlags_ptsz(CUstream s, unsigned int *f);
CUresult cuStreamGetId(CUstream s, unsigned long long *id);
CUresult cuStreamGetId_ptsz(CUstream s, unsigned long long *id);
CUresult cuStreamGetCtx(CUstream s, CUcontext *pctx);
CUresult cuStreamGetCtx_ptsz(CUstream s, CUcontext *p);
CUresult cuStreamGetCtx_v2(CUstream s, CUcontext *pctx, void **green);
CUresult cuStreamGetCtx_v2_ptsz(CUstream s, CUcontext *p, void **g);
CUresult cuStreamGetDevice(CUstream s, CUdevice *dev);
CUresult cuStreamGetDevice_ptsz(CUstream s, CUdevice *d);
CUresult cuStreamQuery(CUstream s);
CUresult cuStreamQuery_ptsz(CUstream s);
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags);
CUresult cuStreamWaitEvent_ptsz(CUstream s, CUevent e, unsigned int f);
CUresult cuEventCreate(CUevent *pe, unsigned int flags);
CUresult cuEventDestroy_v2(CUevent e);
CUresult cuEventDestroy(CUevent e);
CUresult cuEventRecord(CUevent e, CUstream s);
CUresult cuEventRecord_ptsz(CUevent e, CUstream s);
CUresult cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int flags);
CUresult cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned int f);
CUresult cuEventQuery(CUevent e);
CUresult cuEventSynchronize(CUevent e);
CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end);
CUresult cuEventElapsedTime_v2(float *ms, CUevent a, CUevent b);

#endif
