/* nested_handler: a plain C program (no Python) whose signal handler runs when it dies, for signal-frame tests.
 *
 *   nested_handler MODE
 *
 * MODE  abort-then-segv   glibc aborts on a heap overflow; the SA_SIGINFO SIGABRT handler reads through
 *                         address 0x10 (a crash reporter reading a bad pointer): SIGSEGV in the handler
 *       segv-then-abort   a store to address 0x28; the SA_SIGINFO SIGSEGV handler calls abort()
 *       plain-abort       as abort-then-segv, with a handler installed by signal() (no siginfo written)
 *
 * Built by the tests for the machine under test (never committed as a binary).
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile int reporter_calls;

static void on_abort(int signo, siginfo_t *info, void *uc)
{
    volatile int *context = (volatile int *)(uintptr_t)0x10;
    (void)signo, (void)info, (void)uc;
    reporter_calls++;
    reporter_calls += *context; /* SIGSEGV inside the SIGABRT handler */
}

static void on_abort_plain(int signo)
{
    on_abort(signo, NULL, NULL);
}

static void on_segv(int signo, siginfo_t *info, void *uc)
{
    (void)signo, (void)info, (void)uc;
    abort(); /* SIGABRT inside the SIGSEGV handler */
}

static void install(int signo, void (*action)(int, siginfo_t *, void *), void (*plain)(int))
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    if (action) {
        sa.sa_sigaction = action;
        sa.sa_flags = SA_SIGINFO;
    } else {
        sa.sa_handler = plain;
    }
    sigaction(signo, &sa, NULL);
}

/* called through a volatile pointer: the compiler may not drop the write as dead before free() */
static void *(*volatile fill)(void *, int, size_t) = memset;

static void heap_overflow(void)
{
    char *p = malloc(1288);
    char *q = malloc(1288);
    fill(p, 0x5a, 1288 + 16); /* over the next chunk's size */
    free(p);                    /* double free or corruption (!prev) */
    free(q);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "";
    if (!strcmp(mode, "abort-then-segv")) {
        install(SIGABRT, on_abort, NULL);
        heap_overflow();
    } else if (!strcmp(mode, "plain-abort")) {
        install(SIGABRT, NULL, on_abort_plain);
        heap_overflow();
    } else if (!strcmp(mode, "segv-then-abort")) {
        install(SIGSEGV, on_segv, NULL);
        *(volatile int *)(uintptr_t)0x28 = argc;
    }
    fprintf(stderr, "usage: nested_handler abort-then-segv|segv-then-abort|plain-abort\n");
    return 2;
}
