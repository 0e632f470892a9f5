/* A program whose writable data is 80 MiB (a static array in .bss) and holds, at the offset its first
 * argument names, the bytes of the file its second argument names; then it aborts (a kernel core).
 * tests/integration/test_pyread.py plants a real CPython's _Py_DebugOffsets in it, inside and past the
 * 64 MiB that forensics.pyread.scan searches of one object's writable data. */
#include <stdio.h>
#include <stdlib.h>

#define BIG (80 << 20)

static unsigned char big[BIG];

int main(int argc, char **argv) {
    if (argc != 3)
        return 2;
    long offset = strtol(argv[1], NULL, 0);
    FILE *f = fopen(argv[2], "rb");
    if (f == NULL || offset < 0 || offset > BIG - 65536)
        return 2;
    size_t n = fread(big + offset, 1, 65536, f);
    fclose(f);
    if (n == 0)
        return 2;
    abort();
}
