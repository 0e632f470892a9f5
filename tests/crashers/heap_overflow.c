/* heap_overflow: a plain C program (no Python) that writes past a heap buffer and lets glibc catch it.
 *
 *   heap_overflow MODE REQUEST OVERFLOW FILL ORACLE
 *
 * MODE      free-buffer         free the buffer that overflowed: glibc checks the next chunk's header
 *           free-next           free the chunk after it: glibc checks its trampled header
 *           thread-free-buffer  free-buffer in a second thread (its own arena: heap_info, a thread heap)
 *           thread-free-next    free-next in a second thread
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

static void *run(void *unused)
{
    (void)unused;
    unsigned char *buf = malloc(g_request);
    unsigned char *next = malloc(g_request);
    g_keep[0] = buf;
    g_keep[1] = next;
    size_t usable = malloc_usable_size(buf);
    FILE *f = fopen(g_oracle, "w");
    if (!f)
        _exit(3);
    /* next is the chunk right after buf when both came from the top of the arena */
    fprintf(f, "{\"buffer\": %lu, \"request\": %zu, \"usable\": %zu, \"next\": %lu, \"overflow\": %zu, "
               "\"fill\": %d, \"adjacent\": %s}\n",
            (unsigned long)buf, g_request, usable, (unsigned long)next, g_overflow, g_fill,
            (unsigned char *)next == buf + usable + 8 ? "true" : "false");
    fclose(f);
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
