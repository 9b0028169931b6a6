/*
 * A fake libnvidia-ml.so.1: the NVML C ABI that nvidia-ml-py (pynvml) 13 calls
 * through ctypes for gpu-hotmount's code paths, with nvml.h's signatures, struct
 * layouts and return codes. GPUs come from the text file named by $FAKE_NVML_CONFIG,
 * one per line, in NVML index order:
 *
 *     GPU-<uuid> <domain:bus:device.function> minor=<n> [pids=1,2] [graphics=3,4]
 *
 * `pids` are compute processes, `graphics` graphics ones: read again from the file at each
 * process query, as a real driver's lists are live in a session opened before the process
 * started (the agent keeps one open, hotmount/devices/activity.py); the GPUs themselves are read
 * at nvmlInit. $FAKE_NVML_INIT_ERROR=<code>
 * makes nvmlInit fail with that NVML_ERROR_* code (9: NVML_ERROR_DRIVER_NOT_LOADED).
 *
 * MIG: a GPU line may add `mig=on` or `mig=off` (MIG-capable, mode enabled or not; without
 * it the GPU is not MIG-capable). A MIG device is a line of its own, after its parent's:
 *
 *     MIG-<uuid> parent=GPU-<uuid> gi=<n> ci=<n> [slot=<n>] [profile=1g.10gb] [memory=<MiB>]
 *
 * `slot` is its index under the parent (default: the next free one; NVML's indexes may
 * have holes); the profile gives the name's suffix and the attributes' slice counts.
 *
 * NVIDIA's device plugin (k8s-device-plugin, through go-nvml) calls more: those are in
 * fake_nvml_device_plugin.c, #included at the end, with the list.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* MIG devices (the MIG block below): their handles are nvmlDevice_t too. */
static int is_mig(nvmlDevice_t device);
static void reset_migs(void);
static void parse_mig_line(char *uuid, char **save);
static void parse_gpu_mig_flag(struct nvmlDevice_st *gpu, const char *tok);
static nvmlReturn_t mig_handle_by_uuid(const char *uuid, nvmlDevice_t *device);

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
    reset_migs();
    while (fgets(line, sizeof line, f) && ngpus < MAX_GPUS) {
        struct nvmlDevice_st *g = &gpus[ngpus];
        char *save, *tok = strtok_r(line, " \t\r\n", &save);
        if (!tok || tok[0] == '#')
            continue;
        if (!strncmp(tok, "MIG-", 4)) {
            parse_mig_line(tok, &save);
            continue;
        }
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
            else if (!strncmp(tok, "mig=", 4))
                parse_gpu_mig_flag(g, tok + 4);
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
    return mig_handle_by_uuid(uuid, device);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!(valid(device) || is_mig(device)) || !uuid)
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

/* A process the stand-in libcuda checkpointed (a file <pid> in $FAKE_CUDA_STATE_DIR) has
 * no context on any GPU: the real NVML lists it no more (tests/fakes/driver/libcuda.c). */
static int checkpointed(unsigned int pid) {
    const char *dir = getenv("FAKE_CUDA_STATE_DIR");
    char path[512];
    if (!dir)
        return 0;
    snprintf(path, sizeof path, "%s/%u", dir, pid);
    return access(path, F_OK) == 0;
}

/* The process lists of the config file as it is now (a test replaces it by a rename),
 * into the GPUs of the same UUID; the GPUs and their handles stay those nvmlInit read. */
static void reread_processes(void) {
    const char *path = getenv("FAKE_NVML_CONFIG");
    FILE *f = path ? fopen(path, "r") : NULL;
    char line[1024];
    if (!f)
        return;
    while (fgets(line, sizeof line, f)) {
        char *save, *tok = strtok_r(line, " \t\r\n", &save);
        if (!tok || tok[0] == '#' || !strncmp(tok, "MIG-", 4))
            continue;
        struct nvmlDevice_st *g = NULL;
        for (unsigned int i = 0; i < ngpus && !g; i++)
            if (!strcmp(gpus[i].uuid, tok))
                g = &gpus[i];
        if (!g)
            continue;
        unsigned int compute[MAX_PIDS], graphics[MAX_PIDS], ncompute = 0, ngraphics = 0;
        while ((tok = strtok_r(NULL, " \t\r\n", &save))) {
            if (!strncmp(tok, "pids=", 5))
                ncompute = parse_pids(tok + 5, compute);
            else if (!strncmp(tok, "graphics=", 9))
                ngraphics = parse_pids(tok + 9, graphics);
        }
        memcpy(g->compute, compute, ncompute * sizeof *compute);
        g->ncompute = ncompute;
        memcpy(g->graphics, graphics, ngraphics * sizeof *graphics);
        g->ngraphics = ngraphics;
    }
    fclose(f);
}

/* The size dance: too small an array (or count 0 and NULL) -> INSUFFICIENT_SIZE and the count. */
static nvmlReturn_t processes(const unsigned int *all, unsigned int total, unsigned int *infoCount,
                              nvmlProcessInfo_t *infos) {
    unsigned int pids[MAX_PIDS], n = 0;
    for (unsigned int i = 0; i < total; i++)
        if (!checkpointed(all[i]))
            pids[n++] = all[i];
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
    reread_processes();
    return processes(device->compute, device->ncompute, infoCount, infos);
}

nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount,
                                                      nvmlProcessInfo_t *infos) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    reread_processes();
    return processes(device->graphics, device->ngraphics, infoCount, infos);
}

/* The layouts pynvml's ctypes Structures expect (x86-64 and aarch64 alike). */
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t");
_Static_assert(__builtin_offsetof(nvmlPciInfo_t, busId) == 36, "nvmlPciInfo_t.busId");
_Static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_t");
_Static_assert(__builtin_offsetof(nvmlProcessInfo_t, usedGpuMemory) == 8, "usedGpuMemory");

/* ---- MIG: the calls pynvml makes to enumerate MIG devices (nvml.h's "Multi Instance GPU
 * Management" group). A MIG device's handle is a struct nvmlDevice_st of its own (its UUID;
 * minor is the parent's); what is MIG about it lives in the parallel `mig_info`. ---- */

#define MAX_MIGS_PER_GPU 7 /* what an A100 or H100 reports as nvmlDeviceGetMaxMigDeviceCount */
#define MAX_MIGS (MAX_GPUS * MAX_MIGS_PER_GPU)
#define FAKE_NVML_ERROR_NOT_SUPPORTED ((nvmlReturn_t)3) /* NVML_ERROR_NOT_SUPPORTED */
#define NVML_DEVICE_MIG_DISABLE 0
#define NVML_DEVICE_MIG_ENABLE 1
#define MIG_NOT_CAPABLE (-1)

/* nvml.h: nvmlDeviceAttributes_t (what nvmlDeviceGetAttributes_v2 fills). */
typedef struct nvmlDeviceAttributes_st {
    unsigned int multiprocessorCount;
    unsigned int sharedCopyEngineCount;
    unsigned int sharedDecoderCount;
    unsigned int sharedEncoderCount;
    unsigned int sharedJpegCount;
    unsigned int sharedOfaCount;
    unsigned int gpuInstanceSliceCount;
    unsigned int computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;
_Static_assert(sizeof(nvmlDeviceAttributes_t) == 40, "nvmlDeviceAttributes_t");
_Static_assert(__builtin_offsetof(nvmlDeviceAttributes_t, memorySizeMB) == 32, "memorySizeMB");

struct fake_mig {
    unsigned int parent, slot, gi, ci; /* parent: index into gpus */
    unsigned int gi_slices, ci_slices;
    unsigned long long memory_mib;
    char profile[32];
};

static struct nvmlDevice_st mig_devices[MAX_MIGS];
static struct fake_mig mig_info[MAX_MIGS];
static unsigned int nmigs;
static int gpu_mig_mode[MAX_GPUS]; /* MIG_NOT_CAPABLE, or NVML_DEVICE_MIG_{DISABLE,ENABLE} */

static int is_mig(nvmlDevice_t device) {
    return device >= mig_devices && device < mig_devices + nmigs;
}

static struct fake_mig *mig_of(nvmlDevice_t device) {
    return &mig_info[device - mig_devices];
}

static void reset_migs(void) {
    nmigs = 0;
    for (unsigned int i = 0; i < MAX_GPUS; i++)
        gpu_mig_mode[i] = MIG_NOT_CAPABLE;
}

static void parse_gpu_mig_flag(struct nvmlDevice_st *gpu, const char *value) {
    gpu_mig_mode[gpu - gpus] = strcmp(value, "on") ? NVML_DEVICE_MIG_DISABLE : NVML_DEVICE_MIG_ENABLE;
}

static int slot_taken(unsigned int parent, unsigned int slot) {
    for (unsigned int i = 0; i < nmigs; i++)
        if (mig_info[i].parent == parent && mig_info[i].slot == slot)
            return 1;
    return 0;
}

/* "1g.10gb" -> 1 and 1; "1c.2g.20gb" -> 2 GPU slices, 1 compute slice. */
static void profile_slices(const char *profile, unsigned int *gi, unsigned int *ci) {
    unsigned int a, b;
    *gi = *ci = 1;
    if (sscanf(profile, "%uc.%ug.", &a, &b) == 2) {
        *ci = a;
        *gi = b;
    } else if (sscanf(profile, "%ug.", &a) == 1) {
        *gi = *ci = a;
    }
}

/* One `MIG-<uuid> parent=GPU-<uuid> gi= ci= [slot=] [profile=] [memory=]` line; a line
 * whose parent is not an earlier GPU line, or has no room, is ignored. */
static void parse_mig_line(char *uuid, char **save) {
    struct fake_mig m = {.slot = MAX_MIGS_PER_GPU, .memory_mib = 9856};
    int parent = -1;
    char *tok;
    snprintf(m.profile, sizeof m.profile, "1g.10gb");
    while ((tok = strtok_r(NULL, " \t\r\n", save))) {
        if (!strncmp(tok, "parent=", 7)) {
            for (unsigned int i = 0; i < ngpus; i++)
                if (!strcmp(gpus[i].uuid, tok + 7))
                    parent = (int)i;
        } else if (!strncmp(tok, "gi=", 3))
            m.gi = (unsigned int)strtoul(tok + 3, NULL, 10);
        else if (!strncmp(tok, "ci=", 3))
            m.ci = (unsigned int)strtoul(tok + 3, NULL, 10);
        else if (!strncmp(tok, "slot=", 5))
            m.slot = (unsigned int)strtoul(tok + 5, NULL, 10);
        else if (!strncmp(tok, "profile=", 8))
            snprintf(m.profile, sizeof m.profile, "%s", tok + 8);
        else if (!strncmp(tok, "memory=", 7))
            m.memory_mib = strtoull(tok + 7, NULL, 10);
    }
    if (parent < 0 || nmigs >= MAX_MIGS)
        return;
    m.parent = (unsigned int)parent;
    if (m.slot >= MAX_MIGS_PER_GPU)
        for (m.slot = 0; m.slot < MAX_MIGS_PER_GPU && slot_taken(m.parent, m.slot); m.slot++)
            ;
    if (m.slot >= MAX_MIGS_PER_GPU || slot_taken(m.parent, m.slot))
        return;
    profile_slices(m.profile, &m.gi_slices, &m.ci_slices);
    memset(&mig_devices[nmigs], 0, sizeof mig_devices[nmigs]);
    snprintf(mig_devices[nmigs].uuid, sizeof mig_devices[nmigs].uuid, "%s", uuid);
    mig_devices[nmigs].minor = gpus[m.parent].minor;
    mig_info[nmigs++] = m;
}

static nvmlReturn_t mig_handle_by_uuid(const char *uuid, nvmlDevice_t *device) {
    for (unsigned int i = 0; i < nmigs; i++) {
        if (!strcmp(mig_devices[i].uuid, uuid)) {
            *device = &mig_devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                  unsigned int *pendingMode) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !currentMode || !pendingMode)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu_mig_mode[device - gpus] == MIG_NOT_CAPABLE)
        return FAKE_NVML_ERROR_NOT_SUPPORTED;
    *currentMode = *pendingMode = (unsigned int)gpu_mig_mode[device - gpus];
    return NVML_SUCCESS;
}

/* nvml.h: "Returns zero if MIG is not supported or enabled." */
nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = gpu_mig_mode[device - gpus] == NVML_DEVICE_MIG_ENABLE ? MAX_MIGS_PER_GPU : 0;
    return NVML_SUCCESS;
}

/* NOT_FOUND where no MIG device sits at `index`: callers walk 0..max and skip the holes. */
nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                 nvmlDevice_t *migDevice) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || !migDevice || index >= MAX_MIGS_PER_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (gpu_mig_mode[device - gpus] != NVML_DEVICE_MIG_ENABLE)
        return FAKE_NVML_ERROR_NOT_SUPPORTED;
    for (unsigned int i = 0; i < nmigs; i++) {
        if (&gpus[mig_info[i].parent] == device && mig_info[i].slot == index) {
            *migDevice = &mig_devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!(valid(device) || is_mig(device)) || !isMigDevice)
        return NVML_ERROR_INVALID_ARGUMENT;
    *isMigDevice = (unsigned int)is_mig(device);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                          nvmlDevice_t *device) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!is_mig(migDevice) || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &gpus[mig_of(migDevice)->parent];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!is_mig(device) || !id)
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = mig_of(device)->gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!is_mig(device) || !id)
        return NVML_ERROR_INVALID_ARGUMENT;
    *id = mig_of(device)->ci;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device, nvmlDeviceAttributes_t *attributes) {
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!(valid(device) || is_mig(device)) || !attributes)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!is_mig(device))
        return FAKE_NVML_ERROR_NOT_SUPPORTED; /* attributes are a MIG device's */
    const struct fake_mig *m = mig_of(device);
    memset(attributes, 0, sizeof *attributes);
    attributes->multiprocessorCount = 16 * m->ci_slices; /* H100: 16 SMs a compute slice */
    attributes->sharedCopyEngineCount = m->gi_slices;
    attributes->sharedDecoderCount = m->gi_slices;
    attributes->gpuInstanceSliceCount = m->gi_slices;
    attributes->computeInstanceSliceCount = m->ci_slices;
    attributes->memorySizeMB = m->memory_mib;
    return NVML_SUCCESS;
}

/* The driver names a MIG device "<GPU name> MIG <profile>" (nvidia-smi -L prints the tail). */
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    char text[96];
    if (!refcount)
        return NVML_ERROR_UNINITIALIZED;
    if (!(valid(device) || is_mig(device)) || !name)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (is_mig(device))
        snprintf(text, sizeof text, "NVIDIA H200 MIG %s", mig_of(device)->profile);
    else
        snprintf(text, sizeof text, "NVIDIA H200");
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(name, text);
    return NVML_SUCCESS;
}

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
    unsigned long long at; /* the samples' timestamp (microseconds); 0: now */
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
            else if (!strncmp(tok, "at=", 3))
                a->at = strtoull(tok + 3, NULL, 10);
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
    if (a.at)
        now = a.at; /* samples the driver took once, kept in its buffer */
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

#include "fake_nvml_device_plugin.c"
