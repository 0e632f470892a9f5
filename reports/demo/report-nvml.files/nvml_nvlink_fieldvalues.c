/* nvml_nvlink_fieldvalues: nvitop's NVLink throughput query, in C, without Python.
 *
 * Build:  gcc -O1 -g -o nvml_nvlink_fieldvalues nvml_nvlink_fieldvalues.c -ldl
 * Run:    ./nvml_nvlink_fieldvalues [--iterations N] [--threads T] [--duration S] [--malloc-check] [--trace]
 *
 * What it calls, in this order, each return code checked and printed:
 *   dlopen("libnvidia-ml.so.1")          whatever the dynamic loader finds, as nvidia-ml-py does
 *   nvmlInit_v2, nvmlSystemGetDriverVersion, nvmlSystemGetNVMLVersion,
 *   nvmlSystemGetCudaDriverVersion, nvmlDeviceGetCount_v2
 *   per GPU: nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetName, nvmlDeviceGetUUID,
 *            nvmlDeviceGetPciInfo_v3, then
 *            nvmlDeviceGetFieldValues(dev, 1, {NVML_FI_DEV_NVLINK_LINK_COUNT (91)})
 *   N times, per GPU with links:
 *            nvmlDeviceGetFieldValues(dev, 2 x links, values) with
 *            fieldId 138 (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX) x scopeId 0..links-1, then
 *            fieldId 139 (NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX) x scopeId 0..links-1
 *            -- the call nvitop's Device.nvlink_throughput() makes (nvitop/api/device.py),
 *            into a malloc'd array as the Python binding allocates one; the previous sample
 *            of each GPU is kept and freed when replaced, as an exporter computing rates does.
 *   nvmlShutdown
 * From the main thread (--threads 0, the default) or, as the Python reproducer calls, from T
 * background threads, each querying every GPU every iteration: a driver fault that only calls
 * from threads other than the main one meet crashes this one too, with the same --threads, so
 * a crash of the Python reproducer alone points at the binding, not at the calling pattern.
 *
 * nvitop's link-count rule: a GPU whose NVML_FI_DEV_NVLINK_LINK_COUNT query fails (the
 * call or the field's own return code) or reports 0 links is skipped -- nvitop returns no
 * NVLink throughput for it and never makes the throughput call.
 *
 * Output, line-buffered on stdout: the environment header first (before any NVML call
 * that could crash, so a crash at the first call still leaves it), one line naming each
 * GPU (index, UUID, PCI bus id), a "query" line before each call of the first iteration
 * (before every call with --trace), and one final line starting with "VERDICT: " -- also
 * when it crashes: a fatal signal prints "VERDICT: crashed: ..." with the call in
 * progress, the GPU, the time since the first query and the crash rate (1 in N calls),
 * then the signal takes its default action, so the core is the same as without it.
 *
 * --malloc-check re-executes this program under glibc's checking allocator
 * (GLIBC_TUNABLES=glibc.malloc.check=3, LD_PRELOAD=libc_malloc_debug.so.0 where glibc has
 * it) and frees every result array right after its call, so a heap corruption aborts at
 * the call that caused it, not at a later, unrelated free().
 *
 * Run reproducers/nvml_nvlink_fieldvalues.py on the same node too: if only the Python one
 * crashes, suspect the binding or the calling pattern (threads); if this one crashes too,
 * suspect the driver library.  Exit status: 0 clean, 1 NVML errors, 2 could not start
 * (library, symbol, init), or the fatal signal.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <gnu/libc-version.h>
#include <link.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

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
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

#define NVML_FI_DEV_NVLINK_LINK_COUNT 91
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX 138
#define NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX 139
#define MAX_GPUS 64
#define MAX_LINKS 1024 /* a sanity bound on what the link-count field may report */
#define CHECK_ENV "NVML_REPRO_MALLOC_CHECK"

static nvmlReturn_t (*p_init)(void);
static nvmlReturn_t (*p_shutdown)(void);
static const char *(*p_error)(nvmlReturn_t);
static nvmlReturn_t (*p_driver)(char *, unsigned int);
static nvmlReturn_t (*p_nvml_version)(char *, unsigned int);
static nvmlReturn_t (*p_cuda)(int *);
static nvmlReturn_t (*p_count)(unsigned int *);
static nvmlReturn_t (*p_handle)(unsigned int, nvmlDevice_t *);
static nvmlReturn_t (*p_name)(nvmlDevice_t, char *, unsigned int);
static nvmlReturn_t (*p_uuid)(nvmlDevice_t, char *, unsigned int);
static nvmlReturn_t (*p_pci)(nvmlDevice_t, nvmlPciInfo_t *);
static nvmlReturn_t (*p_fields)(nvmlDevice_t, int, nvmlFieldValue_t *);

/* What the crash handler reports: written before each call, read only by the handler. */
struct gpu_id {
    char uuid[96];
    char bus[32];
};
static struct gpu_id g_ids[MAX_GPUS];
static volatile long g_calls;           /* field-value calls started, by every thread */
/* The calling thread's own state: a fault is handled on the thread that faulted (abort's raise too). */
#define TLS __thread __attribute__((tls_model("initial-exec")))
static TLS volatile long g_iteration = -1;  /* -1: the link-count queries */
static TLS volatile int g_gpu = -1;
static TLS volatile int g_in_call;          /* 1 while inside nvmlDeviceGetFieldValues */
static TLS volatile int g_thread = -1;      /* -1: the main thread; else the querying thread's index */
static volatile int g_stop;                 /* a thread met an error: the others stop */
static volatile int g_checked;          /* --malloc-check is in effect */
static struct timespec g_t0;            /* the first field-value call */
static volatile int g_started;

static const char *err(nvmlReturn_t r) { return p_error ? p_error(r) : "?"; }

static double since(const struct timespec *t0)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (ts.tv_sec - t0->tv_sec) + (ts.tv_nsec - t0->tv_nsec) / 1e9;
}

/* ---- the crash line: async-signal-safe (no stdio, no malloc) ------------------------- */

static char g_line[1024];
static size_t g_len;

static void put(const char *s)
{
    while (*s && g_len < sizeof g_line - 2)
        g_line[g_len++] = *s++;
}

static void put_num(unsigned long long v)
{
    char tmp[24];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && n < (int)sizeof tmp);
    while (n && g_len < sizeof g_line - 2)
        g_line[g_len++] = tmp[--n];
}

static const char *signame(int sig)
{
    switch (sig) {
    case SIGABRT: return "SIGABRT";
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    default: return "a fatal signal";
    }
}

static volatile int g_reporting;         /* set by the first thread in on_fatal */
/* The VERDICT line is the last line, always: a querying thread prints only between begin_print
 * and end_print, which it skips once a thread is reporting a crash, and the reporting thread
 * waits (a bounded second) for the lines in progress before it writes its own. */
static volatile int g_printing;          /* threads between begin_print and end_print */
static TLS volatile int g_in_print;

static int begin_print(void)
{
    g_in_print = 1;
    __atomic_add_fetch(&g_printing, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&g_reporting, __ATOMIC_SEQ_CST))
        return 1;
    __atomic_sub_fetch(&g_printing, 1, __ATOMIC_SEQ_CST);
    g_in_print = 0;
    return 0;
}

static void end_print(void)
{
    __atomic_sub_fetch(&g_printing, 1, __ATOMIC_SEQ_CST);
    g_in_print = 0;
}

static void write_all(const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(STDOUT_FILENO, s, n);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

static void on_fatal(int sig, siginfo_t *info, void *uc)
{
    (void)uc;
    /* Threads can fault at once (a fault keyed to every calling thread): the first one
     * writes the line and ends the process; any other waits here, its own action still
     * ours, so it cannot kill the process (SA_RESETHAND would let it) before the line is out. */
    if (__atomic_exchange_n(&g_reporting, 1, __ATOMIC_SEQ_CST))
        for (;;)
            pause();
    for (int i = 0; i < 1000 && __atomic_load_n(&g_printing, __ATOMIC_SEQ_CST) > g_in_print; i++) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    g_len = 0;
    put(g_checked && sig == SIGABRT ? "VERDICT: heap corruption detected: " : "VERDICT: crashed: ");
    put(signame(sig));
    long calls = g_calls;
    if (g_in_call) {
        put(" inside call #");
        put_num((unsigned long long)calls);
        put(g_iteration < 0 ? " (nvmlDeviceGetFieldValues, link count)" : " (nvmlDeviceGetFieldValues, NVLink throughput)");
    } else {
        put(" after call #");
        put_num((unsigned long long)calls);
        put(" returned");
    }
    if (g_thread >= 0) {
        put(" in thread ");
        put_num((unsigned long long)g_thread);
    }
    if (g_gpu >= 0 && g_gpu < MAX_GPUS) {
        put(" on GPU ");
        put_num((unsigned long long)g_gpu);
        put(" (");
        put(g_ids[g_gpu].uuid);
        put(", ");
        put(g_ids[g_gpu].bus);
        put(")");
    }
    if (g_iteration >= 0) {
        put(", iteration ");
        put_num((unsigned long long)g_iteration);
    }
    if (g_started) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        long long us = (ts.tv_sec - g_t0.tv_sec) * 1000000LL + (ts.tv_nsec - g_t0.tv_nsec) / 1000LL;
        put("; time to crash ");
        put_num((unsigned long long)(us / 1000000));
        put(".");
        for (long long d = 100000; d >= 1; d /= 10) /* six decimals, leading zeros kept */
            put_num((unsigned long long)(us / d % 10));
        put(" s after the first query");
    }
    put("; crash rate 1 in ");
    put_num((unsigned long long)(calls > 0 ? calls : 1));
    put(" calls");
    g_line[g_len++] = '\n';
    write_all(g_line, g_len);
    /* Only now the default action: set before the line was out, another thread's fault during the write
     * (a slow pipe, a tracer's stop at the write) killed the process with no line at all. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
    /* The action of sig is the default one again (above).  A fault from an instruction faults
     * again when the handler returns (with its own siginfo); a signal that was sent
     * (abort's raise) is sent again: it stays blocked until the handler returns, then
     * takes the default action at the interrupted point -- the core shows that point. */
    if (info == NULL || info->si_code <= 0 || sig == SIGABRT)
        raise(sig);
}

static void install_crash_handler(void)
{
    static const int sigs[] = {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &sa, NULL);
}

/* ---- --malloc-check ---------------------------------------------------------------- */

static const char *malloc_debug_library(void)
{
    static const char *dirs[] = {"/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                                 "/lib/aarch64-linux-gnu", "/usr/lib64", "/lib64", "/usr/lib", "/lib"};
    static char path[256];
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        snprintf(path, sizeof path, "%s/libc_malloc_debug.so.0", dirs[i]);
        if (access(path, R_OK) == 0)
            return path;
    }
    return NULL; /* glibc < 2.34: the checks are built into libc (MALLOC_CHECK_) */
}

static void reexec_checked(char **argv)
{
    char buf[4096];
    const char *old = getenv("GLIBC_TUNABLES");
    snprintf(buf, sizeof buf, "glibc.malloc.check=3%s%s", old && *old ? ":" : "", old && *old ? old : "");
    setenv("GLIBC_TUNABLES", buf, 1);
    setenv("MALLOC_CHECK_", "3", 1);
    const char *dbg = malloc_debug_library();
    if (dbg) {
        const char *pre = getenv("LD_PRELOAD");
        snprintf(buf, sizeof buf, "%s%s%s", dbg, pre && *pre ? " " : "", pre && *pre ? pre : "");
        setenv("LD_PRELOAD", buf, 1);
    }
    setenv(CHECK_ENV, dbg ? dbg : "MALLOC_CHECK_=3", 1);
    fflush(stdout);
    execv("/proc/self/exe", argv);
    printf("VERDICT: error: --malloc-check: cannot re-execute /proc/self/exe\n");
    exit(2);
}

/* ---- NVML ---------------------------------------------------------------------------- */

static void *sym(void *lib, const char *a, const char *b)
{
    void *p = dlsym(lib, a);
    if (!p && b)
        p = dlsym(lib, b);
    if (!p) {
        printf("VERDICT: error: could not start: %s not found in libnvidia-ml.so.1\n", a);
        exit(2);
    }
    return p;
}

/* One field-value call, with what the crash handler needs set around it. */
static nvmlReturn_t field_values(int gpu, nvmlDevice_t dev, int n, nvmlFieldValue_t *v)
{
    if (!g_started) {
        clock_gettime(CLOCK_MONOTONIC, &g_t0);
        g_started = 1;
    }
    g_gpu = gpu;
    __atomic_add_fetch(&g_calls, 1, __ATOMIC_SEQ_CST);
    g_in_call = 1;
    nvmlReturn_t r = p_fields(dev, n, v);
    g_in_call = 0;
    return r;
}

#define MAX_THREADS 64

/* One querying loop: the main thread's, or one background thread's. */
struct loop {
    int index;                  /* -1: the main thread */
    long iterations;
    double duration;
    const struct timespec *t0;
    unsigned int count;
    nvmlDevice_t *dev;
    unsigned int *links;
    int trace;
    long done, field_errors;
    int error;
    char verdict[512];          /* the thread's error, printed by main once every thread has ended */
};

static void *query_loop(void *arg)
{
    struct loop *l = arg;
    g_thread = l->index;
    nvmlFieldValue_t *previous[MAX_GPUS] = {0};
    for (long it = 0; it < l->iterations && !__atomic_load_n(&g_stop, __ATOMIC_SEQ_CST); it++, l->done++) {
        if (l->duration > 0 && since(l->t0) >= l->duration)
            break;
        g_iteration = it;
        for (unsigned int i = 0; i < l->count; i++) {
            unsigned int n = 2 * l->links[i];
            if (n == 0)
                continue;
            nvmlFieldValue_t *v = calloc(n, sizeof *v);
            if (!v) {
                snprintf(l->verdict, sizeof l->verdict, "VERDICT: error: out of memory for %u field values", n);
                l->error = 1;
                __atomic_store_n(&g_stop, 1, __ATOMIC_SEQ_CST);
                break;
            }
            for (unsigned int k = 0; k < l->links[i]; k++) {
                v[k].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX;
                v[k].scopeId = k;
                v[l->links[i] + k].fieldId = NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX;
                v[l->links[i] + k].scopeId = k;
            }
            if (((it == 0 && l->index <= 0) || l->trace) && begin_print()) {
                /* one write(2) of the whole line, not stdio: a thread waiting for stdout's lock could wait
                 * out the crash reporter's bounded wait and print after the VERDICT line */
                char line[512], thread[32] = "";
                if (l->index >= 0)  /* its own index (every thread prints with --trace) */
                    snprintf(thread, sizeof thread, ", thread %d", l->index);
                int len = snprintf(line, sizeof line,
                                   "query #%ld: GPU %u (%s, %s) nvmlDeviceGetFieldValues(%u values: fieldId %d x "
                                   "scopeId 0-%u, fieldId %d x scopeId 0-%u), iteration %ld%s\n",
                                   g_calls + 1, i, g_ids[i].uuid, g_ids[i].bus, n, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
                                   l->links[i] - 1, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, l->links[i] - 1, it,
                                   thread);
                if (len > 0)
                    write_all(line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1);
                end_print();
            }
            nvmlReturn_t r = field_values((int)i, l->dev[i], (int)n, v);
            if (r) {
                snprintf(l->verdict, sizeof l->verdict,
                         "VERDICT: error: call #%ld nvmlDeviceGetFieldValues on GPU %u (%s, %s), %u values, returned %s "
                         "(%d) at iteration %ld", g_calls, i, g_ids[i].uuid, g_ids[i].bus, n, err(r), r, it);
                free(v);
                l->error = 1;
                __atomic_store_n(&g_stop, 1, __ATOMIC_SEQ_CST);
                break;
            }
            for (unsigned int k = 0; k < n; k++)
                l->field_errors += v[k].nvmlReturn != 0;
            if (g_checked) {
                /* free at once: the checking allocator validates the array and its neighbours now */
                free(v);
                free(malloc(4096));
            } else {
                free(previous[i]); /* the previous sample: a rate would be computed from it */
                previous[i] = v;
            }
        }
        if (l->error)
            break;
    }
    for (unsigned int i = 0; i < l->count; i++)
        free(previous[i]);
    return NULL;
}

int main(int argc, char **argv)
{
    long iterations = 1000;
    double duration = 0; /* seconds; 0: no limit */
    int malloc_check = 0, trace = 0, threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iterations") && i + 1 < argc)
            iterations = strtol(argv[++i], NULL, 10);
        else if (!strncmp(argv[i], "--iterations=", 13))
            iterations = strtol(argv[i] + 13, NULL, 10);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = (int)strtol(argv[++i], NULL, 10);
        else if (!strncmp(argv[i], "--threads=", 10))
            threads = (int)strtol(argv[i] + 10, NULL, 10);
        else if (!strcmp(argv[i], "--duration") && i + 1 < argc)
            duration = strtod(argv[++i], NULL);
        else if (!strncmp(argv[i], "--duration=", 11))
            duration = strtod(argv[i] + 11, NULL);
        else if (!strcmp(argv[i], "--malloc-check"))
            malloc_check = 1;
        else if (!strcmp(argv[i], "--trace"))
            trace = 1;
        else {
            fprintf(stderr, "usage: %s [--iterations N] [--threads T] [--duration S] [--malloc-check] [--trace]\n",
                    argv[0]);
            return 2;
        }
    }
    if (threads < 0 || threads > MAX_THREADS) {
        fprintf(stderr, "%s: --threads takes 0 (the main thread) to %d\n", argv[0], MAX_THREADS);
        return 2;
    }
    const char *checked = getenv(CHECK_ENV);
    if (malloc_check && !checked)
        reexec_checked(argv); /* does not return */
    g_checked = checked != NULL;
    setvbuf(stdout, NULL, _IOLBF, 0);

    /* The header: what is known without NVML first, flushed line by line. */
    struct utsname u;
    if (uname(&u) != 0)
        strcpy(u.release, "?"), strcpy(u.machine, "?"), strcpy(u.sysname, "?");
    printf("nvml_nvlink_fieldvalues (C, no Python): nvitop's NVLink throughput query on every GPU\n");
    printf("  binding:        none (C, dlopen)\n");
    printf("  glibc:          %s\n", gnu_get_libc_version());
    printf("  kernel:         %s %s %s\n", u.sysname, u.release, u.machine);
    if (threads == 0)
        printf("  calling thread: main\n");
    else
        printf("  calling thread: %d background thread(s), each querying every GPU every iteration\n", threads);
    if (duration > 0)
        printf("  iterations:     %ld, duration %gs\n", iterations, duration);
    else
        printf("  iterations:     %ld\n", iterations);
    printf("  malloc check:   %s\n", g_checked ? "on (glibc.malloc.check=3)" : "off");
    if (g_checked)
        printf("  malloc debug:   %s\n", checked);
    install_crash_handler();

    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("VERDICT: error: could not start: cannot load libnvidia-ml.so.1: %s\n", dlerror());
        return 2;
    }
    struct link_map *lm = NULL;
    char real[4096] = "?";
    if (dlinfo(lib, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && !realpath(lm->l_name, real))
        snprintf(real, sizeof real, "%s", lm->l_name);
    printf("  libnvidia-ml:   %s\n", real);
    p_error = sym(lib, "nvmlErrorString", NULL);
    p_init = sym(lib, "nvmlInit_v2", "nvmlInit");
    p_shutdown = sym(lib, "nvmlShutdown", NULL);
    p_driver = sym(lib, "nvmlSystemGetDriverVersion", NULL);
    p_nvml_version = sym(lib, "nvmlSystemGetNVMLVersion", NULL);
    p_cuda = sym(lib, "nvmlSystemGetCudaDriverVersion", NULL);
    p_count = sym(lib, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
    p_handle = sym(lib, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex");
    p_name = sym(lib, "nvmlDeviceGetName", NULL);
    p_uuid = sym(lib, "nvmlDeviceGetUUID", NULL);
    p_pci = sym(lib, "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo");
    p_fields = sym(lib, "nvmlDeviceGetFieldValues", NULL);

    nvmlReturn_t r = p_init();
    if (r) {
        printf("VERDICT: error: could not start: nvmlInit_v2 returned %s (%d)\n", err(r), r);
        return 2;
    }
    char driver[96] = "", nvml[96] = "";
    int cuda = 0, failures = 0;
    if ((r = p_driver(driver, sizeof driver)))
        printf("  driver:         ? (nvmlSystemGetDriverVersion returned %s (%d))\n", err(r), r), failures++;
    else
        printf("  driver:         %s\n", driver);
    if ((r = p_nvml_version(nvml, sizeof nvml)))
        printf("  NVML:           ? (nvmlSystemGetNVMLVersion returned %s (%d))\n", err(r), r), failures++;
    else
        printf("  NVML:           %s\n", nvml);
    if ((r = p_cuda(&cuda)))
        printf("  CUDA driver:    ? (nvmlSystemGetCudaDriverVersion returned %s (%d))\n", err(r), r), failures++;
    else
        printf("  CUDA driver:    %d.%d\n", cuda / 1000, cuda % 1000 / 10);
    unsigned int count = 0;
    if ((r = p_count(&count))) {
        printf("VERDICT: error: could not start: nvmlDeviceGetCount_v2 returned %s (%d)\n", err(r), r);
        return 2;
    }
    if (count == 0) {
        printf("VERDICT: error: could not start: nvmlDeviceGetCount_v2 reports 0 GPUs\n");
        return 2;
    }
    if (count > MAX_GPUS) {
        printf("  note:           %u GPUs; the first %d are queried\n", count, MAX_GPUS);
        count = MAX_GPUS;
    }

    nvmlDevice_t dev[MAX_GPUS];
    char names[MAX_GPUS][96];
    for (unsigned int i = 0; i < count; i++) {
        if ((r = p_handle(i, &dev[i]))) {
            printf("VERDICT: error: could not start: nvmlDeviceGetHandleByIndex_v2(%u) returned %s (%d)\n", i, err(r), r);
            return 2;
        }
        nvmlPciInfo_t pci;
        memset(&pci, 0, sizeof pci);
        strcpy(names[i], "?");
        strcpy(g_ids[i].uuid, "UUID ?");
        strcpy(g_ids[i].bus, "bus ?");
        if ((r = p_name(dev[i], names[i], sizeof names[i])))
            snprintf(names[i], sizeof names[i], "? (nvmlDeviceGetName returned %s (%d))", err(r), r), failures++;
        if ((r = p_uuid(dev[i], g_ids[i].uuid, sizeof g_ids[i].uuid)))
            snprintf(g_ids[i].uuid, sizeof g_ids[i].uuid, "UUID ? (nvmlDeviceGetUUID returned %d)", r), failures++;
        if ((r = p_pci(dev[i], &pci)))
            snprintf(g_ids[i].bus, sizeof g_ids[i].bus, "bus ? (returned %d)", r), failures++;
        else
            snprintf(g_ids[i].bus, sizeof g_ids[i].bus, "%.31s", pci.busId);
    }
    int same = 1;
    for (unsigned int i = 1; i < count; i++)
        same &= !strcmp(names[i], names[0]);
    if (same)
        printf("  GPU:            %u x %s\n", count, names[0]);
    else
        printf("  GPU:            %u GPUs of several models\n", count);
    for (unsigned int i = 0; i < count; i++)
        printf("  GPU %u:%*s%s, %s, PCI bus %s\n", i, i < 10 ? 10 : 9, "", names[i], g_ids[i].uuid, g_ids[i].bus);
    printf("  call:           nvmlDeviceGetFieldValues(device, 2 x links, values): fieldId %d "
           "(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX) x scopeId 0..links-1, then fieldId %d "
           "(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX) x scopeId 0..links-1; one call per GPU per iteration\n",
           NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX);
    fflush(stdout);

    /* nvitop's link-count rule: the field's value when both return codes are success, else 0
     * (the GPU is skipped). */
    unsigned int links[MAX_GPUS];
    unsigned int max_links = 0, with_links = 0;
    for (unsigned int i = 0; i < count; i++) {
        nvmlFieldValue_t lc;
        memset(&lc, 0, sizeof lc);
        lc.fieldId = NVML_FI_DEV_NVLINK_LINK_COUNT;
        printf("query #%ld: GPU %u (%s, %s) nvmlDeviceGetFieldValues(1 value: fieldId %d NVML_FI_DEV_NVLINK_LINK_COUNT)\n",
               g_calls + 1, i, g_ids[i].uuid, g_ids[i].bus, NVML_FI_DEV_NVLINK_LINK_COUNT);
        r = field_values((int)i, dev[i], 1, &lc);
        links[i] = 0;
        if (r) {
            printf("    GPU %u: link count: nvmlDeviceGetFieldValues returned %s (%d): skipped, as nvitop does\n", i, err(r), r);
            failures++;
        } else if (lc.nvmlReturn) {
            printf("    GPU %u: link count: the field returned %s (%d): skipped, as nvitop does\n", i, err(lc.nvmlReturn),
                   lc.nvmlReturn);
        } else if (lc.value.uiVal == 0) {
            printf("    GPU %u: link count: 0 NVLinks: skipped, as nvitop does\n", i);
        } else if (lc.value.uiVal > MAX_LINKS) {
            printf("    GPU %u: link count: %u NVLinks is not plausible: skipped\n", i, lc.value.uiVal);
            failures++;
        } else {
            links[i] = lc.value.uiVal;
            printf("    GPU %u: %u NVLinks: %u field values per call\n", i, links[i], 2 * links[i]);
            with_links++;
            if (links[i] > max_links)
                max_links = links[i];
        }
    }
    int same_links = 1;
    for (unsigned int i = 1; i < count; i++)
        same_links &= links[i] == links[0];
    if (same_links)
        printf("  NVLinks:        %u on each of %u GPUs (NVML_FI_DEV_NVLINK_LINK_COUNT)\n", links[0], count);
    else {
        printf("  NVLinks:        ");
        for (unsigned int i = 0; i < count; i++)
            printf("%sGPU %u: %u", i ? ", " : "", i, links[i]);
        printf(" (NVML_FI_DEV_NVLINK_LINK_COUNT)\n");
    }
    if (with_links == 0) {
        r = p_shutdown();
        printf("VERDICT: error: could not start: no GPU reports NVLinks, nothing to query (nvitop makes no NVLink "
               "throughput call here)%s\n", r ? "; nvmlShutdown failed too" : "");
        return 2;
    }

    struct loop loops[MAX_THREADS];
    pthread_t tids[MAX_THREADS];
    int n_loops = threads > 0 ? threads : 1;
    struct timespec loop_t0;
    clock_gettime(CLOCK_MONOTONIC, &loop_t0);
    for (int t = 0; t < n_loops; t++) {
        memset(&loops[t], 0, sizeof loops[t]);
        loops[t].index = threads > 0 ? t : -1;
        loops[t].iterations = iterations;
        loops[t].duration = duration;
        loops[t].t0 = &loop_t0;
        loops[t].count = count;
        loops[t].dev = dev;
        loops[t].links = links;
        loops[t].trace = trace;
    }
    if (threads == 0) {
        query_loop(&loops[0]);
    } else {
        int started = 0;
        for (; started < n_loops; started++)
            if (pthread_create(&tids[started], NULL, query_loop, &loops[started]))
                break;
        if (started < n_loops)
            __atomic_store_n(&g_stop, 1, __ATOMIC_SEQ_CST);
        /* every thread ends before the verdict is printed: the verdict is the last line */
        for (int t = 0; t < started; t++)
            pthread_join(tids[t], NULL);
        if (started < n_loops) {
            printf("VERDICT: error: could not start: pthread_create failed for thread %d\n", started);
            return 2;
        }
    }
    long field_errors = 0, done = iterations;
    for (int t = 0; t < n_loops; t++) {
        if (loops[t].error) {
            printf("%s\n", loops[t].verdict);
            return 1;
        }
        field_errors += loops[t].field_errors;
        if (loops[t].done < done)
            done = loops[t].done;
    }
    double elapsed = since(&g_t0);
    r = p_shutdown();
    if (r) {
        printf("VERDICT: error: nvmlShutdown returned %s (%d) after %ld calls in %.2fs\n", err(r), r, g_calls, elapsed);
        return 1;
    }
    char who[32] = "main thread";
    if (threads > 0)
        snprintf(who, sizeof who, "%d thread%s", threads, threads == 1 ? "" : "s");
    if (field_errors || failures)
        printf("VERDICT: errors: %u GPUs x %u links x %ld iterations, no crash; %ld field values and %d calls returned an "
               "error (%ld calls in %.2fs, %s)\n", with_links, max_links, done, field_errors, failures, g_calls,
               elapsed, who);
    else
        printf("VERDICT: clean: %u GPUs x %u links x %ld iterations, no crash (%ld calls in %.2fs, %.0f calls/s, %s)\n",
               with_links, max_links, done, g_calls, elapsed, elapsed > 0 ? g_calls / elapsed : 0.0, who);
    return field_errors || failures ? 1 : 0;
}
