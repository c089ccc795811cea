/* The handful of CUDA driver and NVML types and constants memslice uses, declared here so that building
 * needs no CUDA toolkit. Values are those of cuda.h (CUDA 13.0) and nvml.h; names keep NVIDIA's spelling
 * so a reader can grep the real headers. Only what the shim and the simulated GPU touch is declared. */
#ifndef MEMSLICE_CUDA_ABI_H
#define MEMSLICE_CUDA_ABI_H

#include <stddef.h>
#include <stdint.h>

/* ---- CUDA driver API ------------------------------------------------------------------------------ */
#ifndef CUDAAPI
#define CUDAAPI                              /* cuda.h: __stdcall on Windows, nothing on Linux */
#endif
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;      /* CUdeviceptr_v2 on LP64 */
typedef unsigned int CUdeviceptr_v1;         /* legacy 32-bit entry points */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef unsigned int cuuint32_t;
typedef unsigned long long cuuint64_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUarray_st *CUarray;
typedef struct CUmipmappedArray_st *CUmipmappedArray;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef struct CUgraph_st *CUgraph;
typedef struct CUmod_st *CUmodule;
typedef struct CUlib_st *CUlibrary;
typedef struct CUexecAffinityParam_st CUexecAffinityParam;   /* only passed by pointer here */
typedef struct CUctxCreateParams_st CUctxCreateParams;       /* only passed by pointer here */
typedef struct CUuuid_st { char bytes[16]; } CUuuid;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_DEINITIALIZED = 4,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_FILE_NOT_FOUND = 301,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_TIMEOUT = 702,
    CUDA_ERROR_NOT_PERMITTED = 800,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
};

/* cuGetProcAddress */
enum { CU_GET_PROC_ADDRESS_DEFAULT = 0, CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
       CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2 };
typedef enum { CU_GET_PROC_ADDRESS_SUCCESS = 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
               CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2 } CUdriverProcAddressQueryResult;

/* Memory types and pointer attributes */
typedef enum { CU_MEMORYTYPE_HOST = 1, CU_MEMORYTYPE_DEVICE = 2, CU_MEMORYTYPE_ARRAY = 3,
               CU_MEMORYTYPE_UNIFIED = 4 } CUmemorytype;
typedef enum { CU_POINTER_ATTRIBUTE_CONTEXT = 1, CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
       CU_POINTER_ATTRIBUTE_DEVICE_POINTER = 3, CU_POINTER_ATTRIBUTE_HOST_POINTER = 4,
       CU_POINTER_ATTRIBUTE_IS_MANAGED = 8, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
       CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11, CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12,
       CU_POINTER_ATTRIBUTE_MAPPED = 13 } CUpointer_attribute;
enum { CU_MEM_ATTACH_GLOBAL = 1, CU_MEM_ATTACH_HOST = 2 };
enum { CU_MEMHOSTALLOC_PORTABLE = 1, CU_MEMHOSTALLOC_DEVICEMAP = 2, CU_MEMHOSTALLOC_WRITECOMBINED = 4 };
typedef enum { CU_MEM_ADVISE_SET_READ_MOSTLY = 1, CU_MEM_ADVISE_UNSET_READ_MOSTLY = 2,
               CU_MEM_ADVISE_SET_PREFERRED_LOCATION = 3, CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION = 4,
               CU_MEM_ADVISE_SET_ACCESSED_BY = 5, CU_MEM_ADVISE_UNSET_ACCESSED_BY = 6 } CUmem_advise;
#define CU_DEVICE_CPU ((CUdevice)-1)

/* Streams and capture */
typedef enum { CU_STREAM_CAPTURE_MODE_GLOBAL = 0, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
               CU_STREAM_CAPTURE_MODE_RELAXED = 2 } CUstreamCaptureMode;
typedef enum { CU_STREAM_CAPTURE_STATUS_NONE = 0, CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
               CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2 } CUstreamCaptureStatus;

/* Device attributes the simulator answers */
typedef enum {
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK = 1,
    CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19,
    CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
    CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
    CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39,
    CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
    CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY = 83,
    CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS = 89,
    CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102,
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
    CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 141,
    CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 145,
} CUdevice_attribute;

/* VMM */
typedef enum { CU_MEM_LOCATION_TYPE_INVALID = 0, CU_MEM_LOCATION_TYPE_DEVICE = 1,
               CU_MEM_LOCATION_TYPE_HOST = 2, CU_MEM_LOCATION_TYPE_HOST_NUMA = 3,
               CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT = 4 } CUmemLocationType;
typedef struct { CUmemLocationType type; int id; } CUmemLocation;
typedef struct {
    int type;                          /* CUmemAllocationType: PINNED=1, MANAGED=2 */
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct { unsigned char compressionType, gpuDirectRDMACapable; unsigned short usage;
             unsigned char reserved[4]; } allocFlags;
} CUmemAllocationProp;
/* flags is cuda.h's CUmemAccess_flags, an enum: 12 bytes, so an array of several is laid out as cuda.h's */
typedef struct { CUmemLocation location; unsigned int flags; } CUmemAccessDesc;
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc must be laid out as cuda.h's");
enum { CU_MEM_ALLOCATION_TYPE_PINNED = 1, CU_MEM_ALLOCATION_TYPE_MANAGED = 2 };
typedef enum { CU_MEM_HANDLE_TYPE_NONE = 0, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
               CU_MEM_HANDLE_TYPE_WIN32 = 2, CU_MEM_HANDLE_TYPE_WIN32_KMT = 4,
               CU_MEM_HANDLE_TYPE_FABRIC = 8 } CUmemAllocationHandleType;

/* Context limits (cuCtxSetLimit): the first three make the driver reserve device memory */
typedef enum { CU_LIMIT_STACK_SIZE = 0, CU_LIMIT_PRINTF_FIFO_SIZE = 1, CU_LIMIT_MALLOC_HEAP_SIZE = 2 } CUlimit;
/* Module and library loading options: only passed through */
typedef enum { CU_JIT_MAX_REGISTERS = 0 } CUjit_option;
typedef enum { CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE = 0 } CUlibraryOption;
typedef enum { CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1 }
    CUmemAllocationGranularity_flags;

/* Memory pools */
typedef enum { CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,
               CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6, CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,
               CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8 } CUmemPool_attribute;
typedef struct {
    int allocType; int handleTypes; CUmemLocation location; void *win32SecurityAttributes;
    size_t maxSize; unsigned short usage; unsigned char reserved[54];
} CUmemPoolProps;

/* Arrays */
typedef enum { CU_AD_FORMAT_UNSIGNED_INT8 = 0x01, CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
               CU_AD_FORMAT_UNSIGNED_INT32 = 0x03, CU_AD_FORMAT_SIGNED_INT8 = 0x08,
               CU_AD_FORMAT_SIGNED_INT16 = 0x09, CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
               CU_AD_FORMAT_HALF = 0x10, CU_AD_FORMAT_FLOAT = 0x20 } CUarray_format;
typedef struct { size_t Width; size_t Height; CUarray_format Format; unsigned int NumChannels; }
    CUDA_ARRAY_DESCRIPTOR;
typedef struct { unsigned int Width; unsigned int Height; CUarray_format Format; unsigned int NumChannels; }
    CUDA_ARRAY_DESCRIPTOR_v1;
typedef struct { size_t Width, Height, Depth; CUarray_format Format; unsigned int NumChannels, Flags; }
    CUDA_ARRAY3D_DESCRIPTOR;
typedef struct { unsigned int Width, Height, Depth; CUarray_format Format; unsigned int NumChannels, Flags; }
    CUDA_ARRAY3D_DESCRIPTOR_v1;
typedef struct { size_t size; size_t alignment; unsigned int reserved[4]; } CUDA_ARRAY_MEMORY_REQUIREMENTS;

/* Copies with descriptors (cuMemcpy2D/3D/3DPeer and the batch copies of CUDA 12.8+), exactly as cuda.h lays
 * them out; the *_v1 ones are the legacy 32-bit ABI (cuMemcpy2D, cuMemcpy3D without _v2). */
typedef struct CUDA_MEMCPY2D_st {
    size_t srcXInBytes, srcY; CUmemorytype srcMemoryType; const void *srcHost; CUdeviceptr srcDevice;
    CUarray srcArray; size_t srcPitch;
    size_t dstXInBytes, dstY; CUmemorytype dstMemoryType; void *dstHost; CUdeviceptr dstDevice;
    CUarray dstArray; size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;
typedef struct CUDA_MEMCPY2D_v1_st {
    unsigned int srcXInBytes, srcY; CUmemorytype srcMemoryType; const void *srcHost; CUdeviceptr_v1 srcDevice;
    CUarray srcArray; unsigned int srcPitch;
    unsigned int dstXInBytes, dstY; CUmemorytype dstMemoryType; void *dstHost; CUdeviceptr_v1 dstDevice;
    CUarray dstArray; unsigned int dstPitch;
    unsigned int WidthInBytes, Height;
} CUDA_MEMCPY2D_v1;
typedef struct CUDA_MEMCPY3D_st {
    size_t srcXInBytes, srcY, srcZ, srcLOD; CUmemorytype srcMemoryType; const void *srcHost; CUdeviceptr srcDevice;
    CUarray srcArray; void *reserved0; size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD; CUmemorytype dstMemoryType; void *dstHost; CUdeviceptr dstDevice;
    CUarray dstArray; void *reserved1; size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D;
typedef struct CUDA_MEMCPY3D_v1_st {
    unsigned int srcXInBytes, srcY, srcZ, srcLOD; CUmemorytype srcMemoryType; const void *srcHost;
    CUdeviceptr_v1 srcDevice; CUarray srcArray; void *reserved0; unsigned int srcPitch, srcHeight;
    unsigned int dstXInBytes, dstY, dstZ, dstLOD; CUmemorytype dstMemoryType; void *dstHost;
    CUdeviceptr_v1 dstDevice; CUarray dstArray; void *reserved1; unsigned int dstPitch, dstHeight;
    unsigned int WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D_v1;
typedef struct CUDA_MEMCPY3D_PEER_st {
    size_t srcXInBytes, srcY, srcZ, srcLOD; CUmemorytype srcMemoryType; const void *srcHost; CUdeviceptr srcDevice;
    CUarray srcArray; CUcontext srcContext; size_t srcPitch, srcHeight;
    size_t dstXInBytes, dstY, dstZ, dstLOD; CUmemorytype dstMemoryType; void *dstHost; CUdeviceptr dstDevice;
    CUarray dstArray; CUcontext dstContext; size_t dstPitch, dstHeight;
    size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D_PEER;
typedef enum { CU_MEMCPY_SRC_ACCESS_ORDER_INVALID = 0, CU_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1,
               CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL = 2, CU_MEMCPY_SRC_ACCESS_ORDER_ANY = 3,
               CU_MEMCPY_SRC_ACCESS_ORDER_MAX = 0x7fffffff } CUmemcpySrcAccessOrder;
typedef struct CUmemcpyAttributes_st {
    CUmemcpySrcAccessOrder srcAccessOrder; CUmemLocation srcLocHint, dstLocHint; unsigned int flags;
} CUmemcpyAttributes;
typedef enum { CU_MEMCPY_OPERAND_TYPE_POINTER = 1, CU_MEMCPY_OPERAND_TYPE_ARRAY = 2,
               CU_MEMCPY_OPERAND_TYPE_MAX = 0x7fffffff } CUmemcpy3DOperandType;
typedef struct CUoffset3D_st { size_t x, y, z; } CUoffset3D;
typedef struct CUextent3D_st { size_t width, height, depth; } CUextent3D;
typedef struct CUmemcpy3DOperand_st {
    CUmemcpy3DOperandType type;
    union {
        struct { CUdeviceptr ptr; size_t rowLength, layerHeight; CUmemLocation locHint; } ptr;
        struct { CUarray array; CUoffset3D offset; } array;
    } op;
} CUmemcpy3DOperand;
typedef struct CUDA_MEMCPY3D_BATCH_OP_st {
    CUmemcpy3DOperand src, dst; CUextent3D extent; CUmemcpySrcAccessOrder srcAccessOrder; unsigned int flags;
} CUDA_MEMCPY3D_BATCH_OP;

/* Stream memory operations (cuStreamWriteValue*, cuStreamWaitValue*, cuStreamBatchMemOp). The union is 48
 * bytes (pad[6]); its CUDA 13 atomicReduction member is not declared here (nothing reads it). */
typedef enum { CU_STREAM_MEM_OP_WAIT_VALUE_32 = 1, CU_STREAM_MEM_OP_WRITE_VALUE_32 = 2,
               CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES = 3, CU_STREAM_MEM_OP_WAIT_VALUE_64 = 4,
               CU_STREAM_MEM_OP_WRITE_VALUE_64 = 5, CU_STREAM_MEM_OP_BARRIER = 6,
               CU_STREAM_MEM_OP_ATOMIC_REDUCTION = 8 } CUstreamBatchMemOpType;
enum { CU_STREAM_WAIT_VALUE_GEQ = 0, CU_STREAM_WAIT_VALUE_EQ = 1, CU_STREAM_WAIT_VALUE_AND = 2,
       CU_STREAM_WAIT_VALUE_NOR = 3, CU_STREAM_WAIT_VALUE_FLUSH = 1 << 30 };
enum { CU_STREAM_WRITE_VALUE_DEFAULT = 0, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER = 1 };
typedef union CUstreamBatchMemOpParams_union {
    CUstreamBatchMemOpType operation;
    struct { CUstreamBatchMemOpType operation; CUdeviceptr address; union { cuuint32_t value; cuuint64_t value64; };
             unsigned int flags; CUdeviceptr alias; } waitValue, writeValue;
    struct { CUstreamBatchMemOpType operation; unsigned int flags; } flushRemoteWrites, memoryBarrier;
    cuuint64_t pad[6];
} CUstreamBatchMemOpParams;
_Static_assert(sizeof(CUstreamBatchMemOpParams) == 48, "CUstreamBatchMemOpParams is 48 bytes in cuda.h");

/* Only passed by pointer here: the legacy multi-device launch's list and the decompression parameters. */
typedef struct CUDA_LAUNCH_PARAMS_st CUDA_LAUNCH_PARAMS;
typedef struct CUmemDecompressParams_st CUmemDecompressParams;

/* ---- NVML ------------------------------------------------------------------------------------------ */
#ifndef DECLDIR
#define DECLDIR                              /* nvml.h: __declspec(dllexport) on Windows, nothing on Linux */
#endif
typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NO_PERMISSION = 4, NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_TIMEOUT = 10, NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25, NVML_ERROR_UNKNOWN = 999,
};
typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define nvmlMemory_v2 0x02000028u  /* NVML_STRUCT_VERSION(Memory, 2) = sizeof | 2 << 24 */
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; } nvmlProcessInfo_v1_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId,
                 computeInstanceId; } nvmlProcessInfo_t;
typedef nvmlProcessInfo_t nvmlProcessInfo_v2_t;
typedef enum { NVML_NVLINK_DEVICE_TYPE_GPU = 0x00, NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01,
               NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02, NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF }
    nvmlIntNvLinkDeviceType_t;
typedef struct { char busIdLegacy[16]; unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
                 char busId[32]; } nvmlPciInfo_t;
typedef struct { nvmlDevice_t device; unsigned long long eventType, eventData;
                 unsigned int gpuInstanceId, computeInstanceId; } nvmlEventData_t;
enum { nvmlEventTypeSingleBitEccError = 0x1, nvmlEventTypeDoubleBitEccError = 0x2,
       nvmlEventTypePState = 0x4, nvmlEventTypeXidCriticalError = 0x8, nvmlEventTypeClock = 0x10 };

#endif
