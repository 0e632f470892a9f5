/* A crash reporter in C whose own signal handlers fault (issue #22's nested faults).
 *
 * Built by the tests (never committed as a binary), loaded through ctypes by
 * tests/crashers/exporter.py when EXPORTER_HANDLER is c-abort or c-segv.  Each handler
 * really faults: the kernel delivers the second fault and writes the core.
 */
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

static volatile int reporter_calls;

/* The SIGABRT handler: it "reads the crashing context" through a NULL pointer. */
static void forensics_reporter_on_abort(int signo)
{
    volatile int *context = (volatile int *)(uintptr_t)0;
    reporter_calls++;
    reporter_calls += *context; /* SIGSEGV inside the SIGABRT handler */
}

/* The SIGSEGV handler: it faults again (SIGSEGV is blocked while it runs, so the kernel kills). */
static void forensics_reporter_on_segv(int signo, siginfo_t *info, void *uc)
{
    volatile int *scratch = (volatile int *)(uintptr_t)0x28;
    reporter_calls++;
    *scratch = signo; /* a second SIGSEGV, at 0x28 */
}

/* A slow SIGABRT handler: a reporter still writing its report (it waits) when another thread faults. */
static void forensics_reporter_slow_abort(int signo)
{
    struct timespec ts = {30, 0};
    reporter_calls++;
    nanosleep(&ts, 0);
}

static int install(int signo, void (*fn)(int), void (*action)(int, siginfo_t *, void *))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    if (action) {
        sa.sa_sigaction = action;
        sa.sa_flags = SA_SIGINFO;
    } else {
        sa.sa_handler = fn;
    }
    return sigaction(signo, &sa, 0);
}

int forensics_install_abort_handler(void)
{
    return install(SIGABRT, forensics_reporter_on_abort, 0);
}

int forensics_install_segv_handler(void)
{
    return install(SIGSEGV, 0, forensics_reporter_on_segv);
}

int forensics_install_slow_abort_handler(void)
{
    return install(SIGABRT, forensics_reporter_slow_abort, 0);
}
