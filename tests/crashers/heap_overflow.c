/* heap_overflow: a plain C program (no Python) that writes past a heap buffer and lets glibc catch it.
 *
 *   heap_overflow MODE REQUEST OVERFLOW FILL ORACLE
 *
 * MODE      free-buffer         free the buffer that overflowed: glibc checks the next chunk's header
 *           free-next           free the chunk after it: glibc checks its trampled header
 *           thread-free-buffer  free-buffer in a second thread (its own arena: heap_info, a thread heap)
 *           thread-free-next    free-next in a second thread
 *           top                 the buffer is the last chunk before the top: the overflow hits the top
 *                               chunk's size, and the next malloc that needs the top aborts
 *           unsorted            the chunk after the buffer is free (in the unsorted bin): the overflow
 *                               hits its size and links, and the next malloc aborts sorting it
 *           double-free         no overflow: a tcache-sized chunk freed twice
 * REQUEST   bytes asked of malloc (above the tcache's 1032, so free() runs _int_free's checks)
 * OVERFLOW  bytes written past REQUEST
 * FILL      the byte written (0x41: "invalid next size" / "(out)"; 0x5a: "(!prev)" / munmap_chunk)
 * ORACLE    a file written before the crash: what the test expects, from glibc itself
 *           (malloc_usable_size, the pointers malloc returned)
 *
 * Built by the tests (never committed as a binary).
 */
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *g_mode;
static size_t g_request, g_overflow;
static int g_fill;
static const char *g_oracle;
static void *volatile g_keep[4];

static FILE *g_oracle_file; /* opened before the first allocation the test is about */

static void oracle(unsigned char *buf, unsigned char *next, size_t usable)
{
    FILE *f = g_oracle_file;
    fprintf(f, "{\"buffer\": %lu, \"request\": %zu, \"usable\": %zu, \"next\": %lu, \"overflow\": %zu, "
               "\"fill\": %d, \"adjacent\": %s}\n",
            (unsigned long)buf, g_request, usable, (unsigned long)next, g_overflow, g_fill,
            next == buf + usable + 8 ? "true" : "false");
    fclose(f);
}

static void *special(void)
{
    if (!strcmp(g_mode, "double-free")) {
        void *p = malloc(g_request);
        oracle(p, p, malloc_usable_size(p));
        g_keep[0] = p;
        free(g_keep[0]);
        free(g_keep[0]); /* glibc aborts: "free(): double free detected in tcache 2" */
        return NULL;
    }
    if (!strcmp(g_mode, "top")) {
        /* a fresh arena top: a huge request first takes whatever free chunk could serve it */
        unsigned char *buf = malloc(g_request);
        size_t usable = malloc_usable_size(buf);
        g_keep[0] = buf;
        oracle(buf, buf + usable + 8, usable);
        memset(buf, 0x11, g_request);
        memset(buf + g_request, g_fill, g_overflow); /* over the top chunk's size */
        g_keep[1] = malloc(1 << 16);                /* glibc aborts: "malloc(): corrupted top size" */
        return NULL;
    }
    if (!strcmp(g_mode, "unsorted")) {
        unsigned char *buf = malloc(g_request);
        unsigned char *victim = malloc(g_request);
        unsigned char *guard = malloc(g_request);
        size_t usable = malloc_usable_size(buf);
        g_keep[0] = buf;
        g_keep[1] = guard;
        oracle(buf, victim, usable);
        if (victim != buf + usable + 8)
            _exit(2);
        free(victim); /* above the tcache: into the unsorted bin */
        memset(buf, 0x11, g_request);
        memset(buf + g_request, g_fill, g_overflow); /* over its size and fd */
        g_keep[2] = malloc(g_request * 4);           /* sorting the unsorted bin: glibc aborts */
        return NULL;
    }
    return (void *)1;
}

static void *run(void *unused)
{
    (void)unused;
    if (!special())
        return NULL;
    unsigned char *buf = malloc(g_request);
    unsigned char *next = malloc(g_request);
    g_keep[0] = buf;
    g_keep[1] = next;
    size_t usable = malloc_usable_size(buf);
    /* next is the chunk right after buf when both came from the top of the arena */
    oracle(buf, next, usable);
    if ((unsigned char *)next != buf + usable + 8)
        _exit(2);
    memset(buf, 0x11, g_request);
    memset(buf + g_request, g_fill, g_overflow); /* the overflow */
    if (strstr(g_mode, "free-next"))
        free(g_keep[1]);
    else
        free(g_keep[0]);
    return NULL; /* not reached: glibc aborts */
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: %s MODE REQUEST OVERFLOW FILL ORACLE\n", argv[0]);
        return 2;
    }
    g_mode = argv[1];
    g_request = strtoul(argv[2], NULL, 0);
    g_overflow = strtoul(argv[3], NULL, 0);
    g_fill = (int)strtol(argv[4], NULL, 0);
    g_oracle = argv[5];
    g_oracle_file = fopen(g_oracle, "w");
    if (!g_oracle_file)
        return 3;
    setvbuf(g_oracle_file, NULL, _IONBF, 0); /* its buffer allocated now, not between the test's mallocs */
    if (!strncmp(g_mode, "thread-", 7)) {
        pthread_t t;
        if (pthread_create(&t, NULL, run, NULL) != 0)
            return 3;
        pthread_join(t, NULL);
    } else {
        run(NULL);
    }
    return 0;
}
