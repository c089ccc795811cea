/* Driver entry points defined in sim_ipc.c (legacy IPC).
 * Every exported function has its prototype here (the build uses -Wmissing-prototypes). Weak stubs of the
 * same names (sim_stubs_*.c) are replaced by these definitions at link time. */
#ifndef MEMSLICE_SIM_IPC_API_H
#define MEMSLICE_SIM_IPC_API_H

#include "cuda_abi.h"

typedef struct { char reserved[64]; } CUipcMemHandle; /* CU_IPC_HANDLE_SIZE bytes, passed by value */

CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle h, unsigned int flags);
CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int f);
CUresult cuIpcCloseMemHandle(CUdeviceptr p);

#endif
