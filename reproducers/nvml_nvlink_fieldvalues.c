/* nvml_nvlink_fieldvalues: the NVLink field-value queries of nvitop, in C, no Python.
 *
 * Build:  gcc -O1 -g -o nvml_nvlink_fieldvalues nvml_nvlink_fieldvalues.c -ldl
 * Run:    ./nvml_nvlink_fieldvalues [--iterations N] [--duration S]
 *
 * It dlopen()s "libnvidia-ml.so.1" -- whatever the dynamic loader finds, as nvidia-ml-py
 * does -- initializes NVML, and on every GPU queries NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
 * and _RX for every link (one nvmlDeviceGetFieldValues call of 2 x links fields per GPU,
 * into a malloc'd array, as the Python binding allocates one), N times, from the main
 * thread only.  The previous sample of each GPU is kept and freed when replaced, as an
 * exporter computing rates does.  --duration S stops after S seconds even if iterations
 * remain (as the Python reproducer's --duration).  The main thread only, on purpose: a fault
 * that needs the binding's calling pattern (background threads) shows in Python alone.
 *
 * Run it next to reproducers/nvml_nvlink_fieldvalues.py on the same node: if Python
 * crashes and this does not, suspect the binding or the calling pattern (threads); if
 * both crash, suspect the driver.  It prints an environment header and one final line
 * starting with "VERDICT: ".  A crash prints no verdict: the exit signal and the core
 * are the result.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    signed int siVal;
    unsigned short usVal;
} nvmlValue_t;
typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

#define NVML_FI_DEV_NVLINK_LINK_COUNT 91
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX 138
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX 139
#define NVML_NVLINK_MAX_LINKS 18
#define MAX_GPUS 64

static nvmlReturn_t (*p_init)(void);
static nvmlReturn_t (*p_shutdown)(void);
static const char *(*p_error)(nvmlReturn_t);
static nvmlReturn_t (*p_driver)(char *, unsigned int);
static nvmlReturn_t (*p_nvml_version)(char *, unsigned int);
static nvmlReturn_t (*p_cuda)(int *);
static nvmlReturn_t (*p_count)(unsigned int *);
static nvmlReturn_t (*p_handle)(unsigned int, nvmlDevice_t *);
static nvmlReturn_t (*p_name)(nvmlDevice_t, char *, unsigned int);
static nvmlReturn_t (*p_fields)(nvmlDevice_t, int, nvmlFieldValue_t *);

static void *sym(void *lib, const char *a, const char *b)
{
    void *p = dlsym(lib, a);
    if (!p && b)
        p = dlsym(lib, b);
    if (!p) {
        printf("VERDICT: error: %s not found in libnvidia-ml.so.1\n", a);
        exit(2);
    }
    return p;
}

static const char *err(nvmlReturn_t r) { return p_error ? p_error(r) : "?"; }

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    long iterations = 1000;
    double duration = 0; /* seconds; 0: no limit */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iterations") && i + 1 < argc)
            iterations = strtol(argv[++i], NULL, 10);
        else if (!strncmp(argv[i], "--iterations=", 13))
            iterations = strtol(argv[i] + 13, NULL, 10);
        else if (!strcmp(argv[i], "--duration") && i + 1 < argc)
            duration = strtod(argv[++i], NULL);
        else if (!strncmp(argv[i], "--duration=", 11))
            duration = strtod(argv[i] + 11, NULL);
        else {
            fprintf(stderr, "usage: %s [--iterations N] [--duration S]\n", argv[0]);
            return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);

    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("VERDICT: error: cannot load libnvidia-ml.so.1: %s\n", dlerror());
        return 2;
    }
    p_init = sym(lib, "nvmlInit_v2", "nvmlInit");
    p_shutdown = sym(lib, "nvmlShutdown", NULL);
    p_error = sym(lib, "nvmlErrorString", NULL);
    p_driver = sym(lib, "nvmlSystemGetDriverVersion", NULL);
    p_nvml_version = sym(lib, "nvmlSystemGetNVMLVersion", NULL);
    p_cuda = sym(lib, "nvmlSystemGetCudaDriverVersion", NULL);
    p_count = sym(lib, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
    p_handle = sym(lib, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex");
    p_name = sym(lib, "nvmlDeviceGetName", NULL);
    p_fields = sym(lib, "nvmlDeviceGetFieldValues", NULL);

    nvmlReturn_t r = p_init();
    if (r) {
        printf("VERDICT: error: nvmlInit failed: %s (%d)\n", err(r), r);
        return 2;
    }
    char driver[96] = "?", nvml[96] = "?", name[96] = "?";
    int cuda = 0;
    unsigned int count = 0;
    p_driver(driver, sizeof driver);
    p_nvml_version(nvml, sizeof nvml);
    p_cuda(&cuda);
    if ((r = p_count(&count)) || count == 0) {
        printf("VERDICT: error: no GPUs (nvmlDeviceGetCount: %s)\n", err(r));
        return 2;
    }
    if (count > MAX_GPUS)
        count = MAX_GPUS;

    struct link_map *lm = NULL;
    dlinfo(lib, RTLD_DI_LINKMAP, &lm);
    char real[4096] = "?";
    if (lm && lm->l_name && !realpath(lm->l_name, real))
        snprintf(real, sizeof real, "%s", lm->l_name);
    struct utsname u;
    uname(&u);

    nvmlDevice_t dev[MAX_GPUS];
    unsigned int links[MAX_GPUS];
    unsigned int max_links = 0;
    for (unsigned int i = 0; i < count; i++) {
        if ((r = p_handle(i, &dev[i]))) {
            printf("VERDICT: error: nvmlDeviceGetHandleByIndex(%u): %s\n", i, err(r));
            return 2;
        }
        nvmlFieldValue_t lc;
        memset(&lc, 0, sizeof lc);
        lc.fieldId = NVML_FI_DEV_NVLINK_LINK_COUNT;
        links[i] = NVML_NVLINK_MAX_LINKS;
        if (p_fields(dev[i], 1, &lc) == 0 && lc.nvmlReturn == 0 && lc.value.uiVal <= NVML_NVLINK_MAX_LINKS)
            links[i] = lc.value.uiVal;
        if (links[i] > max_links)
            max_links = links[i];
    }
    p_name(dev[0], name, sizeof name);

    printf("nvml_nvlink_fieldvalues (C, no Python): NVLink throughput field values on every link\n");
    printf("  GPU:            %u x %s\n", count, name);
    printf("  driver:         %s\n", driver);
    printf("  NVML:           %s\n", nvml);
    printf("  CUDA driver:    %d.%d\n", cuda / 1000, cuda % 1000 / 10);
    printf("  libnvidia-ml:   %s\n", real);
    printf("  binding:        none (C, dlopen)\n");
    printf("  glibc:          %s\n", gnu_get_libc_version());
    printf("  kernel:         %s %s %s\n", u.sysname, u.release, u.machine);
    printf("  calling thread: main\n");
    if (duration > 0)
        printf("  iterations:     %ld, duration %gs\n", iterations, duration);
    else
        printf("  iterations:     %ld\n", iterations);

    nvmlFieldValue_t *previous[MAX_GPUS] = {0};
    long calls = 0, field_errors = 0, done = 0;
    double deadline = duration > 0 ? now() + duration : 0;
    for (long it = 0; it < iterations; it++, done++) {
        if (deadline && now() >= deadline)
            break;
        for (unsigned int i = 0; i < count; i++) {
            unsigned int n = 2 * links[i];
            if (n == 0)
                continue;
            nvmlFieldValue_t *v = calloc(n, sizeof *v);
            if (!v) {
                printf("VERDICT: error: out of memory\n");
                return 2;
            }
            for (unsigned int l = 0; l < links[i]; l++) {
                v[l].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX;
                v[l].scopeId = l;
                v[links[i] + l].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;
                v[links[i] + l].scopeId = l;
            }
            r = p_fields(dev[i], (int)n, v);
            calls++;
            if (r) {
                printf("VERDICT: error: nvmlDeviceGetFieldValues(gpu %u, %u fields) returned %s (%d) at iteration %ld\n",
                       i, n, err(r), r, it);
                return 1;
            }
            for (unsigned int k = 0; k < n; k++)
                field_errors += v[k].nvmlReturn != 0;
            free(previous[i]); /* the previous sample: a rate would be computed from it */
            previous[i] = v;
        }
    }
    for (unsigned int i = 0; i < count; i++)
        free(previous[i]);
    r = p_shutdown();
    if (r)
        printf("VERDICT: error: nvmlShutdown returned %s (%d)\n", err(r), r);
    else if (field_errors)
        printf("VERDICT: errors: %u GPUs x %u links x %ld iterations, no crash, %ld field values returned an error\n",
               count, max_links, done, field_errors);
    else
        printf("VERDICT: clean: %u GPUs x %u links x %ld iterations, no crash (%ld calls, main thread)\n", count,
               max_links, done, calls);
    return r ? 1 : 0;
}
