/* Memory between GPUs (hooks_peer.c): which GPU a charge for it belongs on. */
#ifndef MEMSLICE_HOOKS_PEER_H
#define MEMSLICE_HOOKS_PEER_H

#include "cuda_abi.h"

/* The ledger index of the GPU an imported VMM handle's memory is on (its allocation's location), or
 * `fallback` where the driver does not say (a host location, an unlisted GPU). */
int peer_handle_dev(CUmemGenericAllocationHandle h, int fallback);

#endif
