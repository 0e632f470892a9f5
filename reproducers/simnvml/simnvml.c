/* simnvml: a simulated libnvidia-ml.so.1 for CPU-only machines.
 *
 * Built by forensics.simnvml.build_simnvml() into libnvidia-ml.so.<driver> with the
 * soname libnvidia-ml.so.1 (the layout of a real driver install), and found by
 * nvidia-ml-py, nvitop and nvitop-exporter through LD_LIBRARY_PATH.  It simulates a
 * node of GPUs whose utilization, memory, temperature, power, clocks, PCIe and NVLink
 * counters change smoothly with wall-clock time, and it can fail on purpose.
 *
 * Environment (read at nvmlInit; see forensics/simnvml.py SIM_ENV):
 *   FORENSICS_SIMNVML_GPUS          number of GPUs (default 8, 0..64)
 *   FORENSICS_SIMNVML_NAME          product name ("NVIDIA H20")
 *   FORENSICS_SIMNVML_DRIVER        driver version ("580.126.09")
 *   FORENSICS_SIMNVML_NVML_VERSION  NVML version ("13.580.126")
 *   FORENSICS_SIMNVML_CUDA          CUDA driver version as an int (13000)
 *   FORENSICS_SIMNVML_FAULT         none | heap | heap-delayed | overflow | segv | use-after-shutdown
 *   FORENSICS_SIMNVML_FAULT_AFTER   eligible nvmlDeviceGetFieldValues calls before the fault (0)
 *   FORENSICS_SIMNVML_HEAP_MESSAGE  prev | next-size: which glibc check fires
 *   FORENSICS_SIMNVML_FAULT_THREAD  any | non-main: fault only off the process's main thread
 *   FORENSICS_SIMNVML_NVLINKS       NVLinks per GPU that NVML_FI_DEV_NVLINK_LINK_COUNT reports (18, 0..18),
 *                                   or "error": that field answers NVML_ERROR_NOT_SUPPORTED
 *   FORENSICS_SIMNVML_OVERFLOW_BYTES  bytes the overflow fault writes past the caller's array (24, 1..4096)
 *   FORENSICS_SIMNVML_DETECT        later | call: when glibc sees a write past the caller's array (later)
 *
 * Faults (all inside nvmlDeviceGetFieldValues unless said otherwise):
 *   heap          overflows a scratch buffer into the next chunk's header and frees it:
 *                 glibc aborts inside nvmlDeviceGetFieldValues (culprit == crashing stack).
 *   heap-delayed  on an NVLink throughput query, writes a record at the wrong place:
 *                 over the malloc header of the caller's field-value array (values[-1])
 *                 and inside it, and returns success.  glibc notices only when the caller
 *                 later frees that array (ctypes' dealloc, free() in C), outside NVML:
 *                 the crashing stack is the victim, not the culprit.
 *   overflow      on an NVLink throughput query, fills the count records it was asked for and
 *                 then writes FORENSICS_SIMNVML_OVERFLOW_BYTES more bytes of "OVERRUN!" past
 *                 values[count-1]: the driver's bug, past a buffer sized for the count it got.
 *                 (The binding's bug -- a count larger than the array -- needs no fault here:
 *                 the library fills the count records it is asked for; see
 *                 forensics.simnvml.seed_binding_fault.)
 *   segv          writes through a near-NULL pointer.
 *   use-after-shutdown
 *                 nvmlShutdown revokes the device table (PROT_NONE) and device queries
 *                 skip the "initialized?" check, so a query racing or following shutdown
 *                 through a stale handle dies with SIGSEGV.  Without the fault such a
 *                 query returns NVML_ERROR_UNINITIALIZED.
 *
 * Detection (FORENSICS_SIMNVML_DETECT), for any nvmlDeviceGetFieldValues call whose writes
 * (the count records, plus an overflow) reach past the caller's array's malloc chunk:
 *   later         nothing more: glibc notices when the caller frees the array, after the call
 *                 returned (the realistic case: the culprit is gone from the stack).
 *   call          before returning, the library hands the chunk after the caller's array to
 *                 free(), as the process's next free of that chunk would: glibc checks its
 *                 trampled header now, while the call -- and the caller's frame holding the
 *                 array and the count -- are on the stack.
 * Record timestamps are multiples of 16 us, so a timestamp written over a chunk's size word
 * carries no flag bits and glibc's abort is always the same one.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
#define NOINLINE __attribute__((noinline))

/* Found by `strings` the way a real driver's version is. */
API const char simnvml_version_banner[] = "NVIDIA Management Library 580.126.09 (forensics simnvml, simulated)";

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_MEMORY = 20,
    NVML_ERROR_NO_DATA = 21,
    NVML_ERROR_UNKNOWN = 999,
};

enum { VT_DOUBLE = 0, VT_UINT = 1, VT_ULONG = 2, VT_ULL = 3, VT_SLL = 4, VT_SINT = 5 };

#define FI_DEV_NVLINK_LINK_COUNT 91
#define FI_NVLINK_THROUGHPUT_DATA_TX 138
#define FI_NVLINK_THROUGHPUT_DATA_RX 139
#define FI_NVLINK_THROUGHPUT_RAW_TX 140
#define FI_NVLINK_THROUGHPUT_RAW_RX 141
#define NVLINK_LINKS 18
#define MAX_GPUS 64
#define MIB (1024ULL * 1024ULL)

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

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned long long bar1Total, bar1Free, bar1Used; } nvmlBAR1Memory_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct { unsigned int version; unsigned int sensorType; int temperature; } nvmlTemperature_t;

struct sim_device {
    unsigned int magic;
    unsigned int index;
    char name[96];
    char uuid[96];
    char serial[32];
    nvmlPciInfo_t pci;
};
typedef struct sim_device *nvmlDevice_t;

#define DEVICE_MAGIC 0x4e564d4cU /* "NVML" */

enum fault { F_NONE, F_HEAP, F_HEAP_DELAYED, F_OVERFLOW, F_SEGV, F_USE_AFTER_SHUTDOWN };

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_refcount;               /* nvmlInit minus nvmlShutdown */
static struct sim_device *g_devs;    /* one mmap'd table, kept across shutdown/init */
static size_t g_devs_bytes;
static unsigned int g_count = 8;
static char g_driver[80] = "580.126.09";
static char g_nvml_version[80] = "13.580.126";
static int g_cuda = 13000;
static enum fault g_fault = F_NONE;
static long g_fault_after;
static int g_heap_next_size;         /* 0: "(!prev)", 1: "invalid next size (normal)" */
static long g_overflow_bytes = 24;   /* the overflow fault: bytes past the caller's array */
static int g_detect_call;            /* 1: free the chunk after a trampled array before returning */
static int g_fault_non_main;
static int g_links = NVLINK_LINKS;   /* what NVML_FI_DEV_NVLINK_LINK_COUNT says; -1: the field fails */
static long g_eligible_calls;        /* atomic */

static const unsigned char BUSES[8] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};

static const char *env_or(const char *name, const char *fallback)
{
    const char *v = getenv(name);
    return v && *v ? v : fallback;
}

static void read_config(void)
{
    g_count = (unsigned int)strtoul(env_or("FORENSICS_SIMNVML_GPUS", "8"), NULL, 10);
    if (g_count > MAX_GPUS)
        g_count = MAX_GPUS;
    snprintf(g_driver, sizeof g_driver, "%s", env_or("FORENSICS_SIMNVML_DRIVER", "580.126.09"));
    snprintf(g_nvml_version, sizeof g_nvml_version, "%s", env_or("FORENSICS_SIMNVML_NVML_VERSION", "13.580.126"));
    g_cuda = atoi(env_or("FORENSICS_SIMNVML_CUDA", "13000"));
    const char *f = env_or("FORENSICS_SIMNVML_FAULT", "none");
    g_fault = !strcmp(f, "heap") ? F_HEAP
            : !strcmp(f, "heap-delayed") ? F_HEAP_DELAYED
            : !strcmp(f, "overflow") ? F_OVERFLOW
            : !strcmp(f, "segv") ? F_SEGV
            : !strcmp(f, "use-after-shutdown") ? F_USE_AFTER_SHUTDOWN
            : F_NONE;
    g_fault_after = strtol(env_or("FORENSICS_SIMNVML_FAULT_AFTER", "0"), NULL, 10);
    g_heap_next_size = !strcmp(env_or("FORENSICS_SIMNVML_HEAP_MESSAGE", "prev"), "next-size");
    g_overflow_bytes = strtol(env_or("FORENSICS_SIMNVML_OVERFLOW_BYTES", "24"), NULL, 10);
    if (g_overflow_bytes < 1 || g_overflow_bytes > 4096)
        g_overflow_bytes = 24;
    g_detect_call = !strcmp(env_or("FORENSICS_SIMNVML_DETECT", "later"), "call");
    g_fault_non_main = !strcmp(env_or("FORENSICS_SIMNVML_FAULT_THREAD", "any"), "non-main");
    const char *links = env_or("FORENSICS_SIMNVML_NVLINKS", "18");
    g_links = !strcmp(links, "error") ? -1 : atoi(links);
    if (g_links > NVLINK_LINKS)
        g_links = NVLINK_LINKS;
}

static void fill_device(struct sim_device *d, unsigned int i)
{
    const char *name = env_or("FORENSICS_SIMNVML_NAME", "NVIDIA H20");
    unsigned int bus = i < 8 ? BUSES[i] : 0x18 + 0x11 * i;
    memset(d, 0, sizeof *d);
    d->magic = DEVICE_MAGIC;
    d->index = i;
    snprintf(d->name, sizeof d->name, "%s", name);
    snprintf(d->uuid, sizeof d->uuid, "GPU-%08x-%04x-%04x-%04x-%012llx", 0x5a1e0000u + i * 0x1111u, 0x7b3c + i,
             0x4a00 + i, 0x9e40 + i, 0x1b2c3d4e5f60ULL + i * 0x10101ULL);
    snprintf(d->serial, sizeof d->serial, "16521240%05u", 31840 + i);
    d->pci.domain = 0;
    d->pci.bus = bus & 0xff;
    d->pci.device = 0;
    d->pci.pciDeviceId = 0x233010de;
    d->pci.pciSubSystemId = 0x17f310de;
    snprintf(d->pci.busIdLegacy, sizeof d->pci.busIdLegacy, "%04X:%02X:%02X.0", 0, d->pci.bus, 0);
    snprintf(d->pci.busId, sizeof d->pci.busId, "%08X:%02X:%02X.0", 0, d->pci.bus, 0);
}

static int is_initialized(void)
{
    return __atomic_load_n(&g_refcount, __ATOMIC_ACQUIRE) > 0;
}

/* Validate a handle.  Under the use-after-shutdown fault the "initialized?" check is
 * skipped (the bug), so the dereference below touches the revoked table. */
static nvmlReturn_t check(nvmlDevice_t d)
{
    if (g_fault != F_USE_AFTER_SHUTDOWN && !is_initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!d)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g_fault != F_USE_AFTER_SHUTDOWN && (d < g_devs || d >= g_devs + g_count))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (*(volatile unsigned int *)&d->magic != DEVICE_MAGIC) /* SIGSEGV here after a revoked shutdown */
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

#define CHECK(d)                        \
    do {                                \
        nvmlReturn_t r_ = check(d);     \
        if (r_ != NVML_SUCCESS)         \
            return r_;                  \
    } while (0)
#define NONNULL(p)                                  \
    do {                                            \
        if (!(p))                                   \
            return NVML_ERROR_INVALID_ARGUMENT;     \
    } while (0)

static nvmlReturn_t copy_string(char *dst, unsigned int len, const char *src)
{
    NONNULL(dst);
    if (strlen(src) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

/* ---- the simulated physics: smooth functions of wall-clock time ---------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)(ts.tv_sec - 1735689600) + ts.tv_nsec / 1e9; /* seconds since 2025-01-01 */
}

static long long now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long)ts.tv_sec * 1000000LL + ts.tv_nsec / 1000;
}

static double clampd(double v, double lo, double hi) { return v < lo ? lo : v > hi ? hi : v; }

static double gpu_util(unsigned int i, double t)
{
    return clampd(58.0 + 32.0 * sin(t / 11.0 + i * 0.7) + 9.0 * sin(t / 2.3 + i * 1.3), 0.0, 100.0);
}

static const unsigned long long MEM_TOTAL = 97871ULL * MIB;
static const unsigned long long MEM_RESERVED = 587ULL * MIB;

static unsigned long long mem_used(unsigned int i, double t)
{
    double frac = 0.55 + 0.35 * sin(t / 37.0 + i * 0.9);
    return (unsigned long long)((MEM_TOTAL - MEM_RESERVED - 2048ULL * MIB) * frac) / MIB * MIB + 1024ULL * MIB;
}

/* NVLink data counter in KiB: the integral of a rate (KiB/s) base + amp*sin(w t + ph). */
static unsigned long long nvlink_counter(unsigned int i, unsigned int link, int rx, int raw, double t)
{
    double base = 9.0e6 + 0.4e6 * link, amp = 6.0e6, w = 1.0 / (13.0 + link), ph = i * 0.5 + link * 0.3 + rx;
    double kib = base * t - amp / w * cos(w * t + ph) + amp / w;
    if (raw)
        kib *= 1.06; /* protocol overhead */
    return (unsigned long long)kib;
}

/* ---- init / shutdown / system --------------------------------------------------- */

static nvmlReturn_t do_init(void)
{
    nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) {
        read_config();
        size_t bytes = (sizeof(struct sim_device) * MAX_GPUS + 4095) & ~(size_t)4095;
        if (!g_devs) {
            void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED) {
                ret = NVML_ERROR_MEMORY;
                goto out;
            }
            g_devs = p;
            g_devs_bytes = bytes;
        } else {
            mprotect(g_devs, g_devs_bytes, PROT_READ | PROT_WRITE);
        }
        for (unsigned int i = 0; i < g_count; i++)
            fill_device(&g_devs[i], i);
    }
    __atomic_add_fetch(&g_refcount, 1, __ATOMIC_ACQ_REL);
out:
    pthread_mutex_unlock(&g_lock);
    return ret;
}

API nvmlReturn_t nvmlInit(void) { return do_init(); }
API nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
API nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return do_init(); }

API nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t ret = NVML_SUCCESS;
    pthread_mutex_lock(&g_lock);
    if (g_refcount == 0) {
        ret = NVML_ERROR_UNINITIALIZED;
    } else if (__atomic_sub_fetch(&g_refcount, 1, __ATOMIC_ACQ_REL) == 0 && g_fault == F_USE_AFTER_SHUTDOWN) {
        /* the device table is torn down while queries may still hold handles into it */
        mprotect(g_devs, g_devs_bytes, PROT_NONE);
    }
    pthread_mutex_unlock(&g_lock);
    return ret;
}

API const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    default: return "Unknown Error";
    }
}

#define NEED_INIT()                             \
    do {                                        \
        if (!is_initialized())                  \
            return NVML_ERROR_UNINITIALIZED;    \
    } while (0)

API nvmlReturn_t nvmlSystemGetDriverVersion(char *v, unsigned int len) { NEED_INIT(); return copy_string(v, len, g_driver); }
API nvmlReturn_t nvmlSystemGetNVMLVersion(char *v, unsigned int len) { NEED_INIT(); return copy_string(v, len, g_nvml_version); }
API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { NEED_INIT(); NONNULL(v); *v = g_cuda; return NVML_SUCCESS; }
API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { NEED_INIT(); NONNULL(v); *v = g_cuda; return NVML_SUCCESS; }

API nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int len)
{
    char path[64], buf[256] = "";
    NEED_INIT();
    snprintf(path, sizeof path, "/proc/%u/comm", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return NVML_ERROR_NOT_FOUND;
    if (fgets(buf, sizeof buf, f))
        buf[strcspn(buf, "\n")] = 0;
    fclose(f);
    return copy_string(name, len, buf);
}

/* ---- device enumeration ---------------------------------------------------------- */

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { NEED_INIT(); NONNULL(n); *n = g_count; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return nvmlDeviceGetCount_v2(n); }

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d)
{
    NEED_INIT();
    NONNULL(d);
    if (i >= g_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *d = &g_devs[i];
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return nvmlDeviceGetHandleByIndex_v2(i, d); }

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d)
{
    NEED_INIT();
    NONNULL(uuid);
    NONNULL(d);
    for (unsigned int i = 0; i < g_count; i++)
        if (!strcmp(g_devs[i].uuid, uuid)) {
            *d = &g_devs[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *d)
{
    NEED_INIT();
    NONNULL(bus);
    NONNULL(d);
    for (unsigned int i = 0; i < g_count; i++)
        if (!strcasecmp(g_devs[i].pci.busId, bus) || !strcasecmp(g_devs[i].pci.busIdLegacy, bus)) {
            *d = &g_devs[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}
API nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *bus, nvmlDevice_t *d) { return nvmlDeviceGetHandleByPciBusId_v2(bus, d); }

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *i) { CHECK(d); NONNULL(i); *i = d->index; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *i) { CHECK(d); NONNULL(i); *i = d->index; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *s, unsigned int len) { CHECK(d); return copy_string(s, len, d->name); }
API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *s, unsigned int len) { CHECK(d); return copy_string(s, len, d->uuid); }
API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t d, char *s, unsigned int len) { CHECK(d); return copy_string(s, len, d->serial); }
API nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t d, char *s, unsigned int len) { CHECK(d); return copy_string(s, len, "96.00.A5.00.01"); }
API nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t d, int *b) { CHECK(d); NONNULL(b); *b = 2; /* TESLA */ return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, unsigned int *a) { CHECK(d); NONNULL(a); *a = 9; /* HOPPER */ return NVML_SUCCESS; }

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) { CHECK(d); NONNULL(p); *p = d->pci; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(d, p); }
API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *p) { return nvmlDeviceGetPciInfo_v3(d, p); }

/* ---- telemetry --------------------------------------------------------------------- */

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m)
{
    CHECK(d);
    NONNULL(m);
    m->total = MEM_TOTAL;
    m->used = mem_used(d->index, now_s()) + MEM_RESERVED;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m)
{
    CHECK(d);
    NONNULL(m);
    if ((m->version >> 24) != 2)
        return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    m->total = MEM_TOTAL;
    m->reserved = MEM_RESERVED;
    m->used = mem_used(d->index, now_s());
    m->free = m->total - m->reserved - m->used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t d, nvmlBAR1Memory_t *b)
{
    CHECK(d);
    NONNULL(b);
    b->bar1Total = 131072ULL * MIB;
    b->bar1Used = 33ULL * MIB;
    b->bar1Free = b->bar1Total - b->bar1Used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u)
{
    CHECK(d);
    NONNULL(u);
    double g = gpu_util(d->index, now_s());
    u->gpu = (unsigned int)g;
    u->memory = (unsigned int)(g * 0.62);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *period)
{
    CHECK(d);
    NONNULL(u);
    NONNULL(period);
    *u = 0;
    *period = 167000;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t d, unsigned int *u, unsigned int *p) { return nvmlDeviceGetEncoderUtilization(d, u, p); }

static unsigned int clock_mhz(unsigned int i, int type, int max)
{
    double busy = gpu_util(i, now_s()) > 3.0;
    switch (type) {
    case 0: /* GRAPHICS */
    case 1: /* SM */
        return max ? 1980 : busy ? 1755 + (unsigned int)(225 * sin(now_s() / 5.0 + i) * sin(now_s() / 5.0 + i)) : 345;
    case 2: /* MEM */
        return 2619;
    case 3: /* VIDEO */
        return max ? 1710 : busy ? 1530 : 765;
    default:
        return 0;
    }
}

API nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *c)
{
    CHECK(d);
    NONNULL(c);
    if (type < 0 || type > 3)
        return NVML_ERROR_INVALID_ARGUMENT;
    *c = clock_mhz(d->index, type, 0);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t d, int type, unsigned int *c)
{
    CHECK(d);
    NONNULL(c);
    if (type < 0 || type > 3)
        return NVML_ERROR_INVALID_ARGUMENT;
    *c = clock_mhz(d->index, type, 1);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t d, int type, int id, unsigned int *c) { (void)id; return nvmlDeviceGetClockInfo(d, type, c); }

API nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw)
{
    CHECK(d);
    NONNULL(mw);
    *mw = 78000 + (unsigned int)(gpu_util(d->index, now_s()) * 3950.0);
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t d, unsigned int *mw) { CHECK(d); NONNULL(mw); *mw = 500000; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) { return nvmlDeviceGetPowerManagementLimit(d, mw); }
API nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t d, unsigned int *mw) { return nvmlDeviceGetPowerManagementLimit(d, mw); }

API nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *mj)
{
    CHECK(d);
    NONNULL(mj);
    *mj = (unsigned long long)(now_s() * 300000.0); /* ~300 W average since 2025 */
    return NVML_SUCCESS;
}

static unsigned int temperature(unsigned int i) { return 31 + (unsigned int)(gpu_util(i, now_s()) * 0.36); }

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *c)
{
    CHECK(d);
    NONNULL(c);
    if (sensor != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *c = temperature(d->index);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t d, nvmlTemperature_t *t)
{
    CHECK(d);
    NONNULL(t);
    if ((t->version >> 24) != 1)
        return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    if (t->sensorType != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    t->temperature = (int)temperature(d->index);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t d, int type, unsigned int *c)
{
    CHECK(d);
    NONNULL(c);
    static const unsigned int th[] = {92, 89, 87, 0};
    if (type < 0 || type > 2)
        return NVML_ERROR_NOT_SUPPORTED;
    *c = th[type];
    return NVML_SUCCESS;
}

/* H20 boards are passively cooled */
API nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t d, unsigned int *s) { CHECK(d); NONNULL(s); return NVML_ERROR_NOT_SUPPORTED; }
API nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t d, unsigned int fan, unsigned int *s) { (void)fan; return nvmlDeviceGetFanSpeed(d, s); }
API nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t d, unsigned int *n) { CHECK(d); NONNULL(n); *n = 0; return NVML_SUCCESS; }

API nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *kbs)
{
    CHECK(d);
    NONNULL(kbs);
    if (counter < 0 || counter > 1)
        return NVML_ERROR_INVALID_ARGUMENT;
    double t = now_s();
    *kbs = (unsigned int)(1.2e6 + 1.0e6 * sin(t / 5.0 + d->index + counter * 1.7));
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t d, unsigned int *v) { CHECK(d); NONNULL(v); *v = 5; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *v) { CHECK(d); NONNULL(v); *v = 5; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned int *v) { CHECK(d); NONNULL(v); *v = 16; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned int *v) { CHECK(d); NONNULL(v); *v = 16; return NVML_SUCCESS; }

API nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t d, int *p) { CHECK(d); NONNULL(p); *p = 0; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t d, int *p) { return nvmlDeviceGetPerformanceState(d, p); }
API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, int *m) { CHECK(d); NONNULL(m); *m = 1; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t d, int *m) { CHECK(d); NONNULL(m); *m = 0; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t d, int *m) { CHECK(d); NONNULL(m); *m = 0; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, int *m) { CHECK(d); NONNULL(m); *m = 0; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetCurrentDriverModel(nvmlDevice_t d, int *m) { CHECK(d); NONNULL(m); return NVML_ERROR_NOT_SUPPORTED; /* Windows only */ }
API nvmlReturn_t nvmlDeviceGetDriverModel(nvmlDevice_t d, int *c, int *p) { CHECK(d); (void)c; (void)p; return NVML_ERROR_NOT_SUPPORTED; }
API nvmlReturn_t nvmlDeviceGetDriverModel_v2(nvmlDevice_t d, int *c, int *p) { CHECK(d); (void)c; (void)p; return NVML_ERROR_NOT_SUPPORTED; }

API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, int type, int counter, unsigned long long *n)
{
    CHECK(d);
    NONNULL(n);
    (void)type;
    (void)counter;
    *n = 0;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t d, int *c, int *p) { CHECK(d); NONNULL(c); NONNULL(p); *c = *p = 1; return NVML_SUCCESS; }

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor)
{
    CHECK(d);
    NONNULL(major);
    NONNULL(minor);
    *major = 9;
    *minor = 0;
    return NVML_SUCCESS;
}

/* ---- MIG: disabled on every GPU ---------------------------------------------------- */

API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *cur, unsigned int *pending)
{
    CHECK(d);
    NONNULL(cur);
    NONNULL(pending);
    *cur = *pending = 0;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *n) { CHECK(d); NONNULL(n); *n = 7; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is) { CHECK(d); NONNULL(is); *is = 0; return NVML_SUCCESS; }
API nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int i, nvmlDevice_t *m) { CHECK(d); (void)i; (void)m; return NVML_ERROR_NOT_FOUND; }
API nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *p) { CHECK(d); (void)p; return NVML_ERROR_INVALID_ARGUMENT; }
API nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) { CHECK(d); (void)id; return NVML_ERROR_INVALID_ARGUMENT; }
API nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) { CHECK(d); (void)id; return NVML_ERROR_INVALID_ARGUMENT; }

/* ---- processes: none are running ---------------------------------------------------- */

static nvmlReturn_t no_processes(nvmlDevice_t d, unsigned int *count, void *infos)
{
    CHECK(d);
    NONNULL(count);
    (void)infos;
    *count = 0;
    return NVML_SUCCESS;
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, void *i) { return no_processes(d, c, i); }
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, void *i) { return no_processes(d, c, i); }
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, void *i) { return no_processes(d, c, i); }
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t d, unsigned int *c, void *i) { return no_processes(d, c, i); }
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, void *i) { return no_processes(d, c, i); }
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, void *i) { return no_processes(d, c, i); }
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses(nvmlDevice_t d, unsigned int *c, void *i) { return no_processes(d, c, i); }
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, void *i) { return no_processes(d, c, i); }
API nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, void *i) { return no_processes(d, c, i); }

API nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t d, void *plist) { CHECK(d); (void)plist; return NVML_ERROR_NOT_SUPPORTED; }
API nvmlReturn_t nvmlDeviceGetConfComputeMemSizeInfo(nvmlDevice_t d, void *info) { CHECK(d); (void)info; return NVML_ERROR_NOT_SUPPORTED; }

API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, void *samples, unsigned int *count, unsigned long long last)
{
    CHECK(d);
    NONNULL(count);
    (void)samples;
    (void)last;
    *count = 0;
    return NVML_ERROR_NOT_FOUND; /* no samples since `last` */
}

API nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t d, void *info) { CHECK(d); (void)info; return NVML_ERROR_NOT_FOUND; }

/* ---- NVLink ------------------------------------------------------------------------ */

API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, int *active)
{
    CHECK(d);
    NONNULL(active);
    if (link >= NVLINK_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    *active = 1;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t d, unsigned int link, unsigned int *v)
{
    CHECK(d);
    NONNULL(v);
    if (link >= NVLINK_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    *v = 4;
    return NVML_SUCCESS;
}

static int is_main_thread(void) { return syscall(SYS_gettid) == getpid(); }

static int is_nvlink_throughput(unsigned int id)
{
    return id >= FI_NVLINK_THROUGHPUT_DATA_TX && id <= FI_NVLINK_THROUGHPUT_RAW_RX;
}

/* Heap fault: overflow a scratch buffer by 16 bytes over the next chunk's header and free
 * it.  0x500 is above the tcache and fastbin sizes, so free() runs _int_free's checks on
 * the next chunk: PREV_INUSE clear -> "double free or corruption (!prev)"; a huge size ->
 * "free(): invalid next size (normal)". */
static void *volatile g_keep;
static NOINLINE void nvlink_scratch_overflow(int next_size)
{
    enum { BIG = 0x500 };
    unsigned char *buf = malloc(BIG);
    unsigned char *guard = malloc(BIG);
    size_t header[2];
    g_keep = guard;
    memset(buf, 0x41, BIG);
    header[0] = 0x4141414141414141ULL;
    header[1] = next_size ? 0x4141414141414141ULL : (size_t)(BIG + 0x10);
    memcpy(buf + BIG, header, sizeof header); /* the overflow */
    g_keep = buf;
    free(g_keep); /* glibc aborts here */
}

/* Delayed heap fault: a record is written at the wrong place in the caller's array.
 * values[-1]'s last word -- the malloc chunk header of the caller's array -- gets a
 * smaller chunk size (0x420, above the tcache and fastbin sizes), and a timestamp lands
 * where that smaller chunk's "next chunk" size word would be, inside values[26].  Nothing
 * in glibc looks at an in-use chunk's header, so the process runs on; when the caller
 * later frees its array, _int_free reads the fake next header: an even timestamp ->
 * "double free or corruption (!prev)", an odd one (huge) -> "free(): invalid next size
 * (normal)".  Only a heap (not mmapped) chunk sized for the request is touched: an array
 * from pymalloc, the stack or a tiny request is left alone, so this fires on NVLink
 * throughput queries of >= 27 fields, as nvitop's all-links TX+RX query is. */
static NOINLINE void nvlink_write_misplaced_record(nvmlFieldValue_t *values, int count, int next_size)
{
    enum { FAKE = 0x420 };
    size_t want = (size_t)count * sizeof *values;
    size_t *hdr = (size_t *)values - 1;
    size_t sz = *hdr & ~(size_t)7;
    if (((uintptr_t)values & 15) || (*hdr & 2) || want + 8 < FAKE + 16 || sz < want + 8 || sz > want + 8 + 96)
        return; /* not a heap chunk we can read the shape of */
    size_t *fake_next = (size_t *)((char *)values - 16 + FAKE);
    long long ts = now_us();
    fake_next[1] = next_size ? (size_t)(ts | 1) : (size_t)(ts & ~0xfLL);
    *hdr = FAKE | (*hdr & 7); /* keep PREV_INUSE and NON_MAIN_ARENA */
}

/* Overflow fault: after the count records, more bytes of "OVERRUN!" past the end of what the
 * caller said its array holds -- the driver's bug. */
static NOINLINE void nvlink_write_past_array(nvmlFieldValue_t *values, int count, long bytes)
{
    static const char pattern[8] = {'O', 'V', 'E', 'R', 'R', 'U', 'N', '!'};
    volatile unsigned char *end = (volatile unsigned char *)(values + count);
    for (long i = 0; i < bytes; i++)
        end[i] = (unsigned char)pattern[i % 8];
}

/* The usable size of the heap chunk holding p, or 0 when p is not the start of a heap chunk
 * whose header can be read (misaligned, mmapped, or an implausible size). */
static size_t heap_usable(const void *p)
{
    const size_t *hdr = (const size_t *)p - 1;
    size_t sz;
    if ((uintptr_t)p & 15)
        return 0;
    sz = *hdr & ~(size_t)7;
    if ((*hdr & 2) || sz < 32 || sz > ((size_t)1 << 26))
        return 0;
    return sz - 8;
}

/* FORENSICS_SIMNVML_DETECT=call: the writes reached the header of the chunk after the
 * caller's array; hand that chunk to free() now, so glibc checks the trampled header while
 * this call is on the stack (glibc aborts here). */
static NOINLINE void free_chunk_after(nvmlFieldValue_t *values, size_t usable)
{
    void *volatile next_mem = (char *)values + usable + 8;
    free(next_mem);
}

static NOINLINE void nvlink_bad_pointer_write(unsigned int link)
{
    volatile unsigned long long *p = (volatile unsigned long long *)(uintptr_t)(0x10 + 8 * link);
    *p = 0xdeadbeefULL;
}

/* Is this call subject to the configured fault, and is it the one that fires? */
static int fault_fires(int nvlink_query)
{
    if (g_fault == F_NONE || g_fault == F_USE_AFTER_SHUTDOWN)
        return 0;
    if ((g_fault == F_HEAP_DELAYED || g_fault == F_OVERFLOW) && !nvlink_query)
        return 0;
    if (g_fault_non_main && is_main_thread())
        return 0;
    long n = __atomic_fetch_add(&g_eligible_calls, 1, __ATOMIC_ACQ_REL);
    return n >= g_fault_after;
}

API nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values)
{
    CHECK(d);
    NONNULL(values);
    if (count < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    double t = now_s();
    long long ts = now_us() & ~0xfLL; /* a multiple of 16: no flag bits if it lands on a size word */
    int nvlink_query = 0;
    size_t usable = heap_usable(values); /* read before writing: only the caller's own header */
    size_t written = (size_t)count * sizeof *values;
    for (int k = 0; k < count; k++) {
        nvmlFieldValue_t *v = &values[k];
        unsigned int id = v->fieldId;
        v->timestamp = ts;
        v->latencyUsec = 0;
        v->nvmlReturn = NVML_SUCCESS;
        if (id == FI_DEV_NVLINK_LINK_COUNT) {
            v->valueType = VT_UINT;
            if (g_links < 0)
                v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
            else
                v->value.uiVal = (unsigned int)g_links;
        } else if (is_nvlink_throughput(id)) {
            nvlink_query = 1;
            if (v->scopeId >= (unsigned int)(g_links < 0 ? NVLINK_LINKS : g_links)) {
                v->nvmlReturn = NVML_ERROR_INVALID_ARGUMENT;
                continue;
            }
            v->valueType = VT_ULL;
            v->value.ullVal = nvlink_counter(d->index, v->scopeId, id & 1, id >= FI_NVLINK_THROUGHPUT_RAW_TX, t);
        } else {
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    if (fault_fires(nvlink_query)) {
        switch (g_fault) {
        case F_HEAP:
            nvlink_scratch_overflow(g_heap_next_size);
            break;
        case F_HEAP_DELAYED:
            nvlink_write_misplaced_record(values, count, g_heap_next_size);
            break;
        case F_OVERFLOW:
            nvlink_write_past_array(values, count, g_overflow_bytes);
            written += (size_t)g_overflow_bytes;
            break;
        case F_SEGV:
            nvlink_bad_pointer_write(count > 0 ? values[0].scopeId : 0);
            break;
        default:
            break;
        }
    }
    /* the size word of the next chunk starts 8 bytes past the usable size */
    if (g_detect_call && usable && written > usable)
        free_chunk_after(values, usable);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceClearFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values)
{
    CHECK(d);
    (void)count;
    (void)values;
    return NVML_SUCCESS;
}
