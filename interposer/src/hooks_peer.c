/* Memory between GPUs of one container: what each route costs and where it is charged (docs/architecture.md,
 * "Several GPUs"). Peer access (cuCtxEnablePeerAccess/cuCtxDisablePeerAccess), peer copies (cuMemcpyPeer*,
 * cuMemcpy3DPeer*, gated in hooks_launch.c) and access grants to other GPUs (cuMemSetAccess) allocate no
 * device memory the shim can charge (page tables only) and pass straight to the driver; legacy IPC imports
 * (cuIpcOpenMemHandle) map the exporter's allocation, charged once, to the exporter, on its GPU. What needs a
 * decision is an imported VMM handle: it keeps memory alive on the GPU it was created on, whichever GPU the
 * importing context is current on, so it is charged there. */
#define _GNU_SOURCE
#include "hooks_peer.h"

#include "shim.h"

/* Where the memory behind handle h is, as the driver describes the allocation. */
int peer_handle_dev(CUmemGenericAllocationHandle h, int fallback) {
    __auto_type props = REAL(cuMemGetAllocationPropertiesFromHandle);
    CUmemAllocationProp prop = {0};
    if (!props || props(&prop, h) != CUDA_SUCCESS || prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return fallback;
    int dev = dev_index(prop.location.id);
    return dev >= 0 ? dev : fallback;
}
