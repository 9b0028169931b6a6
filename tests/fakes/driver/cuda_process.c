/*
 * A stand-in CUDA process, run inside a container (statically linked: a busybox rootfs
 * has no libc). It does what a process with a CUDA context does to the GPU's files:
 *
 *     cuda_process --gpu GPU-<uuid>=/dev/nvidia0 [--gpu GPU-<uuid>=/dev/nvidia1 ...]
 *                  [--ctl /dev/nvidiactl] [--mib N] [--refuse-lock] [--status PATH]
 *                  [--keep-open]
 *
 * holds the first --gpu's node (and --ctl) open and keeps N MiB of a known pattern as
 * its "GPU memory". It answers the stand-in libcuda (libcuda.c) on a Unix socket
 * /tmp/.fake-cuda-<pid>.sock: "lock" (never answered with --refuse-lock: a process whose
 * GPU work never drains), "checkpoint" (the memory copied to host memory, the GPU memory
 * dropped, every GPU fd closed), "restore [old=new ...]" (the node of the GPU it maps to
 * opened again, which fails while the cgroup denies it; the memory copied back and the
 * pattern checked), "unlock", "state". Each --gpu maps a UUID to its node, as the driver
 * maps a UUID to a minor. --keep-open: a second fd on the first GPU's node that is the
 * process's own, not CUDA's, so a checkpoint leaves it open. --status (default
 * /tmp/cuda-process.status) says where it stands, for the tests:
 * "<state> <node> pattern=<ok|bad>".
 *
 * A node with no driver behind it (the real-node tier's 195:<minor>) answers ENXIO
 * once the device cgroup has let the open through (a denied one answers EPERM first):
 * the process then holds the node by an O_PATH fd, which /proc/<pid>/fd shows as the
 * real driver's fd would, and which a checkpoint closes the same way.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

enum { RUNNING = 0, LOCKED = 1, CHECKPOINTED = 2 };
#define MAX_GPUS 8

static const char *uuids[MAX_GPUS], *nodes[MAX_GPUS];
static int ngpus, gpu_fd = -1, ctl_fd = -1, state = RUNNING, current = 0, pattern_ok = 1;
static const char *ctl_path, *status_path = "/tmp/cuda-process.status";
static unsigned char *device_memory, *host_copy;
static size_t size = 4 << 20;

static unsigned char expected(size_t i) { return (unsigned char)((i * 2654435761u) >> 13); }

static int check_pattern(const unsigned char *memory) {
    for (size_t i = 0; i < size; i++)
        if (memory[i] != expected(i))
            return 0;
    return 1;
}

static void status(void) {
    static const char *names[] = {"running", "locked", "checkpointed"};
    char scratch[256];
    snprintf(scratch, sizeof scratch, "%s.new", status_path);
    FILE *f = fopen(scratch, "w");
    if (!f)
        return;
    fprintf(f, "%s %s pattern=%s\n", names[state], state == CHECKPOINTED ? "-" : nodes[current],
            pattern_ok ? "ok" : "bad");
    fclose(f);
    rename(scratch, status_path);
}

/* Open a GPU's node; with no driver behind it (ENXIO: the cgroup allowed it), hold it. */
static int open_node(const char *path) {
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0 && errno == ENXIO)
        fd = open(path, O_PATH | O_CLOEXEC);
    return fd;
}

static int open_gpu(int gpu, char *why, size_t n) {
    gpu_fd = open_node(nodes[gpu]);
    if (gpu_fd < 0) {
        snprintf(why, n, "open %s: %s", nodes[gpu], strerror(errno));
        return -1;
    }
    if (ctl_path && (ctl_fd = open_node(ctl_path)) < 0) {
        snprintf(why, n, "open %s: %s", ctl_path, strerror(errno));
        close(gpu_fd);
        gpu_fd = -1;
        return -1;
    }
    current = gpu;
    return 0;
}

static int gpu_of(const char *uuid) {
    for (int i = 0; i < ngpus; i++)
        if (!strcmp(uuids[i], uuid))
            return i;
    return -1;
}

/* One command line -> one reply line ("<CUresult> [detail]"); -1: no reply at all. */
static int handle(char *line, char *reply, size_t n, int refuse_lock) {
    if (!strcmp(line, "state")) {
        snprintf(reply, n, "0 %d\n", state);
    } else if (!strcmp(line, "lock")) {
        if (refuse_lock)
            return -1;
        if (state != RUNNING)
            return snprintf(reply, n, "401 not running\n"), 0;
        state = LOCKED;
        snprintf(reply, n, "0\n");
    } else if (!strcmp(line, "unlock")) {
        if (state != LOCKED)
            return snprintf(reply, n, "401 not locked\n"), 0;
        state = RUNNING;
        snprintf(reply, n, "0\n");
    } else if (!strcmp(line, "checkpoint")) {
        if (state != LOCKED)
            return snprintf(reply, n, "401 not locked\n"), 0;
        host_copy = malloc(size);
        memcpy(host_copy, device_memory, size);
        memset(device_memory, 0, size); /* the GPU's memory is gone with its context */
        free(device_memory);
        device_memory = NULL;
        close(gpu_fd);
        gpu_fd = -1;
        if (ctl_fd >= 0)
            close(ctl_fd);
        ctl_fd = -1;
        state = CHECKPOINTED;
        snprintf(reply, n, "0\n");
    } else if (!strncmp(line, "restore", 7)) {
        if (state != CHECKPOINTED)
            return snprintf(reply, n, "401 not checkpointed\n"), 0;
        int target = current;
        char *save = NULL;
        for (char *pair = strtok_r(line + 7, " ", &save); pair; pair = strtok_r(NULL, " ", &save)) {
            char *eq = strchr(pair, '=');
            if (!eq)
                return snprintf(reply, n, "1 bad pair\n"), 0;
            *eq = 0;
            if (gpu_of(pair) == current) {
                target = gpu_of(eq + 1);
                if (target < 0)
                    return snprintf(reply, n, "101 no GPU %s\n", eq + 1), 0;
            }
        }
        char why[200];
        if (open_gpu(target, why, sizeof why) < 0) {
            fprintf(stderr, "cuda_process: restore: %s\n", why);
            return snprintf(reply, n, "304 %s\n", why), 0; /* CUDA_ERROR_OPERATING_SYSTEM */
        }
        device_memory = malloc(size);
        memcpy(device_memory, host_copy, size);
        free(host_copy);
        host_copy = NULL;
        pattern_ok = check_pattern(device_memory);
        state = LOCKED;
        snprintf(reply, n, pattern_ok ? "0\n" : "999 pattern lost\n");
    } else {
        snprintf(reply, n, "1 unknown command\n");
    }
    return 0;
}

int main(int argc, char **argv) {
    int refuse_lock = 0, keep_open = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--gpu") && i + 1 < argc && ngpus < MAX_GPUS) {
            char *eq = strchr(argv[++i], '=');
            if (!eq)
                return fprintf(stderr, "--gpu UUID=NODE\n"), 2;
            *eq = 0;
            uuids[ngpus] = argv[i];
            nodes[ngpus++] = eq + 1;
        } else if (!strcmp(argv[i], "--ctl") && i + 1 < argc) {
            ctl_path = argv[++i];
        } else if (!strcmp(argv[i], "--status") && i + 1 < argc) {
            status_path = argv[++i];
        } else if (!strcmp(argv[i], "--mib") && i + 1 < argc) {
            size = (size_t)atoi(argv[++i]) << 20;
        } else if (!strcmp(argv[i], "--keep-open")) {
            keep_open = 1;
        } else if (!strcmp(argv[i], "--refuse-lock")) {
            refuse_lock = 1;
        } else {
            return fprintf(stderr, "unknown argument %s\n", argv[i]), 2;
        }
    }
    if (!ngpus)
        return fprintf(stderr, "no --gpu\n"), 2;
    signal(SIGPIPE, SIG_IGN);
    char why[200];
    if (open_gpu(0, why, sizeof why) < 0)
        return fprintf(stderr, "%s\n", why), 1;
    if (keep_open && open_node(nodes[0]) < 0)
        return perror(nodes[0]), 1;
    device_memory = malloc(size);
    for (size_t i = 0; i < size; i++)
        device_memory[i] = expected(i);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "/tmp/.fake-cuda-%d.sock", getpid());
    unlink(addr.sun_path);
    int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listener < 0 || bind(listener, (struct sockaddr *)&addr, sizeof addr) < 0 ||
        listen(listener, 8) < 0)
        return perror("socket"), 1;
    status();
    printf("READY\n");
    fflush(stdout);
    for (;;) {
        int conn = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0)
            continue;
        char line[256];
        ssize_t got = read(conn, line, sizeof line - 1);
        if (got <= 0) {
            close(conn);
            continue;
        }
        line[got] = 0;
        line[strcspn(line, "\n")] = 0;
        char reply[256];
        if (handle(line, reply, sizeof reply, refuse_lock) < 0)
            continue; /* an unanswered lock: kept open, so the caller's wait runs out */
        status(); /* before the answer: whoever the call returned to reads the new state */
        if (write(conn, reply, strlen(reply)) < 0)
            perror("write");
        close(conn);
    }
}
