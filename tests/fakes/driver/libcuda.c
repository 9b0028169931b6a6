/*
 * A stand-in libcuda.so.<version> (soname libcuda.so.1): cuInit, cuDriverGetVersion and
 * CUDA's checkpoint entry points with cuda.h's signatures and argument layouts.
 *
 * The real driver reaches a CUDA process through its own channel; the stand-in's channel
 * is a Unix socket that the stand-in CUDA process (cuda_process.c) listens on inside its
 * container, reached from the host as /proc/<pid>/root/tmp/.fake-cuda-<nspid>.sock
 * (<nspid>: the process's PID in its own namespace, NSpid in /proc/<pid>/status). One
 * command a connection, one line each way: "lock", "checkpoint", "restore <GPU-uuid>",
 * "unlock", "state"; the answer starts with the CUresult.
 *
 * $FAKE_CUDA_DRIVER_VERSION: what cuDriverGetVersion reports (default 13000: CUDA 13.0,
 * driver 580; 12040 stands for 550, 12020 for 535). Below 12040 the checkpoint calls
 * answer CUDA_ERROR_NOT_SUPPORTED, below 13000 a restore with GPU pairs does too.
 * $FAKE_CUDA_STATE_DIR: the "driver's" list of checkpointed processes, one empty file a
 * host PID; the fake NVML leaves them out of its process lists as the real one does.
 * $FAKE_CUDA_GATE_DIR: when set, a checkpoint or restore of host PID <pid> waits (up to
 * LONGEST_MS) until <dir>/checkpoint-<pid> or <dir>/restore-<pid> exists, so that a test
 * holds an operation part-way and reads its progress, without timing anything.
 * $FAKE_CUDA_STEP_MS: each checkpoint and each restore takes this many milliseconds more
 * (bench/on_demand_bench.py: a GPU memory's copy at a per-GiB cost).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_TIMEOUT 909
#define CUDA_ERROR_UNKNOWN 999

typedef unsigned long long cuuint64_t;
typedef struct CUuuid_st { char bytes[16]; } CUuuid;
typedef enum CUprocessState_enum {
    CU_PROCESS_STATE_RUNNING = 0,
    CU_PROCESS_STATE_LOCKED = 1,
    CU_PROCESS_STATE_CHECKPOINTED = 2,
    CU_PROCESS_STATE_FAILED = 3,
} CUprocessState;
typedef struct CUcheckpointLockArgs_st {
    unsigned int timeoutMs;
    unsigned int reserved0;
    cuuint64_t reserved1[7];
} CUcheckpointLockArgs;
typedef struct CUcheckpointCheckpointArgs_st { cuuint64_t reserved[8]; } CUcheckpointCheckpointArgs;
typedef struct CUcheckpointUnlockArgs_st { cuuint64_t reserved[8]; } CUcheckpointUnlockArgs;
typedef struct CUcheckpointGpuPair_st { CUuuid oldUuid; CUuuid newUuid; } CUcheckpointGpuPair;
typedef struct CUcheckpointRestoreArgs_st {
    CUcheckpointGpuPair *gpuPairs;
    unsigned int gpuPairsCount;
    char reserved[52 - sizeof(CUcheckpointGpuPair *)];
    cuuint64_t reserved1;
} CUcheckpointRestoreArgs;

_Static_assert(sizeof(CUcheckpointLockArgs) == 64, "CUcheckpointLockArgs");
_Static_assert(sizeof(CUcheckpointRestoreArgs) == 64, "CUcheckpointRestoreArgs");
_Static_assert(sizeof(CUcheckpointGpuPair) == 32, "CUcheckpointGpuPair");

#define LONGEST_MS 60000 /* checkpoint and restore: no stand-in step takes longer */

CUresult cuInit(unsigned int flags) { return flags == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE; }

static int version(void) {
    const char *text = getenv("FAKE_CUDA_DRIVER_VERSION");
    return text ? atoi(text) : 13000;
}

CUresult cuDriverGetVersion(int *driverVersion) {
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = version();
    return CUDA_SUCCESS;
}

/* The process's PID in its own PID namespace: the last NSpid field. */
static int ns_pid(int pid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    int found = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "NSpid:", 6))
            continue;
        char *save = NULL;
        for (char *tok = strtok_r(line + 6, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save))
            found = atoi(tok);
    }
    fclose(f);
    return found;
}

/* One command to the process, its answer into `reply`; waits up to `ms` for it. */
static CUresult ask(int pid, const char *command, char *reply, size_t size, int ms) {
    int inner = ns_pid(pid);
    if (inner <= 0)
        return CUDA_ERROR_INVALID_VALUE; /* no such process */
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int n = snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/%d/root/tmp/.fake-cuda-%d.sock",
                     pid, inner);
    if (n >= (int)sizeof addr.sun_path)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return CUDA_ERROR_UNKNOWN;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        close(fd);
        return CUDA_ERROR_NOT_FOUND; /* not a CUDA process */
    }
    char line[256];
    n = snprintf(line, sizeof line, "%s\n", command);
    if (write(fd, line, n) != n) {
        close(fd);
        return CUDA_ERROR_UNKNOWN;
    }
    size_t got = 0;
    struct timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long spent = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (spent >= ms || poll(&p, 1, ms - spent) == 0) {
            close(fd);
            return CUDA_ERROR_TIMEOUT;
        }
        ssize_t r = read(fd, reply + got, size - 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += r;
        if (memchr(reply, '\n', got) || got == size - 1)
            break;
    }
    close(fd);
    reply[got] = 0;
    if (got == 0)
        return CUDA_ERROR_UNKNOWN;
    return (CUresult)atoi(reply);
}

static void mark(int pid, int checkpointed) {
    const char *dir = getenv("FAKE_CUDA_STATE_DIR");
    if (!dir)
        return;
    char path[512];
    snprintf(path, sizeof path, "%s/%d", dir, pid);
    if (checkpointed) {
        FILE *f = fopen(path, "w");
        if (f)
            fclose(f);
    } else {
        unlink(path);
    }
}

/* $FAKE_CUDA_GATE_DIR's gate for `step` of `pid`: waits until it is opened. */
static void wait_gate(const char *step, int pid) {
    const char *dir = getenv("FAKE_CUDA_GATE_DIR");
    if (!dir)
        return;
    char path[512];
    snprintf(path, sizeof path, "%s/%s-%d", dir, step, pid);
    for (int waited = 0; waited < LONGEST_MS && access(path, F_OK) != 0; waited += 10) {
        struct timespec tick = {0, 10 * 1000 * 1000};
        nanosleep(&tick, NULL);
    }
}

/* $FAKE_CUDA_STEP_MS: the cost of one checkpoint or restore. */
static void step_cost(void) {
    const char *text = getenv("FAKE_CUDA_STEP_MS");
    long ms = text ? atol(text) : 0;
    if (ms <= 0 || ms > LONGEST_MS)
        return;
    struct timespec cost = {ms / 1000, (ms % 1000) * 1000 * 1000};
    nanosleep(&cost, NULL);
}

CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args) {
    if (version() < 12040)
        return CUDA_ERROR_NOT_SUPPORTED;
    unsigned int ms = args && args->timeoutMs ? args->timeoutMs : LONGEST_MS;
    char reply[256];
    return ask(pid, "lock", reply, sizeof reply, (int)ms);
}

CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args) {
    (void)args;
    if (version() < 12040)
        return CUDA_ERROR_NOT_SUPPORTED;
    wait_gate("checkpoint", pid);
    step_cost();
    char reply[256];
    CUresult result = ask(pid, "checkpoint", reply, sizeof reply, LONGEST_MS);
    if (result == CUDA_SUCCESS)
        mark(pid, 1);
    return result;
}

static void uuid_text(const CUuuid *uuid, char *out) {
    const unsigned char *b = (const unsigned char *)uuid->bytes;
    sprintf(out, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
            b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
            b[15]);
}

CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args) {
    if (version() < 12040)
        return CUDA_ERROR_NOT_SUPPORTED;
    char command[256] = "restore";
    if (args && args->gpuPairsCount) {
        if (version() < 13000)
            return CUDA_ERROR_NOT_SUPPORTED;
        if (!args->gpuPairs || args->gpuPairsCount > 16)
            return CUDA_ERROR_INVALID_VALUE;
        for (unsigned int i = 0; i < args->gpuPairsCount; i++) {
            char old[48], new[48];
            uuid_text(&args->gpuPairs[i].oldUuid, old);
            uuid_text(&args->gpuPairs[i].newUuid, new);
            size_t used = strlen(command);
            snprintf(command + used, sizeof command - used, " %s=%s", old, new);
        }
    }
    wait_gate("restore", pid);
    step_cost();
    char reply[256];
    CUresult result = ask(pid, command, reply, sizeof reply, LONGEST_MS);
    if (result == CUDA_SUCCESS)
        mark(pid, 0);
    return result;
}

CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args) {
    (void)args;
    if (version() < 12040)
        return CUDA_ERROR_NOT_SUPPORTED;
    char reply[256];
    return ask(pid, "unlock", reply, sizeof reply, LONGEST_MS);
}

CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state) {
    if (!state)
        return CUDA_ERROR_INVALID_VALUE;
    if (version() < 12040)
        return CUDA_ERROR_NOT_SUPPORTED;
    char reply[256];
    CUresult result = ask(pid, "state", reply, sizeof reply, LONGEST_MS);
    if (result != CUDA_SUCCESS)
        return result;
    const char *space = strchr(reply, ' ');
    if (!space)
        return CUDA_ERROR_UNKNOWN;
    *state = (CUprocessState)atoi(space + 1);
    return CUDA_SUCCESS;
}
