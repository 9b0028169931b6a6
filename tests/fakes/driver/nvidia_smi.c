/*
 * A stand-in nvidia-smi: dlopens libnvidia-ml.so.1 by its soname, as the real tool
 * does, so it runs only where the container's dynamic linker finds the driver's
 * library with no environment change, and prints the GPUs NVML reports.
 */
#include <dlfcn.h>
#include <stdio.h>

typedef int (*init_t)(void);
typedef int (*count_t)(unsigned int *);
typedef int (*handle_t)(unsigned int, void **);
typedef int (*uuid_t_)(void *, char *, unsigned int);

int main(void) {
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml) {
        fprintf(stderr, "NVIDIA-SMI has failed: %s\n", dlerror());
        return 9;
    }
    init_t init = (init_t)dlsym(nvml, "nvmlInit_v2");
    count_t count = (count_t)dlsym(nvml, "nvmlDeviceGetCount_v2");
    handle_t handle = (handle_t)dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
    uuid_t_ uuid = (uuid_t_)dlsym(nvml, "nvmlDeviceGetUUID");
    unsigned int n = 0;
    if (!init || !count || !handle || !uuid || init() != 0 || count(&n) != 0) {
        fprintf(stderr, "NVIDIA-SMI has failed: NVML did not initialise\n");
        return 9;
    }
    for (unsigned int i = 0; i < n; i++) {
        void *device = NULL;
        char text[96] = "";
        if (handle(i, &device) == 0 && uuid(device, text, sizeof text) == 0)
            printf("GPU %u: stand-in (UUID: %s)\n", i, text);
    }
    return 0;
}
