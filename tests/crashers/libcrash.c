/* A small native library that fails the way a buggy driver library does.
 *
 * Built by the tests (never committed as a binary) and called through ctypes
 * from tests/crashers/exporter.py.  Each entry point really corrupts the heap
 * or really writes through a bad pointer: glibc's own checks and the kernel
 * produce the abort / SIGSEGV and the core.
 */
#include <stdlib.h>
#include <string.h>
#include <stdint.h>

#define BIG 0x500 /* above the tcache and fastbin sizes: free() takes _int_free's checks */

static void *volatile keep;
static void *volatile keep_buf;

#ifdef FORENSICS_PAD
/* Another build of the library (-DFORENSICS_PAD): code before every function below moves their offsets. */
__attribute__((used, noinline)) int forensics_padding(volatile int *p)
{
    int i, s = 0;
    for (i = 0; i < 64; i++)
        s += p[i] * i + (s >> 3);
    return s;
}
#endif

/* Overflow a heap buffer by 16 bytes into the next chunk's header, then free it.
 * mode 0: the next chunk's size loses PREV_INUSE -> "double free or corruption (!prev)"
 * mode 1: the next chunk's size becomes "AAAAAAAA" -> "free(): invalid next size (normal)"
 */
int forensics_heap_overflow(int mode)
{
    unsigned char *buf = malloc(BIG);
    unsigned char *guard = malloc(BIG); /* the chunk whose header we trample */
    size_t header[2];
    keep = guard;
    keep_buf = buf; /* escape both so the compiler cannot elide the allocations */
    memset(buf, 0x41, BIG);
    header[0] = 0x4141414141414141ULL;             /* prev_size, as a run of "A"s would */
    header[1] = mode == 0 ? (BIG + 0x10) : 0x4141414141414141ULL; /* next size: !PREV_INUSE, or huge */
    memcpy(buf + BIG, header, sizeof header);       /* the 16-byte overflow */
    free(keep_buf);
    return 0; /* not reached: glibc aborts in free() */
}

/* Write through a pointer that was never valid: SIGSEGV with si_addr near NULL. */
int forensics_bad_write(int offset)
{
    volatile uint32_t *p = (volatile uint32_t *)(uintptr_t)(0x10 + offset);
    *p = 0xdeadbeef;
    return 0;
}

/* Integer division by zero: SIGFPE (FPE_INTDIV) with si_addr at the faulting instruction. */
int forensics_divide(int divisor)
{
    volatile int n = 42;
    return n / divisor;
}

/* An undefined instruction (ud2): SIGILL. */
int forensics_trap(void)
{
    __builtin_trap();
}

/* Touch a file mapping past the end of its file: SIGBUS (BUS_ADRERR). */
#include <sys/mman.h>
#include <unistd.h>
#include <fcntl.h>
#include <stdio.h>
int forensics_bus(void)
{
    char path[] = "/tmp/forensics-busXXXXXX";
    int fd = mkstemp(path);
    volatile char *p;
    if (fd < 0)
        return -1;
    unlink(path);
    if (ftruncate(fd, 4096) != 0)
        return -1;
    p = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return -1;
    p[4096] = 1; /* the second page has no file behind it */
    return 0;
}

/* An assertion that fails: glibc's __assert_fail writes "PROGRAM: FILE:LINE: FUNCTION: Assertion ..."
 * (PROGRAM is argv[0]'s name) and aborts. */
#include <assert.h>
int forensics_assert(int channels)
{
    assert(channels > 0);
    return channels;
}

/* A native library's own thread (no Python frames on it) that faults in one of two functions:
 * two different bugs of one library. */
#include <pthread.h>
static volatile int sink;

__attribute__((noinline)) static void forensics_poll_events(volatile int *table)
{
    sink = table[8]; /* reads 0x20 */
}

__attribute__((noinline)) static void forensics_update_clocks(volatile long *clocks)
{
    clocks[6] = sink + 1; /* writes 0x30 */
}

static void *forensics_native_worker(void *which)
{
    if ((uintptr_t)which == 0)
        forensics_poll_events((volatile int *)0);
    else
        forensics_update_clocks((volatile long *)0);
    return 0;
}

int forensics_native_thread(int which)
{
    pthread_t t;
    if (pthread_create(&t, 0, forensics_native_worker, (void *)(uintptr_t)which) != 0)
        return -1;
    pthread_join(t, 0);
    return 0;
}

/* A crash reporter's handler for a signal that is no fault (SIGUSR1: "dump your state"), which itself
 * writes through NULL; and the function that raises the signal (it only raised it). */
#include <signal.h>
static void forensics_on_usr1(int signo)
{
    volatile int *state = (volatile int *)(uintptr_t)0;
    *state = signo; /* SIGSEGV inside the SIGUSR1 handler */
}

int forensics_install_usr1_handler(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = forensics_on_usr1;
    return sigaction(SIGUSR1, &sa, 0);
}

int forensics_raise(int signo)
{
    raise(signo);
    return sink;
}

/* C recursion on a thread whose stack is 256 KiB: the recursion runs into the guard page below the stack
 * (SIGSEGV, SEGV_ACCERR in a PROT_NONE mapping, the stack pointer beside it). */
__attribute__((noinline)) static int forensics_recurse(volatile char *prev, int depth)
{
    volatile char frame[256];
    frame[0] = (char)depth;
    frame[255] = prev ? prev[0] : 0;
    return forensics_recurse(frame, depth + 1) + frame[1]; /* not a tail call: each level keeps its frame */
}

static void *forensics_overflow_worker(void *arg)
{
    (void)arg;
    sink = forensics_recurse(0, 0);
    return 0;
}

int forensics_overflow_thread(void)
{
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    if (pthread_create(&t, &attr, forensics_overflow_worker, 0) != 0)
        return -1;
    pthread_join(t, 0);
    return 0;
}

/* A buffer released twice (a tp_dealloc that runs twice).  glibc's check, and so its message, depends on the
 * size and the heap around it: a tcache size reads "free(): double free detected in tcache 2", a larger one
 * with a chunk after it "double free or corruption (!prev)" -- one bug whatever the message. */
__attribute__((noinline)) void forensics_release_buffer(void *buffer)
{
    free(buffer);
}

int forensics_double_free(size_t size)
{
    void *buffer = malloc(size);
    keep = malloc(32); /* a chunk after it: the buffer's chunk does not border the top chunk */
    forensics_release_buffer(buffer);
    forensics_release_buffer(buffer);
    return 0;
}

/* Two functions of one library, both handed NULL by one generic dispatcher (a binding's _call(fn, ...)): a read
 * at NULL+0 and one at NULL+0x10 -- two bugs behind one Python function. */
struct forensics_names { long count; long spare; const char **names; };

int forensics_sum_keys(const int *keys)
{
    return keys[0] + 1; /* reads 0x0 */
}

long forensics_count_names(const struct forensics_names *table)
{
    return (long)table->names + 1; /* reads 0x10 */
}
