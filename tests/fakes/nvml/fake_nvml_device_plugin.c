/*
 * The NVML calls NVIDIA's own device plugin (k8s-device-plugin v0.18, through go-nvml and
 * go-nvlib) makes beyond pynvml's, #included by fake_nvml.c so they share its GPUs. Found by
 * running the plugin on the fake: go-nvml binds each symbol at its first call, and a missing
 * one ends the process with "undefined symbol: <name>". They are:
 *
 *     nvmlDeviceGetMemoryInfo            80 GiB total, all of it free
 *     nvmlDeviceGetCudaComputeCapability 9.0 (Hopper, as the H200 name says)
 *     nvmlSystemGetDriverVersion         "580.95.05"
 *     nvmlSystemGetCudaDriverVersion(_v2) 13000 (CUDA 13.0)
 *
 * and, for GetPreferredAllocation (go-gpuallocator's links between every two GPUs):
 *
 *     nvmlDeviceGetTopologyCommonAncestor NVML_TOPOLOGY_NODE (PCIe, the same CPU)
 *     nvmlDeviceGetNvLinkState           NOT_SUPPORTED (no NVLink: every link skipped)
 *
 * and, for its health checks (a goroutine that waits for XID events, 5 s at a time):
 *
 *     nvmlEventSetCreate, nvmlEventSetFree
 *     nvmlDeviceGetSupportedEventTypes   XID critical errors, single- and double-bit ECC
 *     nvmlDeviceRegisterEvents
 *     nvmlEventSetWait(_v2)              no event ever: NVML_ERROR_TIMEOUT after the timeout
 *
 * so the plugin runs with its health checks on and every GPU stays Healthy.
 */
#include <time.h>

/* nvml.h: nvmlMemory_t (v1: what nvmlDeviceGetMemoryInfo fills). */
typedef struct nvmlMemory_st {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;
_Static_assert(sizeof(nvmlMemory_t) == 24, "nvmlMemory_t");

#define FAKE_GPU_MEMORY (80ULL << 30)
#define FAKE_DRIVER_VERSION "580.95.05"
#define FAKE_CUDA_DRIVER_VERSION 13000

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!(valid(device) || is_mig(device)) || !memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = is_mig(device) ? mig_of(device)->memory_mib << 20 : FAKE_GPU_MEMORY;
    memory->free = memory->total;
    memory->used = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major, int *minor) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!(valid(device) || is_mig(device)) || !major || !minor)
        return NVML_ERROR_INVALID_ARGUMENT;
    *major = 9;
    *minor = 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!version)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(FAKE_DRIVER_VERSION) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(version, FAKE_DRIVER_VERSION);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = FAKE_CUDA_DRIVER_VERSION;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion) {
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

/* nvml.h: nvmlGpuTopologyLevel_t's NVML_TOPOLOGY_NODE (GPUs under the same CPU's PCIe). */
#define FAKE_NVML_TOPOLOGY_NODE 40

nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                 int *pathInfo) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device1) || !valid(device2) || !pathInfo)
        return NVML_ERROR_INVALID_ARGUMENT;
    *pathInfo = FAKE_NVML_TOPOLOGY_NODE;
    return NVML_SUCCESS;
}

/* The fake's GPUs have no NVLink, as a PCIe H200 NVL without its bridge. */
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, int *isActive) {
    (void)link;
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !isActive)
        return NVML_ERROR_INVALID_ARGUMENT;
    return FAKE_NVML_ERROR_NOT_SUPPORTED;
}

/* ---- Events: an event set that never fires (a GPU with no XIDs, no ECC errors). ---- */
#define FAKE_NVML_ERROR_TIMEOUT ((nvmlReturn_t)10) /* NVML_ERROR_TIMEOUT */
#define FAKE_EVENT_TYPES (0x8ULL | 0x2ULL | 0x1ULL) /* XidCritical | DoubleBitEcc | SingleBitEcc */

/* nvml.h: nvmlEventData_t (what nvmlEventSetWait_v2 fills when an event comes). */
typedef struct nvmlEventData_st {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t");

struct nvmlEventSet_st {
    unsigned long long registered; /* the union of the types registered, for show */
};
typedef struct nvmlEventSet_st *nvmlEventSet_t;

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof **set);
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    free(set);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *types) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!(valid(device) || is_mig(device)) || !types)
        return NVML_ERROR_INVALID_ARGUMENT;
    *types = FAKE_EVENT_TYPES;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long types,
                                      nvmlEventSet_t set) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!(valid(device) || is_mig(device)) || !set || (types & ~FAKE_EVENT_TYPES))
        return NVML_ERROR_INVALID_ARGUMENT;
    set->registered |= types;
    return NVML_SUCCESS;
}

/* No event comes: the wait lasts its timeout, as the driver's does on a healthy GPU. */
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    struct timespec wait = {timeoutms / 1000, (long)(timeoutms % 1000) * 1000000L};
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!set || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    while (nanosleep(&wait, &wait) != 0)
        ;
    return FAKE_NVML_ERROR_TIMEOUT;
}

nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    return nvmlEventSetWait_v2(set, data, timeoutms);
}
