/*
 * A fake libnvidia-ml.so.1: the NVML C ABI that nvidia-ml-py (pynvml) 13 calls
 * through ctypes for gpu-hotmount's code paths, with nvml.h's signatures, struct
 * layouts and return codes. GPUs come from the text file named by $FAKE_NVML_CONFIG,
 * one per line, in NVML index order:
 *
 *     GPU-<uuid> <domain:bus:device.function> minor=<n> [pids=1,2] [graphics=3,4]
 *
 * `pids` are compute processes, `graphics` graphics ones. $FAKE_NVML_INIT_ERROR=<code>
 * makes nvmlInit fail with that NVML_ERROR_* code (9: NVML_ERROR_DRIVER_NOT_LOADED).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_UNKNOWN = 999,
} nvmlReturn_t;

#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_VALUE_NOT_AVAILABLE_UINT 0xFFFFFFFFu

/* nvml.h: nvmlPciInfo_t (what nvmlDeviceGetPciInfo_v3 fills). */
typedef struct nvmlPciInfo_st {
    char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];
} nvmlPciInfo_t;

/* nvml.h: nvmlProcessInfo_t, the same layout as nvmlProcessInfo_v2_t (the _v3 getters). */
typedef struct nvmlProcessInfo_st {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

#define MAX_GPUS 16
#define MAX_PIDS 64

struct nvmlDevice_st {
    char uuid[96];
    unsigned int domain, bus, dev, fn, minor;
    unsigned int ncompute, ngraphics;
    unsigned int compute[MAX_PIDS], graphics[MAX_PIDS];
};
typedef struct nvmlDevice_st *nvmlDevice_t;

static struct nvmlDevice_st gpus[MAX_GPUS];
static unsigned int ngpus;
static int refcount;

static unsigned int parse_pids(const char *list, unsigned int *out) {
    unsigned int n = 0;
    char *end;
    while (*list && n < MAX_PIDS) {
        unsigned long pid = strtoul(list, &end, 10);
        if (end == list)
            break;
        out[n++] = (unsigned int)pid;
        list = *end == ',' ? end + 1 : end;
    }
    return n;
}

static nvmlReturn_t load_config(void) {
    const char *path = getenv("FAKE_NVML_CONFIG");
    FILE *f = path ? fopen(path, "r") : NULL;
    char line[1024];
    if (!f)
        return NVML_ERROR_DRIVER_NOT_LOADED; /* what NVML says with no kernel module */
    ngpus = 0;
    while (fgets(line, sizeof line, f) && ngpus < MAX_GPUS) {
        struct nvmlDevice_st *g = &gpus[ngpus];
        char *save, *tok = strtok_r(line, " \t\r\n", &save);
        if (!tok || tok[0] == '#')
            continue;
        memset(g, 0, sizeof *g);
        snprintf(g->uuid, sizeof g->uuid, "%s", tok);
        tok = strtok_r(NULL, " \t\r\n", &save);
        if (!tok || sscanf(tok, "%x:%x:%x.%x", &g->domain, &g->bus, &g->dev, &g->fn) != 4) {
            fclose(f);
            return NVML_ERROR_UNKNOWN;
        }
        while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
            if (!strncmp(tok, "minor=", 6))
                g->minor = (unsigned int)strtoul(tok + 6, NULL, 10);
            else if (!strncmp(tok, "pids=", 5))
                g->ncompute = parse_pids(tok + 5, g->compute);
            else if (!strncmp(tok, "graphics=", 9))
                g->ngraphics = parse_pids(tok + 9, g->graphics);
        }
        ngpus++;
    }
    fclose(f);
    return NVML_SUCCESS;
}

/* A handle is valid only if it points at one of our GPUs. */
static int valid(nvmlDevice_t device) {
    return device >= gpus && device < gpus + ngpus;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    const char *fail = getenv("FAKE_NVML_INIT_ERROR");
    if (fail && *fail)
        return (nvmlReturn_t)atoi(fail);
    if (refcount == 0) {
        nvmlReturn_t ret = load_config();
        if (ret != NVML_SUCCESS)
            return ret;
    }
    refcount++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (refcount == 0)
        return NVML_ERROR_UNINITIALIZED;
    refcount--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = ngpus;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= ngpus)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < ngpus; i++) {
        if (!strcmp(gpus[i].uuid, uuid)) {
            *device = &gpus[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !uuid)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(device->uuid) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(uuid, device->uuid);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !pci)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    /* As the driver formats them: upper-case hex, an 8-digit domain in busId. */
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.%X", device->domain,
             device->bus, device->dev, device->fn);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.%X", device->domain, device->bus,
             device->dev, device->fn);
    pci->domain = device->domain;
    pci->bus = device->bus;
    pci->device = device->dev;
    pci->pciDeviceId = 0x233510DE; /* H200 device id << 16 | NVIDIA vendor id */
    pci->pciSubSystemId = 0x18BE10DE;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !minorNumber)
        return NVML_ERROR_INVALID_ARGUMENT;
    *minorNumber = device->minor;
    return NVML_SUCCESS;
}

/* The size dance: too small an array (or count 0 and NULL) -> INSUFFICIENT_SIZE and the count. */
static nvmlReturn_t processes(const unsigned int *pids, unsigned int n, unsigned int *infoCount,
                              nvmlProcessInfo_t *infos) {
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (*infoCount < n) {
        *infoCount = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *infoCount = n;
    if (n == 0)
        return NVML_SUCCESS;
    if (!infos)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < n; i++) {
        infos[i].pid = pids[i];
        infos[i].usedGpuMemory = 512ULL << 20;
        infos[i].gpuInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT; /* not a MIG device */
        infos[i].computeInstanceId = NVML_VALUE_NOT_AVAILABLE_UINT;
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    return processes(device->compute, device->ncompute, infoCount, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    return processes(device->graphics, device->ngraphics, infoCount, infos);
}

/* The layouts pynvml's ctypes Structures expect (x86-64 and aarch64 alike). */
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t");
_Static_assert(__builtin_offsetof(nvmlPciInfo_t, busId) == 36, "nvmlPciInfo_t.busId");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t");
_Static_assert(__builtin_offsetof(nvmlProcessInfo_t, usedGpuMemory) == 8, "usedGpuMemory");

/* ---- Utilization (issue 20): nvmlDeviceGetUtilizationRates, nvmlDeviceGetProcessUtilization.
 *
 * Activity comes from the control file named by $FAKE_NVML_ACTIVITY, re-read on every call
 * so a test changes a GPU's activity while a process keeps NVML open. One line per GPU:
 *
 *     GPU-<uuid> gpu=<pct> memory=<pct> [process=<pid>:<sm>:<mem>[,...]] [unsupported]
 *
 * A GPU without a line (or no file) is idle: 0 %, no process samples. `unsupported` makes
 * both calls answer NVML_ERROR_NOT_SUPPORTED, as the driver does for MIG devices. Process
 * samples are stamped with the time of the call (microseconds, as the driver's are), so a
 * process listed as busy stays busy: each call after a timestamp finds a newer sample.
 */
#include <sys/time.h>

#define NVML_ERROR_NOT_SUPPORTED_CODE 3

/* nvml.h: nvmlUtilization_t. */
typedef struct nvmlUtilization_st {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

/* nvml.h: nvmlProcessUtilizationSample_t. */
typedef struct nvmlProcessUtilizationSample_st {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil;
    unsigned int memUtil;
    unsigned int encUtil;
    unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

_Static_assert(sizeof(nvmlUtilization_t) == 8, "nvmlUtilization_t");
_Static_assert(sizeof(nvmlProcessUtilizationSample_t) == 32, "nvmlProcessUtilizationSample_t");
_Static_assert(__builtin_offsetof(nvmlProcessUtilizationSample_t, smUtil) == 16, "smUtil");

struct fake_activity {
    int found, unsupported;
    unsigned int gpu, memory, nproc;
    unsigned int pid[MAX_PIDS], sm[MAX_PIDS], mem[MAX_PIDS];
};

/* This GPU's line of the activity file; found=0 when there is none. */
static void read_activity(const char *uuid, struct fake_activity *a) {
    const char *path = getenv("FAKE_NVML_ACTIVITY");
    FILE *f = path ? fopen(path, "r") : NULL;
    char line[4096];
    memset(a, 0, sizeof *a);
    if (!f)
        return;
    while (!a->found && fgets(line, sizeof line, f)) {
        char *save, *tok = strtok_r(line, " \t\r\n", &save);
        if (!tok || strcmp(tok, uuid))
            continue;
        a->found = 1;
        while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
            if (!strncmp(tok, "gpu=", 4))
                a->gpu = (unsigned int)strtoul(tok + 4, NULL, 10);
            else if (!strncmp(tok, "memory=", 7))
                a->memory = (unsigned int)strtoul(tok + 7, NULL, 10);
            else if (!strcmp(tok, "unsupported"))
                a->unsupported = 1;
            else if (!strncmp(tok, "process=", 8)) {
                char *list = tok + 8, *end;
                while (*list && a->nproc < MAX_PIDS) {
                    unsigned int n = a->nproc;
                    a->pid[n] = (unsigned int)strtoul(list, &end, 10);
                    if (end == list || *end != ':')
                        break;
                    a->sm[n] = (unsigned int)strtoul(end + 1, &end, 10);
                    if (*end != ':')
                        break;
                    a->mem[n] = (unsigned int)strtoul(end + 1, &end, 10);
                    a->nproc++;
                    list = *end == ',' ? end + 1 : end;
                }
            }
        }
    }
    fclose(f);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization) {
    struct fake_activity a;
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    read_activity(device->uuid, &a);
    if (a.unsupported)
        return (nvmlReturn_t)NVML_ERROR_NOT_SUPPORTED_CODE;
    utilization->gpu = a.gpu;
    utilization->memory = a.memory;
    return NVML_SUCCESS;
}

/* The driver's dance: samples NULL -> INSUFFICIENT_SIZE and how many there are; none newer
 * than lastSeenTimeStamp -> NOT_FOUND. */
nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp) {
    struct fake_activity a;
    struct timeval tv;
    unsigned long long now;
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !processSamplesCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    read_activity(device->uuid, &a);
    if (a.unsupported)
        return (nvmlReturn_t)NVML_ERROR_NOT_SUPPORTED_CODE;
    gettimeofday(&tv, NULL);
    now = (unsigned long long)tv.tv_sec * 1000000ULL + (unsigned long long)tv.tv_usec;
    if (a.nproc == 0 || lastSeenTimeStamp >= now)
        return NVML_ERROR_NOT_FOUND;
    if (!utilization || *processSamplesCount < a.nproc) {
        *processSamplesCount = a.nproc;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < a.nproc; i++) {
        memset(&utilization[i], 0, sizeof utilization[i]);
        utilization[i].pid = a.pid[i];
        utilization[i].timeStamp = now;
        utilization[i].smUtil = a.sm[i];
        utilization[i].memUtil = a.mem[i];
    }
    *processSamplesCount = a.nproc;
    return NVML_SUCCESS;
}
/* ---- end of utilization */
